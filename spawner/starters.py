"""The starter notebooks a new disk begins with, stamped with the server's own kernel.

JupyterLab writes the kernel's `language_info` (its Python version included) and
`kernelspec` into a notebook as soon as the kernel answers; when they differ from what the
file holds, a notebook nobody touched shows as modified. A starter copied into a disk gets
the `language_info` of the Python its server runs, and is written the way Jupyter writes a
notebook (nbformat's sorted keys, one-space indent), so a save changes nothing.

    python -m meterhub.spawner.starters DIR   # stamp DIR/*.ipynb for this Python (images)
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from functools import cache, lru_cache

log = logging.getLogger(__name__)

#: what the server's Python says of itself as a kernel (ipykernel's own language_info)
LANGUAGE_INFO_SCRIPT = (
    "import json; from ipykernel.ipkernel import IPythonKernel;"
    " print(json.dumps(IPythonKernel.language_info))"
)
#: how long asking a Python for its language_info may take, in seconds (an import of
#: ipykernel: about a second)
LANGUAGE_INFO_TIMEOUT_SECONDS = 60


@cache
def kernel_language_info(env_prefix: str) -> dict | None:
    """The `language_info` the kernel of the environment at `env_prefix` reports, or None
    when it cannot say (no ipykernel there): then the starters are copied as they are."""
    python = os.path.join(env_prefix, "bin", "python")
    try:
        out = subprocess.run(
            [python, "-c", LANGUAGE_INFO_SCRIPT],
            capture_output=True,
            text=True,
            timeout=LANGUAGE_INFO_TIMEOUT_SECONDS,
            check=True,
        )
        info = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        log.warning("No kernel language_info from %s (%s): starters copied unstamped", python, e)
        return None
    return info if isinstance(info, dict) else None


def stamp(text: str, language_info: dict | None) -> str:
    """The notebook `text` with the kernel's `language_info` (None: as it is), written as
    Jupyter writes notebooks."""
    notebook = json.loads(text)
    if language_info is not None:
        notebook.setdefault("metadata", {})["language_info"] = language_info
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _key(language_info: dict | None) -> str | None:
    return None if language_info is None else json.dumps(language_info, sort_keys=True)


@lru_cache(maxsize=64)
def _stamped(path: str, version: tuple[int, ...], language_info: str | None) -> str:
    """`stamp` of the notebook at `path`, once per version of the file (inode, size, mtime
    and ctime: a copy that keeps the mtime still changes the ctime), not for each new disk
    of a burst of first starts."""
    with open(path, encoding="utf-8") as f:
        return stamp(f.read(), None if language_info is None else json.loads(language_info))


def copy_starters(source_dir: str, target_dir: str, language_info: dict | None) -> list[str]:
    """Copy each notebook of `source_dir` into `target_dir`, stamped; the paths written."""
    written = []
    for name in sorted(os.listdir(source_dir)):
        if not name.endswith(".ipynb"):
            continue
        source = os.path.join(source_dir, name)
        st = os.stat(source)
        version = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        text = _stamped(source, version, _key(language_info))
        target = os.path.join(target_dir, name)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    """Stamp the notebooks of a folder in place for this Python (an image's build step)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: python -m meterhub.spawner.starters DIR", file=sys.stderr)
        return 2
    from ipykernel.ipkernel import IPythonKernel

    for path in copy_starters(args[0], args[0], dict(IPythonKernel.language_info)):
        print(f"stamped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
