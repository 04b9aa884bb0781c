"""A throwaway one-node Slurm cluster for tests: munged, slurmctld and slurmd on loopback.

Everything lives in its own temp dir: a private munge key and socket, a slurm.conf on free
ports, typed GPUs declared by count in gres.conf with `AutoDetect=off` (no devices needed),
one partition per GPU type plus `debug`. The node declares more CPUs and memory than this
machine has (`SlurmdParameters=config_overrides`): the catalog asks for cores per GPU, and
nothing here enforces them (no cgroups). Client commands find the cluster through
`SLURM_CONF`, which `env()` returns. `make test` installs slurm-wlm and munge.

Jobs run as real accounts (slurmd looks them up): `account()` creates a system account on
this machine once, for the session, and the cluster removes those it made when it stops.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .hubprocess import free_port

GPU_COUNT = 8
PARTITIONS = ("debug", "rtx4090", "a800", "h800")
NODE = "localhost"


def slurm_missing() -> str:
    """Why no cluster can start here, or ""."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (make test installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users, so the test cluster needs root"
    return ""


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self, gpu_count: int = GPU_COUNT):
        # world-traversable: jobs run as unprivileged accounts and read what lives here
        self.workdir = Path(tempfile.mkdtemp(prefix="meterhub-slurm-"))
        os.chmod(self.workdir, 0o755)
        self.conf = self.workdir / "slurm.conf"
        self.socket = self.workdir / "munge.sock"
        self.gpu_count = gpu_count
        self.procs: list[subprocess.Popen] = []
        self.accounts: list[str] = []
        self.opened: list[tuple[str, int]] = []

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        w = self.workdir
        for sub in ("state", "spool", "log"):
            (w / sub).mkdir(exist_ok=True)
        gres = ",".join(f"gpu:{t}:{self.gpu_count}" for t in PARTITIONS[1:])
        lines = [
            "ClusterName=meterhub-test",
            f"SlurmctldHost={NODE}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={w / 'state'}",
            f"SlurmdSpoolDir={w / 'spool'}",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmdPidFile={w / 'slurmd.pid'}",
            f"SlurmctldLogFile={w / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={w / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            "ReturnToService=2",
            "MpiDefault=none",
            "SlurmdParameters=config_overrides",
            # a cancelled job's processes get SIGTERM, then SIGKILL this long after
            "KillWait=5",
            # how long a finished job stays in squeue/scontrol (the hub's poll sees it end)
            "MinJobAge=300",
            "SchedulerParameters=sched_interval=1",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs=256 RealMemory=2048000"
            f" Gres={gres} State=UNKNOWN",
        ]
        for partition in PARTITIONS:
            default = " Default=YES" if partition == "debug" else ""
            lines.append(
                f"PartitionName={partition} Nodes={NODE}{default} MaxTime=INFINITE State=UP"
            )
        self.conf.write_text("\n".join(lines) + "\n")
        # Slurm 22.05 drops GPUs without a File from the node's GRES, so each declared
        # GPU names a placeholder file; no job opens it
        (w / "gpus").mkdir(exist_ok=True)
        gres_lines = ["AutoDetect=off"]
        for t in PARTITIONS[1:]:
            for i in range(self.gpu_count):
                (w / "gpus" / f"{t}{i}").touch()
            gres_lines.append(
                f"NodeName={NODE} Name=gpu Type={t} Count={self.gpu_count}"
                f" File={w / 'gpus' / t}[0-{self.gpu_count - 1}]"
            )
        (w / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        key = w / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def start(self) -> None:
        self._write_config()
        w = self.workdir
        subprocess.run(
            [
                _tool("munged"),
                "--force",
                f"--socket={self.socket}",
                f"--key-file={w / 'munge.key'}",
                f"--pid-file={w / 'munged.pid'}",
                f"--log-file={w / 'log' / 'munged.log'}",
                f"--seed-file={w / 'munge.seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        os.chmod(self.socket, 0o777)
        env = {**os.environ, **self.env()}
        for daemon, args in (("slurmctld", ["-D", "-i"]), ("slurmd", ["-D", "-N", NODE])):
            log = open(w / "log" / f"{daemon}.out", "wb")
            self.procs.append(
                subprocess.Popen(
                    [_tool(daemon), *args, "-f", str(self.conf)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if out and out.split()[0] in ("idle", "mixed", "allocated"):
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited: {self.logs()}")
            time.sleep(0.3)
        raise RuntimeError(f"the test cluster's node did not come up: {self.logs()}")

    def logs(self) -> str:
        text = []
        for path in sorted((self.workdir / "log").glob("*")):
            text.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(text)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def account(self, name: str) -> pwd.struct_passwd:
        """A system account jobs can run as (made once; removed by stop() if made here)."""
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        subprocess.run(
            # a regular uid: the spawner refuses system accounts (below 1000)
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self.accounts.append(name)
        return pwd.getpwnam(name)

    def open_path(self, path: str) -> None:
        """Let jobs' accounts traverse to `path` (the hub's Python environment, which a real
        cluster keeps on a shared filesystem its users can read; here it may lie below a
        private /root): each ancestor without `o+x` gets it until stop()."""
        parts = os.path.realpath(path).strip("/").split("/")
        for i in range(1, len(parts) + 1):
            ancestor = "/" + "/".join(parts[:i])
            mode = os.stat(ancestor).st_mode & 0o7777
            if os.path.isdir(ancestor) and not mode & 0o001:
                self.opened.append((ancestor, mode))
                os.chmod(ancestor, mode | 0o001)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (its KEY=VALUE words)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields[key] = value
        return fields

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        pid_file = self.workdir / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ValueError, ProcessLookupError):
                pass
        for name in self.accounts:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
        for path, mode in reversed(self.opened):
            os.chmod(path, mode)
        shutil.rmtree(self.workdir, ignore_errors=True)
