"""Whether a server's process group still runs: its leader alone answers in the common case,
and a group whose leader has exited is still found by its members."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from meterhub.spawner import local
from meterhub.spawner.local import group_has_live_members

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
