"""Prometheus metrics of the billing service, served at `/services/billing/metrics`.

What the ledger holds (money charged, sessions running, wallets at zero, GPUs in use and
reserved, the last audit) is read from the database at each scrape, within bounds: the
money totals are kept here and advanced by the entries written since the previous scrape.
What only the meter sees (how long its passes take, which fail, the stops and warnings it
makes) is counted in the process, from zero at each start, which rate() and increase()
expect. docs/operations.md ("Metrics and alerts") lists every metric.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select

from .money import MICROS
from .orm import OWNER_KINDS, Entry, MeteredSession, Pass, Wallet

if TYPE_CHECKING:
    from .ledger import Ledger
    from .meter import Meter, PassResult

log = logging.getLogger("meterhub.metrics")

#: ledger entries read in one query (one short transaction: on SQLite it holds writers off)
PAGE_ROWS = 20_000
#: the most entries one scrape reads; more (a burst, or history after a start) and the money
#: totals sit that scrape out rather than show a partial sum
SCRAPE_ROWS = 200_000
#: an entry id missing below ids already committed is a transaction still open (PostgreSQL
#: hands out ids before commit) or one rolled back; once the entry after it is this old by
#: the ledger's clock, the id is taken for rolled back and the totals settle past it
GAP_SECONDS = 600
#: missing ids remembered at most (a sequence that jumped further is settled past)
MAX_GAPS = 100_000
#: the entry kinds the money totals sum, each with the sign that makes its total positive
MONEY_KINDS = {"charge": -1, "refund": 1, "pass": -1}

#: why the meter stopped a server (PassResult.stopping, and `unbilled`): the stops' labels
STOP_REASONS = ("credit", "member_cap", "cap", "idle", "lab", "unbilled")
#: a new warning's notification key prefix → its label
WARNING_REASONS = {
    "warn": "credit",
    "warn-cap": "member_cap",
    "warn-session-cap": "cap",
    "idle-warn": "idle",
    "lab-end": "lab",
    "group-alert": "group",
}
#: the GPUs' states (free only where the inventory is known: the local backend)
GPU_STATES = ("in_use", "reserved_pass", "reserved_lab", "free")
#: sessions whose stop was counted, remembered (the oldest forgotten first): a server the
#: meter asks to stop on several passes is one stop
COUNTED_STOPS = 10_000
#: seconds; meter passes take milliseconds to a few seconds (BENCHMARKS.md)
PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

Key = tuple[str, str, str]  # (entry kind, profile, currency)


def units(micros: int) -> float:
    """Currency units for exposition, the only place money becomes a float (Prometheus
    carries floats); Python divides integers correctly rounded."""
    return micros / MICROS


class MeterMetrics:
    """What the meter counts in the process: pass durations and failures, stops and
    warnings by reason. Its registry is the billing service's."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.pass_seconds = Histogram(
            "meterhub_meter_pass_duration_seconds",
            "How long each completed meter pass took (charging every running server).",
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.pass_failures = Counter(
            "meterhub_meter_pass_failures",
            "Meter passes that failed (the hub or the ledger database did not answer);"
            " charges catch up on a later pass.",
            registry=self.registry,
        )
        self.stops = Counter(
            "meterhub_stops",
            "Servers the meter stopped (or restarted in debug mode), once per session, by"
            " reason: credit, member_cap, cap (the session's own), idle, lab (a lab window"
            " ended), unbilled (ran without a billing session).",
            ["reason"],
            registry=self.registry,
        )
        self.warnings = Counter(
            "meterhub_warnings",
            "Warnings the meter sent, by reason: credit, member_cap, cap, idle, lab, group"
            " (a group's budget alert).",
            ["reason"],
            registry=self.registry,
        )
        for reason in STOP_REASONS:
            self.stops.labels(reason)
        for reason in WARNING_REASONS.values():
            self.warnings.labels(reason)
        self._counted: dict[int, None] = {}

    def pass_failed(self) -> None:
        self.pass_failures.inc()

    def pass_completed(self, result: PassResult, seconds: float) -> None:
        self.pass_seconds.observe(seconds)
        for reason, session_id in result.stopping:
            if session_id in self._counted:
                continue
            self._counted[session_id] = None
            if len(self._counted) > COUNTED_STOPS:
                del self._counted[next(iter(self._counted))]
            self.stops.labels(reason).inc()
        if result.unbilled:
            self.stops.labels("unbilled").inc(len(result.unbilled))
        for key in result.notified:
            warning = WARNING_REASONS.get(key.split(":", 1)[0])
            if warning is not None:
                self.warnings.labels(warning).inc()


class LedgerTotals:
    """Exact sums of the ledger's charges, refunds and pass sales by profile and currency,
    in micros, advanced at each refresh by the entries written since.

    The ledger is append-only, so what is summed stays summed: `through` is the entry id up
    to which every entry is in `settled`. An id missing above it is an entry whose
    transaction has not committed yet (PostgreSQL numbers entries before they commit): the
    entries after it are summed again each refresh, never settled, until it appears, or
    until the entry after it is GAP_SECONDS old and it is taken for rolled back.
    """

    def __init__(
        self,
        ledger: Ledger,
        page_rows: int = PAGE_ROWS,
        gap_seconds: int = GAP_SECONDS,
        max_gaps: int = MAX_GAPS,
    ):
        self.ledger = ledger
        self.page_rows = page_rows
        self.gap_seconds = gap_seconds
        self.max_gaps = max_gaps
        self.through = 0
        self.settled: dict[Key, int] = {}
        #: whether a refresh has read up to the newest entry: until then, no totals
        self.complete = False
        #: entries read by the last refresh (BENCHMARKS.md)
        self.last_rows = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def refresh(self, max_rows: int = SCRAPE_ROWS) -> dict[Key, int] | None:
        """The totals now (blocking), or None while the newest entries are more than
        `max_rows` away (after a start, the history is read a page at a time)."""
        with self._lock:
            tail, at_end = self._advance(max_rows)
            self.complete = self.complete or at_end
            if not at_end:
                if self.complete:
                    log.warning("More than %d new ledger entries since the last scrape", max_rows)
                return None
            totals = dict(self.settled)
            for key, micros in tail.items():
                totals[key] = totals.get(key, 0) + micros
            return totals

    def _advance(self, max_rows: int) -> tuple[dict[Key, int], bool]:
        """Read entries after `through`, settling what may be; (what is summed above the
        first open gap, whether the newest entry was reached)."""
        tail: dict[Key, int] = {}
        settling = True
        after = expected = self.through + 1
        now = self.ledger.clock()
        self.last_rows = 0
        while self.last_rows < max_rows:
            limit = min(self.page_rows, max_rows - self.last_rows)
            rows = self._page(after, limit)
            self.last_rows += len(rows)
            for entry_id, kind, amount, created, currency, profile in rows:
                if settling and entry_id > expected:
                    missing = entry_id - expected
                    old = created <= now - self.gap_seconds
                    if not old and missing <= self.max_gaps:
                        settling = False  # a transaction may still commit an entry there
                    elif not old:
                        log.warning(
                            "%d entry ids missing before %d: settled past", missing, entry_id
                        )
                sign = MONEY_KINDS.get(kind)
                if settling:
                    self.through = entry_id
                    if sign is not None:
                        key = (kind, profile or "", currency)
                        self.settled[key] = self.settled.get(key, 0) + sign * amount
                elif sign is not None:
                    key = (kind, profile or "", currency)
                    tail[key] = tail.get(key, 0) + sign * amount
                expected = entry_id + 1
            if len(rows) < limit:
                return tail, True
            after = expected
        return tail, False

    def _page(self, first_id: int, limit: int) -> list:
        """Entries from id `first_id` on, oldest first: (id, kind, amount, created_at, the
        wallet's currency, the profile of the session charged or of the pass sold)."""
        profile = func.coalesce(MeteredSession.profile, Pass.profile)
        query = (
            select(
                Entry.id,
                Entry.kind,
                Entry.amount_micros,
                Entry.created_at,
                Wallet.currency,
                profile,
            )
            .join(Wallet, Wallet.id == Entry.wallet_id)
            .outerjoin(MeteredSession, MeteredSession.id == Entry.session_id)
            .outerjoin(Pass, Pass.entry_key == Entry.key)
            .where(Entry.id >= first_id)
            .order_by(Entry.id)
            .limit(limit)
        )
        with self.ledger.begin() as db:
            return list(db.execute(query).all())

    def catch_up(self, pause_seconds: float = 0.05, sleep: Callable[[float], None] = time.sleep):
        """Read the whole ledger a page at a time, pausing between pages to let writers in
        (blocking: the billing service runs it in a thread at start)."""
        while not self.complete and not self._stopping.is_set():
            with self._lock:
                _tail, at_end = self._advance(self.page_rows)
                self.complete = self.complete or at_end
            if not self.complete:
                sleep(pause_seconds)

    def stop(self) -> None:
        """End a catch_up in progress after its page (the service is stopping)."""
        self._stopping.set()


def gpu_states(
    inventory: Mapping[str, int] | None,
    in_use: Mapping[tuple[str, str], int],
    passes: Mapping[str, Mapping[str, int]],
    windows: Mapping[str, Mapping[str, tuple[int, Sequence[str]]]],
    types: Iterable[str] = (),
) -> dict[str, dict[str, int]]:
    """GPUs by type and state, counted as the local allocator holds them back.

    `in_use`: {(user, gpu type): GPUs of their open sessions}; `passes`: {gpu type: {user:
    GPUs their valid passes reserve}}; `windows`: {gpu type: {"course:NAME": (GPUs, its
    students)}} of courses in a lab window. Reserved is what holders do not use themselves;
    a class gets at most what the inventory has beyond the passes (passes were sold first).
    `inventory` (GPUs per type) is known on the local backend only: there the states share
    it out (what is reserved is at most what is not in use); elsewhere there is no "free".
    """
    types = {*types, *(gpu_type for _user, gpu_type in in_use), *passes, *windows}
    types |= set(inventory or {})
    states = {}
    for gpu_type in sorted(types):
        used = sum(n for (_user, t), n in in_use.items() if t == gpu_type)
        holders = passes.get(gpu_type, {})
        for_passes = sum(
            max(0, count - in_use.get((user, gpu_type), 0)) for user, count in holders.items()
        )
        left = None if inventory is None else inventory.get(gpu_type, 0) - sum(holders.values())
        for_labs = 0
        for _pool, (count, students) in sorted(windows.get(gpu_type, {}).items()):
            take = count if left is None else max(0, min(count, left))
            if left is not None:
                left -= take
            using = sum(in_use.get((student, gpu_type), 0) for student in set(students))
            for_labs += max(0, take - using)
        if inventory is not None:
            idle = max(0, inventory.get(gpu_type, 0) - used)
            for_passes = min(for_passes, idle)
            for_labs = min(for_labs, idle - for_passes)
        state = {"in_use": used, "reserved_pass": for_passes, "reserved_lab": for_labs}
        if inventory is not None:
            state["free"] = max(0, inventory.get(gpu_type, 0) - used - for_passes - for_labs)
        states[gpu_type] = state
    return states


class LedgerCollector:
    """The metrics read from the ledger (and the meter's health) at each scrape."""

    def __init__(
        self,
        ledger: Ledger,
        totals: LedgerTotals,
        profiles: Sequence[str],
        inventory: Mapping[str, int] | None,
        meter: Meter | None = None,
        audit_interval_seconds: int = 0,
    ):
        self.ledger = ledger
        self.totals = totals
        self.profiles = list(profiles)
        self.inventory = None if inventory is None else dict(inventory)
        self.meter = meter
        self.audit_interval_seconds = audit_interval_seconds

    def describe(self) -> Iterable[Metric]:
        """The names (no samples, no database), so a clash fails at registration."""
        return [family for family, _fill in self._families()]

    def collect(self) -> Iterable[Metric]:
        for family, fill in self._families():
            if fill() and family.samples:
                yield family

    def _families(self) -> list[tuple[Metric, Callable[[], bool]]]:
        """(family, a function adding its samples: False to leave the family out)."""
        money = ["profile", "currency"]
        charged = CounterMetricFamily(
            "meterhub_charged",
            "Charged for running servers, in currency units (the ledger's charge entries).",
            labels=money,
        )
        refunded = CounterMetricFamily(
            "meterhub_refunded", "Refunded to wallets, in currency units.", labels=money
        )
        passes = CounterMetricFamily(
            "meterhub_passes_sold", "Paid for passes, in currency units.", labels=money
        )
        running = GaugeMetricFamily(
            "meterhub_running_sessions",
            "Servers running and billed, by profile.",
            labels=["profile"],
        )
        starting = GaugeMetricFamily(
            "meterhub_starting_sessions",
            "Servers authorized and starting (not yet billed), by profile.",
            labels=["profile"],
        )
        broke = GaugeMetricFamily(
            "meterhub_wallets_at_or_below_zero",
            "Wallets whose balance is zero or less, by kind (user, group, course, allowance).",
            labels=["kind"],
        )
        gpus = GaugeMetricFamily(
            "meterhub_gpus",
            "GPUs by type and state: in_use (open sessions), reserved_pass and reserved_lab"
            " (held for pass holders and lab classes, unused), free (local backend only).",
            labels=["type", "state"],
        )
        audit = [
            GaugeMetricFamily(
                "meterhub_audit_problems",
                "Violations of the ledger's invariants the last scheduled audit found (0: sound).",
            ),
            GaugeMetricFamily(
                "meterhub_audit_last_run_timestamp_seconds",
                "When the last scheduled audit finished (Unix time).",
            ),
            GaugeMetricFamily(
                "meterhub_audit_duration_seconds", "How long the last scheduled audit took."
            ),
            GaugeMetricFamily(
                "meterhub_audit_interval_seconds", "Seconds between scheduled audits (0: off)."
            ),
        ]
        meter = [
            GaugeMetricFamily(
                "meterhub_meter_last_pass_timestamp_seconds",
                "When the meter last completed a pass (Unix time).",
            ),
            GaugeMetricFamily("meterhub_meter_interval_seconds", "Seconds between meter passes."),
            GaugeMetricFamily(
                "meterhub_meter_healthy",
                "1 while the meter completed a pass within three intervals (the /health"
                " check), else 0.",
            ),
        ]

        def fill_money() -> bool:
            totals = self.totals.refresh()
            if totals is None:
                return False
            currency = self.ledger.currency
            by_kind: dict[str, dict[tuple[str, str], int]] = {k: {} for k in MONEY_KINDS}
            for profile in self.profiles:
                for kind in MONEY_KINDS:
                    by_kind[kind][(profile, currency)] = 0
            for (kind, profile, in_currency), micros in totals.items():
                by_kind[kind][(profile, in_currency)] = micros
            for family, kind in ((charged, "charge"), (refunded, "refund"), (passes, "pass")):
                for labels, micros in sorted(by_kind[kind].items()):
                    family.add_metric(list(labels), units(micros))
            return True

        state: dict = {}

        def sessions() -> list:
            if "sessions" not in state:
                state["sessions"] = self._open_sessions()
            return state["sessions"]

        def fill_sessions(family, ready: bool) -> Callable[[], bool]:
            def fill() -> bool:
                counts = dict.fromkeys(self.profiles, 0)
                for _user, profile, _gpus, is_ready in sessions():
                    if is_ready == ready:
                        counts[profile] = counts.get(profile, 0) + 1
                for profile, count in sorted(counts.items()):
                    family.add_metric([profile], count)
                return True

            return fill

        def fill_broke() -> bool:
            counts = dict.fromkeys(OWNER_KINDS, 0)
            with self.ledger.begin() as db:
                rows = db.execute(
                    select(Wallet.owner_kind, func.count())
                    .where(Wallet.balance_micros <= 0)
                    .group_by(Wallet.owner_kind)
                ).all()
            counts.update({kind: int(n) for kind, n in rows})
            for kind, count in sorted(counts.items()):
                broke.add_metric([kind], count)
            return True

        def fill_gpus() -> bool:
            in_use: dict[tuple[str, str], int] = {}
            for user, profile, count, _ready in sessions():
                if count:
                    in_use[(user, profile)] = in_use.get((user, profile), 0) + count
            now = self.ledger.clock()
            reserved = gpu_states(
                self.inventory,
                in_use,
                self.ledger.reservations(now),
                self.ledger.window_reservations(now),
                [profile for profile in self.profiles if profile != "debug"],
            )
            for gpu_type, states in reserved.items():
                for name in GPU_STATES:
                    if name in states:
                        gpus.add_metric([gpu_type, name], states[name])
            return True

        def fill_audit() -> bool:
            audit[3].add_metric([], self.audit_interval_seconds)
            run = self.ledger.latest_audit()
            if run is not None:
                audit[0].add_metric([], run.problems_count)
                audit[1].add_metric([], run.finished_at)
                audit[2].add_metric([], run.finished_at - run.started_at)
            return True

        def fill_meter() -> bool:
            if self.meter is None:
                return False
            health = self.meter.health()
            if health["last_pass_at"] is not None:
                meter[0].add_metric([], health["last_pass_at"])
            meter[1].add_metric([], self.meter.interval_seconds)
            meter[2].add_metric([], 1 if health["ok"] else 0)
            return True

        done: dict = {}

        def once(fill: Callable[[], bool]) -> Callable[[], bool]:
            """`fill`, run once a scrape however many families it fills."""

            def run() -> bool:
                if fill not in done:
                    done[fill] = fill()
                return done[fill]

            return run

        audit_once, meter_once = once(fill_audit), once(fill_meter)
        return [
            (charged, once(fill_money)),
            (refunded, once(fill_money)),
            (passes, once(fill_money)),
            (running, fill_sessions(running, True)),
            (starting, fill_sessions(starting, False)),
            (broke, fill_broke),
            (gpus, fill_gpus),
            *((family, audit_once) for family in audit),
            *((family, meter_once) for family in meter),
        ]

    def _open_sessions(self) -> list[tuple[str, str, int, bool]]:
        """(user, profile, GPUs, ready) of every open session: one a running server."""
        S = MeteredSession
        with self.ledger.begin() as db:
            rows = db.execute(
                select(S.user_name, S.profile, S.gpus, S.ready_at).where(S.stopped_at.is_(None))
            ).all()
        return [(user, profile, gpus, ready is not None) for user, profile, gpus, ready in rows]


class BillingMetrics:
    """The billing service's registry: the meter's counters and the ledger's collector."""

    def __init__(
        self,
        ledger: Ledger,
        profiles: Sequence[str],
        inventory: Mapping[str, int] | None,
        meter: Meter | None = None,
        audit_interval_seconds: int = 0,
    ):
        self.registry = meter.metrics.registry if meter is not None else CollectorRegistry()
        self.totals = LedgerTotals(ledger)
        self.registry.register(
            LedgerCollector(ledger, self.totals, profiles, inventory, meter, audit_interval_seconds)
        )

    def exposition(self) -> bytes:
        """The Prometheus text format (blocking: it reads the ledger)."""
        return generate_latest(self.registry)
