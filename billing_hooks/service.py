"""The billing service: a JupyterHub-managed service running the meter.

The hub starts it (`meterhub billing service`) with a token that may only list and read
users and servers and stop servers. Under its prefix it serves the wallet, usage,
notification and grant API (billing_hooks/api.py) and a health check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from decimal import Decimal
from urllib.parse import urlparse

from tornado import web

from .api import MAX_BODY, make_handlers
from .meter import HubClient, Meter
from .settings import BillingSettings, pass_capacity

log = logging.getLogger("meterhub.billing")


def make_app(
    prefix: str,
    ledger,
    max_grant: Decimal,
    hub: HubClient,
    config,
    warn_minutes: list[int] = (),
) -> web.Application:
    return web.Application(
        make_handlers(prefix),
        ledger=ledger,
        max_grant=max_grant,
        user_exists=hub.user_exists,
        prefix=prefix,
        config=config,
        capacity=pass_capacity(config),
        warn_minutes=list(warn_minutes),
        cookie_secret=os.urandom(32),  # OAuth state only; users sign in again after a restart
    )


async def run(settings: BillingSettings, config) -> None:
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s billing] %(message)s"
    )
    ledger = settings.ledger()
    hub = HubClient(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
    meter = Meter(
        ledger,
        hub,
        interval_seconds=settings.meter_interval_seconds,
        warn_minutes=list(settings.warn_minutes),
    )
    service_url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8082"))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/billing/")
    app = make_app(prefix, ledger, Decimal(settings.max_grant), hub, config, settings.warn_minutes)
    # bodies stream into the handlers, which refuse more than api.MAX_BODY with a 413
    app.listen(service_url.port, service_url.hostname, max_body_size=16 * MAX_BODY)
    log.info(
        "Billing service at %s, metering every %ss", service_url.geturl(), meter.interval_seconds
    )
    await meter.run_forever()


def _die_with_the_hub() -> None:
    """Exit when the hub that started us dies (even by SIGKILL): an orphaned meter would hold
    the service port and keep a stale token, and the restarted hub starts a fresh one."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        log.warning("Cannot ask to be stopped with the hub (no prctl)")
    if os.getppid() != parent:  # the hub died before prctl took effect
        raise SystemExit(0)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(settings: BillingSettings, config) -> None:
    _die_with_the_hub()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        asyncio.run(run(settings, config))
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        log.info("Billing service stopped")
