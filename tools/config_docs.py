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

## GPU types

The built-in GPU types are `rtx4090` (RTX 4090), `a800` (A800) and `h800` (H800). A site adds
its own, or overrides fields of a built-in one, under `gpu_types`; profiles, the spawn page,
`meterhub render-k8s`, billing, GPU detection (NVML product names) and the Kubernetes node
selectors all follow, with no code change:

```yaml
gpu_types:
  l40s:                           # a new type: its slug names it everywhere
    display_name: L40S
    vram_gb: 48
    price_per_hour: "3.20"        # per GPU-hour; profiles.l40s.price_per_hour may override it
    cpu_per_gpu: 16
    memory_gib_per_gpu: 96
    product_patterns: [l40s]      # matched in NVML product names ("NVIDIA L40S")
    node_product: NVIDIA-L40S     # the nvidia.com/gpu.product node label on Kubernetes
  h800: {display_name: H800 NVLink, price_per_hour: "6.00"}   # a built-in, overridden
gpus:
  - {type: l40s, count: 4}
```

## jupyterhub_config.d: the escape hatch

Anything the site config has no key for is set in Python, as in any JupyterHub: every
`*.py` file in a folder `jupyterhub_config.d/` beside the site config file runs when
`meterhub serve` starts, in sorted file-name order, with the traitlets config `c` in scope,
after meterhub's own config (so it wins). Change meterhub's values in place rather than
replace them, e.g. `c.JupyterHub.template_vars["announcement"] = "..."`. An error stops the
start with the file and the line. The files are the hub's only: the billing service reads
the site config alone, so prices and GPU types belong in the site config.

```python
# jupyterhub_config.d/50-timeouts.py
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 120
```

## Keys

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


#: how the reference names the keys of a mapping whose keys are a site's own
PLACEHOLDERS = {
    "gpu_types": "<slug>",
    "profiles": "<gpu type>",
    "node_products": "<gpu type>",
    "pass_capacity": "<gpu type>",
}


def rows(schema: dict, prefix: str = "", definitions: dict | None = None):
    """Markdown table rows, one per key, nested keys as dotted paths; the keys of a mapping
    of a site's own names (GPU types) as a placeholder."""
    definitions = SCHEMA["definitions"] if definitions is None else definitions
    properties = dict(schema.get("properties", {}))
    parent = prefix.rstrip(".").rsplit(".", 1)[-1]
    if parent in PLACEHOLDERS and isinstance(schema.get("additionalProperties"), dict):
        properties[PLACEHOLDERS[parent]] = schema["additionalProperties"]
    for key, sub in properties.items():
        name = f"{prefix}{key}"
        resolved = _resolve(sub, definitions)
        default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
        description = " ".join(sub.get("description", resolved.get("description", "")).split())
        yield f"| `{name}` | {_type(sub, definitions)} | {default} | {description} |"
        if resolved.get("type") == "object" and ("properties" in resolved or key in PLACEHOLDERS):
            yield from rows(resolved, f"{name}.", definitions)
        items = resolved.get("items", {})
        if items.get("type") == "object":
            yield from rows(items, f"{name}[].", definitions)


def render() -> str:
    return HEADER + "\n".join(rows(SCHEMA)) + "\n"


if __name__ == "__main__":
    print(render(), end="")
