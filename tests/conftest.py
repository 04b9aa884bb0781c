"""Fixtures for the meterhub tests.

- `hub_factory`: starts real hubs (`meterhub serve` in a subprocess, real proxy, real
  `jupyterhub-singleuser` servers in real sandboxes) on free ports with a site config you
  pass; every hub and every server it started is stopped at teardown.
- `hub`: one module-wide hub with a declared inventory of 2 × A800 and 1 × RTX 4090.
- `admin_token`: the `METERHUB_ADMIN_TOKEN` the hubs are started with.
- `postgres`: one throwaway PostgreSQL cluster for the session (`.new_database()` gives a
  fresh database URL).
- `ledger_url`: a fresh ledger database URL, once on SQLite and once on PostgreSQL.
"""

from __future__ import annotations

import pytest

from .hubprocess import ADMIN_TOKEN, HubProcess
from .postgres import PostgresCluster


@pytest.fixture(scope="session")
def admin_token() -> str:
    return ADMIN_TOKEN


@pytest.fixture(scope="module", autouse=True)
def _no_trial_listener_outlives_its_module():
    """Configuring a hub in this process (meterhub.hub.k8s.configure, the in-process hubs)
    adds a trial-credit listener on JupyterHub's users table: it must not fire for another
    module's accounts."""
    yield
    from meterhub.billing_hooks.hooks import unregister_trial_credit

    unregister_trial_credit()


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
    return hub_factory(
        {
            "gpus": [{"type": "a800", "count": 2}, {"type": "rtx4090", "count": 1}],
            # group restrictions (neither choice fits this machine anyway)
            "profiles": {
                "h800": {"allowed_groups": ["staff"]},
                "a800": {"allowed_groups_by_count": {"8": ["staff"]}},
            },
        }
    )


@pytest.fixture(scope="session")
def postgres():
    cluster = PostgresCluster()
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.sqlite"
    return request.getfixturevalue("postgres").new_database()


#: Debian's Chromium, which `make test` installs (scripts/system-deps)
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Chromium driven by Playwright, one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()
