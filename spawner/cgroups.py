"""CPU and memory limits for local servers: one cgroup per server, below the hub's own.

Pure parts (read the text of /proc/self/cgroup and /proc/self/mountinfo into a layout; turn
a layout and limits into the writes that set them) are separate from the small I/O helpers
the spawner calls off the event loop: detect, create, join (in the child before exec), read
the OOM-kill count, list and kill members, remove.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: the folder below the hub's own cgroup that holds one cgroup per server
PARENT = "meterhub"
#: where the hub moves itself under cgroup v2 when its own cgroup must become a pure parent
HUB_LEAF = "meterhub-hub"
#: CFS period: a quota of N × this many microseconds is N cores
CPU_PERIOD_US = 100_000
#: controllers a server cgroup needs
CONTROLLERS = ("memory", "cpu")


class CgroupsUnavailable(RuntimeError):
    """This host cannot give servers CPU and memory limits; the message says why."""


@dataclass(frozen=True)
class OwnCgroups:
    """Where the hub's own process sits in each mounted cgroup hierarchy (host paths)."""

    #: the hub's cgroup directory in the unified (v2) hierarchy, if one is mounted
    unified: str | None
    #: v1 controller name -> the hub's cgroup directory in that controller's hierarchy
    v1: dict[str, str]


@dataclass(frozen=True)
class CgroupLayout:
    """Where server cgroups are made: `<memory>/meterhub/<name>` and `<cpu>/meterhub/<name>`.

    Under v2 both are the hub's one unified cgroup; under v1 each is the hub's cgroup in
    that controller's hierarchy (the same directory when the two are mounted together).
    """

    version: int
    memory: str
    cpu: str

    def server_dirs(self, name: str) -> tuple[str, ...]:
        dirs = [os.path.join(self.memory, PARENT, name), os.path.join(self.cpu, PARENT, name)]
        return tuple(dict.fromkeys(dirs))

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 below {self.memory}"
        return f"cgroup v1 (memory below {self.memory}, cpu below {self.cpu})"


# ---------------------------------------------------------------------------- pure


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _below(path: str, root: str) -> str | None:
    """`path` (a cgroup path as /proc/self/cgroup names it) relative to a mount's root."""
    if root == "/":
        return path
    if path == root:
        return "/"
    if path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) :]
    return None


def own_cgroups(self_cgroup: str, mountinfo: str) -> OwnCgroups:
    """Join the text of /proc/self/cgroup with /proc/self/mountinfo: the hub's directories."""
    paths_v1: dict[str, str] = {}
    path_v2: str | None = None
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            path_v2 = path
        else:
            for controller in controllers.split(","):
                paths_v1[controller] = path
    unified = None
    v1: dict[str, str] = {}
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        if not sep:
            continue
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint = _unescape(fields[3]), _unescape(fields[4])
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup2" and unified is None and path_v2 is not None:
            rel = _below(path_v2, root)
            if rel is not None:
                unified = os.path.normpath(mountpoint + rel)
        elif fstype == "cgroup":
            for controller in options:
                if controller in paths_v1 and controller not in v1:
                    rel = _below(paths_v1[controller], root)
                    if rel is not None:
                        v1[controller] = os.path.normpath(mountpoint + rel)
    return OwnCgroups(unified, v1)


def choose_layout(own: OwnCgroups, unified_controllers: str = "") -> CgroupLayout:
    """v2 when the unified hierarchy offers memory and cpu to the hub's cgroup (the text of
    its `cgroup.controllers`), else v1 when both controllers are mounted; else why not."""
    offered = set(unified_controllers.split())
    if own.unified and all(c in offered for c in CONTROLLERS):
        return CgroupLayout(2, own.unified, own.unified)
    if all(c in own.v1 for c in CONTROLLERS):
        return CgroupLayout(1, own.v1["memory"], own.v1["cpu"])
    missing = [c for c in CONTROLLERS if c not in own.v1 and c not in offered]
    if own.unified:
        raise CgroupsUnavailable(
            f"the unified cgroup hierarchy does not offer {' and '.join(missing)} to the"
            f" hub's cgroup {own.unified}, and no cgroup v1 hierarchy has them"
        )
    raise CgroupsUnavailable(
        f"no mounted cgroup hierarchy has the {' and '.join(missing)} controller"
    )


def parse_layout(self_cgroup: str, mountinfo: str, unified_controllers: str = "") -> CgroupLayout:
    """The layout for the texts of /proc/self/cgroup, /proc/self/mountinfo and the hub's
    unified `cgroup.controllers`; CgroupsUnavailable says why there is none."""
    return choose_layout(own_cgroups(self_cgroup, mountinfo), unified_controllers)


def limit_writes(
    layout: CgroupLayout, name: str, cpu: float, memory_bytes: int
) -> list[tuple[str, str]]:
    """The (file, value) writes that limit server cgroup `name` to `cpu` cores and
    `memory_bytes` of memory, in order."""
    quota = max(1000, round(cpu * CPU_PERIOD_US))
    memory_dir = os.path.join(layout.memory, PARENT, name)
    cpu_dir = os.path.join(layout.cpu, PARENT, name)
    if layout.version == 2:
        return [
            (os.path.join(memory_dir, "memory.max"), str(memory_bytes)),
            # an OOM kill takes the whole server, not one process of it
            (os.path.join(memory_dir, "memory.oom.group"), "1"),
            (os.path.join(cpu_dir, "cpu.max"), f"{quota} {CPU_PERIOD_US}"),
        ]
    return [
        (os.path.join(memory_dir, "memory.limit_in_bytes"), str(memory_bytes)),
        (os.path.join(cpu_dir, "cpu.cfs_period_us"), str(CPU_PERIOD_US)),
        (os.path.join(cpu_dir, "cpu.cfs_quota_us"), str(quota)),
    ]


def parse_oom_kills(text: str) -> int:
    """The `oom_kill N` count of v1 `memory.oom_control` or v2 `memory.events`."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


# ---------------------------------------------------------------------------- I/O
# All blocking: call them off the hub's event loop (`asyncio.to_thread`).


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def detect(proc: str = "/proc") -> CgroupLayout:
    """The layout this hub can use, after checking that it can really make server cgroups
    there; else CgroupsUnavailable. It leaves nothing behind but, under v2, what cgroup v2
    needs: the hub in a leaf of its own and memory and cpu handed down below its cgroup."""
    try:
        self_cgroup = _read(f"{proc}/self/cgroup")
        mountinfo = _read(f"{proc}/self/mountinfo")
    except OSError as e:
        raise CgroupsUnavailable(f"cannot read the hub's cgroups: {e}") from None
    own = own_cgroups(self_cgroup, mountinfo)
    controllers = ""
    if own.unified:
        try:
            controllers = _read(os.path.join(own.unified, "cgroup.controllers"))
        except OSError:
            controllers = ""
    layout = choose_layout(own, controllers)
    if layout.version == 2:
        probes = [(layout.memory, ("memory.max", "memory.oom.group", "cpu.max"))]
    else:
        probes = [
            (layout.memory, ("memory.limit_in_bytes", "memory.oom_control")),
            (layout.cpu, ("cpu.cfs_quota_us", "cpu.cfs_period_us")),
        ]
    try:
        if layout.version == 2:
            _prepare_v2(layout.memory)
        for directory, files in probes:
            parent = os.path.join(directory, PARENT)
            made = not os.path.isdir(parent)
            os.makedirs(parent, exist_ok=True)
            if layout.version == 2:
                _enable(parent)
            try:
                probe = os.path.join(parent, f"probe-{os.getpid()}")
                os.makedirs(probe, exist_ok=True)
                try:
                    missing = [f for f in files if not os.access(os.path.join(probe, f), os.W_OK)]
                finally:
                    os.rmdir(probe)
            finally:
                if made:
                    _rmdir_quietly(parent)
            if missing:
                raise CgroupsUnavailable(
                    f"a cgroup below {parent} has no writable {', '.join(missing)}"
                )
    except OSError as e:
        raise CgroupsUnavailable(
            f"cannot create server cgroups ({layout.describe()}): {e}"
        ) from None
    return layout


def _rmdir_quietly(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # in use (other servers' cgroups are in it) or gone


def _enable(directory: str) -> None:
    _write(
        os.path.join(directory, "cgroup.subtree_control"), " ".join(f"+{c}" for c in CONTROLLERS)
    )


def _prepare_v2(own: str) -> None:
    """Let `<own>/meterhub/*` have memory and cpu. cgroup v2 lets only a cgroup without
    processes of its own hand controllers to children, so the hub first moves itself into a
    leaf `<own>/meterhub-hub` (what a systemd service with Delegate=yes is meant for)."""
    try:
        _enable(own)
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
        leaf = os.path.join(own, HUB_LEAF)
        os.makedirs(leaf, exist_ok=True)
        _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        try:
            _enable(own)
        except OSError as again:
            if again.errno != errno.EBUSY:
                raise
            raise CgroupsUnavailable(
                f"the hub's cgroup {own} holds other processes too, so cgroup v2 cannot hand"
                " memory and cpu to server cgroups below it; run the hub as a systemd service"
                " with Delegate=yes (and KillMode=process, so servers outlive a hub restart)"
            ) from None
    parent = os.path.join(own, PARENT)
    os.makedirs(parent, exist_ok=True)
    _enable(parent)


def create(layout: CgroupLayout, name: str, cpu: float, memory_bytes: int) -> tuple[str, ...]:
    """Make server cgroup `name` with its limits (again, if it is left over); its folders."""
    dirs = layout.server_dirs(name)
    for directory in dirs:
        try:
            os.makedirs(directory, exist_ok=True)
        except FileNotFoundError:  # the last server's stop just removed the parent
            os.makedirs(directory, exist_ok=True)
        if layout.version == 2:
            _enable(os.path.dirname(directory))
    for path, value in limit_writes(layout, name, cpu, memory_bytes):
        _write(path, value)
    return dirs


def joiner(dirs: Iterable[str]) -> Callable[[], None]:
    """A preexec function: the child enters the server's cgroups before it execs, so bwrap
    and everything below it are inside from the first instruction. Writing 0 to
    `cgroup.procs` moves the writing process."""
    paths = [os.path.join(d, "cgroup.procs").encode() for d in dirs]

    def join() -> None:
        for path in paths:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    return join


#: the exit status of `enter_command`'s shell when it cannot enter a cgroup
ENTER_FAILED = 125
#: `sh -c` script: the shell writes 0 (itself) into each of the first $1 arguments (existing
#: cgroup.procs files, never made here), then execs the rest; ENTER_FAILED if it cannot
_ENTER = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do [ -e "$1" ] && echo 0 >"$1" || exit 125;'
    ' n=$((n - 1)); shift; done; exec "$@"'
)


def enter_command(dirs: Iterable[str]) -> list[str]:
    """The start of a command line that runs the rest inside these cgroups from its first
    instruction, as `joiner` does, but in an exec'd shell instead of a preexec function
    (which rules out vfork)."""
    paths = [os.path.join(d, "cgroup.procs") for d in dirs]
    return ["/bin/sh", "-c", _ENTER, "sh", str(len(paths)), *paths]


def oom_kills(dirs: Iterable[str]) -> int:
    """How many processes the OOM killer killed in these cgroups (0 when they are gone)."""
    total = 0
    for directory in dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                total += parse_oom_kills(_read(os.path.join(directory, name)))
                break
            except FileNotFoundError:
                continue
            except OSError:
                break
    return total


def members(dirs: Iterable[str]) -> set[int]:
    """Process ids in these cgroups (none when they are gone)."""
    pids: set[int] = set()
    for directory in dirs:
        try:
            pids.update(int(p) for p in _read(os.path.join(directory, "cgroup.procs")).split())
        except OSError:
            continue
    return pids


def kill_members(dirs: Iterable[str], sig: int = signal.SIGKILL) -> set[int]:
    """Signal every process in these cgroups; the ids signalled."""
    signalled = set()
    for pid in members(dirs):
        try:
            os.kill(pid, sig)
            signalled.add(pid)
        except ProcessLookupError:
            pass
    return signalled


def remove(dirs: Iterable[str], timeout: float = 5.0) -> list[str]:
    """Remove these (empty) cgroups, retrying while the last members exit; those left.

    Their `meterhub` parents go too once no server cgroup is left in them: an empty child
    would keep whoever manages the hub's own cgroup from removing it.
    """
    dirs = list(dirs)
    left = list(dirs)
    deadline = time.monotonic() + timeout
    while left:
        still = []
        for directory in left:
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                still.append(directory)
        left = still
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for parent in dict.fromkeys(os.path.dirname(d) for d in dirs):
        _rmdir_quietly(parent)
    return left
