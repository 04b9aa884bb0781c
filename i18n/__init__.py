"""English and Simplified Chinese: the gettext catalogs and the language of the moment.

Write every string a person reads in English and wrap it where it is made:

- `_("Your server was stopped.")`; with values, named: `_("%(amount)s left", amount=left)`
  (the translation may move them; a `%` of its own is written `%%` when values are given);
- `ngettext("%(n)s student", "%(n)s students", n, n=n)` for plurals;
- `N_("...")` marks a string kept in a constant for extraction; `_(constant)` translates it
  where it is shown;
- in templates (Jinja's i18n extension, installed by the hub): `{{ _("Wallet") }}` and
  `{{ _("%(n)s left", n=...) }}`.

The language is a context variable: the hub and the billing service set it for each request
(`negotiate`: `?lang=`, the `meterhub-lang` cookie, then `Accept-Language`), the CLI from the
environment's `LANGUAGE`, `LC_ALL`, `LC_MESSAGES` or `LANG` (`environment_language`), and code
running for nobody in particular (the meter) writes what it says in every language
(`in_every_language`) so that each reader gets theirs. The catalogs are the `.po` files beside
this module (`meterhub.pot` is extracted by `tools/i18n.py extract`); they are compiled in
memory when first used.
"""

from __future__ import annotations

import contextvars
import gettext as _gettext
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
DOMAIN = "meterhub"
#: the languages meterhub speaks: code → its own name (for the language switch)
LANGUAGES = {"en": "English", "zh_CN": "简体中文"}
DEFAULT = "en"
#: the cookie that remembers a person's choice on the hub's pages
COOKIE = "meterhub-lang"
#: the query argument for links in a language (`?lang=zh-CN`)
QUERY = "lang"
#: the most of an Accept-Language header read (a header is a client's to make up)
MAX_ACCEPT = 512

_language: contextvars.ContextVar[str] = contextvars.ContextVar(
    "meterhub_language", default=DEFAULT
)


def canonical(tag: str | None) -> str | None:
    """The meterhub language a tag names, or None: `zh`, `zh-CN`, `zh_cn`, `zh-Hans`,
    `zh-Hans-CN`, `zh-SG` → `zh_CN`; `en`, `en-US` → `en`. Traditional Chinese (`zh-TW`,
    `zh-HK`, `zh-Hant`) is not Simplified: None."""
    if not tag:
        return None
    parts = re.split(r"[-_]", tag.strip().lower())
    if not parts or not parts[0]:
        return None
    if parts[0] == "en":
        return "en"
    if parts[0] == "zh":
        rest = parts[1:]
        if any(p in ("hant", "tw", "hk", "mo") for p in rest):
            return None
        return "zh_CN"
    return None


def parse_accept_language(header: str | None) -> list[str]:
    """The languages a browser asks for, most wanted first (quality, then order), as
    meterhub languages; unknown ones left out."""
    if not header:
        return []
    ranked = []
    for position, item in enumerate(header[:MAX_ACCEPT].split(",")):
        tag, _sep, params = item.strip().partition(";")
        quality = 1.0
        for param in params.split(";"):
            name, _eq, value = param.strip().partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality <= 0:
            continue
        language = canonical(tag)
        if language is not None:
            ranked.append((-quality, position, language))
    seen: list[str] = []
    for _q, _p, language in sorted(ranked):
        if language not in seen:
            seen.append(language)
    return seen


def negotiate(
    query: str | None = None, cookie: str | None = None, accept_language: str | None = None
) -> str:
    """The language for a request: `?lang=`, else the remembered choice, else the browser's
    first language meterhub speaks, else English."""
    for chosen in (query, cookie):
        language = canonical(chosen)
        if language is not None:
            return language
    wanted = parse_accept_language(accept_language)
    return wanted[0] if wanted else DEFAULT


def environment_language(environ: Mapping[str, str] | None = None) -> str:
    """The CLI's language, as gettext finds it: LANGUAGE (a list), LC_ALL, LC_MESSAGES, LANG."""
    environ = os.environ if environ is None else environ
    for name in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"):
        value = environ.get(name)
        if not value:
            continue
        for tag in value.split(":"):
            tag = tag.split(".")[0].split("@")[0]
            if tag in ("C", "POSIX"):
                return DEFAULT
            language = canonical(tag)
            if language is not None:
                return language
        if name != "LANGUAGE":
            return DEFAULT
    return DEFAULT


def language() -> str:
    """The language of the moment (this request, this CLI run, or `using`)."""
    return _language.get(DEFAULT)


def chosen_language() -> str | None:
    """The language a request, a CLI run or `using` set, or None in code that runs for
    nobody in particular (a periodic task)."""
    return _language.get(None)


def set_language(code: str) -> contextvars.Token:
    if code not in LANGUAGES:
        raise ValueError(f"not a meterhub language: {code!r}")
    return _language.set(code)


@contextmanager
def using(code: str) -> Iterator[None]:
    """Speak `code` inside the block."""
    token = set_language(code)
    try:
        yield
    finally:
        _language.reset(token)


def html_lang(code: str | None = None) -> str:
    """The BCP 47 tag for `<html lang>` and `Content-Language`: `en`, `zh-CN`."""
    return (code or language()).replace("_", "-")


def po_path(code: str) -> Path:
    return HERE / code / "LC_MESSAGES" / f"{DOMAIN}.po"


@cache
def translations(code: str) -> _gettext.NullTranslations:
    """The compiled catalog of `code` (English: none, the strings are English)."""
    if code == DEFAULT:
        return _gettext.NullTranslations()
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    with open(po_path(code), "rb") as f:
        catalog = read_po(f, locale=code)
    buffer = io.BytesIO()
    # fuzzy entries are not translations yet: English shows instead
    write_mo(buffer, catalog, use_fuzzy=False)
    buffer.seek(0)
    return _gettext.GNUTranslations(buffer)


def gettext(message: str) -> str:
    return translations(language()).gettext(message)


def ngettext(singular: str, plural: str, n: int, /, **values: object) -> str:
    text = translations(language()).ngettext(singular, plural, n)
    return text % values if values else text


def _(message: str, /, **values: object) -> str:
    """`message` in the language of the moment, with its named `values` put in."""
    text = gettext(message)
    return text % values if values else text


def N_(message: str) -> str:
    """Mark `message` for extraction only; translate it with `_` where it is shown."""
    return message


def in_every_language(compose: Callable[[], str]) -> dict[str, str]:
    """What `compose` says in each language: for what is read later by someone whose
    language is not known now (notifications)."""
    said = {}
    for code in LANGUAGES:
        with using(code):
            said[code] = compose()
    return said


def pick(texts: Mapping[str, str] | None, fallback: str, code: str | None = None) -> str:
    """The text of `texts` in `code` (default: the language of the moment), else `fallback`."""
    if texts:
        text = texts.get(code or language())
        if text:
            return text
    return fallback
