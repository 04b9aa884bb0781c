"""The local backend after a crash, and what it leaves readable: a hub killed mid-spawn
stops the server it had started before it hands that server's GPU to anyone else; the
runtime records that make it possible (pure parts); private data directory and databases."""

from __future__ import annotations

import logging
import os
import signal
import stat
import threading
from pathlib import Path

import pytest
import requests

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.orm import Entry, MeteredSession
from meterhub.spawner import procs
from meterhub.spawner.local import (
    ProcessInfo,
    ServerRecord,
    carries_marker,
    group_has_live_members,
    read_record,
    read_records,
    record_path,
    server_processes,
    stop_recorded_server,
    write_record,
)

from .hubprocess import until
from .test_cgroups import remove_hub_cgroups

DISK = "/srv/meterhub/disks/bob"

# ---------------------------------------------------------------- records (pure)


def test_a_record_round_trips_and_bad_ones_are_refused():
    record = ServerRecord("3/", DISK, 1_700_000_000, (0, 1), ("/sys/fs/cgroup/x",), pid=4242)
    assert ServerRecord.from_json(record.to_json()) == record
    assert ServerRecord.from_json(ServerRecord("3/", DISK, 1).to_json()).pid is None
    for text in ("[]", "{}", '{"owner": "3/", "marker": "rel", "started_at": 1}', "{"):
        with pytest.raises(ValueError):
            ServerRecord.from_json(text)
    with pytest.raises(ValueError):
        ServerRecord.from_json(record.to_json().replace("4242", "1"))  # never init


def test_records_are_written_atomically_and_privately(tmp_path):
    record = ServerRecord("3/", DISK, 1, (0,))
    write_record(str(tmp_path), record)
    path = Path(record_path(str(tmp_path), "3/"))
    # a crash's temporary file, readable by all, is written over privately
    Path(f"{path}.tmp").write_text("{")
    os.chmod(f"{path}.tmp", 0o666)
    write_record(str(tmp_path), ServerRecord("3/", DISK, 1, (0,), pid=77))
    assert read_record(str(tmp_path), "3/") == ServerRecord("3/", DISK, 1, (0,), pid=77)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    (path.parent / "junk.json").write_text("not json")
    (path.parent / "x.json.tmp").write_text("{")  # an interrupted write: ignored
    records, bad = read_records(str(tmp_path))
    assert [r.pid for r in records] == [77] and bad == [str(path.parent / "junk.json")]


def proc(pid, pgid, argv=(b"python",), state="S", started_at=100.0):
    return ProcessInfo(pid, pgid, state, started_at, tuple(argv))


BWRAP = (b"bwrap", b"--bind", DISK.encode(), b"/home/jovyan", b"--", b"jupyterhub-singleuser")


def test_only_a_group_that_carries_the_marker_is_the_servers():
    record = ServerRecord("3/", DISK, 100, pid=50)
    server = [proc(50, 50, BWRAP), proc(51, 50, BWRAP), proc(52, 50), proc(53, 50, state="Z")]
    found = server_processes(record, server + [proc(60, 60, BWRAP)])
    assert (found.pgids, found.pids) == ({50}, {50, 51, 52})  # zombies and others left out
    # pid 50 was recycled by an unrelated program, or by another user's server
    assert not server_processes(record, [proc(50, 50, (b"sshd",)), proc(51, 50)])
    other = (b"bwrap", b"--bind", DISK.encode() + b"x", b"/home/jovyan")
    assert not server_processes(record, [proc(50, 50, other)])
    # a group proven earlier stays the server's while it has members
    assert server_processes(record, [proc(52, 50)], known_pgids={50}).pids == {52}
    # what is in the server's cgroup is its own, whatever its group
    assert server_processes(record, [proc(70, 70)], cgroup_pids={70}).pids == {70}


def test_without_a_pid_the_group_leaders_started_since_the_record_are_candidates():
    record = ServerRecord("3/", DISK, 100)
    before = [proc(40, 40, BWRAP, started_at=90.0), proc(41, 40)]
    after = [proc(50, 50, BWRAP, started_at=100.5), proc(51, 50)]
    assert server_processes(record, before + after).pids == {50, 51}


def test_the_marker_is_a_whole_argument():
    assert carries_marker([b"x", DISK.encode()], DISK)
    assert carries_marker([b"--ServerApp.root_dir=" + DISK.encode()], DISK)
    assert not carries_marker([DISK.encode() + b"2"], DISK)
    assert not carries_marker([b"ls " + DISK.encode()], DISK)


def test_stopping_a_recorded_server_stops_its_group_even_when_stopped(tmp_path):
    import subprocess
    import sys

    marker = str(tmp_path / "disk")
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", marker], start_new_session=True
    )
    try:
        os.killpg(child.pid, signal.SIGSTOP)
        record = ServerRecord("9/", marker, 0, pid=child.pid)
        reaper = threading.Thread(target=child.wait)  # as init would
        reaper.start()
        assert stop_recorded_server(record, logging.getLogger("test"), term_timeout=10)
        reaper.join(10)
        assert child.returncode == -signal.SIGTERM
        # nothing left: a second stop has nothing to do
        assert stop_recorded_server(record, logging.getLogger("test"))
    finally:
        if child.poll() is None:
            child.kill()


# ---------------------------------------------------------------- a real hub


@pytest.fixture(scope="module")
def box(hub_factory):
    hub = hub_factory(
        {"gpus": [{"type": "rtx4090", "count": 1}], "billing": {"meter_interval_seconds": 1}},
        name="box",
    )
    yield hub
    hub.teardown()
    remove_hub_cgroups(hub.data_dir)


DATABASES = ("jupyterhub.sqlite", "billing.sqlite", "gpu-allocations.sqlite")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _database_modes(data_dir) -> dict[str, int]:
    modes = {}
    for name in DATABASES:
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = os.path.join(data_dir, name + suffix)
            if suffix == "" or os.path.exists(path):
                modes[name + suffix] = _mode(path)
    return modes


def test_data_dir_and_databases_are_private(box):
    box.spawn("quin", {"profile": "debug"})
    box.stop_server("quin")
    assert _mode(box.data_dir) == 0o700
    modes = _database_modes(box.data_dir)
    assert modes == dict.fromkeys(modes, 0o600) and len(modes) > 3, modes

    # a data directory from before: world-readable; the hub tightens it at start
    box.stop()
    os.chmod(box.data_dir, 0o755)
    for name in os.listdir(box.data_dir):
        if ".sqlite" in name:
            os.chmod(os.path.join(box.data_dir, name), 0o644)
    box.start()
    box.spawn("quin", {"profile": "debug"})
    box.stop_server("quin")
    assert _mode(box.data_dir) == 0o700
    modes = _database_modes(box.data_dir)
    assert modes == dict.fromkeys(modes, 0o600), modes


def _sandbox_of(disk: str) -> tuple[int, int] | None:
    """(pid, process group) of a process whose command line names `disk`."""
    wanted = disk.encode()
    return next(((p.pid, p.pgid) for p in procs.scan() if wanted in p.argv), None)


def _billing_services(hub) -> list[int]:
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"service" in argv and str(hub.config_path).encode() in argv:
            pids.append(int(entry))
    return pids


def test_a_hub_killed_mid_spawn_stops_that_server_before_freeing_its_gpu(box):
    box.ensure_user("ola")
    disk = os.path.join(box.data_dir, "disks", "ola")

    def post():
        try:
            box.api("POST", "/users/ola/server", json={"profile": "rtx4090", "gpus": "1"})
        except requests.RequestException:
            pass  # the hub dies under the request

    threading.Thread(target=post, daemon=True).start()
    _, pgid = until(lambda: _sandbox_of(disk), "ola's sandbox to start", interval=0.02)
    os.killpg(pgid, signal.SIGSTOP)  # it can never become ready: the spawn stays pending
    assert not box.server("ola")["ready"]
    # the spawner recorded it, with its process group, before JupyterHub saved anything
    record = until(
        lambda: [r for r in read_records(box.data_dir)[0] if r.marker == disk and r.pid],
        "ola's runtime record",
    )[0]
    assert record.pid == pgid and record.gpu_indices == (0,)

    box.stop(signal.SIGKILL)  # before JupyterHub saved the server's state
    until(lambda: not _billing_services(box), "the orphaned billing service to exit")
    assert group_has_live_members(pgid), "the server outlives the hub"
    box.start()

    # the hub stopped it before it served anything, and only then freed its GPU
    assert not group_has_live_members(pgid), "the orphaned server must be stopped"
    assert box.server("ola") is None
    assert f"Stopping {record.owner} (processes" in box.log_path.read_text(errors="replace")
    assert not os.path.exists(record_path(box.data_dir, record.owner))
    server = box.spawn("pia", {"profile": "rtx4090", "gpus": "1"})
    assert server["state"]["gpu_indices"] == [0]
    box.stop_server("pia")

    # billing: the session is closed, and nothing was charged for a server never ready
    ledger = Ledger(connect(f"sqlite:///{box.data_dir}/billing.sqlite"))

    def session():
        with ledger.begin() as db:
            (row,) = db.query(MeteredSession).filter_by(user_name="ola").all()
            return row.stopped_at is not None and row

    closed = until(session, "ola's billing session to be closed")
    assert closed.ready_at is None
    with ledger.begin() as db:
        assert db.query(Entry).filter_by(kind="charge", session_id=closed.id).count() == 0
    assert ledger.balance("ola") == to_micros("10.00")


@pytest.mark.skipif(os.geteuid() != 0, reason="servers run as other uids only under a root hub")
def test_without_the_sandbox_under_root_the_data_dir_stays_traversable(hub_factory):
    plain = hub_factory({"gpus": [], "local": {"sandbox": "off"}}, name="plain")
    assert _mode(plain.data_dir) == 0o711
    assert "is mode 0711 (traversable, not listable), not 0700" in plain.log_path.read_text()
    modes = _database_modes(plain.data_dir)
    assert modes == dict.fromkeys(modes, 0o600), modes
    plain.teardown()
