"""The billing service: a JupyterHub-managed service running the meter.

The hub starts it (`meterhub billing service`) with a token that may only list and read
users and servers and stop servers. Under its prefix it serves the wallet, usage,
notification and grant API (billing_hooks/api.py), a health check and Prometheus metrics
(billing_hooks/metrics.py). Beside the meter it runs the ledger's audit on a schedule and
keeps each result for the billing admin page.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import urlparse

from tornado import web

from meterhub.i18n.web import language_transform

from .api import make_handlers
from .ledger import Ledger
from .meter import HubClient, Meter
from .metrics import BillingMetrics
from .money import to_micros
from .orm import AuditRun
from .settings import BillingSettings, pass_capacity

log = logging.getLogger("meterhub.billing")

#: what the server reads of a body before it drops the connection; the handlers keep the
#: first api.MAX_BODY bytes of it and refuse the rest with a 413 (a dropped connection
#: would reach the client as the proxy's 503)
MAX_STREAMED = 256 * 1024 * 1024
#: what stops the service: the hub's SIGINT, and SIGTERM (the hub died, or an operator)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def make_app(
    prefix: str,
    ledger,
    max_grant: Decimal,
    hub: HubClient,
    config,
    warn_minutes: Sequence[int] = (),
    meter: Meter | None = None,
    metrics: BillingMetrics | None = None,
) -> web.Application:
    capacity = pass_capacity(config)
    if metrics is None:
        metrics = billing_metrics(ledger, config, capacity, meter)
    return web.Application(
        make_handlers(prefix),
        # each request in its reader's language (?lang=, Accept-Language); not remembered
        transforms=[language_transform(None)],
        ledger=ledger,
        max_grant=max_grant,
        user_exists=hub.user_exists,
        group_members=hub.group_members,
        prefix=prefix,
        config=config,
        capacity=capacity,
        warn_minutes=list(warn_minutes),
        # the health check fails when the meter has not completed a pass for a while
        meter=meter,
        metrics=metrics,
        metrics_lock=asyncio.Lock(),
        cookie_secret=os.urandom(32),  # OAuth state only; users sign in again after a restart
        log_function=log_request,
    )


def log_request(handler: web.RequestHandler) -> None:
    """Tornado's access log, with a health check that answers 200 at debug level: probes
    (the hub at start-up, Kubernetes' liveness) ask often, and JupyterHub logs its own so."""
    status = handler.get_status()
    if status == 200 and handler.request.path.endswith("/api/v1/health"):
        level = logging.DEBUG
    elif status < 400:
        level = logging.INFO
    elif status < 500:
        level = logging.WARNING
    else:
        level = logging.ERROR
    took_ms = 1000.0 * handler.request.request_time()
    web.access_log.log(level, "%d %s %.2fms", status, handler._request_summary(), took_ms)


def billing_metrics(
    ledger, config, capacity: dict[str, int] | None, meter: Meter | None, audit_interval: int = 0
) -> BillingMetrics:
    """The service's metrics: every profile of the catalog, and the GPU inventory where
    meterhub allocates the GPUs itself (the local backend, whose pass capacity is its
    inventory; on Kubernetes and Slurm the pass capacity is not the cluster's GPUs)."""
    from meterhub.spawner.catalog import Catalog

    local = "LocalGPUSpawner" in str(config.JupyterHub.get("spawner_class", ""))
    return BillingMetrics(
        ledger,
        Catalog(config=config).slugs(),
        capacity if local else None,
        meter,
        audit_interval,
    )


async def run(settings: BillingSettings, config) -> None:
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s billing] %(message)s"
    )
    from meterhub.spawner.catalog import Catalog

    ledger = settings.ledger()
    hub = HubClient(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
    meter = Meter(
        ledger,
        hub,
        interval_seconds=settings.meter_interval_seconds,
        warn_minutes=list(settings.warn_minutes),
        # "0" is a threshold too (the group's credit ran out): not an amount one may grant
        alert_balances_micros=[to_micros(Decimal(v)) for v in settings.group_alert_balances],
        alert_runway_days=settings.group_alert_runway_days,
        # the profiles' idle policies (the catalog: a profile is defined once)
        catalog=Catalog(config=config),
    )
    service_url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8082"))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/billing/")
    metrics = billing_metrics(
        ledger, config, pass_capacity(config), meter, settings.audit_interval_seconds
    )
    app = make_app(
        prefix,
        ledger,
        Decimal(settings.max_grant),
        hub,
        config,
        settings.warn_minutes,
        meter,
        metrics,
    )
    # bodies stream into the handlers, which refuse more than api.MAX_BODY with a 413
    server = app.listen(service_url.port or 8082, service_url.hostname, max_body_size=MAX_STREAMED)
    log.info(
        "Billing service at %s, metering every %ss", service_url.geturl(), meter.interval_seconds
    )
    # the money totals read the ledger's history a page at a time, before the first scrape
    catch_up = asyncio.create_task(catch_up_totals(metrics))
    # kept referenced: the event loop holds only a weak reference to a task
    audit_task = None
    if settings.audit_interval_seconds:
        audit_task = asyncio.create_task(audit_forever(ledger, settings.audit_interval_seconds))
        log.info("Auditing the ledger every %ss", settings.audit_interval_seconds)
    try:
        stopped_by = await until_stopped(meter.run_forever())
        log.info("Billing service stopped on %s", stopped_by)
    finally:
        server.stop()
        metrics.totals.stop()
        catch_up.cancel()
        if audit_task is not None:
            audit_task.cancel()


async def until_stopped(work: Coroutine[Any, Any, object]) -> str:
    """Run `work` until SIGINT or SIGTERM, then cancel it; the signal's name.

    The hub stops its services with SIGINT, the kernel sends SIGTERM when the hub dies
    (`_die_with_the_hub`); either stops the meter between two awaits. A pass already in a
    worker thread finishes its transaction: the executor is shut down after this returns.
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Future[Any] = loop.create_future()

    def stop(name: str) -> None:
        if not received.done():
            received.set_result(name)

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signal.Signals(signum).name)
    task: asyncio.Future[Any] = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, received}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
    failure = task.exception() if not task.cancelled() else None
    if failure is not None:
        raise failure
    return received.result() if received.done() else "its end"


async def catch_up_totals(metrics: BillingMetrics) -> None:
    """Sum the ledger's history for the money metrics, off the event loop; if that fails
    (the database is down), scrapes read it instead, SCRAPE_ROWS entries each."""
    try:
        await asyncio.to_thread(metrics.totals.catch_up)
    except Exception:
        log.exception("Summing the ledger for the metrics failed; scrapes catch up instead")


async def scheduled_audit(ledger: Ledger) -> AuditRun:
    """Run the audit once, off the event loop, and record its result (the admin page's
    "Last audit")."""
    run = await asyncio.to_thread(ledger.record_audit)
    took = run.finished_at - run.started_at
    if run.problems_count:
        first = run.problems.split("\n", 1)[0]
        log.error(
            "Scheduled audit: %d violation(s) in %ss; the first: %s",
            run.problems_count,
            took,
            first,
        )
    else:
        log.info("Scheduled audit: the ledger is sound (%ss)", took)
    return run


def next_audit_delay(ledger: Ledger, interval_seconds: int) -> int:
    """Seconds until the next scheduled audit is due: one interval after the last recorded
    run, so that a restart does not audit again early; 0 when none is recorded or overdue."""
    last = ledger.latest_audit()
    if last is None:
        return 0
    return max(0, last.finished_at + interval_seconds - ledger.clock())


async def audit_forever(
    ledger: Ledger,
    interval_seconds: int,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Audit every `interval_seconds` (plus up to 10% jitter). A failed run (the database
    is down) is logged and tried again an interval later; the meter is not affected."""
    delay: float | None = None
    while True:
        try:
            if delay is None:
                delay = await asyncio.to_thread(next_audit_delay, ledger, interval_seconds)
            await sleep(delay + random.uniform(0, 0.1) * delay)
            delay = interval_seconds
            await scheduled_audit(ledger)
        except Exception:
            delay = interval_seconds
            log.exception("Scheduled audit failed; trying again in %ss", interval_seconds)


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
    # Both signals stop the service whatever it inherited: a hub started in the background
    # by a script (`make serve &`) passes SIGINT on ignored, and the hub would then wait
    # 30 s (its interrupt timeout) before it sends SIGTERM. Until the event loop runs, a
    # signal interrupts the start-up; after, `until_stopped` stops the meter in order.
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    try:
        asyncio.run(run(settings, config))
    except KeyboardInterrupt:
        log.info("Billing service stopped while starting")
