"""Small private files written whole: a reader sees the old content or the new, never part."""

from __future__ import annotations

import os


def write_private(path: str, text: str, temporary: str, durable: bool = True) -> None:
    """Write `text` to `path` (mode 0600) through `temporary`, renamed into place; `durable`:
    fsync'd before the rename, so that a machine crash leaves the old file or the whole new
    one, never an empty one. The mode is set on the open file: a temporary file an earlier
    crash left with another mode is never written readable. FileNotFoundError when the
    folder is missing."""
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = text.encode()
        while data:  # os.write may write less (a signal, a full disk): the rest again
            data = data[os.write(fd, data) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
