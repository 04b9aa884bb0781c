"""The local backend gives each starting server a port no other server of the hub has: a
free port found now is bound by its server only seconds (in a burst, a minute) later."""

from __future__ import annotations

import types

import pytest

from meterhub.spawner import local
from meterhub.spawner.local import LocalGPUSpawner


def _spawner(owner: str) -> types.SimpleNamespace:
    ns = types.SimpleNamespace(owner_key=owner)
    ns._forget_port = types.MethodType(LocalGPUSpawner._forget_port, ns)
    ns._unique_port = types.MethodType(LocalGPUSpawner._unique_port, ns)
    return ns


@pytest.fixture(autouse=True)
def _no_ports_taken(monkeypatch):
    monkeypatch.setattr(LocalGPUSpawner, "_ports_taken", {})


def test_two_starts_never_get_the_same_port_and_a_stop_frees_it(monkeypatch):
    offered = iter([5000, 5000, 5000, 5001, 5000])
    monkeypatch.setattr(local, "random_port", lambda: next(offered))
    amy, ben = _spawner("1/"), _spawner("2/")
    assert amy._unique_port() == 5000
    assert ben._unique_port() == 5001  # 5000 was offered twice more: amy's
    amy._forget_port()  # amy's server stopped
    assert _spawner("3/")._unique_port() == 5000


def test_a_restart_of_one_server_gives_back_its_old_port_first(monkeypatch):
    offered = iter([6000, 6001])
    monkeypatch.setattr(local, "random_port", lambda: next(offered))
    amy = _spawner("1/")
    assert amy._unique_port() == 6000
    assert amy._unique_port() == 6001
    assert LocalGPUSpawner._ports_taken == {6001: "1/"}
