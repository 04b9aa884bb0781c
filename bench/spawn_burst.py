"""Spawn burst: N simultaneous spawns of N users on meterhub vs stock JupyterHub, with
JupyterHub's lightweight mock single-user server (`jupyterhub.tests.mocksu`, no JupyterLab).

Both hubs run side by side; bursts alternate (meterhub, stock, then stock, meterhub, ...),
and between bursts every server is stopped. What each runs:

- meterhub: `meterhub serve` (embedded default, `gpus: []`, the debug profile) with its own
  `LocalGPUSpawner`, `local.sandbox: off`, its `server_env_prefix` pointed at a folder whose
  `bin/jupyterhub-singleuser` runs mocksu; the billing service as always.
- stock: JupyterHub with `SimpleLocalProcessSpawner` and `Spawner.cmd` = the same script.

Both get the same `Spawner.start_timeout` / `http_timeout` and a `concurrent_spawn_limit`
of N (JupyterHub's default, 100, answers 429 to the rest of a burst of 200). A burst sends
the N spawn requests at once from N threads and ends when every server is ready or failed.
Both hubs get the same request, `{"profile": "debug"}`: JupyterHub itself saves a request's
user options as the server's next defaults (a commit of its database, about 0.9 ms of the
hub's CPU a spawn), which stock's spawner then ignores. `--stock-bare` sends stock an empty
body instead (the figures before 2026-12-06's fifth stop), so that stock's JupyterHub skips
that commit.
CPU seconds are utime+stime from /proc/PID/stat of the hub (meterhub: + its billing service)
over the burst; the single-user servers and the proxy are not counted (the proxy's is shown).
The hub's CPU is also shown split between its event loop's thread and its other threads
(/proc/PID/task: meterhub's worker threads run its ledger and host work).
Time to ready: from a user's spawn request to its route in the proxy (polled from the
proxy's API every 0.1 s, which costs the hubs nothing). Failed servers are read from the
hub's log, so neither hub is asked anything during the burst; after it, the REST API says
which servers are ready.

`--together` releases both hubs' bursts at the same moment, so that both see the machine's
same moment-to-moment speed (bursts apart, the same hub's CPU for the same 200 spawns varied
by half); stock's servers then run in per-server cgroups made by the benchmark, of the same
shape and limits as meterhub's, so that the kernel shares the CPU evenly between the two.

Experiments (bench-only patches in meterhub's `jupyterhub_config.d`, not meterhub's code):
`--fast-probe` (the liveness probe reads the group leader before scanning /proc) and
`--slow-port-wait` (the spawner's port wait connects every 1 s instead of every 0.1 s) and
`--no-limits` (servers start without their cgroups: `resource_limits = "off"`).
`--tiny-server` (a diagnostic, not the issue's figure: a server of a few lines that
costs next to nothing to start, so that each hub's own work for a spawn shows without 200
imports on the same cores; with `--together` the two hubs share the machine's moment).
`--gc` counts each hub's garbage collections through each burst and their CPU time.
`--profile SECONDS` records each hub (and meterhub's billing service) with py-spy (`pip install
py-spy`: wall time of running threads); `--yappi` profiles each hub's burst on CPU time (`pip
install yappi`; it inflates call-heavy Python, so it says where rather than how much); `--perf`
records each hub's burst with `perf record -g` (real CPU, C stacks).

    .venv/bin/python bench/spawn_burst.py --users 200 --rounds 1 [--stock-first]
    .venv/bin/python bench/spawn_burst.py --users 200 --only meterhub --profile 330
    .venv/bin/python bench/spawn_burst.py --users 200 --fast-probe
    .venv/bin/python bench/spawn_burst.py --users 200 --yappi   # or --perf
    .venv/bin/python bench/spawn_burst.py --users 150 --rounds 3 --together
    .venv/bin/python bench/spawn_burst.py --users 200 --rounds 5 --tiny-server --together
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.spawn_overhead import StockHub  # noqa: E402
from tests.hubprocess import ADMIN_TOKEN, HubProcess, until  # noqa: E402

TIMEOUT_SECONDS = 600
PROFILE_DIR = Path(tempfile.gettempdir())

#: both hubs, the same (meterhub reads it from its jupyterhub_config.d escape hatch)
COMMON_CONFIG = """
c.Spawner.start_timeout = {timeout}
c.Spawner.http_timeout = {timeout}
c.JupyterHub.concurrent_spawn_limit = {users}
"""

#: `--no-limits`, an experiment: no cgroup per server (what the hub's CPU owes to them)
NO_LIMITS = """
c.LocalGPUSpawner.resource_limits = "off"
"""

#: `--fast-probe`, an experiment (not meterhub's code): `group_has_live_members` reads the
#: group leader's /proc/PID/stat first and scans all of /proc only when the leader is gone
FAST_PROBE = """
import meterhub.spawner.local as local

_scan = local.group_has_live_members


def group_has_live_members(pgid):
    try:
        with open(f"/proc/{pgid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    except OSError:
        pass
    return _scan(pgid)


local.group_has_live_members = group_has_live_members
"""

#: `--slow-port-wait`, an experiment: the spawner's wait for the server's port connects every
#: 1 s instead of every 0.1 s (its only `asyncio.sleep(0.1)`)
SLOW_PORT_WAIT = """
import asyncio as _asyncio
import types as _types

import meterhub.spawner.local as _local


async def _sleep(seconds, *args, **kwargs):
    return await _asyncio.sleep(1.0 if seconds == 0.1 else seconds, *args, **kwargs)


_local.asyncio = _types.SimpleNamespace(**{**vars(_asyncio), "sleep": _sleep})
"""

#: `--yappi`, a measuring aid (not meterhub's code): each hub runs yappi on CPU time, in all
#: its threads; the first SIGUSR2 clears the counts, the next saves them (pstats) to `{out}`
#: (JupyterHub keeps SIGUSR1 for its own status report)
YAPPI = """
import signal as _signal

import yappi as _yappi

_yappi.set_clock_type("cpu")
_yappi.start(builtins=True, profile_threads=True)
_yappi_window = []


def _yappi_mark(*_args):
    if _yappi_window:
        _yappi.get_func_stats().save({out!r}, type="pstat")
        _yappi.stop()  # later rounds run as without it
    else:
        _yappi.clear_stats()
    _yappi_window.append(1)


_signal.signal(_signal.SIGUSR2, _yappi_mark)
"""

#: `--together`: stock's server enters a cgroup of its own (made by the benchmark, not by the
#: stock hub) in each controller before it runs mocksu, as meterhub's servers enter theirs, so
#: that the kernel shares the CPU between the two hubs' servers evenly
STOCK_IN_CGROUP = """#!/bin/sh
for parent in {parents}; do
    echo 0 >"$parent/$JUPYTERHUB_USER/cgroup.procs" || exit 125
done
exec {script} "$@"
"""

#: `--together`: stock's servers take their ports from 20000-29999, below the kernel's
#: ephemeral range where meterhub's (JupyterHub's `random_port`) come from: two hubs that
#: pick free ports independently would otherwise, now and then, give two servers one port
STOCK_PORTS = """
import random as _random
import socket as _socket

import jupyterhub.spawner as _spawner


_bench_ports = set()


def _bench_port():
    while True:
        port = _random.randint(20000, 29999)
        if port in _bench_ports:  # given to a server that may not listen yet
            continue
        with _socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _bench_ports.add(port)
            return port


_spawner.random_port = _bench_port
"""

#: `--gc`, a measuring aid (not meterhub's code): each hub counts its garbage collections and
#: their CPU time, by generation; each SIGUSR2 appends the running totals to `{out}` (JSON)
GC_STATS = """
import gc as _gc
import json as _json
import signal as _signal
import time as _time

_gc_totals = {{"collections": [0, 0, 0], "cpu_seconds": [0.0, 0.0, 0.0]}}
_gc_began = [0.0]


def _gc_clock(phase, info):
    # a collection runs in one thread, holding the GIL: that thread's CPU clock times it
    if phase == "start":
        _gc_began[0] = _time.thread_time()
        return
    generation = info["generation"]
    _gc_totals["collections"][generation] += 1
    _gc_totals["cpu_seconds"][generation] += _time.thread_time() - _gc_began[0]


def _gc_mark(*_args):
    with open({out!r}, "a") as f:
        f.write(_json.dumps(_gc_totals) + "\\n")


_gc.callbacks.append(_gc_clock)
_signal.signal(_signal.SIGUSR2, _gc_mark)
"""


def gc_during(path: Path) -> str:
    """What the last two `--gc` marks in `path` say the hub collected between them."""
    before, after = (json.loads(line) for line in path.read_text().splitlines()[-2:])
    parts = []
    for generation in range(3):
        count = after["collections"][generation] - before["collections"][generation]
        cpu = after["cpu_seconds"][generation] - before["cpu_seconds"][generation]
        parts.append(f"gen{generation} {count} in {cpu:.2f} s")
    return "garbage collections: " + ", ".join(parts)


MOCKSU = """#!{python}
# jupyterhub.tests.mocksu from the benchmark's environment, under a Python every uid can run
import sys
sys.path.insert(0, {site_packages!r})
from jupyterhub.tests.mocksu import main
main()
"""


def server_python() -> str:
    """A Python of the venv's version that the servers' uids can run (as root meterhub drops
    each server to its own uid, which cannot traverse /root where pyenv keeps this one)."""
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    return system if os.path.exists(system) else sys.executable


class StockCgroups:
    """`--together`: a cgroup per stock server below `<this cgroup>/bench-stock`, the same
    shape and limits as meterhub's (`<this cgroup>/meterhub/<server>`, the debug profile's CPU
    and memory). Without them meterhub's 200 cgroups shared the CPU as one group against
    stock's 200 processes (cgroup v1 group scheduling) and its burst lasted twice as long."""

    def __init__(self, names: list[str]):
        from meterhub.spawner import cgroups
        from meterhub.spawner.catalog import DEBUG_CPU, DEBUG_MEMORY_GIB

        own = cgroups.detect()
        self.layout = cgroups.CgroupLayout(
            own.version,
            os.path.join(own.memory, "bench-stock"),
            os.path.join(own.cpu, "bench-stock"),
        )
        if own.version == 2:
            for top in (self.layout.memory, os.path.join(self.layout.memory, cgroups.PARENT)):
                os.makedirs(top, exist_ok=True)
                cgroups._enable(top)
        self.dirs: list[str] = []
        try:
            for name in names:
                self.dirs += self.layout.server_dirs(name)
                cgroups.create(self.layout, name, DEBUG_CPU, DEBUG_MEMORY_GIB * 2**30)
        except BaseException:
            self.remove()
            raise

    def parents(self) -> list[str]:
        return list(dict.fromkeys(os.path.dirname(d) for d in self.dirs))

    def wrap(self, script: Path) -> Path:
        wrapper = script.with_name("mocksu-in-cgroup")
        parents = " ".join(shlex.quote(p) for p in self.parents())
        wrapper.write_text(STOCK_IN_CGROUP.format(parents=parents, script=shlex.quote(str(script))))
        wrapper.chmod(0o755)
        return wrapper

    def remove(self) -> None:
        from meterhub.spawner import cgroups

        left = cgroups.remove(self.dirs)
        for top in dict.fromkeys(os.path.dirname(p) for p in self.parents()):
            try:
                os.rmdir(top)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(top)
        if left:
            print(f"stock's cgroups left behind: {left}", file=sys.stderr)


#: `--tiny-server`, a diagnostic: a server that costs next to nothing to start (no site
#: packages, no tornado), so that a burst measures each hub's own work for a spawn, without
#: 200 servers importing on the same two cores; it answers any request with 200
TINY_SERVER = """#!{python} -S
import os, socket
from urllib.parse import urlsplit

url = urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
server = socket.create_server((url.hostname, url.port), backlog=64)
while True:
    conn, _ = server.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok")
"""


def write_mocksu(prefix: Path, tiny: bool = False) -> Path:
    import jupyterhub

    site_packages = str(Path(jupyterhub.__file__).resolve().parent.parent)
    script = prefix / "bin" / "jupyterhub-singleuser"
    script.parent.mkdir(parents=True)
    text = TINY_SERVER if tiny else MOCKSU
    script.write_text(text.format(python=server_python(), site_packages=site_packages))
    script.chmod(0o755)
    return script


class MeterHub(HubProcess):
    def __init__(self, workdir: Path, prefix: Path, users: int, experiments: str = ""):
        super().__init__(workdir, {"gpus": [], "local": {"sandbox": "off"}})
        extra = self.workdir / "jupyterhub_config.d"
        extra.mkdir()
        (extra / "bench.py").write_text(
            COMMON_CONFIG.format(timeout=TIMEOUT_SECONDS, users=users)
            + f"c.LocalGPUSpawner.server_env_prefix = {str(prefix)!r}\n"
            + experiments
        )


class StockMocksu(StockHub):
    def __init__(self, workdir: Path, script: Path, users: int, experiments: str = ""):
        super().__init__(workdir, {})
        self.script, self.users, self.experiments = script, users, experiments

    def command(self) -> list[str]:
        command = super().command()
        config = self.workdir / "jupyterhub_config.py"
        config.write_text(
            config.read_text()
            + COMMON_CONFIG.format(timeout=TIMEOUT_SECONDS, users=self.users)
            + f"c.Spawner.cmd = [{str(self.script)!r}]\n"
            + self.experiments
        )
        return command


# ---------------------------------------------------------------- processes


def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def find_child(pid: int, needle: str) -> int:
    pids = [p for p in children().get(pid, []) if needle in cmdline(p)]
    assert len(pids) == 1, f"{needle!r} among {pid}'s children: {pids}"
    return pids[0]


def cpu_seconds(pid: int) -> float:
    """The process's own user+system CPU (all its threads; not its reaped children's)."""
    return sum(cpu_split(pid))


def threads_cpu(pid: int) -> dict[int, float]:
    """Each thread's user+system CPU seconds (thread id: seconds); the event loop's thread
    has the process's id. A thread that ended meanwhile is not counted."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def cpu_split(pid: int) -> tuple[float, float]:
    """The process's own user and system CPU seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def proxy_routes(pid: int, port: int):
    """A function that lists the proxy's routes, with the token the hub gave it."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    token = next(v[23:] for v in environ if v.startswith(b"CONFIGPROXY_AUTH_TOKEN=")).decode()
    session = requests.Session()
    url, headers = f"http://127.0.0.1:{port}/api/routes", {"Authorization": f"token {token}"}
    return lambda: session.get(url, headers=headers, timeout=30).json()


# ---------------------------------------------------------------- one burst


class FailureLog:
    """The users whose spawn failed, read from the hub's log (JupyterHub's own lines for a
    failed start: "Error starting b7's server", "b7's server failed to start in",
    "b7's server never showed up", ...), so that the hubs are asked nothing during the
    burst: polling their REST API for failed servers cost the hub whose replies came first
    (meterhub's, every 2 s from its 202s on) a second of CPU that the other did not spend.
    A failure it misses ends the burst at its deadline instead."""

    FAILED = re.compile(
        r"(?:starting|waiting for) (\w+)'s server|(\w+)'s server (?:failed to start|never"
        r" showed up)|Failed to add (\w+) to proxy"
    )

    def __init__(self, path: Path, names: list[str]):
        self.path, self.offset, self.names = path, path.stat().st_size, set(names)
        self.seen: set[str] = set()

    def failed(self) -> set[str]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # whole lines only; the rest next time
        self.offset += end
        for match in self.FAILED.finditer(chunk[:end].decode(errors="replace")):
            self.seen |= {name for name in match.groups() if name in self.names}
        return set(self.seen)


def burst(
    hub: HubProcess,
    names: list[str],
    options: dict,
    counted: dict[str, int],
    mark_pid: int | None = None,
    perf_out: Path | None = None,
    together: threading.Barrier | None = None,
) -> dict:
    """Spawn every user at once; wait until each is ready or failed; stop them all.
    With `mark_pid`, that hub is sent SIGUSR2 at the burst's start and end, so that its
    yappi (`--yappi`) or garbage-collection count (`--gc`) covers the burst; with `perf_out`,
    `perf record` samples the hub's CPU (all threads, C stacks) through the burst (`--perf`)."""
    proxy = find_child(hub.proc.pid, "configurable-http-proxy")
    routes = proxy_routes(proxy, hub.site["hub"]["proxy_api_port"])
    sent: dict[str, float] = {}
    ready: dict[str, float] = {}
    replies: dict[str, int] = {}
    go = threading.Barrier(len(names) + 1)

    def spawn(name: str) -> None:
        session = requests.Session()
        headers = {"Authorization": f"token {ADMIN_TOKEN}"}
        go.wait()
        sent[name] = time.perf_counter()
        r = session.post(
            f"{hub.url}/hub/api/users/{name}/server", json=options, headers=headers, timeout=900
        )
        replies[name] = r.status_code

    if mark_pid:
        os.kill(mark_pid, signal.SIGUSR2)
    perf = None
    if perf_out:
        command = ["perf", "record", "-F", "499", "-g", "-p", str(hub.proc.pid), "-o"]
        perf = subprocess.Popen([*command, str(perf_out)], stderr=subprocess.DEVNULL)
        time.sleep(1)
    before = {what: cpu_seconds(pid) for what, pid in counted.items()}
    hub_before = cpu_split(counted["hub"])
    threads_before = threads_cpu(counted["hub"])
    proxy_before = cpu_seconds(proxy)
    pool = ThreadPoolExecutor(len(names))
    for name in names:
        pool.submit(spawn, name)
    if together is not None:  # `--together`: the other hub's burst is released with this one
        together.wait()
    go.wait()
    start = time.perf_counter()
    failed: set[str] = set()
    log = FailureLog(hub.log_path, names)
    deadline = start + TIMEOUT_SECONDS + 60
    while len(ready) + len(failed) < len(names) and time.perf_counter() < deadline:
        now = time.perf_counter()
        for path in routes():
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if path.rstrip("/").endswith(f"/user/{name}") and name in sent and name not in ready:
                ready[name] = now - sent[name]
        failed = log.failed() | {n for n, code in replies.items() if code not in (201, 202)}
        failed -= set(ready)
        time.sleep(0.1)
    wall = time.perf_counter() - start
    cpu = {what: cpu_seconds(pid) - before[what] for what, pid in counted.items()}
    hub_user, hub_system = (
        b - a for a, b in zip(hub_before, cpu_split(counted["hub"]), strict=True)
    )
    proxy_cpu = cpu_seconds(proxy) - proxy_before
    # the hub's event-loop thread, and its other threads (meterhub's worker threads)
    spent = {t: s - threads_before.get(t, 0.0) for t, s in threads_cpu(counted["hub"]).items()}
    loop_cpu = spent.pop(counted["hub"], 0.0)
    if mark_pid:
        os.kill(mark_pid, signal.SIGUSR2)
    if perf:
        perf.send_signal(signal.SIGINT)
        perf.wait(60)
    pool.shutdown()
    # after the measurement: every ready server answers through the proxy, then stop all
    listing = hub.api("GET", "/users?state=ready&limit=1000").json()
    hub_ready = {u["name"] for u in listing}
    answering = sum(
        requests.get(f"{hub.url}/user/{n}/api", timeout=30).status_code == 200 for n in hub_ready
    )
    with ThreadPoolExecutor(16) as stops:
        list(stops.map(lambda n: hub.api("DELETE", f"/users/{n}/server"), names))
    until(
        lambda: not hub.api("GET", "/users?state=active&limit=1000").json(),
        "every server to stop",
        timeout=300,
        interval=1,
    )
    for name in sorted(set(names) - hub_ready):  # why: the hub's log lines about it
        lines = hub.log_path.read_text(errors="replace").splitlines()
        about = [line for line in lines if re.search(rf"\b{name}\b", line)]
        ports = set(re.findall(r"127\.0\.0\.1:(\d+)", "\n".join(about)))
        about += [line for line in lines if any(f":{p}" in line for p in ports)]
        for i, line in enumerate(lines):  # the servers' own output names no user
            if "Interrupted" in line or "Traceback" in line:
                about += lines[i : i + 12]
        print(f"{name} is not ready; the hub's log about it:", *about[-60:], sep="\n  ")
    codes: dict[int, int] = {}
    for code in replies.values():
        codes[code] = codes.get(code, 0) + 1
    times = sorted(ready.values())
    return {
        "ready": len(hub_ready),
        "answering": answering,
        "failed": len(names) - len(hub_ready),
        "replies": codes,
        "wall": wall,
        "cpu": cpu,
        "hub_user": hub_user,
        "hub_system": hub_system,
        "proxy_cpu": proxy_cpu,
        "loop_cpu": loop_cpu,
        "threads_cpu": sum(spent.values()),
        "p50": statistics.median(times) if times else float("nan"),
        "p95": times[min(len(times) - 1, int(0.95 * len(times)))] if times else float("nan"),
        "max": times[-1] if times else float("nan"),
    }


def show(label: str, r: dict) -> str:
    cpu = " + ".join(f"{what} {s:.2f}" for what, s in r["cpu"].items())
    return (
        f"{label}: {r['ready']} ready ({r['answering']} answering through the proxy),"
        f" {r['failed']} failed, replies {r['replies']}; wall {r['wall']:.1f} s;"
        f" CPU {cpu} = {sum(r['cpu'].values()):.2f} s (hub: user {r['hub_user']:.2f},"
        f" system {r['hub_system']:.2f}; its event loop's thread {r['loop_cpu']:.2f}, other"
        f" threads {r['threads_cpu']:.2f}; proxy {r['proxy_cpu']:.1f} s);"
        f" time to ready p50 {r['p50']:.1f} s, p95 {r['p95']:.1f} s, max {r['max']:.1f} s"
    )


def create_users(hub: HubProcess, names: list[str]) -> None:
    for i in range(0, len(names), 100):
        r = hub.api("POST", "/users", json={"usernames": names[i : i + 100]})
        assert r.status_code == 201, r.text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1, help="each round: one burst on each")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="SECONDS",
        help="also: py-spy each hub (and meterhub's billing service) through its first burst",
    )
    parser.add_argument(
        "--profile-rate", type=int, default=50, metavar="HZ", help="py-spy's samples a second"
    )
    parser.add_argument(
        "--fast-probe",
        action="store_true",
        help="experiment: meterhub's liveness probe reads the group leader before scanning /proc",
    )
    parser.add_argument(
        "--no-limits",
        action="store_true",
        help="experiment: meterhub's servers start without cgroups (resource_limits off)",
    )
    parser.add_argument(
        "--slow-port-wait",
        action="store_true",
        help="experiment: meterhub's spawner waits 1 s, not 0.1 s, between connects to the port",
    )
    parser.add_argument(
        "--yappi",
        action="store_true",
        help="also: yappi (CPU clock) in each hub through its first burst (pip install yappi)",
    )
    parser.add_argument(
        "--perf",
        action="store_true",
        help="also: perf record (CPU samples, C stacks) of each hub through its first burst",
    )
    parser.add_argument(
        "--tiny-server",
        action="store_true",
        help="diagnostic: a server of a few lines instead of mocksu (each hub's own work)",
    )
    parser.add_argument(
        "--gc",
        action="store_true",
        help="also: each hub's garbage collections through each burst, and their CPU time",
    )
    parser.add_argument("--stock-first", action="store_true", help="stock's burst first")
    parser.add_argument(
        "--stock-bare",
        action="store_true",
        help="stock's spawn requests without a body (no user options: its JupyterHub then"
        " saves none), instead of the same request as meterhub's",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="both hubs' bursts at the same moment, on the same machine's moment-to-moment"
        " speed (each round one burst on each, released together); stock's servers in"
        " cgroups of their own, as meterhub's",
    )
    parser.add_argument("--only", choices=("meterhub", "stock"), help="burst on one hub only")
    args = parser.parse_args()
    if args.gc and (args.yappi or args.together):
        parser.error("--gc counts bursts one hub at a time, and not with --yappi")
    names = [f"b{i}" for i in range(args.users)]
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        os.chmod(tmp, 0o755)  # servers run as their own uids and must reach the script
        script = write_mocksu(Path(tmp) / "mocksu", tiny=args.tiny_server)
        experiments = (
            (FAST_PROBE if args.fast_probe else "")
            + (SLOW_PORT_WAIT if args.slow_port_wait else "")
            + (NO_LIMITS if args.no_limits else "")
        )
        gc_out = {label: PROFILE_DIR / f"spawn_burst-{label}.gc" for label in ("meterhub", "stock")}
        # what each hub runs to be marked at a burst's start and end (SIGUSR2)
        marks = {
            label: YAPPI.format(out=str(PROFILE_DIR / f"spawn_burst-{label}.pstat"))
            if args.yappi
            else GC_STATS.format(out=str(gc_out[label]))
            if args.gc
            else ""
            for label in ("meterhub", "stock")
        }
        ours = MeterHub(
            Path(tmp) / "meterhub",
            Path(tmp) / "mocksu",
            args.users,
            experiments + marks["meterhub"],
        )
        # made before the hubs start; on a failure it removes what it made
        stock_cgroups = StockCgroups(names) if args.together else None
        stock_script = stock_cgroups.wrap(script) if stock_cgroups else script
        stock = StockMocksu(
            Path(tmp) / "stock",
            stock_script,
            args.users,
            marks["stock"] + (STOCK_PORTS if args.together else ""),
        )
        results: dict[str, list[dict]] = {"meterhub": [], "stock": []}
        try:
            ours.start()
            stock.start()
            # the billing service is the hub's child: `meterhub.hub.cli billing service`
            billing = until(
                lambda: [p for p in children().get(ours.proc.pid, []) if "billing" in cmdline(p)],
                "the billing service",
            )[0]
            counted = {
                "meterhub": {"hub": ours.proc.pid, "billing": billing},
                "stock": {"hub": stock.proc.pid},
            }
            # the same request to both: JupyterHub saves the options either way
            request = {"profile": "debug"}
            hubs = {
                "meterhub": (ours, request),
                "stock": (stock, {} if args.stock_bare else request),
            }
            for label, (hub, options) in hubs.items():
                if args.only not in (None, label):
                    continue
                create_users(hub, names)
                hub.spawn(names[0], options)  # warm up: imports, caches, the demo pool
                hub.stop_server(names[0])
            for round_no in range(args.rounds if args.together else 0):
                pair = threading.Barrier(2)
                with ThreadPoolExecutor(2) as both:
                    futures = {
                        label: both.submit(
                            burst,
                            hubs[label][0],
                            names,
                            hubs[label][1],
                            counted[label],
                            together=pair,
                        )
                        for label in ("meterhub", "stock")
                    }
                for label, future in futures.items():
                    results[label].append(future.result())
                    print(f"round {round_no + 1} (together) " + show(label, results[label][-1]))
            for round_no in range(0 if args.together else args.rounds):
                order = ["meterhub", "stock"] if round_no % 2 == 0 else ["stock", "meterhub"]
                order = order[::-1] if args.stock_first else order
                order = [label for label in order if args.only in (None, label)]
                for label in order:
                    hub, options = hubs[label]
                    spy = None
                    if args.profile and round_no == 0:
                        spy = profile(label, counted[label], args.profile, args.profile_rate)
                    marked = (args.yappi and round_no == 0) or args.gc
                    mark_pid = hub.proc.pid if marked else None
                    perf_out = None
                    if args.perf and round_no == 0:
                        perf_out = PROFILE_DIR / f"spawn_burst-{label}.perf"
                    r = burst(hub, names, options, counted[label], mark_pid, perf_out)
                    for proc, _out in spy or []:
                        proc.wait(args.profile + 60)
                    results[label].append(r)
                    print(f"round {round_no + 1} " + show(label, r), flush=True)
                    if args.gc:
                        print(f"round {round_no + 1} {label}: {gc_during(gc_out[label])}")
        except Exception:
            print(ours.log_tail(80), stock.log_tail(80), sep="\n", file=sys.stderr)
            raise
        finally:
            try:
                ours.teardown()
                stock.teardown()
            finally:
                if stock_cgroups:
                    stock_cgroups.remove()
        for label in ("meterhub", "stock"):
            for i, r in enumerate(results[label]):
                if r["failed"]:
                    print(f"{label} round {i + 1}: {r['failed']} failed", file=sys.stderr)
        if not args.only:
            ratios = [
                sum(a["cpu"].values()) / sum(b["cpu"].values())
                for a, b in zip(results["meterhub"], results["stock"], strict=True)
            ]
            each = ", ".join(f"{x:.2f}" for x in ratios)
            print(f"CPU ratio meterhub (hub + billing) / stock (hub) per round: {each}")
        if args.yappi:
            print(f"yappi CPU profiles (pstats): {PROFILE_DIR}/spawn_burst-*.pstat")
        if args.profile:
            print(f"py-spy profiles (collapsed stacks): {PROFILE_DIR}/spawn_burst-*.txt")


def profile(label: str, pids: dict[str, int], seconds: int, rate: int) -> list:
    """py-spy record of each counted process for `seconds` (raw text, for `--format raw`)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    procs = []
    for what, pid in pids.items():
        out = PROFILE_DIR / f"spawn_burst-{label}-{what}.txt"
        command = [spy, "record", "-p", str(pid), "-d", str(seconds), "-r", str(rate)]
        command += ["--format", "raw", "-o", str(out), "--nonblocking"]
        procs.append((subprocess.Popen(command, stdout=subprocess.DEVNULL), out))
    time.sleep(1)
    return procs


if __name__ == "__main__":
    main()
