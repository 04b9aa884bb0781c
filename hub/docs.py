"""Generate docs/configuration.md from the site-config schema (the single source).

.venv/bin/python -m hub.docs > docs/configuration.md
"""

from __future__ import annotations

import json

from .config import SCHEMA

HEADER = """# Site configuration reference

<!-- Generated from hub/site-schema.yaml by `python -m hub.docs`; a test keeps it in step. -->

meterhub reads one YAML file, `meterhub serve --config FILE`. Without a file it runs the
embedded default: SQLite under `./meterhub-data`, the local backend, a generated demo pool
and an `admin` account. Every key is optional. Unknown keys and wrong types are errors that
name the key; nothing is written until the file is valid.

```yaml
# a lab's own 8-GPU box
data_dir: /srv/meterhub
public_dir: /srv/pool
gpus:
  - {type: a800, count: 4}
  - {type: rtx4090, count: 4}
profiles:
  a800: {price_per_hour: 4.20}
local:
  sandbox: bwrap
```

| key | type | default | description |
| --- | --- | --- | --- |
"""


def _resolve(schema: dict) -> dict:
    if "$ref" in schema:
        return SCHEMA["definitions"][schema["$ref"].split("/")[-1]]
    return schema


def _type(schema: dict) -> str:
    if "$ref" in schema:
        return _type(_resolve(schema))
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "oneOf" in schema:
        return " or ".join(_type(s) for s in schema["oneOf"])
    kind = schema.get("type", "")
    if kind == "array" and "items" in schema:
        return f"list of {_type(schema['items'])}"
    return kind


def _rows(schema: dict, prefix: str = ""):
    for key, sub in schema.get("properties", {}).items():
        name = f"{prefix}{key}"
        resolved = _resolve(sub)
        default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
        description = " ".join(sub.get("description", resolved.get("description", "")).split())
        yield f"| `{name}` | {_type(sub)} | {default} | {description} |"
        if resolved.get("type") == "object" and "properties" in resolved:
            yield from _rows(resolved, f"{name}.")
        items = resolved.get("items", {})
        if items.get("type") == "object":
            yield from _rows(items, f"{name}[].")


def render() -> str:
    return HEADER + "\n".join(_rows(SCHEMA)) + "\n"


if __name__ == "__main__":
    print(render(), end="")
