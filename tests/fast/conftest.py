"""Fixtures for the fast, in-process tests (`pytest tests/fast`).

JupyterHub's own tests run a `MockHub` on the test's event loop; these run meterhub's hub the
same way, configured by meterhub's own code (`load_site_config`, `prepare`, `apply_config`,
`check_ledger`, `runtime_config`: what `meterhub serve` runs), with three parts replaced:

- the proxy by `RouteTable`, which keeps the routes in memory (requests go to the hub's own
  port and to the billing service's, as configurable-http-proxy would send them);
- the single-user server by `AnsweringLocalGPUSpawner`: LocalGPUSpawner's options parsing, group
  checks, GPU allocation and billing hooks, then a tiny HTTP answer on this loop instead of
  JupyterLab in a sandbox;
- billing's clock by a `FakeClock` the test moves (`hub.clock.advance(90)`).

The billing service (`billing_hooks.service.make_app`) runs on the same loop, behind the
hub's real token checks (HubOAuthenticated asks the in-process hub's API).

Fixtures:

- `fast_hub_factory`: start an `InProcessHub` for a site config (dict) on this module's
  event loop; all are stopped at the module's end.
- `fast_hub`: one module-wide hub with a declared inventory of 2 × A800 and 1 × RTX 4090,
  ¥1.00 trial credit and debug mode at ¥3.60/h.

Tests using them are async and run on the module's loop: a module sets
`pytestmark = FAST` (from .inprocess), which also marks them `fast`.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from .inprocess import InProcessHub


def pytest_configure(config):
    config.addinivalue_line("markers", "fast: in-process hub tests (tests/fast), no subprocesses")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fast_hub_factory(tmp_path_factory):
    hubs: list[InProcessHub] = []
    with pytest.MonkeyPatch.context() as patch:

        async def make(site: dict | None = None, name: str = "fasthub") -> InProcessHub:
            hub = InProcessHub(tmp_path_factory.mktemp(name), site or {}, patch)
            hubs.append(hub)
            await hub.start()
            return hub

        yield make
        for hub in reversed(hubs):
            await hub.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fast_hub(fast_hub_factory) -> InProcessHub:
    return await fast_hub_factory(
        {
            "gpus": [{"type": "a800", "count": 2}, {"type": "rtx4090", "count": 1}],
            "profiles": {"debug": {"price_per_hour": "3.60"}},
            "billing": {"trial_credit": "1.00", "min_minutes_to_start": 10},
        }
    )
