"""Whether a server's process group still runs: its leader alone answers in the common case,
and a group whose leader has exited is still found by its members."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from meterhub.spawner import local
from meterhub.spawner.local import LocalGPUSpawner, group_has_live_members

SLEEPER = "import time; time.sleep(60)"


def test_a_live_leader_answers_without_a_scan_of_every_process(monkeypatch):
    leader = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    try:
        monkeypatch.setattr(
            local.os, "listdir", lambda path: pytest.fail(f"scanned {path} for a live leader")
        )
        assert group_has_live_members(leader.pid)
    finally:
        leader.kill()
        leader.wait()


def test_a_group_whose_leader_exited_lives_on_in_its_members():
    """The leader starts a child in its group and exits (reaped: not even a zombie)."""
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])",
        ],
        start_new_session=True,
    )
    assert leader.wait(timeout=30) == 0
    try:
        assert not os.path.exists(f"/proc/{leader.pid}")
        assert group_has_live_members(leader.pid), "the child still runs in the group"
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_has_live_members(leader.pid):  # a killed member may stay a zombie: not live
        assert time.monotonic() < deadline, "the killed group still has a live member"
        time.sleep(0.01)


def _spawner(proc: subprocess.Popen, probe) -> types.SimpleNamespace:
    """What LocalGPUSpawner.poll reads of its spawner, around a real process group."""
    return types.SimpleNamespace(
        proc=proc,
        pid=proc.pid,
        cgroup_dirs=[],
        oom_baseline=0,
        last_seen_alive=None,
        _probe=probe,
        server=None,
    )


def test_a_running_child_is_polled_by_waitpid_without_reading_proc():
    """Most polls of a burst (bench/spawn_burst.py): the server is the hub's own child."""
    leader = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    try:
        spawner = _spawner(leader, lambda: pytest.fail("read /proc for its own running child"))
        assert asyncio.run(LocalGPUSpawner.poll(spawner)) is None
        assert spawner.last_seen_alive is not None
    finally:
        leader.kill()
        leader.wait()


def test_a_child_leader_that_exited_is_probed_for_its_members():
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])",
        ],
        start_new_session=True,
    )
    leader.wait(timeout=30)
    probed = []

    def probe():
        probed.append(True)
        return group_has_live_members(leader.pid), 0

    try:
        assert asyncio.run(LocalGPUSpawner.poll(_spawner(leader, probe))) is None
        assert probed, "an exited leader's group must be looked for in /proc"
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
