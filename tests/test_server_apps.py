"""Web apps inside a server through jupyter-server-proxy (extensions/apps.py): TensorBoard
answers at /user/NAME/tensorboard/ behind the server's own authentication, and shows runs
written anywhere on the disk; VS Code is offered only where code-server is installed."""

from __future__ import annotations

import pytest
import requests

from meterhub.extensions import apps

from .hubprocess import ADMIN_TOKEN, until
from .jupyter import execute

WRITE_RUN = """
import os, struct, time, zlib
# a TensorBoard event file by hand (its record format: length, crc, data, crc), so that this
# test needs no PyTorch: one scalar, "loss" = 0.5 at step 1
from tensorboard.compat.proto import event_pb2, summary_pb2
os.makedirs("runs/first", exist_ok=True)
event = event_pb2.Event(wall_time=time.time(), step=1, summary=summary_pb2.Summary(
    value=[summary_pb2.Summary.Value(tag="loss", simple_value=0.5)]))
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter("runs/first")
writer.add_event(event)
writer.close()
print(sorted(os.listdir("runs/first"))[0].startswith("events.out.tfevents"))
"""


def test_an_app_the_environment_lacks_is_left_out(monkeypatch):
    monkeypatch.setattr(apps.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="code-server is not installed"):
        apps.code_server()
    with pytest.raises(RuntimeError, match="TensorBoard is not installed"):
        apps.tensorboard()
    monkeypatch.setattr(apps.shutil, "which", lambda name: f"/opt/bin/{name}")
    entry = apps.code_server()
    assert entry["command"][:3] == ["code-server", "--auth", "none"]
    assert "127.0.0.1:{port}" in entry["command"]


async def test_tensorboard_answers_through_the_server_proxy_with_the_disks_runs(hub_factory):
    hub = hub_factory({}, name="apps")
    hub.spawn("tia", {"profile": "debug"})
    assert (await execute(hub.url, "tia", ADMIN_TOKEN, WRITE_RUN)).strip() == "True"
    auth = {"Authorization": f"token {ADMIN_TOKEN}"}
    listed = requests.get(f"{hub.url}/user/tia/server-proxy/servers-info", headers=auth, timeout=60)
    assert listed.status_code == 200, listed.text
    assert "tensorboard" in [s["name"] for s in listed.json()["server_processes"]]
    page = requests.get(f"{hub.url}/user/tia/tensorboard/", headers=auth, timeout=120)
    assert page.status_code == 200, page.text[:500]
    assert "tensorboard" in page.text.lower()

    def runs():
        r = requests.get(f"{hub.url}/user/tia/tensorboard/data/runs", headers=auth, timeout=60)
        return r.status_code == 200 and "runs/first" in r.json() and r.json()

    until(runs, "TensorBoard to find the run on the disk", timeout=120)
    # behind the server's own authentication: nothing without a token
    anonymous = requests.get(
        f"{hub.url}/user/tia/tensorboard/data/runs", timeout=60, allow_redirects=False
    )
    assert anonymous.status_code in (302, 403)
    hub.stop_server("tia")
