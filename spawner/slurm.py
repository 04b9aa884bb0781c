"""The Slurm backend: servers as batch jobs on a GPU cluster, through batchspawner.

`SlurmGPUSpawner` is batchspawner's `SlurmSpawner` driven by the one catalog: the choice
becomes `--gres=gpu:<type>:<n>` in the GPU type's partition with CPUs and memory per GPU
from the catalog; debug mode runs in the debug partition with no GPU at all. The job runs
`jupyterhub-singleuser` as the user's cluster account, with the user's disk on the shared
filesystem and `/public` read-only in a bubblewrap sandbox where the node has bubblewrap.
GPU exclusivity is Slurm's. The batch script is built by a pure function (`job_script`),
which `meterhub render-slurm` prints.

batchspawner's own API handler would let any holder of a server's token (its kernels
included) set any attribute of the hub's spawner object; it is replaced by one that
accepts a port and nothing else, from the spawning server's own token, while it spawns.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import pwd
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field

import batchspawner
from batchspawner import JobStatus, SlurmSpawner
from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web
from traitlets import Dict, Float, Int, Unicode, default, validate

from meterhub.i18n import _

from .catalog import Choice
from .local import (
    disk_dirname,
    environment_paths,
    server_code_paths,
    server_user_env,
    starter_notebooks,
)
from .options import FolderEnvironments
from .sandbox import SandboxSpec, bwrap_command

#: what a site may write in `slurm.user_map`
USER_MAP = re.compile(r"\A(same|prefix:[a-z_][a-z0-9_.-]{0,15}|run_as:[a-z_][a-z0-9_.-]{0,31})\Z")
#: a cluster account name (POSIX portable, as useradd takes it)
ACCOUNT_NAME = re.compile(r"\A[a-z_][a-z0-9_.-]{0,31}\Z")
#: Slurm time limits have minute granularity; a job is never given less than this
MIN_TIME_MINUTES = 1
#: where a job's own log goes, on the user's disk
LOG_DIR = ".meterhub"


class SlurmStartError(Exception):
    """A spawn that failed on the cluster, with a message for the user (JupyterHub shows
    `jupyterhub_message` on the spawn page)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.jupyterhub_message = message


def cluster_account(user_name: str, user_map: str) -> str:
    """The cluster account a hub user's jobs run as (`same`, `prefix:<p>`, `run_as:<a>`);
    ValueError when the result cannot name an account."""
    kind, _sep, value = user_map.partition(":")
    account = {"same": user_name, "prefix": value + user_name, "run_as": value}.get(kind, "")
    if not ACCOUNT_NAME.match(account):
        raise ValueError(
            _(
                "the hub user %(user)s maps to %(account)s with slurm.user_map %(map)s, which"
                " cannot name a cluster account",
                user=repr(user_name),
                account=repr(account),
                map=repr(user_map),
            )
        )
    return account


def time_limit_minutes(credit_seconds: int | None, max_minutes: int | None) -> int | None:
    """The job's `--time` in whole minutes: never longer than the credit lasts (rounded
    down), nor than the site's maximum; None when neither limits it."""
    limits = []
    if credit_seconds is not None:
        limits.append(max(MIN_TIME_MINUTES, credit_seconds // 60))
    if max_minutes:
        limits.append(max_minutes)
    return min(limits) if limits else None


def format_time(minutes: int) -> str:
    """Slurm's `days-hours:minutes:00`."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


@dataclass(frozen=True)
class JobSpec:
    """Everything the batch script says; built from the catalog choice and the site."""

    user: str
    choice: Choice
    partition: str
    disk: str
    disk_mount: str
    pool: str
    pool_mount: str
    env_prefix: str
    #: environment variable names the job takes from the submission (their values are the
    #: spawner's environment: the hub's API URL and the server's token among them)
    export: tuple[str, ...]
    command: tuple[str, ...]
    time_minutes: int | None = None
    account: str = ""
    qos: str = ""
    #: auto: bubblewrap where the node has it; bwrap: required; off: never
    sandbox: str = "auto"
    #: paths the sandbox covers with an empty tmpfs (other users' disks)
    hidden: tuple[str, ...] = ()
    #: host paths bound read-only (the server's Python environment, meterhub's code)
    ro_paths: tuple[str, ...] = ()
    starter: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)


def sbatch_options(spec: JobSpec) -> list[str]:
    """The `#SBATCH` options of a job, in order."""
    choice = spec.choice
    options = [
        f"--job-name=meterhub-{spec.user}",
        f"--partition={spec.partition}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={choice.cpu}",
        f"--mem={choice.memory_gib}G",
    ]
    if not choice.profile.is_debug:
        options.append(f"--gres=gpu:{choice.profile.slug}:{choice.gpus}")
    if spec.time_minutes is not None:
        options.append(f"--time={format_time(spec.time_minutes)}")
    if spec.account:
        options.append(f"--account={spec.account}")
    if spec.qos:
        options.append(f"--qos={spec.qos}")
    # the job's own log is written on the user's disk, by the job itself (below): the
    # submitting host may not see the disk, and the disk may not exist yet
    # a requeued job would be charged while pending and come back where the proxy does
    # not point: a job that ends is gone, and the user starts again
    options.append("--no-requeue")
    options += ["--output=/dev/null", f"--export={','.join(spec.export) or 'NONE'}"]
    return options


def job_script(spec: JobSpec) -> str:
    """The batch script of a server: a pure function of its spec."""
    q = shlex.quote
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {option}" for option in sbatch_options(spec)]
    lines += [
        "set -euo pipefail",
        "umask 077",
        f"DISK={q(spec.disk)}",
        # the user's disk, made by the job as the user when it is new
        'new=0; [ -d "$DISK" ] || new=1',
        'mkdir -p "$DISK"; chmod 700 "$DISK"',
        f'mkdir -p "$DISK/{LOG_DIR}"',
        f'exec >>"$DISK/{LOG_DIR}/slurm-${{SLURM_JOB_ID:-0}}.log" 2>&1',
        'echo "meterhub: job ${SLURM_JOB_ID:-?} on $(hostname) as $(id -un)"',
    ]
    if spec.starter:
        lines.append(
            f'if [ "$new" = 1 ]; then cp -n {q(spec.starter)}/*.ipynb "$DISK"/ 2>/dev/null || true; fi'
        )
    for key, value in sorted(spec.extra_env.items()):
        lines.append(f"export {key}={q(value)}")
    if spec.choice.profile.is_debug:
        # debug mode: no GPU, even on a GPU node
        lines += ['export CUDA_VISIBLE_DEVICES=""', "export NVIDIA_VISIBLE_DEVICES=void"]
    command = list(spec.command)
    sandbox = SandboxSpec(
        disk=spec.disk,
        disk_mount=spec.disk_mount,
        pool=spec.pool or None,
        pool_mount=spec.pool_mount,
        ro_paths=spec.ro_paths,
        hidden=spec.hidden,
    )
    bwrap = bwrap_command(sandbox, command, bwrap="bwrap")
    # the node's GPU device nodes go in after bwrap's private /dev (Slurm's cgroup, where
    # the site constrains devices, leaves the job only its own)
    cut = bwrap.index("/dev/shm") + 1
    head, tail = shlex.join(bwrap[:cut]), shlex.join(bwrap[cut:])

    def public_link(target: str) -> list[str]:
        # ~/public points at the pool as this server sees it (a link the user replaced stays)
        if not spec.pool:
            return []
        return [
            f'if [ -L "$DISK/public" ] || [ ! -e "$DISK/public" ]; then ln -sfn {q(target)} "$DISK/public"; fi'
        ]

    in_sandbox = [
        *public_link(spec.pool_mount),
        "devices=()",
        'for d in /dev/nvidia*; do [ -e "$d" ] && devices+=(--dev-bind "$d" "$d"); done',
        f"export HOME={q(spec.disk_mount)} METERHUB_PUBLIC_DIR={q(spec.pool_mount)}",
        f'exec {head} "${{devices[@]}}" {tail}',
    ]
    without = [
        *public_link(spec.pool),
        'echo "meterhub: no bubblewrap sandbox on $(hostname): the server runs as $(id -un) with no /public mount" >&2',
        'export HOME="$DISK"' + (f" METERHUB_PUBLIC_DIR={q(spec.pool)}" if spec.pool else ""),
        'cd "$DISK"',
        f'exec {shlex.join(command)} --ServerApp.root_dir="$DISK"',
    ]
    if spec.sandbox == "off":
        lines += without
    else:
        lines.append("if command -v bwrap >/dev/null && bwrap --ro-bind / / true 2>/dev/null; then")
        lines += ["  " + line for line in in_sandbox]
        lines.append("fi")
        if spec.sandbox == "bwrap":
            lines += [
                'echo "meterhub: bubblewrap is required (slurm.sandbox: bwrap) but cannot run on $(hostname)" >&2',
                "exit 1",
            ]
        else:
            lines += without
    return "\n".join(lines) + "\n"


#: states of a job that is over (squeue -t all, or -j on a finished job)
FINISHED_STATES = frozenset(
    "BOOT_FAIL CANCELLED COMPLETED DEADLINE FAILED NODE_FAIL OUT_OF_MEMORY PREEMPTED"
    " REVOKED SPECIAL_EXIT TIMEOUT".split()
)
#: states of a job that holds or will hold its resources
LIVE_STATES = frozenset(
    "PENDING CONFIGURING RUNNING COMPLETING RESV_DEL_HOLD REQUEUE_FED REQUEUE_HOLD REQUEUED"
    " RESIZING SIGNALING STAGE_OUT STOPPED SUSPENDED".split()
)


def job_is_gone(output: str) -> bool | None:
    """What squeue's answer about one job says: True when it is over or unknown to Slurm
    (an empty answer, "Invalid job id"), False when it lives, None when the answer says
    neither (an error, a timeout): a job is never taken for gone on an error, or it
    would run on, unbilled, while its session is closed."""
    text = output.strip()
    if not text or "Invalid job id" in text:
        return True
    state = parse_job_line(text.splitlines()[-1])[0]
    if state in FINISHED_STATES:
        return True
    if state in LIVE_STATES:
        return False
    return None


def parse_job_line(line: str) -> tuple[str, str, str]:
    """`squeue -o '%T %B %r'` of one job: (state, batch host, reason)."""
    words = line.split(maxsplit=2)
    words += [""] * (3 - len(words))
    return words[0], words[1], words[2].strip()


def queue_position(job_id: str, lines: str) -> int | None:
    """Where a pending job stands in its partition: `squeue -t PD -o '%i %Q'` lines, the
    highest priority first (Slurm starts them in that order), then the oldest."""
    jobs = []
    for line in lines.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].isdigit():
            jobs.append((-int(words[1]), int(words[0]) if words[0].isdigit() else 0, words[0]))
    order = [job for _priority, _index, job in sorted(jobs)]
    return order.index(job_id) + 1 if job_id in order else None


class SlurmGPUSpawner(FolderEnvironments, SlurmSpawner):
    """Servers as Slurm batch jobs, sized and placed from the catalog."""

    home_root = Unicode(
        help="""
        Directory on the cluster's shared filesystem holding the users' disks, one folder
        each (`<home_root>/<user>`), mounted at `disk_mount_path` in the job's sandbox.
        The job creates a new disk as the user's cluster account; when the hub runs as
        root it creates the folder first, owned by that account.
        """
    ).tag(config=True)

    disk_mount_path = Unicode("/home/jovyan", help="Where the disk appears in the sandbox.").tag(
        config=True
    )

    pool_dir = Unicode(
        "", help="The /public pool on the shared filesystem (read-only in the job)."
    ).tag(config=True)

    pool_mount_path = Unicode("/public", help="Where the pool appears in the sandbox.").tag(
        config=True
    )

    partitions = Dict(
        help="Partition per GPU type slug (`{a800: gpu-a800}`); a type not listed uses its slug."
    ).tag(config=True)

    debug_partition = Unicode("debug", help="The partition of debug-mode jobs (no GPU).").tag(
        config=True
    )

    account = Unicode("", help="Slurm account (`--account`) jobs are charged to, if any.").tag(
        config=True
    )

    qos = Unicode("", help="Slurm QOS (`--qos`) of the jobs, if any.").tag(config=True)

    user_map = Unicode(
        "same",
        help="""
        How hub users map to cluster accounts: `same` (the hub name), `prefix:<p>` (`<p>`
        then the hub name) or `run_as:<account>` (every job as one account).

        With `run_as` every user's disk belongs to one account: only the sandbox keeps
        users apart, so a node without bubblewrap lets one user's server read another's
        disk. Use `sandbox: bwrap` with it.
        """,
    ).tag(config=True)

    @validate("user_map")
    def _validate_user_map(self, proposal):
        if not USER_MAP.match(proposal.value):
            raise ValueError(
                f"user_map must be same, prefix:<p> or run_as:<account>: {proposal.value!r}"
            )
        return proposal.value

    sandbox = Unicode(
        "auto",
        help="""
        `auto`: the job runs the server in a bubblewrap sandbox where the node has a working
        bubblewrap, and without one (its log says so) where it does not; `bwrap`: the job
        fails without one; `off`: never. Without the sandbox there is no `/public` mount
        (the server finds the pool at its real path) and the server sees the node's files
        as its account may.
        """,
    ).tag(config=True)

    server_env_prefix = Unicode(
        help="The Python environment on the nodes with jupyterhub-singleuser and batchspawner"
        " (default: the hub's own, on the shared filesystem)."
    ).tag(config=True)

    @default("server_env_prefix")
    def _default_server_env_prefix(self):
        return sys.prefix

    envs_dir = Unicode(
        help="Where `meterhub env build` puts the environments (site config `environments`),"
        " on the shared filesystem the nodes run them from: `<envs_dir>/<slug>`."
    ).tag(config=True)

    @default("envs_dir")
    def _default_envs_dir(self):
        return os.path.join(os.path.dirname(os.path.abspath(self.home_root)), "envs")

    max_time_minutes = Int(
        0,
        help="The longest time limit a job gets, in minutes (0: only the credit limits it).",
    ).tag(config=True)

    queue_timeout_seconds = Int(
        300,
        help="""
        How long a spawn may wait for its job to start and its server to answer before it
        is cancelled with a message saying where it stood in the queue.
        """,
    ).tag(config=True)

    @default("start_timeout")
    def _default_start_timeout(self):
        # ours fires first, with the queue's state in its message
        return self.queue_timeout_seconds + 60

    stop_grace_seconds = Int(
        10, help="How long a stop waits for the job to leave the queue after scancel."
    ).tag(config=True)

    startup_poll_interval = Float(1.0).tag(config=True)

    server_start_seconds = Int(
        120,
        help="How long a running job's server has to answer; then the job is cancelled"
        " (time before the server answers is not charged).",
    ).tag(config=True)

    # batchspawner's formats, with the pending reason after the host
    batch_query_cmd = Unicode("squeue -h -j {job_id} -o '%T %B %r'").tag(config=True)
    batch_cancel_cmd = Unicode("scancel {job_id}").tag(config=True)

    #: how long the user's credit lasts at this session's rate (set by billing's
    #: pre-spawn hook; None: no limit from credit)
    credit_seconds: int | None = None
    #: when poll() last saw the job running, and, once it is gone, until when it ran
    last_seen_alive: int | None = None
    exited_after: int | None = None
    exited_unseen: bool = False
    _queue_message: str = ""

    # ---------------------------------------------------------------- the job

    @property
    def cluster_account(self) -> str:
        return cluster_account(self.user.name, self.user_map)

    @property
    def disk_path(self) -> str:
        return os.path.join(self.home_root, disk_dirname(self.user.name))

    def partition_for(self, choice: Choice) -> str:
        if choice.profile.is_debug:
            return self.debug_partition
        return self.partitions.get(choice.profile.slug, choice.profile.slug)

    def singleuser_command(self, env_prefix: str) -> list[str]:
        bin_dir = os.path.join(env_prefix, "bin")
        return [
            os.path.join(bin_dir, "batchspawner-singleuser"),
            os.path.join(bin_dir, "jupyterhub-singleuser"),
            *self.get_args(),
        ]

    def job_spec(self, choice: Choice, env: dict[str, str]) -> JobSpec:
        env_prefix = self.env_prefix  # resolved by the start (or the offline render)
        return JobSpec(
            user=self.user.name,
            choice=choice,
            partition=self.partition_for(choice),
            disk=self.disk_path,
            disk_mount=self.disk_mount_path,
            pool=self.pool_dir,
            pool_mount=self.pool_mount_path,
            env_prefix=env_prefix,
            export=tuple(sorted(env)),
            command=tuple(self.singleuser_command(env_prefix)),
            time_minutes=time_limit_minutes(self.credit_seconds, self.max_time_minutes or None),
            account=self.account,
            qos=self.qos,
            sandbox=self.sandbox,
            hidden=(os.path.abspath(self.home_root),),
            ro_paths=tuple(environment_paths(env_prefix) + server_code_paths(env_prefix)),
            starter=starter_notebooks(),
        )

    def user_env(self, env):
        return server_user_env(env, self.cluster_account, self.disk_mount_path, self.env_prefix)

    def get_env(self):
        env = super().get_env()
        choice = self.choice
        if choice is not None:
            env.update(
                {
                    "METERHUB_PROFILE": choice.profile.slug,
                    "METERHUB_ENVIRONMENT": (self.catalog.environment_of(choice)).slug,
                    "METERHUB_GPUS": str(choice.gpus),
                    "METERHUB_STOP_GRACE_SECONDS": str(self.stop_grace_seconds),
                }
            )
            env.update(self.catalog.idle_env(choice.profile.slug))
        # the job's view of these differs (set by the script); never the hub's own
        for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "SLURM_CONF"):
            env.pop(key, None)
        return env

    async def _get_batch_script(self, **subvars):
        # never batchspawner's template: it would take user options as template variables
        return job_script(self.job_spec(self.choice, self.get_env()))

    @default("req_homedir")
    def _default_req_homedir(self):
        return self.disk_path  # batchspawner's looks the hub user up in this host's passwd

    @default("exec_prefix")
    def _default_exec_prefix(self):
        return "{submit_as}"

    #: the exec prefix of this start (submit_prefix(), found off the event loop)
    _submit_prefix: str = ""

    min_uid = Int(
        1000,
        help="""
        The lowest uid a job may run as. A hub name that maps to a system account (root,
        slurm, munge, ...) is refused, as is the hub's own account unless `user_map` is
        `run_as` naming it: with `user_map: same` and open sign-up, whoever registers a
        system account's name would otherwise run jobs as it.
        """,
    ).tag(config=True)

    def account_entry(self) -> pwd.struct_passwd:
        """The cluster account's passwd entry on this host; ValueError if jobs may not run
        as it."""
        account = self.cluster_account
        try:
            entry = pwd.getpwnam(account)
        except KeyError:
            raise ValueError(
                _("no account %(account)s on the hub's machine", account=repr(account))
            ) from None
        if entry.pw_uid < self.min_uid:
            raise ValueError(
                _(
                    "%(account)s is a system account (uid %(uid)s)",
                    account=repr(account),
                    uid=entry.pw_uid,
                )
            )
        if entry.pw_uid == os.getuid() and not self.user_map.startswith("run_as:"):
            raise ValueError(_("%(account)s is the hub's own account", account=repr(account)))
        return entry

    def submit_prefix(self) -> str:
        """How the hub submits as the user's account: directly when it is the hub's own
        (`run_as` naming it), with setpriv when the hub is root, else with sudo
        (batchspawner's way; a sudoers rule lets the hub's account run sbatch as users)."""
        entry = self.account_entry()
        if entry.pw_uid == os.getuid():
            return ""
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or "/usr/bin/setpriv"
            return f"{setpriv} --reuid={entry.pw_uid} --regid={entry.pw_gid} --init-groups"
        return f"sudo -E -u {shlex.quote(entry.pw_name)}"

    def get_req_subvars(self):
        subvars = super().get_req_subvars()
        subvars["username"] = shlex.quote(self.cluster_account)
        subvars["submit_as"] = self._submit_prefix
        return subvars

    async def query_job_status(self):
        """squeue as the hub itself (anyone may list jobs unless the site hides them): a
        user's own processes can neither fail nor fake the hub's look at the job."""
        if not self.job_id:
            self.job_status = ""
            return JobStatus.NOTFOUND
        try:
            self.job_status = await self.run_command(
                self.batch_query_cmd.format(job_id=self.job_id)
            )
        except RuntimeError as e:
            self.job_status = str(e.args[0]) if e.args else ""
        except Exception as e:
            self.log.warning("squeue failed for job %s: %s", self.job_id, e)
            self.job_status = ""
            return JobStatus.UNKNOWN
        gone = job_is_gone(self.job_status)
        if gone is None:
            return JobStatus.UNKNOWN
        if gone:
            return JobStatus.NOTFOUND
        if self.state_isrunning():
            return JobStatus.RUNNING
        if self.state_ispending():
            return JobStatus.PENDING
        return JobStatus.RUNNING  # suspended, stopped, resizing: it holds its resources

    async def cancel_batch_job(self):
        """scancel, as root itself or as the job's account; tried again before giving up."""
        prefix = "" if os.geteuid() == 0 else self._submit_prefix
        command = f"{prefix} scancel {self.job_id}".strip()
        for attempt in range(3):
            try:
                await self.run_command(command)
                return
            except RuntimeError as e:
                if attempt == 2:
                    raise
                self.log.warning("scancel %s failed (%s); trying again", self.job_id, e)
                await asyncio.sleep(1 + attempt)

    async def run_command(self, cmd, input=None, env=None):
        if env is not None and "SLURM_CONF" in os.environ:
            # the submission's environment is the job's; sbatch still finds the cluster as
            # the hub does (the name is not in --export, so the job never sees it)
            env = {**env, "SLURM_CONF": os.environ["SLURM_CONF"]}
        return await super().run_command(cmd, input=input, env=env)

    # ---------------------------------------------------------------- start

    def _prepare_disk(self) -> None:
        """As root, make a new disk folder owned by the account (the job fills it)."""
        if os.geteuid() != 0 or not self.home_root:
            return
        entry = self.account_entry()
        disk = self.disk_path
        if os.path.islink(disk) or (os.path.isdir(disk) and os.stat(disk).st_uid != entry.pw_uid):
            raise ValueError(
                _(
                    "%(disk)s exists but is not %(account)s's own folder",
                    disk=disk,
                    account=entry.pw_name,
                )
            )
        if not os.path.isdir(disk):
            os.makedirs(disk, mode=0o700)
            os.chown(disk, entry.pw_uid, entry.pw_gid)

    async def start(self):
        choice = self.parse_options()
        self.choice = choice
        await self.resolve_environment(choice)
        try:
            account = self.cluster_account
            self._submit_prefix = await asyncio.to_thread(self.submit_prefix)
        except ValueError as e:
            raise web.HTTPError(
                500,
                "%s",
                _("This hub cannot run your server on the cluster: %(error)s", error=e),
                reason="No account",
            ) from None
        self.log.info("Submitting %s for %s as %s", choice.label, self._log_name, account)
        if self.credit_seconds is not None and self.credit_seconds < 60:
            raise web.HTTPError(
                402,
                "%s",
                _(
                    "Your credit pays for less than a minute of this profile, the shortest"
                    " time limit a Slurm job can have. Top up, or choose debug mode."
                ),
                reason="Not enough credit",
            )
        try:
            await asyncio.to_thread(self._prepare_disk)
        except ValueError as e:
            raise web.HTTPError(
                500, "%s", _("Your disk cannot be prepared: %(error)s", error=e)
            ) from None
        self.job_id, self.job_status, self._queue_message = "", "", ""
        self.last_seen_alive = self.exited_after = None
        self.exited_unseen = False
        self.ip = self.traits()["ip"].default_value
        self.port = 0
        await self.submit_batch_script()
        if not self.job_id:
            raise SlurmStartError(
                _("Slurm did not accept the job (no job id); the hub's log says why.")
            )
        # the job id in the hub's database at once: a hub that dies while it is queued
        # finds (and cancels, or adopts) it at its next start
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is not None:
            orm_spawner.state = self.get_state()
            self.db.commit()
        deadline = time.monotonic() + self.queue_timeout_seconds
        running_since = None
        try:
            while True:
                status = await self.query_job_status()
                if status == JobStatus.RUNNING and self.port:
                    break
                if status == JobStatus.RUNNING:
                    # nothing is charged before the server answers: a job that runs (user
                    # code included: its ~/.jupyter config) without answering is cut short
                    running_since = running_since or time.monotonic()
                    if time.monotonic() - running_since > self.server_start_seconds:
                        raise SlurmStartError(
                            _(
                                "Your server's job %(job)s ran but JupyterLab did not answer"
                                " within %(seconds)s s, so it was cancelled and nothing was"
                                " charged; its log is %(log)s on your disk.",
                                job=self.job_id,
                                seconds=self.server_start_seconds,
                                log=self.job_log,
                            )
                        )
                if status == JobStatus.NOTFOUND:
                    raise SlurmStartError(
                        _(
                            "Your server's Slurm job %(job)s ended before the server answered;"
                            " its log is %(log)s on your disk.",
                            job=self.job_id,
                            log=self.job_log,
                        )
                    )
                if status == JobStatus.PENDING:
                    await self._note_queue()
                if time.monotonic() > deadline:
                    raise SlurmStartError(self._queue_timeout_message())
                await asyncio.sleep(self.startup_poll_interval)
        except BaseException:
            await self._cancel_quietly()
            raise
        self.ip = self.state_gethost() or "127.0.0.1"
        self.last_seen_alive = int(time.time())
        self.db.commit()
        self.log.info(
            "Slurm job %s of %s at %s:%s", self.job_id, self._log_name, self.ip, self.port
        )
        return self.ip, self.port

    @property
    def job_log(self) -> str:
        """Where the job's own log is, on the user's disk."""
        return f"{LOG_DIR}/slurm-{self.job_id}.log"

    def _queue_timeout_message(self) -> str:
        values = {
            "seconds": self.queue_timeout_seconds,
            "job": self.job_id,
            "where": self._queue_message,
        }
        if self._queue_message:
            return _(
                "Your server did not start within %(seconds)s s (%(where)s), so its job %(job)s"
                " was cancelled and nothing was charged. Try again later, or choose a profile"
                " with free GPUs.",
                **values,
            )
        return _(
            "Your server did not start within %(seconds)s s, so its job %(job)s was cancelled"
            " and nothing was charged. Try again later, or choose a profile with free GPUs.",
            **values,
        )

    async def _cancel_quietly(self) -> None:
        if not self.job_id:
            return
        try:
            await self.cancel_batch_job()
        except Exception as e:  # the hub's stop() tries again
            self.log.warning("Could not cancel job %s: %s", self.job_id, e)

    async def _note_queue(self) -> None:
        _state, _host, reason = parse_job_line(self.job_status)
        partition = self.partition_for(self.choice)
        try:
            lines = await self.run_command(
                f"squeue -h -t PD -p {shlex.quote(partition)} -o '%i %Q'"
            )
        except RuntimeError:
            lines = ""
        position = queue_position(self.job_id, lines)
        # Slurm's reason (Resources, Priority, ...) as Slurm and its documentation spell it
        reason = reason.strip("()")
        values = {"reason": reason, "position": position, "partition": partition}
        if reason and position:
            message = _(
                "pending (%(reason)s), position %(position)s in the %(partition)s queue", **values
            )
        elif reason:
            message = _("pending (%(reason)s)", **values)
        elif position:
            message = _(
                "pending (waiting), position %(position)s in the %(partition)s queue", **values
            )
        else:
            message = _("pending (waiting)")
        self._queue_message = message

    async def progress(self):
        sent = ""
        while self.pending == "spawn":
            message = ""
            if self.job_id and not self.job_status:
                message = _("Submitted Slurm job %(job)s", job=self.job_id)
            elif self.state_ispending():
                message = _(
                    "Slurm job %(job)s: %(state)s",
                    job=self.job_id,
                    state=self._queue_message or _("pending"),
                )
            elif self.state_isrunning():
                message = _(
                    "Slurm job %(job)s running on %(host)s; starting JupyterLab",
                    job=self.job_id,
                    host=self.state_gethost(),
                )
            if message and message != sent:
                sent = message
                yield {"message": message}
            await asyncio.sleep(0.5)

    def state_ispending(self):
        return parse_job_line(self.job_status)[0] in ("PENDING", "CONFIGURING")

    def state_isrunning(self):
        return parse_job_line(self.job_status)[0] in ("RUNNING", "COMPLETING")

    def state_gethost(self):
        host = parse_job_line(self.job_status)[1]
        return host if host and host != "n/a" else ""

    # ---------------------------------------------------------------- running

    async def _know_account(self) -> None:
        """After a hub restart the job's cancel still runs as its account (a non-root hub)."""
        if not self._submit_prefix and os.geteuid() != 0:
            try:
                self._submit_prefix = await asyncio.to_thread(self.submit_prefix)
            except ValueError as e:
                self.log.warning("No account for %s's job: %s", self._log_name, e)

    async def poll(self):
        if not self.job_id:
            return 0 if self.exited_after is None else 1
        await self._know_account()
        status = await self.query_job_status()
        if status in (JobStatus.RUNNING, JobStatus.PENDING):
            if status == JobStatus.RUNNING:
                self.last_seen_alive = int(time.time())
            return None
        if status == JobStatus.UNKNOWN:
            return None  # the controller does not answer: the job is not known to be gone
        # gone on its own (time limit, node failure, preemption, scancel from outside):
        # billing charges it only until it was last seen running
        self.exited_after = self.last_seen_alive
        self.exited_unseen = self.last_seen_alive is None
        self.clear_state()
        return 1

    async def stop(self, now=False):
        if not self.job_id:
            return
        self.log.info("Cancelling Slurm job %s of %s", self.job_id, self._log_name)
        await self._know_account()
        await self.cancel_batch_job()
        if now:
            return
        deadline = time.monotonic() + self.stop_grace_seconds + 30
        while time.monotonic() < deadline:
            status = await self.query_job_status()
            if status not in (JobStatus.RUNNING, JobStatus.PENDING, JobStatus.UNKNOWN):
                return
            await asyncio.sleep(1)
        self.log.warning("Slurm job %s of %s is still in the queue", self.job_id, self._log_name)

    def load_state(self, state):
        super().load_state(state)
        # seen by this process only: after a hub restart a job found gone is charged
        # until the meter last saw it running (exited_unseen), never from a stale time
        self.last_seen_alive = None


# ------------------------------------------------------------------- the port handler


class SlurmPortHandler(APIHandler):
    """The port a job's server listens on, reported by batchspawner-singleuser. Only the
    spawning server's own token, only a port, only while it spawns."""

    @web.authenticated
    def post(self):
        token = self.get_auth_token() or ""
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, 'the body must be JSON: {"port": N}') from None
        port = body.get("port") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"port"} or type(port) is not int:
            raise web.HTTPError(400, 'the body must be {"port": N} and nothing else')
        if not 1024 <= port <= 65535:
            raise web.HTTPError(400, f"port {port} is out of range (1024-65535)")
        spawner = next(
            (
                s
                # a service's token has no spawners
                for s in (getattr(self.current_user, "spawners", None) or {}).values()
                if isinstance(s, SlurmGPUSpawner)
                and s.api_token
                and hmac.compare_digest(s.api_token, token)
            ),
            None,
        )
        if spawner is None:
            raise web.HTTPError(403, "only a spawning server's own token reports its port")
        if spawner.pending != "spawn" or spawner.port:
            raise web.HTTPError(409, "this server is not waiting for its port")
        spawner.port = port
        self.set_status(201)
        self.finish(json.dumps({"message": "port recorded"}))


_OURS = (r"/api/batchspawner", SlurmPortHandler)
default_handlers[:] = [
    h for h in default_handlers if h[1] is not batchspawner.api.BatchSpawnerAPIHandler
]
if _OURS not in default_handlers:
    default_handlers.append(_OURS)
