"""The language of each request to a tornado application (the hub, the billing service).

A tornado output transform is made for every request before its handler runs, so it sets
the language for the handler's whole run, JupyterHub's own handlers included, without
touching them: `?lang=` first (and then remembered in a cookie), the cookie, then the
browser's `Accept-Language`. Responses say their `Content-Language`.
"""

from __future__ import annotations

from tornado.httputil import HTTPHeaders, HTTPServerRequest
from tornado.web import OutputTransform

from . import COOKIE, QUERY, canonical, html_lang, negotiate, set_language

#: how long a chosen language is remembered: a year, in seconds
COOKIE_MAX_AGE = 365 * 86_400


def request_language(request: HTTPServerRequest) -> tuple[str, str | None]:
    """(the language for `request`, the language to remember in the cookie, or None)."""
    asked = request.query_arguments.get(QUERY)
    query = asked[-1].decode("utf-8", "replace") if asked else None
    try:
        morsel = request.cookies.get(COOKIE)
    except Exception:  # a malformed Cookie header is the client's problem, not a 500
        morsel = None
    cookie = morsel.value if morsel is not None else None
    language = negotiate(query, cookie, request.headers.get("Accept-Language"))
    chosen = canonical(query)
    remember = chosen if chosen is not None and chosen != canonical(cookie) else None
    return language, remember


def language_transform(cookie_path: str | None = "/") -> type[OutputTransform]:
    """An output transform class setting each request's language (`cookie_path`: where a
    `?lang=` choice is remembered, the hub's base URL; None: not remembered, for an API)."""

    class LanguageTransform(OutputTransform):
        def __init__(self, request: HTTPServerRequest) -> None:
            self.language, remember = request_language(request)
            self.remember = remember if cookie_path is not None else None
            set_language(self.language)
            # `?lang=` is this layer's alone: JupyterHub's spawn page takes any other query
            # argument for a user option and tries to start a server with it (a refusal
            # shown above the form, on every change of language there)
            request.query_arguments.pop(QUERY, None)
            request.arguments.pop(QUERY, None)

        def transform_first_chunk(
            self, status_code: int, headers: HTTPHeaders, chunk: bytes, finishing: bool
        ) -> tuple[int, HTTPHeaders, bytes]:
            headers.setdefault("Content-Language", html_lang(self.language))
            if self.remember:
                headers.add(
                    "Set-Cookie",
                    f"{COOKIE}={self.remember}; Path={cookie_path}; Max-Age={COOKIE_MAX_AGE};"
                    " SameSite=Lax",
                )
            return status_code, headers, chunk

    return LanguageTransform
