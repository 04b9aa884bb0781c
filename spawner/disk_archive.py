"""A user's disk archived and restored (the local backend): by instructors, and when idle.

An instructor resets a student's environment: the disk is archived first, as a dated
`.tar.gz` outside the disk (only the hub reads it: staff restore it, never open it), then
emptied and given a fresh copy of the course's materials. Restoring archives the current
state too, then puts the archive's files back. The server must be stopped; the hub checks.

A disk nobody has used for `disks.archive_after_days` is archived whole (`archive_idle`):
a checksummed `STAMP-idle.tar.gz` beside the others, then the disk is emptied and a marker
in the hub's data (never on the disk, where its user could forge it) says where its files
are; the next start puts them back (`restore_idle`) after checking the checksum. Disks are
never deleted here. All functions are blocking: call them off the event loop.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import threading
import time

from meterhub.i18n import _

from .files import write_private

#: an archive's file name: when, then what for
ARCHIVE_NAME = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[a-z0-9._-]{1,80}\.tar\.gz\Z")


#: an idle archive's label, and the marker of an archived disk in its archive folder
IDLE_LABEL = "idle"
MARKER = "archived.json"
#: where the per-disk lock files live, below <data_dir> (a name no user's folder has)
LOCKS_DIR = os.path.join("run", "disk-locks.d")
#: how long a disk's measured size is reused (pages must not walk a big disk each load)
SIZE_CACHE_SECONDS = 60
CHUNK = 1024 * 1024


class ArchiveError(RuntimeError):
    """An archive that cannot be made or restored; the message is for people."""


def utcnow() -> datetime.datetime:
    """Now, in UTC: the one clock of idle archiving (tests move it)."""
    return datetime.datetime.now(datetime.UTC)


def archive_dir(data_dir: str, disk_name: str) -> str:
    """Where the archives of the disk folder `disk_name` are kept:
    `<data_dir>/archives/<disk folder>` (0700, the hub's alone)."""
    return os.path.join(data_dir, "archives", disk_name)


def archive_disk(disk: str, archive_dir: str, label: str, now: datetime.datetime) -> str:
    """Archive `disk`'s contents to `archive_dir` (made 0700) as STAMP-LABEL.tar.gz;
    returns the archive's name. Symlinks are archived as links, never followed; a missing
    disk makes an empty archive."""
    label = re.sub(r"[^a-z0-9._-]+", "-", label.lower())[:80].strip("-") or "archive"
    os.makedirs(archive_dir, mode=0o700, exist_ok=True)
    os.chmod(archive_dir, 0o700)
    name = f"{now:%Y%m%dT%H%M%S}Z-{label}.tar.gz"
    path = os.path.join(archive_dir, name)
    if os.path.exists(path):
        raise ArchiveError(
            _("an archive named %(name)s exists already; try again in a second", name=name)
        )
    _write_tar(disk, path)
    return name


def archives(archive_dir: str) -> list[str]:
    """The archives of one disk, newest first."""
    if not os.path.isdir(archive_dir):
        return []
    return sorted((n for n in os.listdir(archive_dir) if ARCHIVE_NAME.match(n)), reverse=True)


def empty_disk(disk: str) -> None:
    """Remove everything on the disk, keeping the disk itself (its owner and mode). Folders
    its user made read-only are made writable first (a hub that is not root needs that).
    Without recursion (shutil.rmtree's ends in a RecursionError a thousand folders deep):
    the deepest entries first."""
    entries = list(_walk(disk, make_readable=True))
    for relative in reversed(entries):
        path = os.path.join(disk, relative)
        if os.path.isdir(path) and not os.path.islink(path):
            try:
                os.rmdir(path)
            except PermissionError:
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
                os.rmdir(path)
            continue
        try:
            os.unlink(path)
        except PermissionError:
            parent = os.path.dirname(path)
            os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
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
    would land outside the disk is skipped. An archive with a checksum beside it (an idle
    archive) is checked first and refused, untouched, when it does not match."""
    if os.path.exists(checksum_path(archive_path)):
        verify_checksum(archive_path, read_checksum(archive_path))
    empty_disk(disk)
    try:
        with tarfile.open(archive_path, mode="r:gz") as tar:
            tar.extractall(disk, filter=_inside)
    except (tarfile.TarError, OSError) as e:
        raise ArchiveError(
            _(
                "cannot restore %(archive)s: %(error)s",
                archive=os.path.basename(archive_path),
                error=e,
            )
        ) from None
    if run_as is None:
        return
    for relative in _walk(disk):  # not os.walk: it recurses (a deep disk ends it)
        os.lchown(os.path.join(disk, relative), *run_as)


def _own(path: str, run_as: tuple[int, int] | None) -> None:
    if run_as is not None:
        os.lchown(path, *run_as)


# ---------------------------------------------------------------------- idle archives


@dataclasses.dataclass(frozen=True)
class Archived:
    """The marker of an archived disk: where its files are and how to check them."""

    archive: str  # the archive's file name in the disk's archive folder
    sha256: str  # of the archive file, hex
    bytes: int  # the archive file's size
    disk_bytes: int  # what its files held, uncompressed
    archived_at: str  # ISO 8601, UTC

    @property
    def day(self) -> str:
        return self.archived_at[:10]

    @classmethod
    def from_json(cls, text: str) -> Archived:
        data = json.loads(text)
        fields = {f.name: data[f.name] for f in dataclasses.fields(cls)}
        marker = cls(**fields)
        if not (
            ARCHIVE_NAME.match(marker.archive)
            and re.fullmatch(r"[0-9a-f]{64}", marker.sha256)
            and isinstance(marker.bytes, int)
            and isinstance(marker.disk_bytes, int)
            and datetime.datetime.fromisoformat(marker.archived_at)
        ):
            raise ValueError("a field has an unexpected value")
        return marker


def archived(folder: str) -> Archived | None:
    """The marker of the disk whose archive folder is `folder`; None when it is not
    archived. A marker that cannot be read is an ArchiveError, never "not archived": a
    server must not start on the empty disk."""
    path = os.path.join(folder, MARKER)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ArchiveError(
            _("cannot read the archive marker %(path)s: %(error)s", path=path, error=e.strerror)
        ) from None
    try:
        return Archived.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise ArchiveError(
            _(
                "the archive marker %(path)s is damaged (%(error)s); see docs/idle.md",
                path=path,
                error=e,
            )
        ) from None


def checksum_path(archive_path: str) -> str:
    """The checksum file beside an archive, in `sha256sum` format (`sha256sum -c` reads it)."""
    return archive_path + ".sha256"


def read_checksum(archive_path: str) -> str:
    try:
        with open(checksum_path(archive_path)) as f:
            words = f.read(200).split()
    except OSError as e:
        raise ArchiveError(
            _(
                "cannot read the checksum of %(archive)s: %(error)s",
                archive=archive_path,
                error=e.strerror,
            )
        ) from None
    return words[0] if words else ""


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksum(archive_path: str, expected: str) -> None:
    """Refuse an archive whose bytes are not those that were archived."""
    try:
        found = file_sha256(archive_path)
    except OSError as e:
        raise ArchiveError(
            _("cannot read %(archive)s: %(error)s", archive=archive_path, error=e.strerror)
        ) from None
    if found != expected:
        raise ArchiveError(
            _(
                "the archive %(archive)s does not match its checksum (expected %(expected)s…,"
                " found %(found)s…): it is damaged, and nothing was restored; it is kept in"
                " %(folder)s",
                archive=os.path.basename(archive_path),
                expected=expected[:12],
                found=found[:12],
                folder=os.path.dirname(archive_path),
            )
        )


class _HashingReader:
    """A file read once, front to back, hashing what passes."""

    def __init__(self, raw):
        self.raw, self.digest = raw, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        return data


def _write_durably(path: str, text: str) -> None:
    """Write `path` (0600) through `.partial`, fsync'd, then renamed into place."""
    write_private(path, text, path + ".partial")
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class _Written:
    """What `_write_tar` put in an archive."""

    entries: int
    disk_bytes: int  # the regular files' sizes, uncompressed
    sha256: str  # of the archive file, hex


def _write_tar(disk: str, path: str) -> _Written:
    """Write the archive `path` (0600) of everything below `disk` through `path.partial`:
    fsync'd, read back (every entry there) and checksummed before it is renamed into place.
    Links are archived as links, never followed; modes and owners are kept; sockets, pipes
    and device files hold no data and are left out. The disk is walked here, not by
    tarfile's recursion: a disk nested a thousand folders deep would end it in a
    RecursionError. A failure removes the partial file and is an ArchiveError."""
    partial = path + ".partial"
    added, disk_bytes = 0, 0

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal added, disk_bytes
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            return None
        added += 1
        disk_bytes += member.size if member.isreg() else 0
        return member

    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                for relative in _walk(disk) if os.path.isdir(disk) else ():
                    tar.add(
                        os.path.join(disk, relative), arcname=relative, recursive=False, filter=keep
                    )
            raw.flush()
            os.fsync(raw.fileno())
        # read back before anything is removed: every member there, and the checksum of
        # the bytes on the (file system's) disk
        with open(partial, "rb") as raw:
            reader = _HashingReader(raw)
            with tarfile.open(fileobj=reader, mode="r|gz") as tar:
                found = sum(1 for _member in tar)
            while reader.read(CHUNK):
                pass
        if found != added:
            raise ArchiveError(
                _(
                    "the archive of %(disk)s reads back %(found)s of %(added)s entries",
                    disk=disk,
                    found=found,
                    added=added,
                )
            )
        os.replace(partial, path)
        _fsync_dir(os.path.dirname(path))
    except (OSError, tarfile.TarError) as e:
        _unlink_if_there(partial)
        raise ArchiveError(_("cannot archive %(disk)s: %(error)s", disk=disk, error=e)) from None
    except BaseException:
        _unlink_if_there(partial)
        raise
    return _Written(added, disk_bytes, reader.digest.hexdigest())


def _unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def archive_idle(disk: str, folder: str, now: datetime.datetime) -> Archived:
    """Archive the whole disk into `folder` as STAMP-idle.tar.gz with its SHA-256 beside it,
    read it back to check it, record the marker, then empty the disk (kept: its mode and
    owner). Links are archived as links, never followed; modes and owners are kept;
    sockets, pipes and device files hold no data and are left out. Older idle archives of
    the disk are removed once the new one is recorded.

    The caller holds the disk's lock and has checked that no server uses the disk. Until
    the marker is written nothing is removed: a failure leaves the disk as it was."""
    if archived(folder) is not None:
        raise ArchiveError(_("%(disk)s is archived already", disk=disk))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    for leftover in os.listdir(folder):
        if leftover.endswith(f"-{IDLE_LABEL}.tar.gz.partial"):  # a hub stopped mid-archive
            os.unlink(os.path.join(folder, leftover))
    name = f"{now:%Y%m%dT%H%M%S}Z-{IDLE_LABEL}.tar.gz"
    path = os.path.join(folder, name)
    if os.path.exists(path):
        raise ArchiveError(
            _("an archive named %(name)s exists already; try again in a second", name=name)
        )
    written = _write_tar(disk, path)
    _write_durably(checksum_path(path), f"{written.sha256}  {name}\n")
    marker = Archived(
        archive=name,
        sha256=written.sha256,
        bytes=os.path.getsize(path),
        disk_bytes=written.disk_bytes,
        archived_at=now.astimezone(datetime.UTC).isoformat(timespec="seconds"),
    )
    _write_durably(os.path.join(folder, MARKER), json.dumps(dataclasses.asdict(marker)) + "\n")
    for older in idle_archives(folder):
        if older != name:
            for stale in (os.path.join(folder, older), checksum_path(os.path.join(folder, older))):
                if os.path.exists(stale):
                    os.unlink(stale)
    try:
        empty_disk(disk)
    except OSError as e:
        # the marker stands: the next start restores the archive over what is left
        raise ArchiveError(
            _(
                "archived %(disk)s as %(name)s, but could not empty it: %(error)s",
                disk=disk,
                name=name,
                error=e,
            )
        ) from None
    forget_size(disk)
    return marker


def idle_archives(folder: str) -> list[str]:
    """The idle archives in a disk's archive folder, newest first."""
    return [n for n in archives(folder) if n.endswith(f"-{IDLE_LABEL}.tar.gz")]


def _walk(disk: str, make_readable: bool = False):
    """Every entry below `disk`, as paths relative to it, each folder before what it holds,
    in sorted order; links are listed, never followed. Iterative: a user may nest folders
    deeper than Python recurses (os.walk and tarfile's recursion end in a RecursionError).
    An unreadable folder raises, unless `make_readable` (to remove it: a hub that is not
    root cannot list a folder its user made unreadable)."""
    stack = [""]
    while stack:
        relative = stack.pop()
        folder = os.path.join(disk, relative) if relative else disk
        try:
            names = sorted(os.listdir(folder))
        except PermissionError:
            if not make_readable:
                raise
            os.chmod(folder, stat.S_IMODE(os.lstat(folder).st_mode) | stat.S_IRWXU)
            names = sorted(os.listdir(folder))
        below = []
        for name in names:
            path = os.path.join(relative, name) if relative else name
            yield path
            if stat.S_ISDIR(os.lstat(os.path.join(disk, path)).st_mode):
                below.append(path)
        stack.extend(reversed(below))


def _member_problem(
    member: tarfile.TarInfo, seen: set[str], links: set[str], files: set[str]
) -> str:
    """Why a member may not be extracted onto a disk, or "" when it may."""
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or not name or ".." in parts:
        return _("an absolute path or `..`")
    normal = os.path.normpath(name)
    if normal in seen:
        return _("a second entry of one name")
    steps = normal.split("/")
    if any("/".join(steps[:i]) in links for i in range(1, len(steps))):
        return _("a path through a link")
    if member.islnk():
        target = member.linkname
        if target.startswith("/") or ".." in target.split("/") or target not in seen:
            return _("a hard link to something outside the archive")
        if os.path.normpath(target) not in files:
            # a hard link to a symlink: extracting it as root would chown and chmod the
            # symlink's target, wherever it is
            return _("a hard link to something that is not a file of the archive")
    elif not (member.isreg() or member.isdir() or member.issym()):
        return _("a device file or pipe")
    return ""


def _checked_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member, or an ArchiveError naming the first one that could write outside the
    disk: nothing is extracted from such an archive. Symlinks are kept as the links they
    were (their user made them; the hub never follows them) but nothing is written through
    them."""
    seen: set[str] = set()
    links: set[str] = set()
    files: set[str] = set()
    members = tar.getmembers()
    for member in members:
        problem = _member_problem(member, seen, links, files)
        if problem:
            raise ArchiveError(
                _(
                    "refused: member %(member)s is %(problem)s",
                    member=repr(member.name[:200]),
                    problem=problem,
                )
            )
        seen.add(os.path.normpath(member.name))
        if member.issym():
            links.add(os.path.normpath(member.name))
        elif member.isreg():
            files.add(os.path.normpath(member.name))
    return members


def _as_archived(member: tarfile.TarInfo, _path: str) -> tarfile.TarInfo:
    """Modes and owners as archived (owners take effect when the hub is root), without
    setuid and setgid bits on files."""
    if member.isdir() or member.mode is None:
        return member
    return member.replace(mode=member.mode & ~(stat.S_ISUID | stat.S_ISGID), deep=False)


def restore_idle(disk: str, folder: str, run_as: tuple[int, int] | None) -> Archived | None:
    """Put an archived disk's files back; None when it is not archived. The checksum is
    checked first: an archive that does not match is refused and nothing is extracted.
    Whatever is on the disk meanwhile is archived first (never silently deleted). The
    marker goes once every file is back; the archive stays until the disk's next idle
    archive replaces it. The caller holds the disk's lock."""
    marker = archived(folder)
    if marker is None:
        return None
    path = os.path.join(folder, marker.archive)
    if not os.path.isfile(path):
        raise ArchiveError(
            _(
                "the archive %(archive)s of this disk is missing from %(folder)s",
                archive=marker.archive,
                folder=folder,
            )
        )
    verify_checksum(path, marker.sha256)
    if not os.path.isdir(disk):
        os.makedirs(disk, mode=0o700)
        if run_as is not None:
            os.chown(disk, *run_as)
    elif os.listdir(disk):
        archive_disk(disk, folder, "before-idle-restore", utcnow())
        empty_disk(disk)
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            members = _checked_members(tar)
            tar.extractall(disk, members=members, numeric_owner=True, filter=_as_archived)
    except (tarfile.TarError, OSError, ArchiveError) as e:
        empty_disk(disk)  # a half-restored disk: the archive is still whole, and still marked
        if isinstance(e, ArchiveError):
            raise
        raise ArchiveError(
            _("cannot restore %(archive)s: %(error)s", archive=marker.archive, error=e)
        ) from None
    os.unlink(os.path.join(folder, MARKER))
    _fsync_dir(folder)
    forget_size(disk)
    return marker


def forget_archived(folder: str) -> Archived | None:
    """Drop the marker of an archived disk, keeping its archive (staff reset or restored the
    disk: what it holds now is what they chose). Returns the marker that was dropped."""
    marker = archived(folder)
    if marker is not None:
        os.unlink(os.path.join(folder, MARKER))
        _fsync_dir(folder)
    return marker


# ---------------------------------------------------------------------- locks


class DiskLock:
    """An exclusive lock on one disk between processes (the hub's archiving, its spawns and
    the CLI): `<data_dir>/run/disk-locks.d/<disk folder>.lock`, flock'd. Held by whoever
    archives, restores or deletes a disk, and by a spawn until its server's runtime record
    names the disk, so nothing archives a disk a server is starting on."""

    def __init__(self, data_dir: str, disk_name: str):
        self.path = os.path.join(data_dir, LOCKS_DIR, disk_name + ".lock")
        self.fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock if it is free (never waits); True when taken."""
        if self.fd is not None:
            return True
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> DiskLock:
        if not self.acquire():
            raise ArchiveBusy(_("the disk is being archived, restored or started right now"))
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class ArchiveBusy(ArchiveError):
    """Someone else holds the disk's lock; try again later."""


# ---------------------------------------------------------------------- sizes

_sizes: dict[str, tuple[float, int]] = {}
#: the walk in flight of each disk being measured: one a disk, whoever asks
_walks: dict[str, concurrent.futures.Future] = {}
_sizes_lock = threading.Lock()


def tree_bytes(top: str) -> int:
    """The sum of the sizes of the files below `top` (as `du --apparent-size`; hard links
    once, links never followed); 0 when it does not exist."""
    total, seen = 0, set()
    stack = [top]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(info.st_mode):
                if info.st_nlink > 1:
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def measure(disk: str, max_age_seconds: float = SIZE_CACHE_SECONDS) -> concurrent.futures.Future:
    """The size of `disk` (`tree_bytes`) as a future: done when it was measured less than
    `max_age_seconds` ago, else the walk in flight for that disk (started here, in a thread
    of its own, when none is). Never blocks: the event loop may call it, and wait for the
    result with a bound (`asyncio.wrap_future`); the walk goes on whoever stops waiting."""
    with _sizes_lock:
        cached = _sizes.get(disk)
        if cached is not None and time.monotonic() - cached[0] < max_age_seconds:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(cached[1])
            return done
        walk = _walks.get(disk)
        if walk is None:
            walk = _walks[disk] = concurrent.futures.Future()
            walk.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it
            threading.Thread(
                target=_measure, args=(disk, walk), name="meterhub-disk-size", daemon=True
            ).start()
    return walk


def _measure(disk: str, walk: concurrent.futures.Future) -> None:
    try:
        size = tree_bytes(disk)
    except BaseException as e:
        with _sizes_lock:
            if _walks.get(disk) is walk:
                del _walks[disk]
        walk.set_exception(e)
        return
    with _sizes_lock:
        if _walks.get(disk) is walk:  # else the disk was archived or emptied meanwhile
            del _walks[disk]
            _sizes[disk] = (time.monotonic(), size)
    walk.set_result(size)


def disk_bytes(disk: str, max_age_seconds: float = SIZE_CACHE_SECONDS) -> int:
    """`tree_bytes(disk)`, measured at most once per `max_age_seconds` per disk, by one walk
    at a time (blocking)."""
    return measure(disk, max_age_seconds).result()


def forget_size(disk: str) -> None:
    """Drop the disk's measured size, and the result of a walk in flight (it may have
    counted files that are gone)."""
    with _sizes_lock:
        _sizes.pop(disk, None)
        _walks.pop(disk, None)


def gib(nbytes: int) -> str:
    """A size for people: `1.2 GiB` (MiB below a tenth of a GiB)."""
    if nbytes < 1024**3 // 10:
        return f"{nbytes / 1024**2:.1f} MiB"
    return f"{nbytes / 1024**3:.1f} GiB"
