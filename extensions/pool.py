"""The /public pool of models and datasets, the way Python code reaches data: fsspec.

    import fsspec
    fsspec.filesystem("public").ls("models")
    with fsspec.open("public://datasets/tiny-arithmetic/train.jsonl") as f: ...

`public://` is registered through fsspec's entry points (`fsspec.specs`), maps to the pool
(`$METERHUB_PUBLIC_DIR`, which every meterhub server has, else `/public`), and is
read-only: every write raises PermissionError saying where to write instead. The pool's
`catalog.yaml` lists what it holds; `catalog()` reads it and `Catalog` shows it as a table.
"""

from __future__ import annotations

import html
import os

import yaml
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

DEFAULT_ROOT = "/public"
READ_ONLY = (
    "public:// is read-only: the pool is shared by everyone on this hub. Write to your own"
    " disk instead (your home directory, e.g. ~/outputs/)."
)
#: every AbstractFileSystem / AsyncFileSystem method that changes something
WRITES = (
    "mkdir",
    "mkdirs",
    "makedirs",
    "rm",
    "rm_file",
    "rmdir",
    "mv",
    "move",
    "rename",
    "cp",
    "copy",
    "cp_file",
    "put",
    "put_file",
    "upload",
    "pipe",
    "pipe_file",
    "touch",
    "write_text",
    "write_bytes",
    "setxattrs",
    "chmod",
    "symlink",
    "link",
)


def pool_root() -> str:
    return os.environ.get("METERHUB_PUBLIC_DIR") or DEFAULT_ROOT


def _refuse(*_args, **_kwargs):
    raise PermissionError(READ_ONLY)


async def _refuse_async(*_args, **_kwargs):
    raise PermissionError(READ_ONLY)


def _read_only(mode: str) -> str:
    if any(flag in mode for flag in "wax+"):
        raise PermissionError(READ_ONLY)
    return mode


class PublicFileSystem(DirFileSystem):
    """The pool, read-only, with paths relative to its root: `public://models/tiny-llama`."""

    protocol = "public"

    def __init__(self, root: str | None = None, **kwargs):
        kwargs.pop("path", None)
        kwargs.pop("fs", None)
        super().__init__(path=root or pool_root(), fs=LocalFileSystem(), **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("public://"):
            path = path[len("public://") :]
        return path.lstrip("/")

    def _open(self, path, mode="rb", *args, **kwargs):
        return super()._open(path, _read_only(mode), *args, **kwargs)

    def open(self, path, mode="rb", *args, **kwargs):
        return super().open(path, _read_only(mode), *args, **kwargs)

    async def open_async(self, path, mode="rb", **kwargs):
        return await super().open_async(path, _read_only(mode), **kwargs)


for _name in WRITES:
    setattr(PublicFileSystem, _name, _refuse)
    setattr(PublicFileSystem, f"_{_name}", _refuse_async)


def catalog(root: str | None = None) -> dict:
    """The pool's catalog: {"models": [...], "datasets": [...]}, each with name, path,
    size_bytes, licence and description."""
    fs = PublicFileSystem(root)
    if not fs.exists("catalog.yaml"):
        return {"models": [], "datasets": []}
    with fs.open("catalog.yaml", "r") as f:
        data = yaml.safe_load(f) or {}
    return {"models": data.get("models", []), "datasets": data.get("datasets", [])}


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


class Catalog:
    """What the pool holds, shown as a table in a notebook: `Catalog()`."""

    def __init__(self, root: str | None = None):
        self.data = catalog(root)

    def _repr_html_(self) -> str:
        rows = []
        for kind in ("models", "datasets"):
            for item in self.data[kind]:
                rows.append(
                    "<tr>"
                    + "".join(
                        f"<td>{html.escape(str(value))}</td>"
                        for value in (
                            kind[:-1],
                            item.get("name", ""),
                            f"public://{item.get('path', '')}",
                            _size(item.get("size_bytes")),
                            item.get("licence", ""),
                            item.get("description", ""),
                        )
                    )
                    + "</tr>"
                )
        head = "".join(
            f"<th>{h}</th>" for h in ("", "name", "path", "size", "licence", "description")
        )
        body = "".join(rows) or '<tr><td colspan="6">The pool is empty.</td></tr>'
        return f'<table class="meterhub-pool"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def __repr__(self) -> str:
        lines = []
        for kind in ("models", "datasets"):
            for item in self.data[kind]:
                lines.append(
                    f"{kind[:-1]:<8} public://{item.get('path', ''):<40}"
                    f" {_size(item.get('size_bytes')):>9}  {item.get('licence', '')}"
                )
        return "\n".join(lines) or "The pool is empty."
