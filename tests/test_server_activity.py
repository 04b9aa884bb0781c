"""What counts as a server's activity for idle shutdown (extensions/server.py).

- The pieces, pure: which API requests count, the saving window, the status's `idle` and
  `stop` keys, which GPUs a server samples.
- The GPU monitor with the NVML test double (tests/fakes/pynvml.py): busy above the
  threshold stamps activity and, when a GPU turns busy, has jupyterhub-singleuser report it to
  the hub at once; no NVML is logged once and changes nothing. SIGTERM's pass-on to kernels.
- A real `jupyter-server` with the extension and a stand-in billing API (answering as the real
  one, `servers[].cap` included): reads, marking notifications read and JupyterLab's workspace
  saves do not count, saves after `POST /api/meterhub/saving` do not,
  `POST /api/meterhub/activity` does; the status keys.
- A real hub: its activity API's `last_activity` of a server advances while the server's
  GPU is busy and stops when it is idle; GET polls do not advance it, a POST does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from jupyterhub.singleuser.extension import JupyterHubSingleUser

from meterhub.extensions import server as ext
from meterhub.spawner.sandbox import bwrap_works

from .fakes import pynvml as fake_nvml
from .hubprocess import ADMIN_TOKEN, HubProcess, free_port, until

FAKES = Path(__file__).parent / "fakes"
JUPYTER_SERVER = str(Path(sys.executable).parent / "jupyter-server")
BASE = "/user/ada/"


# ---------------------------------------------------------------- which requests count


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "get"])
def test_reads_are_not_activity(method):
    for path in ("/user/ada/api/contents", "/user/ada/api/kernels", "/user/ada/api/sessions"):
        assert not ext.counts_as_activity(method, path, BASE, saving_until=0, now=100)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_changes_are_activity(method):
    assert ext.counts_as_activity(method, "/user/ada/api/contents/a.ipynb", BASE, 0, 100)
    assert ext.counts_as_activity(method, "/user/ada/api/kernels", BASE, 0, 100)


def test_saves_in_the_saving_window_are_not_activity_and_after_it_are():
    until = 130.0  # POST /api/meterhub/saving at t=100
    for path in ("/user/ada/api/contents/a.ipynb", "/user/ada/api/contents/dir/b.py"):
        assert not ext.counts_as_activity("PUT", path, BASE, until, now=129.9)
        assert ext.counts_as_activity("PUT", path, BASE, until, now=130)
    # only saves (PUT): a rename (PATCH), a new kernel, a deleted file or another API is the
    # user at work
    assert ext.counts_as_activity("PATCH", "/user/ada/api/contents/a.ipynb", BASE, until, 110)
    assert ext.counts_as_activity("POST", "/user/ada/api/kernels", BASE, until, 110)
    assert ext.counts_as_activity("DELETE", "/user/ada/api/contents/a.py", BASE, until, 110)
    assert ext.counts_as_activity("PUT", "/user/ada/api/contentsx/a", BASE, until, 110)
    assert ext.counts_as_activity("PUT", "/user/bob/api/contents/a", BASE, until, 110)


def test_the_layout_an_open_tab_saves_by_itself_is_not_activity():
    for path in ("/user/ada/lab/api/workspaces/default", "/user/ada/lab/api/workspaces"):
        assert not ext.counts_as_activity("PUT", path, BASE, saving_until=0, now=100)
    assert ext.counts_as_activity("PUT", "/user/ada/lab/api/workspacesx", BASE, 0, 100)
    assert ext.counts_as_activity("PUT", "/user/bob/lab/api/workspaces/default", BASE, 0, 100)


# ---------------------------------------------------------------- idle and stop


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_idle_is_null_without_a_limit_and_measured_from_the_last_activity():
    assert ext.idle_status({}, NOW, NOW) is None
    assert ext.idle_status({"METERHUB_IDLE_SECONDS": "0"}, NOW, NOW) is None
    environ = {
        "METERHUB_IDLE_SECONDS": "1800",
        "METERHUB_IDLE_WARN_SECONDS": "300",
        "METERHUB_ON_IDLE": "debug",
    }
    assert ext.idle_status(environ, NOW - timedelta(seconds=90.7), NOW) == {
        "idle_seconds": 90,
        "limit_seconds": 1800,
        "warn_seconds": 300,
        "action": "debug",
    }
    # a clock a little ahead of ours, an unknown action
    odd = ext.idle_status({**environ, "METERHUB_ON_IDLE": "x"}, NOW + timedelta(seconds=2), NOW)
    assert odd["idle_seconds"] == 0 and odd["action"] == "stop"


IDLE = {"idle_seconds": 100, "limit_seconds": 1800, "warn_seconds": 300, "action": "stop"}


def test_the_soonest_stop_is_credit_cap_or_idle():
    wallet = {"minutes_left": 60, "servers": []}
    assert ext.soonest_stop(IDLE, wallet, "") == {"reason": "idle", "in_seconds": 1700}
    assert ext.soonest_stop(IDLE, {"minutes_left": 20}, "") == {
        "reason": "credit",
        "in_seconds": 1200,
    }
    assert ext.soonest_stop(IDLE, {"minutes_left": None}, "") == {
        "reason": "idle",
        "in_seconds": 1700,
    }
    capped = {
        "minutes_left": 60,
        "servers": [
            {"server": "", "cap": {"left_seconds": 600, "max_hours": 1}},
            {"server": "gpu", "cap": {"left_seconds": 30}},
        ],
    }
    assert ext.soonest_stop(IDLE, capped, "") == {"reason": "cap", "in_seconds": 600}
    assert ext.soonest_stop(IDLE, capped, "gpu") == {"reason": "cap", "in_seconds": 30}
    assert ext.soonest_stop(IDLE, capped, "other") == {"reason": "idle", "in_seconds": 1700}


def test_a_stop_needs_a_number_and_a_tie_names_what_activity_cannot_put_off():
    assert ext.soonest_stop(None, {"minutes_left": None}, "") is None
    assert ext.soonest_stop(None, {}, "") is None
    nothing = {
        "minutes_left": True,
        "servers": [
            {"server": "", "cap": None},
            {"server": "", "cap": {"left_seconds": None}},
            {"server": "", "cap": {"left_seconds": "60"}},
            "junk",
        ],
    }
    assert ext.soonest_stop(None, nothing, "") is None
    assert ext.soonest_stop(None, {"servers": {"": 5}}, "") is None
    # past the deadline: 0, never negative
    late = dict(IDLE, idle_seconds=2000)
    assert ext.soonest_stop(late, {}, "") == {"reason": "idle", "in_seconds": 0}
    tie = {"minutes_left": 1, "servers": [{"server": "", "cap": {"left_seconds": 60}}]}
    assert ext.soonest_stop(dict(IDLE, idle_seconds=1740), tie, "")["reason"] == "credit"
    cap_tie = {"servers": [{"server": "", "cap": {"left_seconds": 60}}]}
    assert ext.soonest_stop(dict(IDLE, idle_seconds=1740), cap_tie, "")["reason"] == "cap"


# ---------------------------------------------------------------- the GPU monitor


def test_the_servers_gpus_are_what_cuda_is_told():
    assert ext.visible_devices(None) is None  # Kubernetes: every GPU the container sees
    assert ext.visible_devices("") == []
    assert ext.visible_devices("0,2") == ["0", "2"]
    assert ext.visible_devices("GPU-aa, GPU-bb") == ["GPU-aa", "GPU-bb"]


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """The NVML test double as `pynvml`, with a state file; returns a setter of the GPUs."""
    state = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    fake_nvml.calls.clear()

    def set_gpus(*utilizations: int) -> None:
        gpus = [{"uuid": f"GPU-{i}{i}", "utilization": u} for i, u in enumerate(utilizations)]
        state.write_text(json.dumps({"gpus": gpus}))

    return set_gpus


def _monitor(devices, notified: list, settings: dict | None = None) -> ext.GpuMonitor:
    """A monitor whose notify records the activity stamp it finds (what the hub is sent)."""
    settings = settings if settings is not None else {}

    async def notify():
        notified.append(settings.get(ext.GPU_ACTIVITY_KEY))

    return ext.GpuMonitor(settings, devices, 5, 1, notify)


async def test_a_busy_gpu_stamps_activity_and_a_gpu_turning_busy_tells_the_hub(nvml):
    nvml(3, 40)
    notified: list = []
    settings: dict = {}
    monitor = _monitor(["GPU-00"], notified, settings)
    # only its own GPU counts: GPU 1 (40 %) is someone else's
    assert await monitor.sample() is False
    assert ext.GPU_ACTIVITY_KEY not in settings and notified == []
    nvml(6, 40)  # above 5 %
    assert await monitor.sample() is True
    stamp = settings[ext.GPU_ACTIVITY_KEY]
    assert stamp.tzinfo is not None and abs(datetime.now(UTC) - stamp) < timedelta(seconds=5)
    assert notified == [stamp]
    # still busy: the stamp moves on, the hub hears it at the next report
    assert await monitor.sample() is True
    assert settings[ext.GPU_ACTIVITY_KEY] >= stamp and len(notified) == 1
    nvml(5, 40)  # at the threshold is not above it
    assert await monitor.sample() is False
    nvml(99, 0)
    assert await monitor.sample() is True and len(notified) == 2
    assert ("uuid", "GPU-00") in fake_nvml.calls


async def test_gpus_by_index_or_all_that_nvml_shows(nvml):
    nvml(0, 70)
    assert await _monitor(["1"], []).sample() is True
    assert fake_nvml.calls == [("index", 1)]
    fake_nvml.calls.clear()
    assert await _monitor(None, []).sample() is True  # both, as a pod sees only its own
    assert fake_nvml.calls == [("index", 0), ("index", 1)]
    assert await _monitor([], []).sample() is False


async def test_without_nvml_the_monitor_logs_once_and_stamps_nothing(nvml, monkeypatch, caplog):
    monkeypatch.delenv("FAKE_NVML_STATE")  # nvmlInit fails, as without a driver
    settings: dict = {}
    monitor = _monitor(["0"], [], settings)
    with caplog.at_level(logging.WARNING):
        assert await monitor.sample() is None
        assert await monitor.sample() is None
    assert settings == {}
    warnings = [r for r in caplog.records if "cannot read GPU utilization" in r.getMessage()]
    assert len(warnings) == 1
    # no pynvml at all
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert await _monitor(["0"], []).sample() is None
    # a GPU server only, from its environment
    assert ext.gpu_monitor({}, {"METERHUB_GPUS": "0"}) is None
    made = ext.gpu_monitor(
        {},
        {"METERHUB_GPUS": "2", "JUPYTERHUB_ACTIVITY_INTERVAL": "0", "CUDA_VISIBLE_DEVICES": "3,4"},
    )
    assert made.interval_seconds == 1 and made.devices == ["3", "4"] and made.busy_percent == 5


async def test_nvml_is_shut_down_for_each_time_it_is_opened(nvml, monkeypatch):
    opened: list = []
    monkeypatch.setattr(fake_nvml, "nvmlInit", lambda: opened.append("init"))
    monkeypatch.setattr(fake_nvml, "nvmlShutdown", lambda: opened.append("shutdown"))
    nvml(50)
    monitor = _monitor(["0"], [])
    assert await monitor.sample() is True
    assert await monitor.sample() is True
    assert opened == ["init"]  # once, not at every sample
    nvml()  # the GPU is gone (reset): the sample fails and NVML is shut down
    assert await monitor.sample() is None
    assert opened == ["init", "shutdown"]
    # opened again at the next sample; a GPU not found then shuts it down again
    assert await monitor.sample() is None
    assert opened == ["init", "shutdown", "init", "shutdown"]
    nvml(50)
    assert await monitor.sample() is True
    assert opened == ["init", "shutdown", "init", "shutdown", "init"]


class SingleUser:
    """jupyterhub-singleuser's extension app as `notify_hub` sees it."""

    def __init__(self, hub_activity_url: str, fails: bool = False):
        self.hub_activity_url = hub_activity_url
        self.fails = fails
        self.notified = 0

    async def notify_activity(self):
        self.notified += 1
        if self.fails:
            raise TimeoutError("Failed to notify Hub of activity")


def _serverapp(singleuser: SingleUser | None) -> SimpleNamespace:
    points = (
        {} if singleuser is None else {ext.SINGLEUSER_EXTENSION: SimpleNamespace(app=singleuser)}
    )
    return SimpleNamespace(
        extension_manager=SimpleNamespace(extension_points=points), log=logging.getLogger("t")
    )


async def test_a_gpu_turning_busy_has_jupyterhub_singleuser_tell_the_hub(nvml, caplog):
    assert ext.SINGLEUSER_EXTENSION == JupyterHubSingleUser.name
    singleuser = SingleUser("http://hub/hub/api/users/ada/activity")
    settings: dict = {}
    monitor = ext.gpu_monitor(
        settings, {"METERHUB_GPUS": "1"}, notify=lambda: ext.notify_hub(_serverapp(singleuser))
    )
    nvml(0)
    assert await monitor.sample() is False and singleuser.notified == 0
    nvml(80)
    assert await monitor.sample() is True and singleuser.notified == 1
    assert await monitor.sample() is True and singleuser.notified == 1  # still busy
    # a server without a hub, or without an activity URL: nothing to tell
    await ext.notify_hub(_serverapp(None))
    await ext.notify_hub(_serverapp(quiet := SingleUser("")))
    assert quiet.notified == 0
    # a hub that stays unreachable through jupyterhub-singleuser's retries is logged
    with caplog.at_level(logging.WARNING):
        await ext.notify_hub(_serverapp(SingleUser("http://hub/x", fails=True)))
    assert "could not report GPU activity" in caplog.text


# ---------------------------------------------------------------- stopping


class Kernel:
    """A kernel as `terminate_kernels` sees it, that ignores SIGTERM."""

    def __init__(self):
        self.signals: list = []

    def stop_restarter(self):
        pass

    def signal_kernel(self, signum):
        self.signals.append(signum)

    def is_alive(self):
        return True


async def test_kernels_get_sigterm_and_the_grace_on_the_modules_clock(monkeypatch, caplog):
    kernel = Kernel()
    manager = SimpleNamespace(list_kernel_ids=lambda: ["k"], get_kernel=lambda _: kernel)
    clock = iter(range(0, 1000, 10))  # 10 s a look: the fake clock ends the wait, not sleeps
    monkeypatch.setattr(ext, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.WARNING):
        await ext.terminate_kernels(manager, 25, logging.getLogger("t"))
    assert kernel.signals == [signal.SIGTERM]
    assert next(clock) == 40  # deadline 25: looked at 10 and 20, stopped at 30
    assert "1 kernels did not exit within 25 s" in caplog.text


async def test_sigterm_leaves_jupyter_servers_shutdown_its_time_within_the_grace(monkeypatch):
    waited: list = []
    stopped = asyncio.Event()

    async def terminate_kernels(kernel_manager, grace_seconds, logger):
        waited.append(grace_seconds)

    monkeypatch.setattr(ext, "terminate_kernels", terminate_kernels)
    serverapp = SimpleNamespace(
        io_loop=SimpleNamespace(asyncio_loop=asyncio.get_running_loop()),
        kernel_manager=None,
        log=logging.getLogger("t"),
    )
    before = signal.getsignal(signal.SIGTERM)
    try:
        for grace in (30, 3):
            stopped.clear()
            signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
            ext.install_graceful_stop(serverapp, grace)
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
            await asyncio.wait_for(stopped.wait(), 10)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert waited == [30 - ext.SERVER_SHUTDOWN_SECONDS, 0]


# ---------------------------------------------------------------- a real jupyter-server


class Billing(BaseHTTPRequestHandler):
    """The billing API's two answers the status reads; `wallet` is set by each test."""

    wallet: dict = {}

    def do_GET(self):
        assert self.headers["Authorization"] == "token server-token"
        if self.path == "/wallet":
            body = self.wallet
        elif self.path == "/users/ada/notifications?unread=1":
            body = {"notifications": []}
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


WALLET = {
    "user": "ada",
    "currency": "CNY",
    "balance": "9.00",
    "rate_per_hour": "4.50",
    "minutes_left": 120,
    "summary": "¥9.00",
    "warn_minutes": [30, 10],
}
TOKEN = "test-server-token-" + "y" * 16


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    """`jupyter-server` with the extension (enabled as in every server), told a 30-minute
    idle limit; its billing API is `Billing`."""
    billing = ThreadingHTTPServer(("127.0.0.1", free_port()), Billing)
    threading.Thread(target=billing.serve_forever, daemon=True).start()
    root = tmp_path_factory.mktemp("jupyter")
    port = free_port()
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "METERHUB_"))
    }
    environ.update(
        METERHUB_BILLING_URL=f"http://127.0.0.1:{billing.server_port}",
        METERHUB_IDLE_SECONDS="1800",
        METERHUB_IDLE_WARN_SECONDS="300",
        METERHUB_ON_IDLE="debug",
        METERHUB_GPUS="0",
        JUPYTERHUB_API_TOKEN="server-token",
        JUPYTERHUB_USER="ada",
        JUPYTERHUB_SERVER_NAME="gpu",
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
    )
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(
        [
            JUPYTER_SERVER,
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={root}",
        ],
        env=environ,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, (root / "server.log").read_text()
        try:
            return requests.get(f"{url}/api/status", timeout=5, headers=AUTH).ok
        except requests.ConnectionError:
            return False

    try:
        until(up, "jupyter-server to answer")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        billing.shutdown()
        billing.server_close()


AUTH = {"Authorization": f"token {TOKEN}"}


def last_activity(url: str) -> datetime:
    """jupyter_server's own `last_activity()`, what jupyterhub-singleuser reports."""
    r = requests.get(f"{url}/api/status", headers=AUTH, timeout=30)  # not tracked itself
    return datetime.fromisoformat(r.json()["last_activity"])


def call(method: str, url: str, **kwargs) -> requests.Response:
    r = requests.request(method, url, headers=AUTH, timeout=30, **kwargs)
    assert r.ok, f"{method} {url}: {r.status_code} {r.text}"
    return r


def test_reads_do_not_count_writes_and_the_activity_ping_do(jupyter):
    Billing.wallet = WALLET
    call(
        "PUT",
        f"{jupyter}/api/contents/notes.txt",
        json={"type": "file", "format": "text", "content": "1"},
    )
    before = last_activity(jupyter)
    for path in ("api/contents", "api/contents/notes.txt", "api/kernels", "api/sessions",
                 "api/terminals", "api/meterhub/status"):  # fmt: skip
        call("GET", f"{jupyter}/{path}")
    assert last_activity(jupyter) == before, "a read counted as activity"
    # what an open tab does by itself: mark what it showed read, save its layout
    assert call("POST", f"{jupyter}/api/meterhub/notifications/read", json={"ids": []}).json() == {
        "marked": 0
    }
    assert last_activity(jupyter) == before, "marking notifications read counted as activity"
    layout = {"data": {}, "metadata": {"id": "default"}}
    call("PUT", f"{jupyter}/lab/api/workspaces/default", json=layout)
    assert last_activity(jupyter) == before, "JupyterLab's layout save counted as activity"
    r = call("POST", f"{jupyter}/api/meterhub/activity")
    assert r.status_code == 204
    pinged = last_activity(jupyter)
    assert pinged > before
    call("DELETE", f"{jupyter}/api/contents/notes.txt")
    assert last_activity(jupyter) > pinged


def test_saves_announced_as_before_a_stop_do_not_count(jupyter):
    call("POST", f"{jupyter}/api/meterhub/activity")
    before = last_activity(jupyter)
    r = call("POST", f"{jupyter}/api/meterhub/saving")
    assert r.status_code == 204 and not r.content
    body = {"type": "file", "format": "text", "content": "saved before the stop"}
    call("PUT", f"{jupyter}/api/contents/draft.txt", json=body)
    assert last_activity(jupyter) == before, "the pre-stop save cancelled the idle stop"
    # anything else is still the user at work: a rename is a PATCH, not a save
    call("PATCH", f"{jupyter}/api/contents/draft.txt", json={"path": "draft2.txt"})
    assert last_activity(jupyter) > before


def status(url: str) -> dict:
    return call("GET", f"{url}/api/meterhub/status").json()


def test_the_status_says_how_idle_the_server_is_and_when_it_stops(jupyter):
    Billing.wallet = WALLET
    call("POST", f"{jupyter}/api/meterhub/activity")
    answer = status(jupyter)
    assert answer["idle"]["idle_seconds"] in (0, 1)
    assert {k: v for k, v in answer["idle"].items() if k != "idle_seconds"} == {
        "limit_seconds": 1800,
        "warn_seconds": 300,
        "action": "debug",
    }
    idle_left = 1800 - answer["idle"]["idle_seconds"]
    assert answer["stop"] == {"reason": "idle", "in_seconds": idle_left}  # 120 min of credit
    Billing.wallet = dict(WALLET, minutes_left=9)
    assert status(jupyter)["stop"] == {"reason": "credit", "in_seconds": 540}
    # this server ("gpu") has a session cap; another server's cap is not its own
    Billing.wallet = dict(
        WALLET,
        servers=[
            {"server": "", "cap": {"left_seconds": 5}},
            {"server": "gpu", "cap": {"left_seconds": 200, "max_hours": 1}},
        ],
    )
    assert status(jupyter)["stop"] == {"reason": "cap", "in_seconds": 200}


# ---------------------------------------------------------------- a real hub


GPU_IDLE_SECONDS = 18  # 0.3 minutes


def _sandbox_mode() -> str | None:
    if bwrap_works() == "":
        return "bwrap"
    # unsandboxed servers of a root hub run as other uids, which cannot reach pytest's
    # private temporary folders
    return None if os.geteuid() == 0 else "off"


@pytest.fixture(scope="module")
def gpu_hub(tmp_path_factory):
    """A hub with one declared A800, activity reported every second, a 10 % busy threshold,
    and the NVML test double in the pool (`/public/fake-nvml`, read-only in the sandbox),
    first on its servers' PYTHONPATH."""
    mode = _sandbox_mode()
    if mode is None:
        pytest.skip("needs bubblewrap, or a hub that is not root")
    workdir = tmp_path_factory.mktemp("activity-hub")
    pool = workdir / "pool"
    fakes = pool / "fake-nvml"
    fakes.mkdir(parents=True)
    shutil.copy(FAKES / "pynvml.py", fakes / "pynvml.py")
    for path in (workdir, pool, fakes):
        path.chmod(0o755)
    inside = "/public/fake-nvml" if mode == "bwrap" else str(fakes)
    config_d = workdir / "jupyterhub_config.d"
    config_d.mkdir()
    (config_d / "fake_nvml.py").write_text(
        "# the NVML test double instead of pynvml (tests/fakes/pynvml.py)\n"
        f"c.Spawner.environment.update(PYTHONPATH={inside!r},"
        f" FAKE_NVML_STATE={inside + '/state.json'!r})\n"
    )
    hub = HubProcess(
        workdir,
        {
            "gpus": [{"type": "a800", "count": 1}],
            "public_dir": str(pool),
            "idle": {"check_interval_seconds": 1, "gpu_busy_percent": 10, "warn_minutes": 0.1},
            # an A800 idle for 18 s stops (test_the_meter_keeps_…); debug keeps 4 hours
            "profiles": {"a800": {"idle_minutes": GPU_IDLE_SECONDS / 60}},
            "billing": {"meter_interval_seconds": 1, "trial_credit": "100.00"},
            "local": {"sandbox": mode},
        },
    )
    hub.gpu_state = fakes / "state.json"
    set_utilization(hub, 0)
    hub.start()
    yield hub
    hub.teardown()


def set_utilization(hub, percent: int) -> None:
    temporary = hub.gpu_state.with_suffix(".tmp")
    temporary.write_text(json.dumps({"gpus": [{"uuid": "", "utilization": percent}]}))
    temporary.chmod(0o644)
    os.replace(temporary, hub.gpu_state)


def hub_activity(hub, user: str) -> datetime:
    """The server's `last_activity` in the hub's API: what an idle culler reads."""
    return datetime.fromisoformat(hub.server(user)["last_activity"])


def settled(hub, user: str, quiet_seconds: float = 3.5) -> datetime:
    """The hub's `last_activity` of the server once it has not moved for `quiet_seconds`
    (more than three reports)."""
    seen = {"at": hub_activity(hub, user), "since": time.monotonic()}

    def quiet():
        now = hub_activity(hub, user)
        if now != seen["at"]:
            seen.update(at=now, since=time.monotonic())
        return time.monotonic() - seen["since"] >= quiet_seconds and seen["at"]

    return until(quiet, f"{user}'s activity to settle", timeout=60, interval=0.5)


def advances(hub, user: str, times: int) -> list[datetime]:
    seen = [hub_activity(hub, user)]

    def moved():
        now = hub_activity(hub, user)
        if now > seen[-1]:
            seen.append(now)
        return len(seen) > times

    until(moved, f"{user}'s activity to advance {times} times", timeout=30, interval=0.3)
    return seen


def user_api(hub, method: str, user: str, path: str) -> requests.Response:
    r = requests.request(
        method,
        f"{hub.url}/user/{user}/{path}",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=60,
    )
    assert r.ok, f"{method} {path}: {r.status_code} {r.text}"
    return r


def test_polls_do_not_keep_a_server_active_a_post_does(gpu_hub):
    gpu_hub.spawn("ada", {"profile": "debug"})
    quiet = settled(gpu_hub, "ada")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # an open JupyterLab tab, polling
        for path in ("api/contents", "api/kernels", "api/sessions", "api/meterhub/status"):
            user_api(gpu_hub, "GET", "ada", path)
        time.sleep(0.25)
    assert settled(gpu_hub, "ada", quiet_seconds=2) == quiet, "GET polls counted as activity"
    # the status the JupyterLab extension shows: debug mode's default of 4 hours
    idle = user_api(gpu_hub, "GET", "ada", "api/meterhub/status").json()["idle"]
    assert idle["limit_seconds"] == 14400 and idle["action"] == "stop"
    assert idle["idle_seconds"] >= 3
    assert user_api(gpu_hub, "POST", "ada", "api/meterhub/activity").status_code == 204
    until(lambda: hub_activity(gpu_hub, "ada") > quiet, "the POST to reach the hub", timeout=20)
    gpu_hub.stop_server("ada")


def test_a_busy_gpu_keeps_its_server_active_and_an_idle_one_does_not(gpu_hub):
    set_utilization(gpu_hub, 50)
    server = gpu_hub.spawn("gil", {"profile": "a800", "gpus": "1"})
    assert server["state"]["gpu_indices"] == [0]
    advances(gpu_hub, "gil", 3)
    set_utilization(gpu_hub, 10)  # at the site's threshold: not busy
    quiet = settled(gpu_hub, "gil")
    assert settled(gpu_hub, "gil", quiet_seconds=2) == quiet
    status = user_api(gpu_hub, "GET", "gil", "api/meterhub/status").json()
    assert status["idle"]["limit_seconds"] == GPU_IDLE_SECONDS
    assert status["idle"]["idle_seconds"] >= 3
    set_utilization(gpu_hub, 90)
    until(lambda: hub_activity(gpu_hub, "gil") > quiet, "a busy GPU to count again", timeout=20)
    log = gpu_hub.log_path.read_text()
    assert "cannot read GPU utilization" not in log
    gpu_hub.stop_server("gil")


def test_the_meter_keeps_a_busy_gpu_server_past_its_idle_timeout_and_stops_it_idle(gpu_hub):
    """Nobody touches the server: a training run on its GPU keeps it (for twice its idle
    timeout here); once the GPU falls idle, the meter warns, then stops it."""
    from meterhub.billing_hooks.db import connect
    from meterhub.billing_hooks.ledger import Ledger

    ledger = Ledger(connect(f"sqlite:///{gpu_hub.data_dir}/billing.sqlite"))
    set_utilization(gpu_hub, 60)
    gpu_hub.spawn("hal", {"profile": "a800", "gpus": "1"})
    (session,) = ledger.open_sessions("hal")

    def busy_for_twice_the_timeout():
        assert gpu_hub.server("hal") is not None, "a busy GPU server was stopped as idle"
        now = ledger.session(session.id).metered_through or 0
        return now - (ledger.session(session.id).ready_at or now) >= 2 * GPU_IDLE_SECONDS

    until(busy_for_twice_the_timeout, "hal's busy server to outlive its idle timeout")
    assert [n.kind for n in ledger.notifications("hal")] == []
    set_utilization(gpu_hub, 0)
    until(lambda: gpu_hub.server("hal") is None, "hal's idle GPU server to stop", timeout=90)
    kinds = [n.kind for n in ledger.notifications("hal")]
    assert kinds[0] == "idle-warning" and kinds[-1] == "stopped", kinds
    assert ledger.audit() == []
