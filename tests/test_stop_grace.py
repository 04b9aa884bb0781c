"""Stopping a server: SIGTERM to the server and every kernel in it, `stop_grace_seconds`
to checkpoint, then SIGKILL (a real hub, real sandboxed servers and kernels)."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from meterhub.spawner.local import disk_dirname, group_has_live_members

from .hubprocess import ADMIN_TOKEN, until

# ---------------------------------------------------------------- stopping: SIGTERM, a grace, SIGKILL

GRACE_SECONDS = 8

CHECKPOINTS = """
import os, signal, time
step = 0
def checkpoint(signum, frame):
    with open("checkpoint.txt", "w") as f:
        f.write(f"step {step}")
    os._exit(0)
signal.signal(signal.SIGTERM, checkpoint)
print("training", flush=True)
while True:
    step += 1
    time.sleep(0.05)
"""

IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("training", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def graceful(hub_factory):
    return hub_factory({"gpus": [], "stop_grace_seconds": GRACE_SECONDS}, name="grace")


async def start_training(hub, user: str, code: str) -> None:
    """Run `code` in a new kernel of `user`'s server and return once it printed "training",
    leaving the cell running (as a training loop is when its server is stopped)."""
    headers = {"Authorization": f"token {ADMIN_TOKEN}"}
    api = f"{hub.url}/user/{user}/api/kernels"
    r = requests.post(api, headers=headers, json={}, timeout=60)
    assert r.status_code == 201, r.text
    ws_url = api.replace("http", "ws", 1) + f"/{r.json()['id']}/channels"
    ws = await websocket_connect(HTTPRequest(ws_url, headers=headers, request_timeout=60))
    header = {
        "msg_id": uuid.uuid4().hex,
        "username": user,
        "session": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "version": "5.3",
        "date": datetime.now(UTC).isoformat(),
    }
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}}
    ws.write_message(
        json.dumps(
            {
                "header": header,
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "content": {**content, "allow_stdin": False, "stop_on_error": True},
            }
        )
    )
    while True:
        msg = json.loads(await ws.read_message())
        if msg.get("parent_header", {}).get("msg_id") != header["msg_id"]:
            continue
        assert msg["msg_type"] != "error", msg["content"]
        if msg["msg_type"] == "stream" and "training" in msg["content"]["text"]:
            break
    ws.close()


def processes_in(folder: str) -> set[int]:
    """Host pids whose working directory is `folder` (a server's kernels are in its disk)."""
    found = set()
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/cwd") == folder:
                found.add(int(pid))
        except OSError:
            pass
    return found


async def test_a_stop_gives_a_training_kernel_sigterm_and_time_to_checkpoint(graceful):
    graceful.spawn("kim", {"profile": "debug"})
    disk = os.path.join(graceful.data_dir, "disks", disk_dirname("kim"))
    await start_training(graceful, "kim", CHECKPOINTS)
    started = time.monotonic()
    graceful.stop_server("kim")
    took = time.monotonic() - started
    with open(os.path.join(disk, "checkpoint.txt")) as f:
        saved = f.read()
    # SIGTERM reached the running cell (not SIGINT first, which would have ended it)
    assert saved.startswith("step ") and int(saved.split()[1]) > 0, saved
    assert took < GRACE_SECONDS, f"stopped after {took:.1f} s: it waited for nothing"


async def test_a_kernel_that_ignores_sigterm_is_killed_after_the_grace(graceful):
    server = graceful.spawn("lin", {"profile": "debug"})
    disk = os.path.join(graceful.data_dir, "disks", disk_dirname("lin"))
    await start_training(graceful, "lin", IGNORES_SIGTERM)
    kernels = processes_in(disk)
    assert kernels, "the kernel runs in the disk"
    started = time.monotonic()
    graceful.stop_server("lin")
    took = time.monotonic() - started
    assert took >= GRACE_SECONDS - 0.5, f"killed after {took:.1f} s, before the grace"
    assert took < GRACE_SECONDS + 15, f"stopped only after {took:.1f} s"
    until(lambda: not processes_in(disk) & kernels, "the kernel to be gone", timeout=10)
    assert not group_has_live_members(server["state"]["pid"])
    assert f"did not exit within {GRACE_SECONDS} s of SIGTERM: killing it" in (
        graceful.log_path.read_text()
    )
