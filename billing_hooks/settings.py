"""Billing settings (traitlets), shared by the hub's hooks, the meter service and the CLI."""

from __future__ import annotations

import asyncio
import threading
from decimal import Decimal

from traitlets import Dict, Int, List, Unicode
from traitlets.config import LoggingConfigurable

from meterhub.spawner.configured import per_config

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
    stop_grace_seconds = Int(
        30,
        min=0,
        help="""
        How long a stop may take (the servers' grace between SIGTERM and SIGKILL; site
        config `stop_grace_seconds`). A session's own spend cap must buy at least twice
        this and a meter interval: the time after the cap is not charged.
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
    group_alert_balances = List(
        Unicode(),
        ["100.00", "10.00", "0"],
        help="Group balances (amount strings) under which group admins are notified.",
    ).tag(config=True)
    group_alert_runway_days = Int(
        7,
        min=0,
        help="Notify group admins when the credit lasts fewer days than this (0: never).",
    ).tag(config=True)
    audit_interval_seconds = Int(
        3600,
        min=0,
        help="""
        Seconds between the billing service's scheduled audits of the whole ledger; each
        run's result is shown on the billing admin page. 0 turns them off. The audit reads
        every entry and session: on SQLite it holds writers off while it runs, so keep this
        well above the time one audit takes (`meterhub billing audit` shows it).
        """,
    ).tag(config=True)
    pass_capacity = Dict(
        key_trait=Unicode(),
        value_trait=Int(min=0),
        default_value={},
        help="""
        GPUs per GPU type (e.g. {"a800": 16}) that passes may reserve on Kubernetes, where
        meterhub cannot count them (site config `kubernetes.pass_capacity`). A pass is sold
        only if it fits beside every other pass valid in the same time; a type not listed
        gets no passes, and empty (the default) sells none. KubeGPUSpawner does not hold
        these GPUs back from hourly servers: list only GPUs kept free for pass holders.
        The local backend counts its own inventory and ignores this.
        """,
    ).tag(config=True)

    topup_url = Unicode(
        "",
        help="""
        Where the Wallet page sends people to buy credit (site config `billing.topup_url`):
        the site's payment page. `{user}` in it is replaced by the user's name (URL-encoded),
        for a page that needs to know whom a payment is for. Empty: no link.
        """,
    ).tag(config=True)
    topup_secret = Unicode(
        "",
        help="""
        The HMAC-SHA256 key a payment provider signs top-up webhooks with (site config
        `billing.topup_secret`, or $METERHUB_TOPUP_SECRET), at least 32 bytes. Whoever
        knows it can credit any wallet: keep it out of logs and version control; prefer
        `topup_secret_file`. Empty (and no file): the top-up route answers 503.
        """,
    ).tag(config=True)
    topup_secret_file = Unicode(
        "",
        help="""
        A file whose first line is the top-up webhook's secret (site config
        `billing.topup_secret_file`), read by the billing service when the first top-up
        arrives. Readable by the hub's user only. `topup_secret` wins when both are set.
        """,
    ).tag(config=True)
    max_topup = Unicode(
        "10000", help="A provider's top-up must be below this amount (an amount string)."
    ).tag(config=True)
    redeem_failures_per_user = Int(
        10,
        min=1,
        help="""
        Voucher codes that may fail (unknown, used, expired, revoked) per user in
        `redeem_window_seconds`; more are refused with 429 until the oldest leave the window.
        """,
    ).tag(config=True)
    redeem_failures_overall = Int(
        500,
        min=1,
        help="""
        Voucher codes that may fail for the whole site in `redeem_window_seconds` (many
        accounts guessing together). Reaching it refuses everyone's redemptions until the
        window moves on: set it well above what typos by honest users add up to.
        """,
    ).tag(config=True)
    redeem_window_seconds = Int(
        900, min=1, help="The window the voucher rate limits count failures in. Seconds."
    ).tag(config=True)

    @property
    def redeem_limits(self):
        from .vouchers import RedeemLimits

        return RedeemLimits(
            self.redeem_failures_per_user,
            self.redeem_failures_overall,
            self.redeem_window_seconds,
        )

    def topup_key(self) -> bytes | None:
        """The top-up webhook's secret (blocking: it may read a file); None when not set.
        OSError or ValueError, never holding the secret, when it cannot be used."""
        from .topups import read_secret

        return read_secret(self.topup_secret or None, self.topup_secret_file or None)

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


_ENGINES: dict[str, object] = {}
#: the first connection to a ledger may migrate it, and alembic's operations are module
#: globals: two threads migrating at once (the trial-credit thread and a spawn at a new
#: hub's first sign-in) crashed the interpreter. One connects; the others wait for it.
_ENGINES_LOCK = threading.Lock()


def _engine(db_url: str):
    engine = _ENGINES.get(db_url)
    if engine is None:
        with _ENGINES_LOCK:
            engine = _ENGINES.get(db_url)
            if engine is None:
                engine = _ENGINES[db_url] = connect(db_url)
    return engine


def billing_settings_of(config) -> BillingSettings:
    """The BillingSettings of a config that stays as it is (the hub's): made once."""
    return per_config(BillingSettings, config)


def priced_catalog(config, ledger: Ledger, overrides: dict[str, int] | None = None):
    """The catalog with the admins' price changes (kept in the ledger, or `overrides` as
    read from it) applied (blocking). Made once for each config and set of price changes:
    shared, never to be changed."""
    from meterhub.spawner.catalog import Catalog

    if overrides is None:
        overrides = ledger.price_overrides()
    prices = tuple(sorted((p, str(from_micros(m))) for p, m in overrides.items()))

    def make() -> Catalog:
        catalog = Catalog(config=config)
        if prices:
            catalog.prices = {**catalog.prices, **dict(prices)}
        return catalog

    # without price changes it is the hub's plain catalog, the one its spawners share
    return per_config(Catalog, config, prices or None, make)


def pass_capacity(config) -> dict[str, int] | None:
    """GPUs per type that passes may reserve. The local backend: its inventory (declared in
    the site config, or found by NVML). Kubernetes and Slurm: `BillingSettings.pass_capacity`, {} when
    not set, so that no pass is offered or sold that nothing set aside could honour. None
    (sold without a check) only for a spawner that is neither."""
    from meterhub.spawner.catalog import Catalog
    from meterhub.spawner.inventory import declared_inventory, detect_inventory

    spawner_class = str(config.JupyterHub.get("spawner_class", ""))
    if "KubeGPUSpawner" in spawner_class or "SlurmGPUSpawner" in spawner_class:
        return dict(BillingSettings(config=config).pass_capacity)
    if "LocalGPUSpawner" not in spawner_class:
        return None
    # the configured catalog's types, as LocalGPUSpawner.inventory reads them
    types = Catalog(config=config).types()
    declared = config.LocalGPUSpawner.get("gpus")
    if declared is not None:
        gpus = declared_inventory(declared, types)
    else:
        gpus = detect_inventory(gpu_types=types)
    capacity: dict[str, int] = {}
    for gpu in gpus:
        capacity[gpu.type] = capacity.get(gpu.type, 0) + 1
    return capacity
