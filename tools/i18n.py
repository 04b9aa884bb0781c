"""The translation catalogs: extract what a person reads, keep the `.po` files in step.

    .venv/bin/python -m tools.i18n            # add new strings to the .po files, drop gone ones
    .venv/bin/python -m tools.i18n --check    # only say what is missing or stale

Two catalogs, one per environment:

- `i18n/zh_CN/LC_MESSAGES/meterhub.po`: the hub side — `_()`, `ngettext()` and `N_()` in
  hub/, spawner/ and billing_hooks/, and `{{ _("…") }}` in their Jinja templates (Babel's
  extractors).
- `extensions/locale/zh_CN/LC_MESSAGES/meterhub.po`: the JupyterLab extension — `trans.__()`
  and `trans._n()` in extensions/labextension/src (JupyterLab's translation API, `%1`
  placeholders); `tools.generate` compiles it to the `.json` JupyterLab loads.

A new string lands in the `.po` with an empty translation; tests/test_i18n.py fails until it
is translated.
"""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
HUB_PO = ROOT / "i18n" / "zh_CN" / "LC_MESSAGES" / "meterhub.po"
LAB_SRC = ROOT / "extensions" / "labextension" / "src"
LAB_PO = ROOT / "extensions" / "locale" / "zh_CN" / "LC_MESSAGES" / "meterhub.po"
LAB_JSON = LAB_PO.with_suffix(".json")
LANGUAGE = "zh_CN"
DOMAIN = "meterhub"

#: where the hub side's strings are: (folder, Babel method map)
HUB_SOURCES = {
    "hub": [("**.py", "python"), ("templates/**.html", "jinja2")],
    "spawner": [("**.py", "python"), ("**.html", "jinja2")],
    "billing_hooks": [("**.py", "python")],
}
JINJA_OPTIONS = {"extensions": "jinja2.ext.i18n", "trim_blocks": "true", "lstrip_blocks": "true"}
KEYWORDS = {"_": None, "gettext": None, "ngettext": (1, 2), "N_": None}

#: trans.__('…') and trans._n('…', '…', n) in the extension's TypeScript (one string literal
#: each, as JupyterLab's own extraction requires)
_LITERAL = r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
_TS_SINGULAR = re.compile(r"\.__\(\s*" + _LITERAL)
_TS_PLURAL = re.compile(r"\._n\(\s*" + _LITERAL + r"\s*,\s*" + _LITERAL)


#: the catalogs' header dates, fixed: a date that moves on every run would make the files
#: differ from themselves (git has the history)
FIXED_DATE = datetime(2026, 12, 4, tzinfo=UTC)


def _new_catalog() -> Catalog:
    return Catalog(
        locale=LANGUAGE,
        domain=DOMAIN,
        project="meterhub",
        version="0.1",
        charset="utf-8",
        creation_date=FIXED_DATE,
        revision_date=FIXED_DATE,
        last_translator="meterhub",
        language_team="meterhub",
        fuzzy=False,
    )


def extract_hub() -> Catalog:
    """Every string of the hub side, as a template catalog."""
    template = _new_catalog()
    for folder, method_map in HUB_SOURCES.items():
        options = {pattern: JINJA_OPTIONS for pattern, method in method_map if method == "jinja2"}
        for filename, lineno, message, _comments, context in extract_from_dir(
            ROOT / folder, method_map, options, keywords=KEYWORDS
        ):
            if isinstance(message, tuple) and len(message) == 1:
                message = message[0]
            if not message or (isinstance(message, tuple) and not all(message)):
                continue
            template.add(message, locations=[(f"{folder}/{filename}", lineno)], context=context)
    return template


def _ts_string(literal: str) -> str:
    # the literals are plain JavaScript strings: JSON reads the double-quoted ones
    body = literal[1:-1]
    if literal[0] == "'":
        body = body.replace('\\"', '"').replace('"', '\\"').replace("\\'", "'")
    return json.loads(f'"{body}"')


def extract_lab() -> Catalog:
    """Every string of the JupyterLab extension, as a template catalog."""
    template = _new_catalog()
    for path in sorted(LAB_SRC.rglob("*.ts")):
        if "__tests__" in path.parts:
            continue
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        for match in _TS_SINGULAR.finditer(text):
            lineno = text.count("\n", 0, match.start()) + 1
            template.add(_ts_string(match.group(1)), locations=[(where, lineno)])
        for match in _TS_PLURAL.finditer(text):
            lineno = text.count("\n", 0, match.start()) + 1
            message = (_ts_string(match.group(1)), _ts_string(match.group(2)))
            template.add(message, locations=[(where, lineno)])
    return template


def read(path: Path) -> Catalog:
    if not path.exists():
        return _new_catalog()
    with open(path, "rb") as f:
        return read_po(f, locale=LANGUAGE, domain=DOMAIN)


def render(catalog: Catalog) -> str:
    buffer = io.BytesIO()
    # file names without line numbers: a moved line is not a change of the catalog
    write_po(
        buffer, catalog, width=100, include_lineno=False, ignore_obsolete=True, sort_output=True
    )
    return buffer.getvalue().decode("utf-8")


def updated(path: Path, template: Catalog) -> Catalog:
    """The `.po` at `path` with the template's strings: new ones untranslated, gone ones
    dropped, translations kept."""
    catalog = read(path)
    catalog.update(template, no_fuzzy_matching=True, update_header_comment=False)
    catalog.creation_date = catalog.revision_date = FIXED_DATE
    catalog.fuzzy = False
    catalog.last_translator = catalog.language_team = "meterhub"
    catalog.header_comment = "# Simplified Chinese for meterhub. Edit the msgstr lines only;\n"
    catalog.header_comment += "# `.venv/bin/python -m tools.i18n` adds and removes the msgids.\n"
    return catalog


def catalogs() -> dict[Path, Catalog]:
    return {HUB_PO: updated(HUB_PO, extract_hub()), LAB_PO: updated(LAB_PO, extract_lab())}


def untranslated(catalog: Catalog) -> list[str]:
    """The msgids of `catalog` with no translation (or only a fuzzy one)."""
    missing = []
    for message in catalog:
        if not message.id:
            continue
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        if message.fuzzy or not all(strings):
            missing.append(message.id if isinstance(message.id, str) else message.id[0])
    return missing


def lab_json(po: Catalog) -> str:
    """The catalog JupyterLab's translation API loads (the format of its language packs)."""
    data: dict[str, object] = {
        "": {
            "domain": DOMAIN,
            "language": LANGUAGE.replace("_", "-"),
            "plural_forms": po.plural_forms,
            "version": DOMAIN,
        }
    }
    for message in po:
        if not message.id or message.fuzzy:
            continue
        msgid = message.id if isinstance(message.id, str) else message.id[0]
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        if all(strings):
            data[msgid] = list(strings)
    return json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    status = 0
    for path, catalog in catalogs().items():
        text = render(catalog)
        name = path.relative_to(ROOT)
        if not path.exists() or path.read_text() != text:
            if check:
                print(f"stale: {name} (run: .venv/bin/python -m tools.i18n)")
                status = 1
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"wrote {name}")
        missing = untranslated(catalog)
        if missing:
            print(f"{name}: {len(missing)} string(s) to translate, the first: {missing[0]!r}")
            status = 1 if check else status
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
