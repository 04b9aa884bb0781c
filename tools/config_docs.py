"""Generate docs/configuration.md from the site-config schema (the single source).

.venv/bin/python -m tools.generate   (writes every generated file)
"""

from __future__ import annotations

import json

from meterhub.hub.config import SCHEMA

HEADER = """# Site configuration reference

<!-- Generated from hub/site-schema.yaml by `python -m tools.generate`; a test keeps it in step. -->

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


def _resolve(schema: dict, definitions: dict) -> dict:
    if "$ref" in schema:
        return definitions[schema["$ref"].split("/")[-1]]
    return schema


def _type(schema: dict, definitions: dict) -> str:
    if "$ref" in schema:
        return _type(_resolve(schema, definitions), definitions)
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "oneOf" in schema:
        return " or ".join(_type(s, definitions) for s in schema["oneOf"])
    kind = schema.get("type", "")
    if kind == "array" and "items" in schema:
        return f"list of {_type(schema['items'], definitions)}"
    return kind


def rows(schema: dict, prefix: str = "", definitions: dict | None = None):
    """Markdown table rows, one per key, nested keys as dotted paths."""
    definitions = SCHEMA["definitions"] if definitions is None else definitions
    for key, sub in schema.get("properties", {}).items():
        name = f"{prefix}{key}"
        resolved = _resolve(sub, definitions)
        default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
        description = " ".join(sub.get("description", resolved.get("description", "")).split())
        yield f"| `{name}` | {_type(sub, definitions)} | {default} | {description} |"
        if resolved.get("type") == "object" and "properties" in resolved:
            yield from rows(resolved, f"{name}.", definitions)
        items = resolved.get("items", {})
        if items.get("type") == "object":
            yield from rows(items, f"{name}[].", definitions)


def render() -> str:
    return HEADER + "\n".join(rows(SCHEMA)) + "\n"


if __name__ == "__main__":
    print(render(), end="")
