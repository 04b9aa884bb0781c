"""LocalGPUSpawner: single-user servers as local processes with exclusive GPUs.

Each server runs unprivileged in a bubblewrap sandbox that shows only its own disk,
the pool read-only at /public and its own GPU device nodes. GPUs are allocated from a
persistent table, so a hub restart that keeps servers running never hands one out twice.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import shutil
import signal
import sys
import time
from subprocess import Popen

from escapism import escape
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import maybe_future, random_port
from tornado import web
from traitlets import Any, Dict, Enum, Int, List, Unicode, default

from .allocator import GpuAllocator, NotEnoughGpus
from .catalog import Choice, InvalidChoice
from .form import render_options_form
from .inventory import Gpu, declared_inventory, detect_inventory, device_nodes, visible_devices_env
from .options import CatalogOptions, group_names
from .sandbox import SandboxSpec, bwrap_command, bwrap_works

SAFE_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


@functools.cache
def _detected_inventory() -> tuple[Gpu, ...]:
    return tuple(detect_inventory())


@functools.cache
def _allocator(db_path: str, inventory: tuple[Gpu, ...]) -> GpuAllocator:
    return GpuAllocator(db_path, list(inventory))


def environment_paths(prefix: str) -> list[str]:
    """Host paths a Python environment needs: itself and, for a venv, its base interpreter."""
    candidates = [prefix]
    try:
        with open(os.path.join(prefix, "pyvenv.cfg")) as f:
            for line in f:
                key, _, value = line.partition("=")
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
    """
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def starter_notebooks() -> str:
    """The folder of the starter notebooks meterhub ships (`meterhub.notebooks`, data only)."""
    spec = importlib.util.find_spec("meterhub.notebooks")
    folders = [p for p in (spec.submodule_search_locations or []) if os.path.isdir(p)]
    return folders[0] if folders else ""


def disk_dirname(username: str) -> str:
    """A user's disk folder name: stable, filesystem-safe and collision-free."""
    return escape(username, safe=SAFE_NAME_CHARS, escape_char="-")


class LocalGPUSpawner(CatalogOptions, LocalProcessSpawner):
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

    uid_base = Int(
        200000,
        min=1000,
        help="""
        When the hub runs as root, user N's server runs as uid and gid `uid_base + N`,
        where N is the user's JupyterHub id. Choose a range no system account uses.
        Ignored when the hub is not root: servers then run as the hub's own user.
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
        Prefix of the Python environment servers run from (it needs `meterhub[lab]`).
        Default: the hub's own environment.
        """
    ).tag(config=True)

    @default("server_env_prefix")
    def _default_server_env_prefix(self):
        return sys.prefix

    gpu_reservations = Any(
        None,
        help="""
        Optional (async) callable `f(spawner) -> {gpu_type: {user_name: count}}` of GPUs
        reserved for users (e.g. pass holders): what they reserved and do not use is not
        handed to anyone else. The hub sets it from billing; the spawner knows no more.
        """,
    ).tag(config=True)

    async def current_reservations(self) -> dict[str, dict[str, int]]:
        if self.gpu_reservations is None:
            return {}
        return await maybe_future(self.gpu_reservations(self))

    gpu_indices = List(Int())
    #: epoch seconds of the last time start() or poll() found the server alive (this hub run)
    last_seen_alive = Int(None, allow_none=True)
    #: set when poll() finds the server dead: when it was last seen alive (None if unknown)
    exited_after = Int(None, allow_none=True)

    # ------------------------------------------------------------------ inventory

    @property
    def inventory(self) -> tuple[Gpu, ...]:
        if self.gpus is None:
            return _detected_inventory()
        return tuple(declared_inventory(self.gpus))

    @property
    def allocator(self) -> GpuAllocator:
        os.makedirs(self.data_dir, exist_ok=True)
        return _allocator(os.path.join(self.data_dir, "gpu-allocations.sqlite"), self.inventory)

    @property
    def owner_key(self) -> str:
        return f"{self.user.id}/{self.name}"

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

    def _progress(self, percent: int, message: str) -> None:
        self.log.info("%s: %s", self._log_name, message)
        self._events.append({"progress": percent, "message": message})
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
        choice = self.parse_options()
        self.choice = choice
        self._events = []
        why_not = await asyncio.to_thread(bwrap_works) if self.sandbox != "off" else ""
        sandboxed = self.sandbox == "bwrap" or (self.sandbox == "auto" and not why_not)
        if self.sandbox == "bwrap" and why_not:
            raise web.HTTPError(500, f"The sandbox is required but cannot run: {why_not}")

        gpus: list[Gpu] = []
        if not choice.profile.is_debug:
            self._progress(10, f"Allocating {choice.label}")
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
                raise web.HTTPError(409, str(e), reason="GPUs unavailable") from None
            self._progress(25, f"Allocated GPU {', '.join(str(g.index) for g in gpus)}")
        self.gpu_indices = [gpu.index for gpu in gpus]
        try:
            self._progress(40, "Preparing disk")
            disk = await asyncio.to_thread(self._prepare_disk, sandboxed)
            self.cpu_limit = float(choice.cpu)
            self.mem_limit = choice.memory_gib * 1024**3
            self.notebook_dir = self.disk_mount_path if sandboxed else disk
            self.port = self.port or random_port()
            env = self.get_env()
            env.update(self._profile_env(choice, gpus, sandboxed))
            if sandboxed:
                env["HOME"] = self.disk_mount_path
            cmd = [os.path.join(self.server_env_prefix, "bin", "jupyterhub-singleuser")]
            cmd += self.get_args()
            if sandboxed:
                files = await asyncio.to_thread(self._write_identity_files)
                spec = SandboxSpec(
                    disk=disk,
                    disk_mount=self.disk_mount_path,
                    pool=self.pool_dir or None,
                    pool_mount=self.pool_mount_path,
                    ro_paths=tuple(
                        environment_paths(self.server_env_prefix)
                        + server_code_paths(self.server_env_prefix)
                    ),
                    hidden=(os.path.abspath(self.data_dir),),
                    devices=tuple(device_nodes(gpus)),
                    files=files,
                    run_as=self.run_as,
                )
                cmd = bwrap_command(spec, cmd, bwrap=shutil.which("bwrap") or "bwrap")
                self._progress(60, "Starting JupyterLab in its sandbox")
            else:
                self.log.warning(
                    "Starting %s WITHOUT a sandbox (%s): it can see the hub's data directory",
                    self._log_name,
                    why_not or "sandbox = off",
                )
                self._check_unsandboxed_access()
                self._progress(60, "Starting JupyterLab (no sandbox)")
            self.proc = Popen(
                cmd,
                env=env,
                cwd=disk,
                preexec_fn=None if sandboxed else self._drop_privileges_fn(),
                start_new_session=True,  # own process group: stop signals the whole sandbox
                **self.popen_kwargs,
            )
            self.pid = self.proc.pid
            self._progress(80, "Waiting for JupyterLab to answer")
            await self._wait_for_port_or_exit()
            self.last_seen_alive, self.exited_after = int(time.time()), None
        except BaseException:
            if self.proc is not None and self.proc.poll() is None:
                await self._signal(signal.SIGKILL)
            await asyncio.to_thread(self.allocator.release, self.owner_key)
            self.gpu_indices = []
            raise
        return (self.ip or "127.0.0.1", self.port)

    async def _wait_for_port_or_exit(self) -> None:
        """Return once the server listens; fail with a clear message if it exits first.

        JupyterHub would otherwise only notice the exit later, as a generic error.
        """
        ip = self.ip or "127.0.0.1"
        while True:
            status = self.proc.poll()
            if status is not None and not await self._signal(0):
                raise web.HTTPError(
                    500,
                    f"The server exited during start-up (status {status});"
                    " the hub's log has its output.",
                    reason="Server exited",
                )
            try:
                _, writer = await asyncio.open_connection(ip, self.port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            writer.close()
            return

    def _profile_env(self, choice: Choice, gpus: list[Gpu], sandboxed: bool) -> dict[str, str]:
        env = {
            "METERHUB_PROFILE": choice.profile.slug,
            "METERHUB_GPUS": str(choice.gpus),
            "METERHUB_PUBLIC_DIR": self.pool_mount_path if sandboxed else self.pool_dir,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        env.update(visible_devices_env(gpus))
        return env

    def user_env(self, env):
        env["USER"] = "jovyan"
        env["HOME"] = self.disk_mount_path
        env["SHELL"] = "/bin/bash"
        env["PATH"] = os.pathsep.join(
            [os.path.join(self.server_env_prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
        )
        env["JUPYTER_RUNTIME_DIR"] = "/tmp/jupyter-runtime"
        return env

    # ------------------------------------------------------------------ disk

    @property
    def disk_path(self) -> str:
        return os.path.join(self.disk_root, disk_dirname(self.user.name))

    def _prepare_disk(self, sandboxed: bool) -> str:
        for path in (self.data_dir, self.disk_root):
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o711)  # traversable, not listable: users never see who else has a disk
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

    def _copy_starter_notebooks(self, disk: str, run_as) -> None:
        """A new disk starts with the starter notebooks (a copy: the user's to change)."""
        if not os.path.isdir(self.starter_notebooks_dir):
            return
        for name in sorted(os.listdir(self.starter_notebooks_dir)):
            if name.endswith(".ipynb"):
                target = os.path.join(disk, name)
                shutil.copyfile(os.path.join(self.starter_notebooks_dir, name), target)
                if run_as:
                    os.chown(target, *run_as)

    def _write_identity_files(self) -> dict[str, str]:
        """/etc/passwd and /etc/group naming the server's uid, so tools that look it up work."""
        uid, gid = self.run_as or (os.getuid(), os.getgid())
        run_dir = os.path.join(self.data_dir, "run", disk_dirname(self.user.name))
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        files = {
            "/etc/passwd": (
                "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                f"jovyan:x:{uid}:{gid}:{self.user.name}:{self.disk_mount_path}:/bin/bash\n"
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
            "/etc/group": f"root:x:0:\njovyan:x:{gid}:\nnogroup:x:65534:\n",
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

        def drop():
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        return drop

    def _check_unsandboxed_access(self) -> None:
        """Without a sandbox the dropped uid must reach the environment; say so clearly."""
        if self.run_as is None:
            return
        for path in environment_paths(self.server_env_prefix):
            parts = os.path.realpath(path).split(os.sep)
            for i in range(2, len(parts) + 1):
                prefix = os.sep.join(parts[:i])
                if not os.stat(prefix).st_mode & 0o001:
                    raise web.HTTPError(
                        500,
                        f"Servers run as uid {self.run_as[0]} but {prefix} is not traversable"
                        f" by other users, so the environment {path} cannot run. Install"
                        " bubblewrap (the sandbox binds it in) or use a world-readable Python.",
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
        if self.proc is not None:
            self.proc.poll()  # reap the bwrap monitor so it does not linger as a zombie
        if not self.pid:
            self.clear_state()
            return 0
        if await self._signal(0) and await asyncio.to_thread(group_has_live_members, self.pid):
            self.last_seen_alive = int(time.time())
            return None
        # found dead: billing charges it only until it was last seen running
        self.exited_after = self.last_seen_alive
        status = self.proc.returncode if self.proc is not None else 0
        self.clear_state()
        # JupyterHub does not call stop() for a server it finds dead: release its GPUs here
        released = await asyncio.to_thread(self.allocator.release, self.owner_key)
        if released:
            self.log.info("Released GPUs %s of %s, which exited", released, self._log_name)
        self.gpu_indices = []
        return status if status is not None else 0

    async def stop(self, now=False):
        await super().stop(now=now)
        if self.pid and await self._signal(0):
            self.log.error(
                "%s did not die; keeping GPUs %s allocated", self._log_name, self.gpu_indices
            )
            return
        released = await asyncio.to_thread(self.allocator.release, self.owner_key)
        if released:
            self.log.info("Released GPUs %s of %s", released, self._log_name)
        self.gpu_indices = []

    def get_state(self):
        state = super().get_state()
        if self.gpu_indices:
            state["gpu_indices"] = list(self.gpu_indices)
        if self.choice is not None:
            state["profile"] = self.choice.user_options
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_indices = list(state.get("gpu_indices", []))
        if state.get("profile"):
            try:
                self.choice = self.catalog.parse(state["profile"])
            except (InvalidChoice, ValueError):
                self.choice = None

    def clear_state(self):
        super().clear_state()
        self.proc = None


async def _options_form(spawner: LocalGPUSpawner) -> str:
    reserved = await spawner.current_reservations()
    availability = await asyncio.to_thread(
        spawner.allocator.availability, spawner.user.name, reserved
    )
    return render_options_form(spawner.catalog, availability, groups=group_names(spawner.user))
