"""Regenerate every generated file from its one source; `--check` only says which are stale.

    .venv/bin/python -m tools.generate [--check]

- docs/configuration.md from hub/site-schema.yaml
- helm/meterhub/values.schema.json and docs/helm-values.md from helm/meterhub/values.schema.yaml
  (with the site schema filled in)
- extensions/locale/zh_CN/LC_MESSAGES/meterhub.json (what JupyterLab loads) from its .po

pre-commit runs it (a local hook) whenever a source changes; tests fail if a file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import config_docs, helm_schema, i18n

ROOT = Path(__file__).resolve().parent.parent


def outputs() -> dict[Path, str]:
    return {
        ROOT / "docs" / "configuration.md": config_docs.render(),
        helm_schema.VALUES_SCHEMA_JSON: helm_schema.render_json(),
        helm_schema.VALUES_DOCS: helm_schema.render_docs(),
        i18n.LAB_JSON: i18n.lab_json(i18n.read(i18n.LAB_PO)),
    }


def main(argv: list[str]) -> int:
    stale = [
        path for path, text in outputs().items() if not path.exists() or path.read_text() != text
    ]
    if "--check" in argv:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run: .venv/bin/python -m tools.generate)")
        return 1 if stale else 0
    for path, text in outputs().items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
