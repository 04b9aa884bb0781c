"""English and Simplified Chinese: choosing the language, and catalogs with nothing missing.

The pages in Chinese, in Chromium, are tests/test_pages_zh.py.
"""

from __future__ import annotations

import re

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from meterhub import i18n
from meterhub.billing_hooks.money import format_duration, format_money
from meterhub.i18n.web import language_transform, request_language
from tools import i18n as catalogs


@pytest.mark.parametrize(
    "tag, language",
    [
        ("zh", "zh_CN"),
        ("zh-CN", "zh_CN"),
        ("zh_cn", "zh_CN"),
        ("zh-Hans", "zh_CN"),
        ("zh-Hans-CN", "zh_CN"),
        ("ZH-SG", "zh_CN"),
        ("en", "en"),
        ("en-GB", "en"),
        ("zh-TW", None),
        ("zh-Hant", None),
        ("zh-HK", None),
        ("fr", None),
        ("", None),
        ("-", None),
    ],
)
def test_tags_name_meterhubs_languages(tag, language):
    assert i18n.canonical(tag) == language


@pytest.mark.parametrize(
    "header, language",
    [
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh_CN"),
        ("en-US,en;q=0.9,zh-CN;q=0.8", "en"),
        ("fr-FR, zh;q=0.5", "zh_CN"),
        ("zh-TW, en;q=0.1", "en"),
        ("en;q=0.1, zh;q=0.9", "zh_CN"),
        ("zh;q=0, en", "en"),
        ("zh;q=bogus, en;q=0.5", "en"),
        ("de", "en"),
        (None, "en"),
        ("zh-" + "x" * 10_000, "zh_CN"),
    ],
)
def test_the_browser_language_is_the_first_meterhub_speaks(header, language):
    assert i18n.negotiate(accept_language=header) == language


def test_a_chosen_language_wins_over_the_cookie_and_the_cookie_over_the_browser():
    assert i18n.negotiate("en", "zh_CN", "zh-CN") == "en"
    assert i18n.negotiate(None, "zh_CN", "en") == "zh_CN"
    assert i18n.negotiate("klingon", "bogus", "zh") == "zh_CN"


@pytest.mark.parametrize(
    "environ, language",
    [
        ({"LANG": "zh_CN.UTF-8"}, "zh_CN"),
        ({"LANG": "en_US.UTF-8", "LC_ALL": "zh_CN.UTF-8"}, "zh_CN"),
        ({"LANGUAGE": "fr:zh_CN", "LANG": "fr_FR.UTF-8"}, "zh_CN"),
        ({"LC_ALL": "C", "LANG": "zh_CN.UTF-8"}, "en"),
        ({"LANG": "fr_FR.UTF-8"}, "en"),
        ({}, "en"),
    ],
)
def test_the_cli_speaks_the_environments_language(environ, language):
    assert i18n.environment_language(environ) == language


def _request(uri: str, **headers: str) -> HTTPServerRequest:
    start = RequestStartLine("GET", uri, "HTTP/1.1")
    return HTTPServerRequest(headers=HTTPHeaders(Host="hub", **headers), start_line=start)


def test_a_request_speaks_its_query_then_cookie_then_browser_and_remembers_a_choice():
    assert request_language(_request("/hub/wallet", **{"Accept-Language": "zh"})) == (
        "zh_CN",
        None,
    )
    assert request_language(_request("/hub/wallet?lang=zh-CN")) == ("zh_CN", "zh_CN")
    asked_again = _request("/hub/wallet?lang=zh-CN", Cookie="meterhub-lang=zh_CN")
    assert request_language(asked_again) == ("zh_CN", None)
    assert request_language(_request("/hub/wallet", Cookie="meterhub-lang=zh_CN")) == (
        "zh_CN",
        None,
    )
    # a malformed cookie header or an unknown choice is English, never an error
    assert request_language(_request("/hub/wallet?lang=xx", Cookie='a="')) == ("en", None)


def test_the_transform_sets_the_language_and_the_cookie_and_says_content_language():
    transform_class = language_transform("/")
    with i18n.using("en"):
        transform = transform_class(_request("/hub/home?lang=zh"))
        assert i18n.language() == "zh_CN"
        headers = HTTPHeaders()
        transform.transform_first_chunk(200, headers, b"", True)
        assert headers["Content-Language"] == "zh-CN"
        cookie = headers["Set-Cookie"]
        assert cookie.startswith("meterhub-lang=zh_CN;") and "SameSite=Lax" in cookie
        api = language_transform(None)(_request("/services/billing/api/v1/wallet?lang=zh"))
        headers = HTTPHeaders()
        api.transform_first_chunk(200, headers, b"", True)
        assert "Set-Cookie" not in headers
    assert i18n.language() == "en"


def test_the_transform_keeps_lang_from_the_handlers_that_read_query_arguments():
    # JupyterHub's spawn page starts a server from any query argument it is given: the
    # language switch (`?lang=`) on it showed "Unknown profile ''" above the form
    request = _request("/hub/spawn?lang=zh-CN&next=%2Fhub%2Fhome")
    with i18n.using("en"):
        language_transform("/")(request)
        assert i18n.language() == "zh_CN"
    assert "lang" not in request.query_arguments and "lang" not in request.arguments
    assert request.query_arguments == {"next": [b"/hub/home"]}


def test_money_groups_thousands_for_people_and_not_for_scripts():
    assert format_money(1_234_500_000) == "¥1,234.50"
    assert format_money(-1_234_500_000) == "-¥1,234.50"
    assert format_money(1_234_500_000, symbol=False) == "1234.50 CNY"
    with i18n.using("zh_CN"):
        assert format_money(1_234_500_000) == "¥1,234.50"


def test_durations_read_naturally_in_both_languages():
    assert format_duration(2 * 3600 + 15 * 60) == "2 h 15 min"
    with i18n.using("zh_CN"):
        assert format_duration(2 * 3600 + 15 * 60) == "2 小时 15 分钟"
        assert format_duration(3600) == "1 小时"
        assert format_duration(12 * 60) == "12 分钟"
        assert format_duration(45) == "45 秒"


def test_what_is_said_for_later_is_kept_in_every_language():
    said = i18n.in_every_language(lambda: format_duration(90))
    assert said == {"en": "1 min", "zh_CN": "1 分钟"}
    assert i18n.pick({"zh_CN": "一"}, "one", "zh_CN") == "一"
    assert i18n.pick({"zh_CN": "一"}, "one", "en") == "one"
    assert i18n.pick(None, "one", "zh_CN") == "one"


@pytest.mark.parametrize("path", [catalogs.HUB_PO, catalogs.LAB_PO], ids=["hub", "lab"])
def test_every_string_people_read_is_in_the_catalog_and_translated(path):
    """A string added to the code without running `python -m tools.i18n` fails here, and
    so does one whose translation is still empty."""
    extract = catalogs.extract_hub if path == catalogs.HUB_PO else catalogs.extract_lab
    fresh = catalogs.updated(path, extract())
    assert catalogs.render(fresh) == path.read_text(), (
        f"{path.name} is not up to date with the code: run .venv/bin/python -m tools.i18n"
    )
    missing = catalogs.untranslated(fresh)
    assert not missing, f"{len(missing)} untranslated in {path}, the first: {missing[:5]}"


PLACEHOLDER = re.compile(r"%\([a-z_]+\)s|%\d+|%%")


@pytest.mark.parametrize("path", [catalogs.HUB_PO, catalogs.LAB_PO], ids=["hub", "lab"])
def test_translations_keep_every_placeholder(path):
    for message in catalogs.read(path):
        if not message.id:
            continue
        ids = message.id if isinstance(message.id, tuple) else (message.id,)
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        wanted = sorted(set(PLACEHOLDER.findall(ids[-1])) | set(PLACEHOLDER.findall(ids[0])))
        for string in filter(None, strings):  # an empty one is the test above's to report
            assert sorted(set(PLACEHOLDER.findall(string))) == wanted, (message.id, string)


def test_the_lab_catalog_jupyterlab_loads_is_generated_from_its_po():
    assert catalogs.LAB_JSON.read_text() == catalogs.lab_json(catalogs.read(catalogs.LAB_PO))


def _binds_underscore(tree) -> list[int]:
    """Lines where a function (or the module) binds the name `_` (`a, _, b = ...`,
    `for _ in ...`): in a module that translates with `_`, that shadows it in the whole
    function, and the first `_("...")` there fails. Comprehensions have scopes of their own."""
    import ast

    lines = []

    def visit(node, scoped: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
                continue
            if isinstance(child, ast.Name) and child.id == "_" and isinstance(child.ctx, ast.Store):
                lines.append(child.lineno)
            visit(child, scoped)

    visit(tree, False)
    return lines


def test_no_module_that_translates_shadows_underscore():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for folder in ("hub", "spawner", "billing_hooks", "extensions", "i18n"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            translates = any(
                isinstance(node, ast.ImportFrom)
                and node.module == "meterhub.i18n"
                and any(alias.name == "_" for alias in node.names)
                for node in ast.walk(tree)
            )
            if translates:
                found += [f"{path.relative_to(root)}:{line}" for line in _binds_underscore(tree)]
    assert not found, f"`_` rebound where it translates: {found}"


def test_a_value_may_be_called_message_or_n():
    """The spawn page's "Error: %(message)s" (a 500 once: `_` took `message` as its own)."""
    from meterhub.i18n import _, ngettext

    assert _("Error: %(message)s", message="no") == "Error: no"
    assert ngettext("%(n)s day", "%(n)s days", 2, n=2) == "2 days"
