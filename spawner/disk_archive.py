"""A user's disk archived, reset with fresh materials, and restored (the local backend).

An instructor resets a student's environment: the disk is archived first, as a dated
`.tar.gz` outside the disk (only the hub reads it: staff restore it, never open it), then
emptied and given a fresh copy of the course's materials. Restoring archives the current
state too, then puts the archive's files back. The server must be stopped; the hub checks.
All functions are blocking: call them off the event loop.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import tarfile

#: an archive's file name: when, then what for
ARCHIVE_NAME = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[a-z0-9._-]{1,80}\.tar\.gz\Z")


class ArchiveError(RuntimeError):
    """An archive that cannot be made or restored; the message is for people."""


def archive_disk(disk: str, archive_dir: str, label: str, now: datetime.datetime) -> str:
    """Archive `disk`'s contents to `archive_dir` (made 0700) as STAMP-LABEL.tar.gz;
    returns the archive's name. Symlinks are archived as links, never followed."""
    label = re.sub(r"[^a-z0-9._-]+", "-", label.lower())[:80].strip("-") or "archive"
    os.makedirs(archive_dir, mode=0o700, exist_ok=True)
    os.chmod(archive_dir, 0o700)
    name = f"{now:%Y%m%dT%H%M%S}Z-{label}.tar.gz"
    path = os.path.join(archive_dir, name)
    if os.path.exists(path):
        raise ArchiveError(f"an archive named {name} exists already; try again in a second")
    partial = path + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        if os.path.isdir(disk):
            for entry in sorted(os.listdir(disk)):
                tar.add(os.path.join(disk, entry), arcname=entry, recursive=True)
    os.replace(partial, path)
    return name


def archives(archive_dir: str) -> list[str]:
    """The archives of one disk, newest first."""
    if not os.path.isdir(archive_dir):
        return []
    return sorted((n for n in os.listdir(archive_dir) if ARCHIVE_NAME.match(n)), reverse=True)


def empty_disk(disk: str) -> None:
    """Remove everything on the disk, keeping the disk itself (its owner and mode)."""
    for entry in os.listdir(disk):
        path = os.path.join(disk, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def copy_materials(source: str, target: str, run_as: tuple[int, int] | None) -> int:
    """Copy a course's materials folder to `target` on the disk, owned by the disk's user;
    symlinks in the materials are skipped, never followed. Returns the files copied."""
    copied = 0
    for root, dirs, files in os.walk(source, followlinks=False):
        relative = os.path.relpath(root, source)
        here = os.path.normpath(os.path.join(target, relative))
        os.makedirs(here, exist_ok=True)
        _own(here, run_as)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in files:
            origin = os.path.join(root, name)
            if os.path.islink(origin) or not os.path.isfile(origin):
                continue
            copy = os.path.join(here, name)
            shutil.copyfile(origin, copy)
            os.chmod(copy, 0o644)
            _own(copy, run_as)
            copied += 1
    return copied


def _inside(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, skipping (not failing on) what it refuses: absolute paths,
    `..`, device files, and links that leave the disk (the disk's `public` link to the pool
    is one; the server makes it again at its next start)."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        return None


def restore_disk(disk: str, archive_path: str, run_as: tuple[int, int] | None) -> None:
    """Put an archive's files back on the (emptied) disk, owned by the disk's user; what
    would land outside the disk is skipped."""
    empty_disk(disk)
    try:
        with tarfile.open(archive_path, mode="r:gz") as tar:
            tar.extractall(disk, filter=_inside)
    except (tarfile.TarError, OSError) as e:
        raise ArchiveError(f"cannot restore {os.path.basename(archive_path)}: {e}") from None
    for root, dirs, files in os.walk(disk):
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            if run_as is not None:
                os.lchown(path, *run_as)


def _own(path: str, run_as: tuple[int, int] | None) -> None:
    if run_as is not None:
        os.lchown(path, *run_as)
