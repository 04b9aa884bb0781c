"""Billing settings (traitlets), shared by the hub's hooks, the meter service and the CLI."""

from __future__ import annotations

import asyncio
import functools
from decimal import Decimal

from traitlets import Int, List, Unicode
from traitlets.config import LoggingConfigurable

from .db import connect
from .ledger import Ledger
from .money import from_micros, to_micros


class BillingSettings(LoggingConfigurable):
    db_url = Unicode(
        "sqlite:///meterhub-data/billing.sqlite",
        help="SQLAlchemy URL of the ledger database (SQLite or postgresql://, psycopg 3).",
    ).tag(config=True)
    currency = Unicode("CNY", help="ISO 4217 code of the site currency.").tag(config=True)
    trial_credit = Unicode(
        "10.00", help="Credit (an amount string) every new user account gets exactly once."
    ).tag(config=True)
    meter_interval_seconds = Int(
        60,
        min=1,
        help="""
        Seconds between meter passes. The worst overshoot past zero credit is
        rate × (this interval + the stop latency).
        """,
    ).tag(config=True)
    min_minutes_to_start = Int(
        10, min=0, help="A spawn needs credit for this many minutes at its rate."
    ).tag(config=True)
    warn_minutes = List(Int(), [30, 10, 2], help="Minutes left at which users are warned.").tag(
        config=True
    )
    overdraft = Unicode("0", help="How far below zero a wallet may go (an amount string).").tag(
        config=True
    )
    max_grant = Unicode("100000", help="Grants must be below this amount.").tag(config=True)

    @property
    def min_seconds_to_start(self) -> int:
        return self.min_minutes_to_start * 60

    async def ledger_async(self) -> Ledger:
        """The ledger, from a coroutine: the first call per database connects and checks the
        schema (I/O), which must not run on the hub's event loop."""
        return await asyncio.to_thread(self.ledger)

    def ledger(self) -> Ledger:
        return Ledger(
            _engine(self.db_url),
            currency=self.currency,
            trial_credit_micros=to_micros(Decimal(self.trial_credit)),
            overdraft_micros=to_micros(Decimal(self.overdraft)),
        )


@functools.cache
def _engine(db_url: str):
    return connect(db_url)


def priced_catalog(config, ledger: Ledger):
    """The catalog with the admins' price changes (kept in the ledger) applied (blocking)."""
    from meterhub.spawner.catalog import Catalog

    catalog = Catalog(config=config)
    overrides = ledger.price_overrides()
    if overrides:
        catalog.prices = {
            **catalog.prices,
            **{p: str(from_micros(m)) for p, m in overrides.items()},
        }
    return catalog


def pass_capacity(config) -> dict[str, int] | None:
    """GPUs per type a pass may reserve: the local backend's inventory (declared in the
    site config, or found by NVML). None elsewhere: passes are then sold without a check."""
    from meterhub.spawner.inventory import declared_inventory, detect_inventory

    if "LocalGPUSpawner" not in str(config.JupyterHub.get("spawner_class", "")):
        return None
    declared = config.LocalGPUSpawner.get("gpus")
    gpus = declared_inventory(declared) if declared is not None else detect_inventory()
    capacity: dict[str, int] = {}
    for gpu in gpus:
        capacity[gpu.type] = capacity.get(gpu.type, 0) + 1
    return capacity
