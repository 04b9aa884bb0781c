"""The bubblewrap sandbox a local server runs in, as a pure command builder.

Inside: the system read-only, the user's disk read-write at its mount path, the pool
read-only at /public, the shared folders of the user's groups read-write, a private /tmp
and /dev/shm, only the user's GPU device nodes, and nothing of other users or of the hub's
data directory.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

#: system directories bound read-only (when they exist)
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
#: top-level links or directories of a merged-/usr system
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class SandboxSpec:
    disk: str
    disk_mount: str
    pool: str | None
    pool_mount: str
    #: host paths bound read-only at the same path (the server's Python environment)
    ro_paths: tuple[str, ...] = ()
    #: host paths covered by an empty tmpfs if they fall inside a bound path
    hidden: tuple[str, ...] = ()
    #: device nodes bound read-write (the server's GPUs and the NVIDIA control devices)
    devices: tuple[str, ...] = ()
    #: files bound read-only over a path inside: {inside path: host file}
    files: dict[str, str] = field(default_factory=dict)
    #: (uid, gid) to switch to inside, when bwrap itself runs as root
    run_as: tuple[int, int] | None = None
    #: (host path, inside path) bound read-write after the disk (the groups' shared
    #: folders); each inside path's mount point must already exist on the disk
    rw_binds: tuple[tuple[str, str], ...] = ()
    #: supplementary group ids inside, with run_as (the groups whose folders are bound)
    groups: tuple[int, ...] = ()


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _ro_bind_with_parents(path: str) -> list[str]:
    """`path` bound read-only at itself, its parents made first as bwrap would not: 0755,
    traversable by the user (bwrap makes them 0700 root)."""
    parts = path.strip("/").split("/")[:-1]
    args = []
    for i in range(1, len(parts) + 1):
        args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return [*args, "--ro-bind", path, path]


def bwrap_command(spec: SandboxSpec, command: list[str], bwrap: str = "bwrap") -> list[str]:
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "meterhub"]
    bound: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for path in SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    for device in spec.devices:
        args += ["--dev-bind", device, device]
    args += ["--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", "/var"]
    args += ["--perms", "1777", "--dir", "/var/tmp", "--tmpfs", "/home"]
    # /run is hidden (host sockets live there), but name resolution may point into it
    resolv = os.path.realpath("/etc/resolv.conf")
    if _inside(resolv, "/run") and os.path.isfile(resolv):
        args += ["--ro-bind", resolv, resolv]
    # after the private /tmp, /home, ...: the environment may live below one of them
    for path in spec.ro_paths:
        if not any(_inside(path, b) for b in bound):
            args += _ro_bind_with_parents(path)
            bound.append(path)
    covered = [path for path in spec.hidden if any(_inside(path, b) for b in bound)]
    for path in covered:
        args += ["--tmpfs", path]
    # an environment built inside a hidden folder (`<data_dir>/envs/...` when the data
    # directory lies below a bound one, /opt say) is bound again over the tmpfs
    for path in spec.ro_paths:
        if any(_inside(path, h) for h in covered):
            args += _ro_bind_with_parents(path)
    args += ["--bind", spec.disk, spec.disk_mount]
    for host_path, inside in spec.rw_binds:
        args += ["--bind", host_path, inside]
    if spec.pool:
        args += ["--ro-bind", spec.pool, spec.pool_mount]
    for inside, host_file in spec.files.items():
        args += ["--ro-bind", host_file, inside]
    args += ["--chdir", spec.disk_mount]
    if spec.run_as is not None:
        uid, gid = spec.run_as
        # bwrap as root keeps only the two capabilities setpriv needs to become the user;
        # setpriv then drops every capability for good (empty bounding set, no_new_privs).
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
        args += become_user("setpriv", uid, gid, spec.groups)
    else:
        args += ["--"]
    return args + list(command)


def become_user(setpriv: str, uid: int, gid: int, groups: Iterable[int] = ()) -> list[str]:
    """The start of a command line that runs the rest as `uid`/`gid` with exactly `groups`
    and without any capability, ever (empty bounding set, no_new_privs): setpriv copies the
    effective ids to the saved ones, so nothing can become root again."""
    groups = list(groups)
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


@functools.cache
def bwrap_works(bwrap: str | None = None) -> str:
    """'' if bubblewrap can build a sandbox here, else why not (for the warning)."""
    bwrap = bwrap or shutil.which("bwrap")
    if not bwrap:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv (util-linux) is not installed; it drops root inside the sandbox"
    probe = [bwrap, "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    try:
        result = subprocess.run(probe + ["true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap failed to run: {e}"
    if result.returncode != 0:
        return f"bwrap cannot create a sandbox here: {result.stderr.strip()[:300]}"
    return ""
