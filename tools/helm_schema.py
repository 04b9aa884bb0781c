"""Generate the Helm chart's values.schema.json and docs/helm-values.md from values.schema.yaml.

    .venv/bin/python -m tools.generate   (writes every generated file)

`site` in the chart's values is the site config, so its schema is hub/site-schema.yaml itself,
filled in here: one source for both.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from meterhub.hub.config import SCHEMA as SITE_SCHEMA

from . import config_docs

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "meterhub"
VALUES_SCHEMA = CHART / "values.schema.yaml"
VALUES_SCHEMA_JSON = CHART / "values.schema.json"
VALUES_DOCS = ROOT / "docs" / "helm-values.md"

DOCS_HEADER = """# Helm chart values

<!-- Generated from helm/meterhub/values.schema.yaml by `python -m tools.generate`. -->

The chart in `helm/meterhub` validates its values against `values.schema.json`; a value
outside the schema stops `helm install` with the key it concerns. `site` is the meterhub site
config ([configuration.md](configuration.md)); `jupyterhub` holds the values of the
zero-to-jupyterhub chart. See [kubernetes.md](kubernetes.md) for the installation.

| key | type | default | description |
| --- | --- | --- | --- |
"""


def values_schema() -> dict:
    schema = yaml.safe_load(VALUES_SCHEMA.read_text())
    site = copy.deepcopy(SITE_SCHEMA)
    site.pop("$schema", None)
    definitions = schema.setdefault("definitions", {})
    for name, definition in site.pop("definitions", {}).items():
        if name in definitions:
            raise ValueError(f"definition {name!r} is in both schemas")
        definitions[name] = definition
    definitions["site"] = site
    return schema


def render_json() -> str:
    return json.dumps(values_schema(), indent=2, ensure_ascii=False) + "\n"


def _with_defaults(schema: dict, values) -> dict:
    """The schema with each scalar (or list of scalars) default of values.yaml shown."""
    schema = dict(schema)
    if isinstance(values, dict) and "properties" in schema:
        schema["properties"] = {
            key: _with_defaults(sub, values.get(key)) for key, sub in schema["properties"].items()
        }
    elif values is not None and not isinstance(values, dict):
        if not isinstance(values, list) or all(not isinstance(v, (dict, list)) for v in values):
            schema.setdefault("default", values)
    return schema


def render_docs() -> str:
    schema = yaml.safe_load(VALUES_SCHEMA.read_text())
    # `site` is the site config, documented in configuration.md: one row here
    schema["properties"]["site"] = {
        "type": "object",
        "description": schema["properties"]["site"]["description"],
    }
    schema = _with_defaults(schema, yaml.safe_load((CHART / "values.yaml").read_text()))
    return DOCS_HEADER + "\n".join(config_docs.rows(schema, definitions={})) + "\n"
