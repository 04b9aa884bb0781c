"""Fixtures for the meterhub tests.

- `hub_factory`: starts real hubs (`meterhub serve` in a subprocess, real proxy, real
  `jupyterhub-singleuser` servers in real sandboxes) on free ports with a site config you
  pass; every hub and every server it started is stopped at teardown.
- `hub`: one module-wide hub with a declared inventory of 2 × A800 and 1 × RTX 4090.
- `admin_token`: the `METERHUB_ADMIN_TOKEN` the hubs are started with.
"""

from __future__ import annotations

import pytest

from .hubprocess import ADMIN_TOKEN, HubProcess


@pytest.fixture(scope="session")
def admin_token() -> str:
    return ADMIN_TOKEN


@pytest.fixture(scope="module")
def hub_factory(tmp_path_factory):
    hubs: list[HubProcess] = []

    def make(site: dict | None = None, name: str = "hub") -> HubProcess:
        hub = HubProcess(tmp_path_factory.mktemp(name), site or {})
        hubs.append(hub)
        hub.start()
        return hub

    yield make
    for hub in hubs:
        hub.teardown()


@pytest.fixture(scope="module")
def hub(hub_factory) -> HubProcess:
    return hub_factory({"gpus": [{"type": "a800", "count": 2}, {"type": "rtx4090", "count": 1}]})
