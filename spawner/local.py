"""LocalGPUSpawner: single-user servers as local processes with exclusive GPUs.

Each server runs unprivileged in a bubblewrap sandbox that shows only its own disk,
the pool read-only at /public, its groups' shared folders and its own GPU device nodes,
in a cgroup that holds it to its profile's CPU and memory. GPUs are allocated from a
persistent table, so a hub restart that keeps servers running never hands one out twice;
a runtime record per server lets a hub that crashed mid-spawn find and stop what it
started before it frees those GPUs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import errno
import functools
import grp
import hashlib
import importlib.util
import ipaddress
import json
import logging
import os
import pwd
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from subprocess import Popen

from escapism import escape
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import maybe_future, random_port
from tornado import web
from traitlets import Any, Bool, Dict, Enum, Float, Int, List, Unicode, default

from meterhub.i18n import N_, _

from . import cgroups, disk_archive, procs
from .allocator import GpuAllocator, NotEnoughGpus
from .catalog import Choice, GpuType, InvalidChoice
from .files import write_private
from .form import environment_options, render_options_form
from .inventory import Gpu, declared_inventory, detect_inventory, device_nodes, visible_devices_env
from .options import (
    SHARED_FOLDER_NAME,
    FolderEnvironments,
    SharedGroup,
    group_names,
    shared_folder_groups,
)
from .sandbox import SandboxSpec, become_user, bwrap_command, bwrap_works
from .starters import copy_starters, kernel_language_info

#: how long before JupyterHub's start_timeout a start that is still waiting for its server
#: to listen gives up with a message of its own, in seconds
START_TIMEOUT_MARGIN_SECONDS = 2
SAFE_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
GIB = 1024**3
#: how long a recorded server gets to exit after SIGTERM, then after SIGKILL
TERM_TIMEOUT_SECONDS = 10
KILL_TIMEOUT_SECONDS = 5
#: waiting for a starting server to listen: the first pause, its growth, the longest
PORT_WAIT_FIRST_SECONDS = 0.05
PORT_WAIT_BACKOFF = 1.5
PORT_WAIT_MAX_SECONDS = 0.5
#: ... the longest pause while this many servers or more are starting at once: each waits a
#: little longer to be seen listening, and the hub tries far fewer connections (a burst of
#: 200 starts on two cores, each server a minute to listen, tried 8,000 at 2 s and about
#: 200 a second at 0.5 s, bench/spawn_burst.py); JupyterHub's own wait for a server's HTTP
#: backs off to 5 s as well
PORT_WAIT_BUSY_STARTS = 20
PORT_WAIT_BUSY_MAX_SECONDS = 5.0
#: the runtime records, one a server, below <data_dir>/run (a name no user's folder has)
RECORDS_DIR = "servers.d"
#: how often a spawn looks again whether its disk's archiving has finished
DISK_LOCK_POLL_SECONDS = 0.5
#: how long the Wallet page waits for a disk to be measured against the quota (the walk goes
#: on; a spawn does not wait: it reports the quota only if the walk ended by the time its
#: server answers)
DISK_SIZE_WAIT_SECONDS = 10


@functools.cache
def _detected_inventory(gpu_types: tuple[GpuType, ...]) -> tuple[Gpu, ...]:
    return tuple(detect_inventory(gpu_types={t.slug: t for t in gpu_types}))


@functools.cache
def _allocator(
    db_path: str, inventory: tuple[Gpu, ...], gpu_types: tuple[GpuType, ...]
) -> GpuAllocator:
    return GpuAllocator(db_path, list(inventory), {t.slug: t for t in gpu_types})


def environment_paths(prefix: str) -> list[str]:
    """Host paths a Python environment needs: itself and, for a venv, its base interpreter."""
    candidates = [prefix]
    try:
        with open(os.path.join(prefix, "pyvenv.cfg")) as f:
            for line in f:
                key, _sep, value = line.partition("=")
                if key.strip() == "home":
                    candidates.append(os.path.dirname(value.strip()))
    except FileNotFoundError:
        pass
    paths: list[str] = []
    for path in candidates:
        for p in (path, os.path.realpath(path)):
            if p not in paths and os.path.isdir(p):
                paths.append(p)
    return paths


def server_code_paths(prefix: str) -> list[str]:
    """meterhub's code that runs inside servers (the `extensions` package), when the servers
    use the hub's own environment but the package lives outside it (an editable install,
    as `make` makes): that package directory alone, to be bound read-only."""
    from meterhub import extensions

    if os.path.realpath(prefix) != os.path.realpath(sys.prefix):
        return []  # another environment: meterhub[lab] is installed in it
    package = os.path.dirname(os.path.abspath(extensions.__file__))
    inside = os.path.realpath(package).startswith(os.path.realpath(prefix) + os.sep)
    return [] if inside else [package]


def group_has_live_members(pgid: int) -> bool:
    """Whether a process group still has a process that is not a zombie.

    After a hub restart a server's processes are no longer our children; when they die
    they can stay zombies for a while (or, under an init that does not reap, for good),
    and signalling the group still succeeds. Only a live member means a running server.

    The group's leader (the server's first process, whose pid is the group's id) alive is
    the common case and one read; only without it is every process looked at (a scan of
    /proc per poll made a burst of 200 servers cost the hub O(servers²), bench/spawn_burst.py).
    A pid reused by another group's leader cannot be this group's id while the group has a
    member, so the leader's answer is the scan's.
    """
    leader = _stat_fields(pgid)
    if leader is not None and _is_live_member(leader, pgid):
        return True
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # no member at all, not even a zombie: no scan (a stop's common case)
    except PermissionError:
        pass  # members of another uid's: the scan says whether they live
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and _is_live_member(fields, pgid):
            return True
    return False


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _is_live_member(fields: list[str], pgid: int) -> bool:
    return int(fields[2]) == pgid and fields[0] not in ("Z", "X")


# ---------------------------------------------------------------------- runtime records
# JupyterHub stores a server's state (its pid) only after start() returns. A hub killed
# between starting the process and that commit would forget a running server and hand its
# GPUs to someone else. So the spawner writes its own record first, and the hub's start-up
# stops every recorded server it does not know as running before it frees any GPU.


@dataclass(frozen=True)
class ServerRecord:
    """What a hub needs to find a server's processes again after it crashed."""

    #: the allocator's owner key, "{user id}/{server name}"
    owner: str
    #: an argument only this server's command line carries (the user's disk path)
    marker: str
    #: epoch seconds, taken before the process was started
    started_at: int
    gpu_indices: tuple[int, ...] = ()
    cgroups: tuple[str, ...] = ()
    #: the process group id (the first process's pid); None until the process exists
    pid: int | None = None

    def to_json(self) -> str:
        # its fields as they are (tuples are JSON arrays): dataclasses.asdict deep-copies
        return json.dumps(vars(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServerRecord:
        """Parse a record; ValueError when it is not one."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        try:
            record = cls(
                owner=data["owner"],
                marker=data["marker"],
                started_at=data["started_at"],
                gpu_indices=tuple(data.get("gpu_indices", ())),
                cgroups=tuple(data.get("cgroups", ())),
                pid=data.get("pid"),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"missing or bad field: {e}") from None
        checks = [
            isinstance(record.owner, str) and record.owner,
            isinstance(record.marker, str) and os.path.isabs(record.marker),
            isinstance(record.started_at, int),
            all(isinstance(i, int) for i in record.gpu_indices),
            all(isinstance(d, str) and os.path.isabs(d) for d in record.cgroups),
            record.pid is None or (isinstance(record.pid, int) and record.pid > 1),
        ]
        if not all(checks):
            raise ValueError("a field has the wrong type")
        return record


def records_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "run", RECORDS_DIR)


def record_path(data_dir: str, owner: str) -> str:
    name = escape(owner, safe=SAFE_NAME_CHARS, escape_char="-")
    return os.path.join(records_dir(data_dir), name + ".json")


def write_record(data_dir: str, record: ServerRecord) -> None:
    """Write (or replace) a server's record atomically, readable by the hub's user only.

    fsync'd, though a machine crash ends the servers too: a record left empty by one would
    read as a server that may use its disk (`hub/disk_cli.server_on_disk`), and no disk
    could be archived until someone deleted it.
    """
    path = record_path(data_dir, record.owner)
    try:
        write_private(path, record.to_json(), path + ".tmp")
    except FileNotFoundError:  # the first record of this data folder
        os.makedirs(records_dir(data_dir), mode=0o700, exist_ok=True)
        write_private(path, record.to_json(), path + ".tmp")


def read_record(data_dir: str, owner: str) -> ServerRecord | None:
    try:
        with open(record_path(data_dir, owner)) as f:
            return ServerRecord.from_json(f.read())
    except FileNotFoundError:
        return None
    except ValueError:
        return None


def read_records(data_dir: str) -> tuple[list[ServerRecord], list[str]]:
    """Every record, and the paths of files that are not records."""
    try:
        names = sorted(os.listdir(records_dir(data_dir)))
    except FileNotFoundError:
        return [], []
    records, bad = [], []
    for name in names:
        if not name.endswith(".json"):
            continue  # an interrupted write's temporary file; its record is whole
        path = os.path.join(records_dir(data_dir), name)
        try:
            with open(path) as f:
                records.append(ServerRecord.from_json(f.read()))
        except (OSError, ValueError):
            bad.append(path)
    return records, bad


def remove_record(data_dir: str, owner: str) -> None:
    try:
        os.unlink(record_path(data_dir, owner))
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    pgid: int
    #: one letter of /proc/<pid>/stat: R, S, D, T, Z ...
    state: str
    #: epoch seconds
    started_at: float
    argv: tuple[bytes, ...]


@dataclass(frozen=True)
class ServerProcesses:
    """A recorded server's live processes: the process groups proven to be its own, and
    every pid to signal (members of those groups and of its cgroups)."""

    pgids: frozenset[int] = frozenset()
    pids: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.pids)


def carries_marker(argv: Iterable[bytes], marker: str) -> bool:
    """Whether a command line has the marker as an argument (or as `--option=<marker>`)."""
    wanted = marker.encode()
    return any(arg == wanted or arg.endswith(b"=" + wanted) for arg in argv)


def server_processes(
    record: ServerRecord,
    processes: Iterable[ProcessInfo],
    cgroup_pids: Iterable[int] = (),
    known_pgids: Iterable[int] = (),
) -> ServerProcesses:
    """Which live processes are the recorded server's (pure).

    A process group is the server's only if a live member's command line carries the
    record's marker: a pid recycled since the record was written is never taken for it.
    Without a pid (the hub died between writing the record and starting the process), the
    candidates are process groups whose leader started after the record was written.
    Groups in `known_pgids` were proven earlier and stay the server's while they have
    members (the kernel does not reuse a process group id that is still in use); members
    of the server's cgroups are its own whatever their command line.
    """
    live = [p for p in processes if p.state not in ("Z", "X")]
    if record.pid is not None:
        candidates = {record.pid}
    else:
        candidates = {
            p.pgid for p in live if p.pid == p.pgid and p.started_at >= record.started_at - 1
        }
    proven = {
        p.pgid for p in live if p.pgid in candidates and carries_marker(p.argv, record.marker)
    }
    proven |= {pgid for pgid in known_pgids if any(p.pgid == pgid for p in live)}
    in_cgroups = set(cgroup_pids)
    pids = {p.pid for p in live if p.pgid in proven or p.pid in in_cgroups}
    return ServerProcesses(frozenset(proven), frozenset(pids))


#: when the kernel booted (epoch seconds); kept under this name for older callers
_boot_time = procs.boot_time


def scan_processes(proc: str = "/proc") -> list[ProcessInfo]:
    """Every process this hub can see (blocking)."""
    return [ProcessInfo(p.pid, p.pgid, p.state, p.started_at, p.argv) for p in procs.scan(proc)]


def _signal_processes(found: ServerProcesses, sig: int) -> None:
    for pgid in found.pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in found.pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_recorded_server(
    record: ServerRecord,
    log: logging.Logger,
    term_timeout: float = TERM_TIMEOUT_SECONDS,
    kill_timeout: float = KILL_TIMEOUT_SECONDS,
) -> bool:
    """Stop whatever still runs of a recorded server (blocking); True once nothing does.

    SIGTERM with SIGCONT (a stopped process handles its SIGTERM only once continued), a
    bounded wait, then SIGKILL and another bounded wait.
    """
    known: frozenset[int] = frozenset()

    def find() -> ServerProcesses:
        nonlocal known
        found = server_processes(
            record, scan_processes(), cgroups.members(record.cgroups), known_pgids=known
        )
        known = known | found.pgids
        return found

    found = find()
    if not found:
        return True
    log.warning(
        "Stopping %s (processes %s), which the hub does not know as running: its spawn was"
        " interrupted or its state lost",
        record.owner,
        sorted(found.pids),
    )
    for signals, timeout in (
        ((signal.SIGTERM, signal.SIGCONT), term_timeout),
        ((signal.SIGKILL,), kill_timeout),
    ):
        for sig in signals:
            _signal_processes(found, sig)
        deadline = time.monotonic() + timeout
        while found and time.monotonic() < deadline:
            time.sleep(0.1)
            found = find()
        if not found:
            return True
    return False


def forget_server(data_dir: str, record: ServerRecord, log: logging.Logger) -> None:
    """Remove a stopped server's cgroups and record (blocking)."""
    left = cgroups.remove(record.cgroups)
    if left:
        log.warning("Could not remove the cgroups %s of %s", left, record.owner)
    remove_record(data_dir, record.owner)


async def stop_orphans(data_dir: str, active: set[str], log: logging.Logger) -> set[str]:
    """At hub start-up: stop every recorded server whose owner is not an active server of
    the hub, then drop its record. Returns the owners of those that could not be stopped:
    their GPUs must stay allocated."""
    records, bad = await asyncio.to_thread(read_records, data_dir)
    for path in bad:
        log.error("%s is not a server record; remove it by hand once nothing of it runs", path)
    orphans = [record for record in records if record.owner not in active]

    async def stop(record: ServerRecord) -> bool:
        if not await asyncio.to_thread(stop_recorded_server, record, log):
            log.error(
                "Could not stop the processes of %s; keeping GPUs %s allocated to it",
                record.owner,
                list(record.gpu_indices),
            )
            return False
        await asyncio.to_thread(forget_server, data_dir, record, log)
        return True

    stopped = await asyncio.gather(*(stop(record) for record in orphans))
    return {record.owner for record, ok in zip(orphans, stopped, strict=True) if not ok}


# ---------------------------------------------------------------------- resource limits


_layout_lock = threading.Lock()


@functools.cache
def _detected_layout() -> cgroups.CgroupLayout | str:
    try:
        return cgroups.detect()
    except cgroups.CgroupsUnavailable as e:
        return str(e)


def _cgroup_layout() -> cgroups.CgroupLayout | str:
    with _layout_lock:  # one probe, even when the first spawns come together
        return _detected_layout()


def resource_limits_status(mode: str) -> tuple[cgroups.CgroupLayout | None, str]:
    """(layout, "") when servers get cgroup limits under `mode`, else (None, why not).
    Blocking the first time (it probes the host)."""
    if mode == "off":
        return None, "resource_limits is off"
    found = _cgroup_layout()
    if isinstance(found, str):
        return None, found
    return found, ""


_warned_without_limits = False


def _warn_without_limits(log: logging.Logger, why: str) -> None:
    global _warned_without_limits
    if not _warned_without_limits:
        _warned_without_limits = True
        log.warning("servers run WITHOUT CPU/memory limits: %s", why)


_warned_without_sandbox: set[str] = set()


def _warn_without_sandbox(log: logging.Logger, why: str, name: str) -> None:
    """Once a reason a warning (the hub's start-up warned already, and its pages show a
    banner); each start at debug: a burst of 200 starts wrote 200 warnings."""
    if why not in _warned_without_sandbox:
        _warned_without_sandbox.add(why)
        log.warning(
            "Starting %s WITHOUT a sandbox (%s): it, and every server started after it for"
            " the same reason, can see the hub's data directory",
            name,
            why,
        )
    else:
        log.debug("Starting %s WITHOUT a sandbox (%s)", name, why)


async def announce_resource_limits(mode: str, log: logging.Logger) -> None:
    """Say at start-up whether servers get CPU and memory limits, and how."""
    layout, why = await asyncio.to_thread(resource_limits_status, mode)
    if layout is not None:
        log.info("CPU and memory limits for servers: %s", layout.describe())
    elif mode == "cgroup":
        log.error(
            "resource_limits = cgroup, but this host cannot limit servers (%s): every spawn"
            " will fail",
            why,
        )
    else:
        _warn_without_limits(log, why)


def _live(pids: Iterable[int]) -> set[int]:
    """Those of `pids` that are neither gone nor zombies."""
    live = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            live.add(pid)
    return live


# ---------------------------------------------------------------------- group folders
# A group's folder is <data_dir>/shared/<group>, bound at <disk mount>/shared/<group> for
# members only. The mount points live on the member's own disk, which is the user's to
# change: the hub reaches them only through directory descriptors and never follows a link.

#: a POSIX default ACL "user::rwx group::rwx other::---" (linux/posix_acl_xattr.h): what a
#: member makes in a group folder is writable by the group whatever the server's umask
_ACL_UNDEFINED_ID = 0xFFFFFFFF
GROUP_DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perm, _ACL_UNDEFINED_ID)
    for tag, perm in ((0x01, 7), (0x04, 7), (0x20, 0))
)


@dataclass(frozen=True)
class GroupFolders:
    """What a start binds of its groups' folders, and the group ids the server gets."""

    #: (host folder, path inside the sandbox)
    binds: tuple[tuple[str, str], ...] = ()
    #: supplementary group ids (a root hub only: its servers run as uids of their own)
    gids: tuple[int, ...] = ()
    #: (gid, group name), for the sandbox's /etc/group
    names: tuple[tuple[int, str], ...] = ()


def prepare_group_folder(path: str, gid: int | None, log: logging.Logger) -> None:
    """Make a group's host folder (blocking). `gid` None (every server runs as the hub's
    user): mode 0700. Otherwise root:gid, mode 2770 with a default ACL that keeps new
    files group-writable: members (their servers get the gid) share it, nobody else enters."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if gid is None:
        os.chmod(path, 0o700, follow_symlinks=False)
        return
    os.chown(path, 0, gid, follow_symlinks=False)
    os.chmod(path, 0o2770, follow_symlinks=False)  # setgid: what is made inside is the group's
    try:
        if os.getxattr(path, "system.posix_acl_default") == GROUP_DEFAULT_ACL:
            return
    except OSError:
        pass
    try:
        os.setxattr(path, "system.posix_acl_default", GROUP_DEFAULT_ACL)
    except OSError as e:
        log.warning(
            "%s: no default ACL (%s): members' new files follow their umask and may be"
            " read-only for the other members",
            path,
            e,
        )


def prepare_mount_points(
    disk: str,
    wanted: dict[str, str],
    owner: tuple[int, int] | None,
    shared_root: str,
    log: logging.Logger,
) -> list[str]:
    """Make `<disk>/shared/<name>` for each name in `wanted` (blocking): an empty folder
    where `wanted[name]` is "" (a bind's mount point), else a link to `wanted[name]` (no
    sandbox). Returns the names that are ready. Empty folders, and links into `shared_root`,
    of groups the user has left are removed; what else the user put there stays, and that
    group's folder is then not mounted (a warning says why)."""
    ready: list[str] = []
    disk_fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if wanted:
            try:
                os.mkdir("shared", 0o755, dir_fd=disk_fd)
                if owner:
                    os.chown("shared", *owner, dir_fd=disk_fd, follow_symlinks=False)
            except FileExistsError:
                pass
        try:
            fd = os.open("shared", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=disk_fd)
        except FileNotFoundError:
            return ready
        except OSError:
            if wanted:
                log.warning("%s/shared is not a folder: no group folders mounted", disk)
            return ready
        try:
            for name in os.listdir(fd):
                if name not in wanted and SHARED_FOLDER_NAME.match(name):
                    _remove_mount_point(fd, name, shared_root)
            for name, target in wanted.items():
                if _make_mount_point(fd, name, target, owner, shared_root):
                    ready.append(name)
                else:
                    log.warning(
                        "%s/shared/%s holds the user's own files: group folder not mounted",
                        disk,
                        name,
                    )
        finally:
            os.close(fd)
    finally:
        os.close(disk_fd)
    return ready


def _kind(fd: int, name: str) -> str:
    """What `name` is in the directory `fd`: "" (nothing), "link", "empty" (an empty
    folder) or "theirs" (anything else)."""
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(mode):
        return "link"
    if not stat.S_ISDIR(mode):
        return "theirs"
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return "theirs"
    try:
        return "theirs" if os.listdir(sub) else "empty"
    finally:
        os.close(sub)


def _remove_mount_point(fd: int, name: str, shared_root: str) -> None:
    """Remove a left group's mount point: an empty folder, or a link the hub made."""
    try:
        kind = _kind(fd, name)
        if kind == "link" and os.readlink(name, dir_fd=fd) == os.path.join(shared_root, name):
            os.unlink(name, dir_fd=fd)
        elif kind == "empty":
            os.rmdir(name, dir_fd=fd)  # fails unless still empty: nothing of theirs is lost
    except OSError:
        pass


def _make_mount_point(
    fd: int, name: str, target: str, owner: tuple[int, int] | None, shared_root: str
) -> bool:
    kind = _kind(fd, name)
    if kind == "link":
        link = os.readlink(name, dir_fd=fd)
        if target and link == target:
            return True
        if link != os.path.join(shared_root, name):
            return False  # the user's own link
        os.unlink(name, dir_fd=fd)
    elif kind == "empty":
        if not target:
            return True
        os.rmdir(name, dir_fd=fd)  # the mount point of an earlier start in the sandbox
    elif kind == "theirs":
        return False
    if target:
        os.symlink(target, name, dir_fd=fd)
    else:
        os.mkdir(name, 0o755, dir_fd=fd)
    if owner:
        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
    return True


def starter_notebooks() -> str:
    """The folder of the starter notebooks meterhub ships (`meterhub.notebooks`, data only)."""
    spec = importlib.util.find_spec("meterhub.notebooks")
    folders = [p for p in (spec.submodule_search_locations or []) if os.path.isdir(p)]
    return folders[0] if folders else ""


def server_user_env(env: dict, user: str, home: str, env_prefix: str) -> dict:
    """A server's user, home, shell and PATH (its environment's bin first), every backend's."""
    env["USER"] = user
    env["HOME"] = home
    env["SHELL"] = "/bin/bash"
    env["PATH"] = os.pathsep.join(
        [os.path.join(env_prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    )
    env["JUPYTER_RUNTIME_DIR"] = "/tmp/jupyter-runtime"
    return env


def disk_dirname(username: str) -> str:
    """A user's disk folder name: stable, filesystem-safe and collision-free."""
    return escape(username, safe=SAFE_NAME_CHARS, escape_char="-")


async def accepts_connections(ip: str, port: int) -> bool:
    """Whether something listens at ip:port of this host now.

    A server of this host almost always answers a connection in the connect call itself: a
    closed port refuses it (ECONNREFUSED), an open one accepts it. So a non-blocking connect
    and a look without waiting tell, in two system calls, what an asyncio connection told
    with a transport, a protocol and a round of the event loop (a burst of 200 starts made
    8,000 of them, bench/spawn_burst.py). When there is no answer yet (the kernel put off
    its part, or a full queue of connections), and for a host name, asyncio connects and
    waits a second at most; no answer then counts as not listening.
    """
    family = _address_family(ip)
    if family is None:
        return await _connects(ip, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        error = sock.connect_ex((ip, port))
        if error == errno.EINPROGRESS:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            if not poller.poll(0):
                error = None  # no answer yet
            else:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error is None:
        return await _connects(ip, port)
    return error == 0


@functools.lru_cache(maxsize=64)
def _address_family(ip: str) -> socket.AddressFamily | None:
    """The socket family of an IP address; None for a host name (parsed once an address:
    a burst's port waits asked it thousands of times)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
    except ValueError:
        return None


async def _connects(host: str, port: int, timeout: float = 1) -> bool:
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def named_like_ids(uid: int, gid: int, groups: tuple[int, ...] = ()) -> bool:
    """Whether the host's user or group database (NSS: files, LDAP ...) has a name that
    is one of these numbers, which setpriv would take for that name's id (blocking)."""
    lookups = [(pwd.getpwnam, uid), (grp.getgrnam, gid)]
    lookups += [(grp.getgrnam, g) for g in groups]
    for lookup, number in lookups:
        try:
            lookup(str(number))
        except KeyError:
            continue
        return True
    return False


class PortBook:
    """Which server (owner key) holds which port: one port per server, one server per port,
    each lookup O(1) (a scan of all ports for a server's was a burst's quadratic cost)."""

    def __init__(self) -> None:
        self.owner_of: dict[int, str] = {}
        self.port_of: dict[str, int] = {}

    def take(self, port: int, owner: str) -> bool:
        """Give `port` to `owner` (its earlier port is freed); False if another holds it."""
        if self.owner_of.setdefault(port, owner) != owner:
            return False
        earlier = self.port_of.get(owner)
        if earlier is not None and earlier != port:
            del self.owner_of[earlier]
        self.port_of[owner] = port
        return True

    def release(self, owner: str) -> None:
        port = self.port_of.pop(owner, None)
        if port is not None:
            del self.owner_of[port]


class LocalGPUSpawner(FolderEnvironments, LocalProcessSpawner):
    """Spawn servers locally with a profile from the catalog, exclusive GPUs and a sandbox."""

    data_dir = Unicode(
        help="""
        Directory holding the disks, the GPU allocation table and per-server runtime files.

        Servers never see it: the sandbox hides it even when it lies inside a bound path.
        """
    ).tag(config=True)

    @default("data_dir")
    def _default_data_dir(self):
        return os.path.abspath("meterhub-data")

    disk_root = Unicode(
        help="Directory of the users' persistent disks, one folder each. Default: `<data_dir>/disks`."
    ).tag(config=True)

    @default("disk_root")
    def _default_disk_root(self):
        return os.path.join(self.data_dir, "disks")

    disk_mount_path = Unicode(
        "/home/jovyan",
        help="""
        Where a user's disk appears inside the sandbox: the server's working directory,
        HOME and file browser root. Must be under /home (the sandbox hides the host's /home).
        """,
    ).tag(config=True)

    disk_quota_gib = Float(
        None,
        allow_none=True,
        min=0,
        help="""
        GiB a user's disk should hold at most (the sum of its files' sizes). A user over it
        is told so at spawn and on the Wallet page; the server starts anyway and nothing
        is removed. None (default): no quota. Measuring walks the disk, at most once a
        minute per disk.
        """,
    ).tag(config=True)

    pool_dir = Unicode(
        "",
        help="Host directory of the read-only pool of models and datasets; empty for none.",
    ).tag(config=True)

    pool_mount_path = Unicode(
        "/public", help="Where the pool appears inside the sandbox, read-only."
    ).tag(config=True)

    starter_notebooks_dir = Unicode(
        help="Notebooks copied into each new disk (default: the starter notebooks meterhub ships).",
    ).tag(config=True)

    @default("starter_notebooks_dir")
    def _default_starter_notebooks_dir(self):
        return starter_notebooks()

    sandbox = Enum(
        ["auto", "bwrap", "off"],
        "auto",
        help="""
        How servers are isolated.

        - `auto` (default): bubblewrap when it works on this machine, else plain processes.
        - `bwrap`: always bubblewrap; a spawn fails if it cannot run.
        - `off`: plain processes. DANGER: without the sandbox every server can read the
          hub's data directory and, when the hub is not root, every other user's disk.
        """,
    ).tag(config=True)

    resource_limits = Enum(
        ["auto", "cgroup", "off"],
        "auto",
        help="""
        How a server is held to its profile's CPU cores and memory.

        - `auto` (default): a cgroup per server (v2 where the host's unified hierarchy
          offers the memory and cpu controllers, else v1) when the hub can create cgroups
          below its own; otherwise servers run without limits, with one warning in the log.
        - `cgroup`: always cgroups; a spawn fails when they cannot be set.
        - `off`: no limits. DANGER: one user can then take every core and all the memory of
          the machine, starve the other users' servers and the hub, and make the kernel's
          OOM killer pick processes anywhere on the host.
        """,
    ).tag(config=True)

    @default("poll_interval")
    def _default_poll_interval(self):
        # not JupyterHub's 30 s: a server that died (or went over its memory, which v1
        # cgroups notice only here) would hold its GPUs, and show as running, that much longer
        return 10

    uid_base = Int(
        200000,
        min=1000,
        help="""
        When the hub runs as root, user N's server runs as uid and gid `uid_base + N`,
        where N is the user's JupyterHub id. Choose a range no system account uses.
        Ignored when the hub is not root: servers then run as the hub's own user.
        """,
    ).tag(config=True)

    group_folders = Bool(
        True,
        help="""
        Give each JupyterHub group whose properties say `"shared_folder": true` a folder,
        `<data_dir>/shared/<group>`, that its members' servers see read-write at
        `<disk_mount_path>/shared/<group>`. Membership is read at every start: a member
        removed from the group has no mount from their next start on; the files stay.
        Only groups named like `^[a-z0-9][a-z0-9._-]{0,63}$` get one.

        When the hub is not root every server runs as the hub's own user: the folder is
        mode 0700 and the sandbox alone keeps non-members out, so without the sandbox
        (`sandbox = off`, or `auto` on a host where bubblewrap cannot run) every server can
        reach every group's folder. When the hub is root each server runs as a uid of its
        own and gets, as supplementary groups, the gids `group_gid_base + <group id>` of
        its groups: a folder is root:<gid>, mode 2770 (setgid) with a default ACL keeping
        new files group-writable, so members share it and nobody else can enter it, with
        or without the sandbox. DANGER: anything in a group folder can be read, changed and
        deleted by every member, and a file a member moves in from their own disk keeps
        its own group and mode until they `chgrp` it.
        """,
    ).tag(config=True)

    group_gid_base = Int(
        300000,
        min=1000,
        help="""
        When the hub runs as root, the shared folder of the group with JupyterHub id N
        belongs to gid `group_gid_base + N`, which its members' servers get as a
        supplementary group. Choose a range no system group and no `uid_base` user uses.
        Ignored when the hub is not root.
        """,
    ).tag(config=True)

    gpus = List(
        Dict(),
        default_value=None,
        allow_none=True,
        help="""
        The machine's GPUs as a list of `{"type": <gpu type>, "count": N}`, numbered in
        order from device 0. None (default): detect them with NVML.
        """,
    ).tag(config=True)

    server_env_prefix = Unicode(
        help="""
        Prefix of the Python environment servers run from when their environment names
        none of its own (the built-in `pytorch`, and any without `requirements` or
        `prefix`); it needs `meterhub[lab]`. Default: the hub's own environment.
        """
    ).tag(config=True)

    @default("server_env_prefix")
    def _default_server_env_prefix(self):
        return sys.prefix

    envs_dir = Unicode(
        help="""
        Where `meterhub env build` puts the environments servers may choose (site config
        `environments`): `<envs_dir>/<slug>`. Default: `<data_dir>/envs`. Servers see the
        one they run from read-only, nothing else of the data directory.
        """
    ).tag(config=True)

    @default("envs_dir")
    def _default_envs_dir(self):
        return os.path.join(self.data_dir, "envs")

    stop_grace_seconds = Int(
        30,
        min=0,
        help="""
        Seconds a stopping server has to exit after SIGTERM before it is killed (SIGKILL).

        A stop sends SIGTERM (and SIGCONT, so a suspended server handles it) to the
        server's process group; its meterhub extension passes SIGTERM on to every kernel
        at once and waits for them, so a training loop can checkpoint. There is no SIGINT
        first: it would interrupt running cells before they can save anything. The
        grace period is charged like any running time; 0 kills at once. Site config
        `stop_grace_seconds`.
        """,
    ).tag(config=True)

    gpu_reservations = Any(
        None,
        help="""
        Optional (async) callable `f(spawner) -> {gpu_type: {key: reservation}}` of GPUs
        reserved for users (a user's name: a count, e.g. a pass holder's) or for pools (a
        pool's name: (count, its members), e.g. a course's class in its lab window): what
        they reserved and do not use is not handed to anyone else. The hub sets it from
        billing; the spawner knows no more.
        """,
    ).tag(config=True)

    async def current_reservations(self) -> dict[str, dict]:
        if self.gpu_reservations is None:
            return {}
        return await maybe_future(self.gpu_reservations(self))

    gpu_indices = List(Int())
    #: epoch seconds of the last time start() or poll() found the server alive (this hub run)
    last_seen_alive = Int(None, allow_none=True)
    #: set when poll() finds the server dead: when it was last seen alive (None if unknown)
    exited_after = Int(None, allow_none=True)
    #: set with it: found dead by a hub that never saw it alive (started since: a reboot)
    exited_unseen = Bool(False)
    #: the server's cgroup folders (empty when it runs without limits)
    cgroup_dirs = List(Unicode())
    #: supplementary gids of the current start: its groups' shared folders (a root hub)
    group_gids = List(Int())
    #: OOM kills its cgroups had counted when it started (a reused cgroup keeps its count)
    oom_baseline = Int(0)
    #: how many servers of this hub are waiting to be seen listening now (all spawners)
    _waiting_for_port = 0
    #: the ports of the servers of this hub that may be starting or running
    _ports: PortBook = PortBook()

    def _unique_port(self) -> int:
        """A free port no other server of this hub was given: JupyterHub's random_port
        only finds one free now, and a server binds it seconds later (a minute, in a burst
        of 200 on two cores), so two starts could get the same one and the second fail
        with "Address already in use" (bench/spawn_burst.py saw it)."""
        ports, owner = LocalGPUSpawner._ports, self.owner_key
        ports.release(owner)
        for _attempt in range(100):
            port = random_port()
            if ports.take(port, owner):
                return port
        raise web.HTTPError(503, "%s", _("No free port for the server; try again."))

    def _forget_port(self) -> None:
        LocalGPUSpawner._ports.release(self.owner_key)

    # ------------------------------------------------------------------ inventory

    @property
    def inventory(self) -> tuple[Gpu, ...]:
        gpu_types = self.catalog.types()
        if self.gpus is None:
            return _detected_inventory(tuple(gpu_types.values()))
        return tuple(declared_inventory(self.gpus, gpu_types))

    @property
    def allocator(self) -> GpuAllocator:
        os.makedirs(self.data_dir, exist_ok=True)
        return _allocator(
            os.path.join(self.data_dir, "gpu-allocations.sqlite"),
            self.inventory,
            tuple(self.catalog.types().values()),
        )

    @property
    def owner_key(self) -> str:
        return f"{self.user.id}/{self.name}"

    @property
    def cgroup_name(self) -> str:
        """The server's cgroup: its owner, after a tag of this hub (several hubs may share
        the cgroup they were started in, each with its own user ids)."""
        hub = hashlib.sha256(os.path.abspath(self.data_dir).encode()).hexdigest()[:8]
        return f"{hub}-{escape(self.owner_key, safe=SAFE_NAME_CHARS, escape_char='-')}"

    @property
    def run_as(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        uid = self.uid_base + self.user.id
        return uid, uid

    # ------------------------------------------------------------------ options

    @default("options_form")
    def _default_options_form(self):
        return _options_form

    # ------------------------------------------------------------------ progress

    def _progress(self, percent: int, message: str, **values: object) -> None:
        """A spawn progress event: `message` (marked with N_) in the language of the spawn's
        request, in English in the hub's debug log (at info, four lines a start that stock's
        hub does not write: a burst of 200 starts wrote 800)."""
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("%s: %s", self._log_name, message % values if values else message)
        self._events.append({"progress": percent, "message": _(message, **values)})
        self._events_changed.set()

    _events = List()

    async def progress(self):
        sent = 0
        changed = self._events_changed
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            if not self._start_pending and sent:
                return
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), timeout=1)
            except TimeoutError:
                pass

    @functools.cached_property
    def _events_changed(self) -> asyncio.Event:
        return asyncio.Event()

    # ------------------------------------------------------------------ start

    async def start(self):
        started = time.monotonic()
        choice = self.parse_options()
        self.choice = choice
        await self.resolve_environment(choice)
        self._events = []
        why_not = await asyncio.to_thread(bwrap_works) if self.sandbox != "off" else ""
        sandboxed = self.sandbox == "bwrap" or (self.sandbox == "auto" and not why_not)
        if self.sandbox == "bwrap" and why_not:
            raise web.HTTPError(
                500, "%s", _("The sandbox is required but cannot run: %(why)s", why=why_not)
            )
        await self._stop_leftover()

        gpus: list[Gpu] = []
        if not choice.profile.is_debug:
            self._progress(10, N_("Allocating %(label)s"), label=choice.label)
            try:
                reserved = await self.current_reservations()
                gpus = await asyncio.to_thread(
                    self.allocator.allocate,
                    self.owner_key,
                    choice.profile.slug,
                    choice.gpus,
                    self.user.name,
                    reserved.get(choice.profile.slug, {}),
                )
            except NotEnoughGpus as e:
                raise web.HTTPError(409, "%s", e, reason="GPUs unavailable") from None
            indices = ", ".join(str(g.index) for g in gpus)
            self._progress(25, N_("Allocated GPU %(indices)s"), indices=indices)
        self.gpu_indices = [gpu.index for gpu in gpus]
        self.cgroup_dirs = []
        disk_lock = disk_archive.DiskLock(self.data_dir, disk_dirname(self.user.name))
        groups = self.shared_groups()  # on the event loop: the hub ORM's, not the thread's
        prepared: asyncio.Future | None = None
        try:
            await self._claim_disk(disk_lock)
            self._progress(40, N_("Preparing disk"))
            # the disk, the group folders and the cgroups in one thread hop: each hop costs
            # the hub's event loop (a burst of 200 starts, bench/spawn_burst.py); shielded,
            # so that a start cancelled meanwhile still learns which cgroups it made (below)
            prepared = asyncio.ensure_future(
                asyncio.to_thread(self._prepare_host, choice, sandboxed, groups)
            )
            disk, folders, limits = await asyncio.shield(prepared)
            self.group_gids = list(folders.gids)
            if limits is not None:
                self.cgroup_dirs, self.oom_baseline = limits
                self._progress(
                    50,
                    N_("Limited to %(cpu)s CPU cores and %(memory)s GiB memory"),
                    cpu=choice.cpu,
                    memory=choice.memory_gib,
                )
            self.cpu_limit = float(choice.cpu)
            self.mem_limit = choice.memory_gib * GIB
            self.notebook_dir = self.disk_mount_path if sandboxed else disk
            self.port = self._unique_port()
            env = self.get_env()
            env.update(self._profile_env(choice, gpus, sandboxed))
            if sandboxed:
                env["HOME"] = self.disk_mount_path
            cmd = [os.path.join(self.env_prefix, "bin", "jupyterhub-singleuser")]
            cmd += self.get_args()
            record = ServerRecord(
                owner=self.owner_key,
                marker=disk,
                started_at=int(time.time()),
                gpu_indices=tuple(self.gpu_indices),
                cgroups=tuple(self.cgroup_dirs),
            )
            files, ids_named = await asyncio.to_thread(
                self._write_start_files, record, sandboxed, folders
            )
            disk_lock.release()  # the record names the disk now: nothing archives it
            if sandboxed:
                spec = SandboxSpec(
                    disk=disk,
                    disk_mount=self.disk_mount_path,
                    pool=self.pool_dir or None,
                    pool_mount=self.pool_mount_path,
                    ro_paths=tuple(
                        environment_paths(self.env_prefix) + server_code_paths(self.env_prefix)
                    ),
                    hidden=(os.path.abspath(self.data_dir),),
                    devices=tuple(device_nodes(gpus)),
                    files=files,
                    run_as=self.run_as,
                    rw_binds=folders.binds,
                    groups=folders.gids,
                )
                # the disk path is an argument of bwrap's command line: the record's marker
                cmd = bwrap_command(spec, cmd, bwrap=shutil.which("bwrap") or "bwrap")
                self._progress(60, N_("Starting JupyterLab in its sandbox"))
            else:
                _warn_without_sandbox(self.log, why_not or "sandbox = off", self._log_name)
                self._check_unsandboxed_access()
                # the same root as JUPYTERHUB_ROOT_DIR, named on the command line as the marker
                cmd.append(f"--ServerApp.root_dir={disk}")
                self._progress(60, N_("Starting JupyterLab (no sandbox)"))
            cmd, preexec = self._launch(cmd, sandboxed, ids_named)
            self.proc = Popen(
                cmd,
                env=env,
                cwd=disk,
                preexec_fn=preexec,
                start_new_session=True,  # own process group: stop signals the whole sandbox
                **self.popen_kwargs,
            )
            self.pid = self.proc.pid
            record = dataclasses.replace(record, pid=self.pid)
            await asyncio.to_thread(write_record, self.data_dir, record)
            self._progress(80, N_("Waiting for JupyterLab to answer"))
            LocalGPUSpawner._waiting_for_port += 1
            try:
                await self._wait_for_port_or_exit(started)
            finally:
                LocalGPUSpawner._waiting_for_port -= 1
            self._warn_over_quota()
            self.last_seen_alive, self.exited_after = int(time.time()), None
        except BaseException:
            if prepared is not None and not self.cgroup_dirs:
                # cancelled (start_timeout) while the host work ran: the thread goes on; the
                # cleanup waits for it (the disk still locked) to know the cgroups it made
                if not prepared.done():
                    try:
                        await asyncio.wait({prepared})  # which never cancels `prepared`
                    except asyncio.CancelledError:
                        pass  # cancelled again: clean up all the same, then re-raise
                self.cgroup_dirs = self._cgroups_made(prepared)
            disk_lock.release()
            if self.proc is not None and self.proc.poll() is None:
                await self._signal(signal.SIGKILL)
            await self._release(self.pid)
            raise
        return (self.ip or "127.0.0.1", self.port)

    def _cgroups_made(self, prepared: asyncio.Future) -> list[str]:
        """The cgroups `_prepare_host` made, once it has ended; if it still runs (a start
        cancelled twice), they are removed when it ends."""

        def made(future: asyncio.Future) -> list[str]:
            if future.cancelled() or future.exception() is not None:
                return []
            limits = future.result()[2]
            return [] if limits is None else list(limits[0])

        if prepared.done():
            return made(prepared)

        def remove_late(future: asyncio.Future) -> None:
            dirs = made(future)
            if dirs:  # off the loop; the executor holds the work until it is done
                asyncio.get_running_loop().run_in_executor(None, cgroups.remove, dirs)

        prepared.add_done_callback(remove_late)
        return []

    async def _stop_leftover(self) -> None:
        """Stop what runs of an earlier start of this server that the hub lost track of,
        so that it never shares GPUs with the new one; refuse the spawn if that fails."""
        record = await asyncio.to_thread(read_record, self.data_dir, self.owner_key)
        if record is None:
            return
        if not await asyncio.to_thread(stop_recorded_server, record, self.log):
            self.log.error(
                "Could not stop the processes of an earlier %s; keeping GPUs %s allocated",
                self._log_name,
                list(record.gpu_indices),
            )
            raise web.HTTPError(
                500,
                "%s",
                _(
                    "An earlier server of yours is still running and could not be stopped;"
                    " ask the operator (the hub's log names it)."
                ),
                reason="Earlier server still running",
            )
        await asyncio.to_thread(forget_server, self.data_dir, record, self.log)

    def _prepare_host(
        self, choice: Choice, sandboxed: bool, groups: list[SharedGroup]
    ) -> tuple[str, GroupFolders, tuple[list[str], int] | None]:
        """What a start makes on the host before the server runs (blocking): the disk, the
        group folders' mount points and the server's cgroups; the disk, the folders and
        (cgroup folders, OOM kills so far), None without limits."""
        disk = self._prepare_disk(sandboxed)
        folders = self._prepare_group_folders(disk, sandboxed, groups)
        return disk, folders, self._make_cgroups(choice)

    def _make_cgroups(self, choice: Choice) -> tuple[list[str], int] | None:
        """Make the server's cgroups with its profile's limits (blocking): their folders and
        the OOM kills counted in them so far; None when the server runs without limits
        (an HTTP error when `resource_limits = cgroup` and they cannot be made)."""
        layout, why = resource_limits_status(self.resource_limits)
        if layout is None:
            if self.resource_limits == "cgroup":
                raise web.HTTPError(
                    500,
                    "%s",
                    _(
                        "CPU and memory limits are required (resource_limits = cgroup) but this"
                        " host cannot set them: %(why)s",
                        why=why,
                    ),
                    reason="No resource limits",
                )
            _warn_without_limits(self.log, why)
            return None
        dirs = list(layout.server_dirs(self.cgroup_name))
        try:
            cgroups.create(layout, self.cgroup_name, choice.cpu, choice.memory_gib * GIB)
            return dirs, cgroups.oom_kills(dirs)
        except OSError as e:
            try:
                left = cgroups.remove(dirs)
            except OSError as removing:
                left = [f"{dirs} ({removing})"]
            if left:
                self.log.warning("Could not remove the cgroups %s of %s", left, self._log_name)
            if self.resource_limits == "cgroup":
                raise web.HTTPError(
                    500,
                    "%s",
                    _("Could not set the server's CPU and memory limits: %(error)s", error=e),
                ) from None
            self.log.warning(
                "Starting %s WITHOUT CPU/memory limits: its cgroup failed: %s", self._log_name, e
            )
            return None

    def _write_start_files(
        self, record: ServerRecord, sandboxed: bool, folders: GroupFolders
    ) -> tuple[dict[str, str], bool]:
        """The last files before the server runs (blocking): the sandbox's /etc/passwd and
        /etc/group, and the server's record; and whether the host names a user or group
        like one of the server's ids (`_launch`)."""
        files = self._write_identity_files(folders.names) if sandboxed else {}
        write_record(self.data_dir, record)
        ids_named = False
        if not sandboxed and self.run_as is not None:
            ids_named = named_like_ids(*self.run_as, tuple(self.group_gids))
        return files, ids_named

    def _launch(
        self, cmd: list[str], sandboxed: bool, ids_named: bool = False
    ) -> tuple[list[str], Callable | None]:
        """The command that starts the server, and a preexec function if one is still needed.

        Before the server runs, the child enters the server's cgroups (as the hub's user) and,
        without the sandbox, becomes the server's user. Exec'd programs do both (`sh`, then
        `setpriv`) rather than a preexec function, so that Popen can vfork: a fork copies the
        hub's page tables, and every page the hub writes afterwards faults (a twentieth of
        the hub's CPU in a burst of 200 starts, bench/spawn_burst.py). Where `setpriv` is
        missing, or the host names a user or group like one of the server's ids
        (`ids_named`: setpriv looks its numbers up as names first), the preexec function
        does it, by number.
        """
        drop = None if sandboxed else self.run_as
        setpriv = shutil.which("setpriv", path="/usr/bin:/bin") if drop else None
        if drop and (not setpriv or ids_named):
            steps = [cgroups.joiner(self.cgroup_dirs)] if self.cgroup_dirs else []
            steps.append(self._drop_privileges_fn())

            def preexec():
                for step in steps:
                    step()

            return cmd, preexec
        if drop:
            uid, gid = drop
            cmd = [*become_user(setpriv, uid, gid, self.group_gids), *cmd]
        if self.cgroup_dirs:
            cmd = [*cgroups.enter_command(self.cgroup_dirs), *cmd]
        return cmd, None

    async def _wait_for_port_or_exit(self, started: float) -> None:
        """Return once the server listens; fail with a clear message if it exits first,
        or if it does not listen before JupyterHub's `start_timeout` (counted from
        `started`, a monotonic time) would end the start with a bare TimeoutError, which a
        person reads as "Spawn failed:" and nothing after it.
        """
        ip = self.ip or "127.0.0.1"
        deadline = started + self.start_timeout - START_TIMEOUT_MARGIN_SECONDS
        delay = PORT_WAIT_FIRST_SECONDS
        while True:
            if time.monotonic() > deadline:
                raise web.HTTPError(
                    503,
                    "%s",
                    _(
                        "JupyterLab did not answer within %(seconds)s seconds: this machine"
                        " may be busy. Your files are kept; start again in a minute, or ask"
                        " the operator.",
                        seconds=self.start_timeout,
                    ),
                    reason="Server did not answer",
                )
            status = self.proc.poll()
            if status == cgroups.ENTER_FAILED and self.cgroup_dirs:
                self.log.error(
                    "%s could not enter its cgroups %s", self._log_name, self.cgroup_dirs
                )
                raise web.HTTPError(
                    500,
                    "%s",
                    _(
                        "The server could not be given its CPU and memory limits; ask the"
                        " operator (the hub's log names the cgroups)."
                    ),
                    reason="No resource limits",
                )
            if status is not None and not await self._signal(0):
                raise web.HTTPError(
                    500,
                    "%s",
                    _(
                        "The server exited during start-up (status %(status)s); the hub's log has"
                        " its output.",
                        status=status,
                    ),
                    reason="Server exited",
                )
            if await accepts_connections(ip, self.port):
                return
            # backing off to half a second: ten tries a second for each of a burst's 200
            # starting servers was a tenth of the hub's CPU (bench/spawn_burst.py); never
            # past the deadline, so that a start that runs out says why
            await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            busy = LocalGPUSpawner._waiting_for_port >= PORT_WAIT_BUSY_STARTS
            longest = PORT_WAIT_BUSY_MAX_SECONDS if busy else PORT_WAIT_MAX_SECONDS
            delay = min(delay * PORT_WAIT_BACKOFF, longest)

    def _profile_env(self, choice: Choice, gpus: list[Gpu], sandboxed: bool) -> dict[str, str]:
        environment = self.catalog.environment_of(choice)
        env = {
            "METERHUB_PROFILE": choice.profile.slug,
            "METERHUB_ENVIRONMENT": environment.slug,
            "METERHUB_GPUS": str(choice.gpus),
            "METERHUB_PUBLIC_DIR": self.pool_mount_path if sandboxed else self.pool_dir,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # how long its kernels get to exit on SIGTERM before this spawner kills them
            "METERHUB_STOP_GRACE_SECONDS": str(self.stop_grace_seconds),
        }
        env.update(visible_devices_env(gpus))
        env.update(self.catalog.idle_env(choice.profile.slug))
        return env

    def user_env(self, env):
        return server_user_env(env, "jovyan", self.disk_mount_path, self.env_prefix)

    # ------------------------------------------------------------------ disk

    @property
    def disk_path(self) -> str:
        return os.path.join(self.disk_root, disk_dirname(self.user.name))

    @property
    def disk_archive_dir(self) -> str:
        return disk_archive.archive_dir(self.data_dir, disk_dirname(self.user.name))

    async def _claim_disk(self, lock: disk_archive.DiskLock) -> None:
        """Hold the disk's lock (waiting out an archiving in progress) until the server's
        record names the disk; put an archived disk back; start measuring it against the
        quota (never waited for under the lock: see `_warn_over_quota`). A disk that cannot
        be restored fails the spawn: never a start on an empty disk."""
        folder = self.disk_archive_dir

        def take() -> tuple[bool, disk_archive.Archived | None]:
            # the lock and, once held, whether the disk is archived: one thread hop
            if not lock.acquire():
                return False, None
            return True, disk_archive.archived(folder)

        try:
            taken, marker = await asyncio.to_thread(take)
            if not taken:
                self._progress(30, N_("Waiting for your disk's archiving to finish"))
                while not taken:
                    await asyncio.sleep(DISK_LOCK_POLL_SECONDS)
                    taken, marker = await asyncio.to_thread(take)
            if marker is not None:
                size = disk_archive.gib(marker.disk_bytes)
                self._progress(
                    30,
                    N_("Restoring your disk (%(size)s archived on %(day)s)…"),
                    size=size,
                    day=marker.day,
                )
                await asyncio.to_thread(
                    disk_archive.restore_idle, self.disk_path, folder, self.run_as
                )
                self._progress(35, N_("Restored your disk"))
        except disk_archive.ArchiveError as e:
            self.log.error("Cannot restore the disk of %s: %s", self._log_name, e)
            raise web.HTTPError(
                500,
                "%s",
                _(
                    "Your disk is archived and could not be restored: %(error)s. Nothing was"
                    " started; your files stay in the archive. Ask the operator (`meterhub disk"
                    " restore`).",
                    error=e,
                ),
            ) from None
        if self.disk_quota_gib is not None:
            # one walk a disk, shared with the Wallet page; it goes on while the server starts
            self._disk_size = disk_archive.measure(self.disk_path)

    _disk_size: concurrent.futures.Future | None = None

    def _warn_over_quota(self) -> None:
        """Once the server answers: a progress message when the disk holds more than
        `disk_quota_gib`, if the walk `_claim_disk` started has ended by then (a bigger
        disk is measured on, unwaited, for the Wallet page)."""
        measuring, self._disk_size = self._disk_size, None
        quota = self.disk_quota_gib
        if measuring is None or quota is None:
            return
        if not measuring.done():
            self.log.info("%s: the disk is still being measured; no quota check", self._log_name)
            return
        if measuring.exception() is not None:
            self.log.warning(
                "%s: cannot measure the disk: %s", self._log_name, measuring.exception()
            )
            return
        size = measuring.result()
        if size > quota * GIB:
            self._progress(
                90,
                N_(
                    "Your disk holds %(size)s, over the site's %(quota)s GiB quota: please delete"
                    " what you no longer need (the server starts anyway)"
                ),
                size=disk_archive.gib(size),
                quota=format(quota, "g"),
            )

    def _prepare_disk(self, sandboxed: bool) -> str:
        os.makedirs(self.data_dir, exist_ok=True)
        # the hub's databases and secrets: only servers without the sandbox running as
        # their own uids must traverse it to reach their disks (the hub logs it at start)
        os.chmod(self.data_dir, 0o711 if not sandboxed and self.run_as else 0o700)
        os.makedirs(self.disk_root, exist_ok=True)
        # traversable, not listable: nobody sees who else has a disk
        os.chmod(self.disk_root, 0o711)
        disk = self.disk_path
        created = not os.path.isdir(disk)
        os.makedirs(disk, mode=0o700, exist_ok=True)
        run_as = self.run_as
        if run_as and created:
            os.chown(disk, *run_as)
        os.chmod(disk, 0o700)
        if created:
            self._copy_starter_notebooks(disk, run_as)
        if self.pool_dir:
            link = os.path.join(disk, "public")
            target = self.pool_mount_path if sandboxed else self.pool_dir
            if os.path.islink(link) and os.readlink(link) != target:
                os.unlink(link)
            if not os.path.lexists(link):
                os.symlink(target, link)
                if run_as:
                    os.lchown(link, *run_as)
            elif not os.path.islink(link):
                self.log.warning("%s has its own 'public' entry; not linking the pool", disk)
        return disk

    @property
    def shared_root(self) -> str:
        """The host folder of the groups' shared folders."""
        return os.path.join(self.data_dir, "shared")

    def group_gid(self, group: SharedGroup) -> int | None:
        """The gid a group's folder belongs to; None when servers run as the hub's user."""
        return None if self.run_as is None else self.group_gid_base + group.id

    def shared_groups(self) -> list[SharedGroup]:
        """The user's groups with a shared folder, read from the hub user now (the hub's
        ORM: on the event loop's thread)."""
        return shared_folder_groups(self.user, self.log) if self.group_folders else []

    def _prepare_group_folders(
        self, disk: str, sandboxed: bool, groups: list[SharedGroup]
    ) -> GroupFolders:
        """The folders of `groups` (`shared_groups`) and their mount points on the disk
        (blocking)."""
        root = self.shared_root
        if groups:
            os.makedirs(root, mode=0o700, exist_ok=True)
            # servers outside the sandbox, as uids of their own, open the folders by path
            os.chmod(root, 0o711 if self.run_as and not sandboxed else 0o700)
        for group in groups:
            prepare_group_folder(os.path.join(root, group.name), self.group_gid(group), self.log)
        wanted = {g.name: "" if sandboxed else os.path.join(root, g.name) for g in groups}
        ready = set(prepare_mount_points(disk, wanted, self.run_as, root, self.log))
        mounted = [g for g in groups if g.name in ready]
        if mounted:
            self.log.info(
                "%s gets the shared folders of %s", self._log_name, [g.name for g in mounted]
            )
        inside = os.path.join(self.disk_mount_path, "shared")
        gids = [(self.group_gid(g), g.name) for g in mounted]
        return GroupFolders(
            binds=tuple(
                (os.path.join(root, g.name), os.path.join(inside, g.name))
                for g in mounted
                if sandboxed
            ),
            gids=tuple(gid for gid, _name in gids if gid is not None),
            names=tuple((gid, name) for gid, name in gids if gid is not None),
        )

    def _copy_starter_notebooks(self, disk: str, run_as) -> None:
        """A new disk starts with the starter notebooks (a copy: the user's to change),
        stamped with the server's kernel so that JupyterLab opens them unmodified."""
        if not os.path.isdir(self.starter_notebooks_dir):
            return
        language_info = kernel_language_info(self.env_prefix)
        for target in copy_starters(self.starter_notebooks_dir, disk, language_info):
            if run_as:
                os.chown(target, *run_as)

    def _write_identity_files(self, groups: Iterable[tuple[int, str]] = ()) -> dict[str, str]:
        """/etc/passwd and /etc/group naming the server's uid and its groups' gids, so tools
        that look them up work."""
        uid, gid = self.run_as or (os.getuid(), os.getgid())
        run_dir = os.path.join(self.data_dir, "run", disk_dirname(self.user.name))
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        files = {
            "/etc/passwd": (
                "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                f"jovyan:x:{uid}:{gid}:{self.user.name}:{self.disk_mount_path}:/bin/bash\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
            "/etc/group": f"root:x:0:\njovyan:x:{gid}:\nnogroup:x:65534:\n"
            + "".join(f"{name}:x:{group_gid}:jovyan\n" for group_gid, name in groups),
        }
        paths = {}
        for inside, text in files.items():
            path = os.path.join(run_dir, os.path.basename(inside))
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)
            paths[inside] = path
        return paths

    def _drop_privileges_fn(self):
        run_as = self.run_as
        if run_as is None:
            return None
        uid, gid = run_as
        supplementary = list(self.group_gids)

        def drop():
            os.setgroups(supplementary)
            os.setgid(gid)
            os.setuid(uid)

        return drop

    def _check_unsandboxed_access(self) -> None:
        """Without a sandbox the dropped uid must reach the environment; say so clearly."""
        if self.run_as is None:
            return
        for path in environment_paths(self.env_prefix):
            parts = os.path.realpath(path).split(os.sep)
            for i in range(2, len(parts) + 1):
                prefix = os.sep.join(parts[:i])
                if not os.stat(prefix).st_mode & 0o001:
                    raise web.HTTPError(
                        500,
                        "%s",
                        _(
                            "Servers run as uid %(uid)s but %(prefix)s is not traversable by"
                            " other users, so the environment %(path)s cannot run. Install"
                            " bubblewrap (the sandbox binds it in) or use a world-readable"
                            " Python.",
                            uid=self.run_as[0],
                            prefix=prefix,
                            path=path,
                        ),
                    )

    # ------------------------------------------------------------------ lifecycle

    async def _signal(self, sig):
        """Signal the server's whole process group (the sandbox and what runs inside it)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    async def poll(self):
        # reaps the bwrap monitor so it does not linger as a zombie, too
        leader_status = self.proc.poll() if self.proc is not None else None
        if not self.pid:
            self.clear_state()
            return 0
        if self.proc is not None and self.proc.pid == self.pid and leader_status is None:
            # the group's leader is our own child and runs: a waitpid(WNOHANG) says so, as
            # in stock's LocalProcessSpawner, without a thread hop and a read of /proc (most
            # of a burst's polls, bench/spawn_burst.py); cgroupfs answers from memory
            alive, oom_kills = True, cgroups.oom_kills(self.cgroup_dirs)
        else:
            alive, oom_kills = await asyncio.to_thread(self._probe)
        over_memory = oom_kills > self.oom_baseline
        if alive and not over_memory:
            self.last_seen_alive = int(time.time())
            if self.server is not None:  # adopted after a hub restart: its port is taken
                ports, owner = LocalGPUSpawner._ports, self.owner_key
                if owner not in ports.port_of:
                    ports.take(self.server.port, owner)
            return None
        if over_memory:
            # v2 (memory.oom.group) has killed the whole server; v1 killed one process
            # (usually the kernel) and left the rest running: a server over its limit stops
            # as a whole, as a Kubernetes container does
            self.log.error(
                "%s went over its memory limit of %s GiB (the OOM killer killed a process in"
                " it); %s",
                self._log_name,
                self.choice.memory_gib if self.choice else "?",
                "stopping the whole server" if alive else "the server is gone",
            )
        if alive:
            self.last_seen_alive = int(time.time())
            await self._signal(signal.SIGKILL)
        # found dead: billing charges it only until it was last seen running
        self.exited_after = self.last_seen_alive
        self.exited_unseen = self.last_seen_alive is None
        # JupyterHub does not call stop() for a server it finds dead: release it here
        await self._release(self.pid)
        status = self.proc.poll() if self.proc is not None else 0
        self.clear_state()
        return status if status is not None else 0

    def _probe(self) -> tuple[bool, int]:
        """Whether the server's process group has a live member; its cgroups' OOM kills."""
        return group_has_live_members(self.pid), cgroups.oom_kills(self.cgroup_dirs)

    async def stop(self, now=False):
        """SIGTERM (with SIGCONT) to the server's process group, up to `stop_grace_seconds`
        for it to exit, then SIGKILL; `now`: SIGKILL at once. No SIGINT first, unlike
        LocalProcessSpawner: it would interrupt running cells before they checkpoint."""
        if self.pid and await self.poll() is None:
            if not now and self.stop_grace_seconds:
                self.log.info(
                    "Stopping %s: SIGTERM, then SIGKILL after %s s",
                    self._log_name,
                    self.stop_grace_seconds,
                )
                await self._signal(signal.SIGTERM)
                await self._signal(signal.SIGCONT)  # a stopped process handles it once continued
                await self._wait_for_exit(self.stop_grace_seconds)
            if self.pid and await self.poll() is None:
                if not now and self.stop_grace_seconds:
                    self.log.warning(
                        "%s did not exit within %s s of SIGTERM: killing it",
                        self._log_name,
                        self.stop_grace_seconds,
                    )
                await self._signal(signal.SIGKILL)
                await self._wait_for_exit(KILL_TIMEOUT_SECONDS)
        if self.pid and await asyncio.to_thread(group_has_live_members, self.pid):
            self.log.error(
                "%s did not die; keeping GPUs %s allocated", self._log_name, self.gpu_indices
            )
            return
        await self._release(self.pid)

    async def _wait_for_exit(self, timeout: float) -> bool:
        """Poll (which releases a server it finds gone) until it is gone or `timeout` seconds
        have passed; True when gone. Every 0.2 s: a stopped server's charge ends when it
        was last seen running, so a late look would charge for time it was not running."""
        deadline = time.monotonic() + timeout
        while await self.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    async def _release(self, pgid: int) -> None:
        """After the server's process group was told to die: once nothing of it runs, remove
        its cgroups and record and release its GPUs; if something survives, keep them."""
        if await asyncio.to_thread(self._wait_until_gone, pgid):
            released = await asyncio.to_thread(self.allocator.release, self.owner_key)
            if released:
                self.log.info("Released GPUs %s of %s", released, self._log_name)
            self.gpu_indices = []
        else:
            self.log.error(
                "Processes of %s survived SIGKILL; keeping GPUs %s allocated",
                self._log_name,
                self.gpu_indices,
            )

    def _wait_until_gone(self, pgid: int, timeout: float = KILL_TIMEOUT_SECONDS) -> bool:
        """Blocking half of `_release`. Processes in the server's cgroups that left its
        process group (`setsid`, a kernel started in a session of its own) are killed too."""
        record = read_record(self.data_dir, self.owner_key)
        dirs = list(dict.fromkeys([*self.cgroup_dirs, *(record.cgroups if record else ())]))
        deadline = time.monotonic() + timeout
        while True:
            rest = _live(cgroups.members(dirs))
            if not rest and not (pgid and group_has_live_members(pgid)):
                break
            if time.monotonic() > deadline:
                return False
            for pid in rest:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        left = cgroups.remove(dirs)
        if left:
            self.log.warning("Could not remove the cgroups %s of %s", left, self._log_name)
        remove_record(self.data_dir, self.owner_key)
        return True

    def get_state(self):
        state = super().get_state()
        if self.gpu_indices:
            state["gpu_indices"] = list(self.gpu_indices)
        if self.cgroup_dirs:
            state["cgroups"] = list(self.cgroup_dirs)
            state["oom_baseline"] = self.oom_baseline
        if self.choice is not None:
            state["profile"] = self.choice.user_options
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_indices = list(state.get("gpu_indices", []))
        self.cgroup_dirs = list(state.get("cgroups", []))
        self.oom_baseline = int(state.get("oom_baseline", 0))
        if state.get("profile"):
            try:
                self.choice = self.catalog.parse(state["profile"])
            except (InvalidChoice, ValueError):
                self.choice = None

    def clear_state(self):
        super().clear_state()
        self._forget_port()
        self.proc = None
        self.cgroup_dirs = []
        self.oom_baseline = 0


async def _options_form(spawner: LocalGPUSpawner) -> str:
    reserved = await spawner.current_reservations()
    availability = await asyncio.to_thread(
        spawner.allocator.availability, spawner.user.name, reserved
    )
    environments = await asyncio.to_thread(
        environment_options, spawner.catalog, spawner.environment_refusal
    )
    return render_options_form(
        spawner.catalog, availability, groups=group_names(spawner.user), environments=environments
    )
