"""`meterhub stop`: a real hub stopped with its proxy and billing service, its users' servers
left running (and adopted) or, with --servers, stopped and billed exactly to their stop;
nothing running, stale pid files, a hub that ignores SIGTERM, a proxy that outlives it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import accrued, to_micros, window_charge
from meterhub.billing_hooks.orm import Entry, MeteredSession
from meterhub.spawner.local import group_has_live_members

from .clirun import run_cli
from .hubprocess import until

RATE = to_micros("36.00")  # 0.01 per second
SITE = {
    "gpus": [],
    "profiles": {"debug": {"price_per_hour": "36.00"}},
    "billing": {"meter_interval_seconds": 1, "trial_credit": "100.00", "min_minutes_to_start": 0},
}


def cli(config_path, *args) -> subprocess.CompletedProcess:
    return run_cli(["stop", "--config", str(config_path), *args])


def alive(pid: int) -> bool:
    """A live process (a zombie nobody reaped yet is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def stoppable(hub_factory):
    return hub_factory(SITE, name="stoppable")


def running(hub):
    if hub.proc.poll() is not None:
        hub.start()
    return hub


def test_stop_leaves_servers_running_and_the_next_hub_adopts_them(stoppable, monkeypatch):
    hub = running(stoppable)
    server_pid = hub.spawn("ada", {"profile": "debug"})["state"]["pid"]
    pid_file = Path(hub.data_dir) / "meterhub.pid"
    assert pid_file.read_text() == f"{hub.proc.pid}\n"
    assert stat.S_IMODE(pid_file.stat().st_mode) == 0o600
    proxy = int((Path(hub.data_dir) / "jupyterhub-proxy.pid").read_text())
    (billing,) = hub.service_pids(b"billing", b"service")
    assert alive(proxy) and alive(billing)

    # a second hub on the same data directory is refused before it starts anything
    from meterhub.hub import app

    def launched(*args, **kwargs):
        raise AssertionError("a second hub was launched")

    monkeypatch.setattr(app.MeterHub, "launch_instance", launched)
    second = run_cli(["serve", "--config", str(hub.config_path), "--port", "1"])
    assert second.returncode == 2, second.stderr
    assert f"meterhub serve already runs for {hub.data_dir} (pid {hub.proc.pid})" in second.stderr

    out = cli(hub.config_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"hub (pid {hub.proc.pid}): SIGTERM sent; it exits"
    assert lines[1].startswith(f"hub (pid {hub.proc.pid}): stopped after ")
    assert f"proxy (pid {proxy}): stopped with the hub" in lines
    assert f"billing service (pid {billing}): stopped with the hub" in lines
    assert lines[-1] == "users' servers: 1 left running; the next meterhub serve adopts them"
    # gone, as the command said (reaped here: under load, poll() right away once saw it not
    # reaped yet)
    assert hub.proc.wait(timeout=30) is not None
    assert not alive(proxy) and not alive(billing)
    assert group_has_live_members(server_pid), "the user's server must keep running"
    assert not pid_file.exists()

    hub.start()
    server = hub.server("ada")
    assert server and server["ready"] and server["state"]["pid"] == server_pid
    hub.stop_server("ada")


def _charges(ledger: Ledger, session_id: int) -> list[tuple[int, int, int]]:
    with ledger.begin() as db:
        rows = db.query(Entry).filter_by(session_id=session_id, kind="charge").all()
        return sorted((e.window_start, e.window_end, e.amount_micros) for e in rows)


def test_stop_servers_stops_them_and_bills_exactly_to_their_stop(stoppable):
    hub = running(stoppable)
    ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    server_pid = hub.spawn("bea", {"profile": "debug"})["state"]["pid"]
    (session,) = ledger.open_sessions("bea")
    until(lambda: _charges(ledger, session.id), "the meter to charge bea", timeout=30)
    proxy = int((Path(hub.data_dir) / "jupyterhub-proxy.pid").read_text())

    asked = int(time.time())
    out = cli(hub.config_path, "--servers")
    answered = int(time.time())
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"hub (pid {hub.proc.pid}): SIGTERM sent; it stops users' servers")
    assert "users' servers: 1 stopped with the hub" in lines
    assert lines[-1] == "billing: no session left open"
    assert not group_has_live_members(server_pid)
    assert not alive(proxy) and hub.service_pids(b"billing", b"service") == []
    assert not (Path(hub.data_dir) / "meterhub-stop-servers").exists()

    with ledger.begin() as db:
        closed = db.get(MeteredSession, session.id)
    assert closed.rate_micros_per_hour == RATE
    assert asked <= closed.stopped_at <= answered, "closed at the server's stop"
    windows = _charges(ledger, session.id)
    # the windows tile [ready_at, stopped_at) with no gap or overlap, each at the rate
    assert windows[0][0] == closed.ready_at and windows[-1][1] == closed.stopped_at
    for (_, end, _), (start, _, _) in zip(windows, windows[1:], strict=False):
        assert end == start
    for start, end, amount in windows:
        assert amount == -window_charge(RATE, closed.ready_at, start, end)
    total = -sum(amount for _, _, amount in windows)
    assert total == accrued(RATE, closed.stopped_at - closed.ready_at)
    assert ledger.audit() == []

    again = cli(hub.config_path)
    assert again.returncode == 1 and "no meterhub serve runs for" in again.stderr


# ---------------------------------------------------------------- without a real hub


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    return path


def _data_dir(config: Path) -> Path:
    data = config.parent / "data"
    data.mkdir(exist_ok=True)
    return data


def _process(*argv: str, ignore_term: bool = False) -> subprocess.Popen:
    """A Python process with the given argv after its code (what its command line shows)."""
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(300)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def _end(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def test_nothing_running_is_said_and_changes_nothing(config):
    out = cli(config)
    assert out.returncode == 1 and out.stdout == ""
    data = config.parent / "data"
    assert out.stderr == f"meterhub: no meterhub serve runs for {data} (no {data}/meterhub.pid)\n"
    assert not data.exists()


def test_a_stale_pid_file_kills_nothing(config):
    pid_file = _data_dir(config) / "meterhub.pid"
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        pid_file.write_text(f"{sleeper.pid}\n")
        out = cli(config)
        assert out.returncode == 1, out.stdout
        assert (
            f"names pid {sleeper.pid}, which is now `sleep 300`, not meterhub serve" in out.stderr
        )
        assert sleeper.poll() is None, "an unrelated process must not be signalled"
        assert pid_file.read_text() == f"{sleeper.pid}\n"
    finally:
        sleeper.kill()
        sleeper.wait()
    out = cli(config)  # now the pid is gone
    assert out.returncode == 1 and f"names pid {sleeper.pid}, which is gone" in out.stderr
    pid_file.write_text("not a pid")
    out = cli(config)
    assert out.returncode == 1 and "holds no process id" in out.stderr


def test_a_pid_reused_by_another_hub_is_not_taken_for_ours(config):
    pid_file = _data_dir(config) / "meterhub.pid"
    other = _process("meterhub", "serve")
    try:
        pid_file.write_text(f"{other.pid}\n")
        an_hour_ago = time.time() - 3600  # ours wrote the file; this one started since
        os.utime(pid_file, (an_hour_ago, an_hour_ago))
        out = cli(config)
        assert out.returncode == 1 and "started after the file was written" in out.stderr
        assert other.poll() is None
    finally:
        _end(other)


def test_a_hub_that_ignores_sigterm_is_killed_only_with_force(config):
    data = _data_dir(config)
    hub = _process("meterhub", "serve", ignore_term=True)
    try:
        (data / "meterhub.pid").write_text(f"{hub.pid}\n")
        out = cli(config, "--timeout", "0.5")
        assert out.returncode == 4, out.stdout + out.stderr
        assert f"hub (pid {hub.pid}) still runs after 0.5 s; not killed" in out.stderr
        assert hub.poll() is None
        out = cli(config, "--timeout", "0.5", "--force")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"hub (pid {hub.pid}): still running after 0.5 s; killed (SIGKILL)" in out.stdout
        assert hub.wait(10) == -signal.SIGKILL
        assert not (data / "meterhub.pid").exists()  # the killed hub's file is stale
    finally:
        _end(hub)


def test_a_proxy_that_outlives_its_hub_is_stopped(config):
    data = _data_dir(config)
    stubborn = _process("/x/configurable-http-proxy", ignore_term=True)
    proxy = _process("/x/configurable-http-proxy")
    hubs = [_process("meterhub", "serve"), _process("meterhub", "serve")]
    try:
        # one that goes on SIGTERM
        (data / "jupyterhub-proxy.pid").write_text(f"{proxy.pid}\n")
        (data / "meterhub.pid").write_text(f"{hubs[0].pid}\n")
        out = cli(config, "--timeout", "5")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"proxy (pid {proxy.pid}): outlived the hub; stopped it (SIGTERM)" in out.stdout
        assert proxy.wait(10) == -signal.SIGTERM
        # one that does not: reported, killed only with --force
        (data / "jupyterhub-proxy.pid").write_text(f"{stubborn.pid}\n")
        (data / "meterhub.pid").write_text(f"{hubs[1].pid}\n")
        out = cli(config, "--timeout", "0.5")
        assert out.returncode == 4
        assert f"proxy (pid {stubborn.pid}) outlived the hub and still runs" in out.stderr
        assert stubborn.poll() is None
    finally:
        _end(stubborn, proxy, *hubs)


@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_a_bad_timeout_is_refused(config, timeout):
    out = cli(config, "--timeout", timeout)
    assert out.returncode == 2 and "is not a number of seconds" in out.stderr
