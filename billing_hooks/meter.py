"""The meter: charges every running server each interval and stops those out of credit.

It runs in the billing service, a JupyterHub-managed service whose token can only list and
read users and servers and stop servers. Each pass reads real server state from the hub,
then, off the event loop, charges each ready server for [metered_through, now) (one
transaction a window, keyed per window), closes sessions of servers that vanished at the
time they were last seen running, writes warnings at the configured minutes left, and
finally asks the hub to stop the servers of wallets at zero (their disks are kept).

The hub's paginated listing is not a snapshot: a server that stops between two pages shifts
the others, and one can be missed. So the meter never trusts an absence: it asks the hub
about that user before closing, and it stops a ready server that has no open session
(nothing may run unbilled). Both corrections are recorded (`Ledger.reconciliations`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from meterhub.i18n import DEFAULT as DEFAULT_LANGUAGE
from meterhub.i18n import _, in_every_language

from . import labwindows
from .clock import utcnow
from .courses import lab_phrase
from .groups import RUNWAY_DAYS, AlertFacts, CapState, runway_phrase
from .ledger import Ledger
from .metrics import MeterMetrics
from .money import SECONDS_PER_HOUR, format_duration, format_money, seconds_covered, to_micros
from .postings import cap_left_seconds, cap_phrase
from .restarts import wallet_option
from .wallets import pass_period_name, period_phrase

log = logging.getLogger("meterhub.meter")

#: a session opened this recently may not be in the hub's answer yet (spawn just began)
SNAPSHOT_GRACE_SECONDS = 5
PAGE_SIZE = 200
#: sessions charged in one transaction
BATCH = 1000
MAX_PAGES = 1000
#: users asked about one by one in a pass (absent sessions, servers without a session);
#: the rest wait for the next pass, uncharged meanwhile (the next window covers the gap)
MAX_CONFIRMATIONS = 200

#: the meter is unhealthy once this many intervals pass without a completed pass
UNHEALTHY_AFTER_INTERVALS = 3

#: reconciliation kinds (the column holds 16 characters)
MISSED = "missed-listing"  # absent from the listing, the hub says it runs: kept
VANISHED = "closed-vanished"  # absent from the listing and from the user: closed
UNBILLED = "stopped-unbilled"  # ready with no open session: stopped


@dataclass
class PassResult:
    charged: int = 0
    closed: list[int] = field(default_factory=list)
    to_stop: list[tuple[str, str]] = field(default_factory=list)
    notified: list[str] = field(default_factory=list)
    #: sessions the listing missed that the hub confirmed running (kept and charged)
    missed: list[int] = field(default_factory=list)
    #: ready servers that had no open session: stopped
    unbilled: list[tuple[str, str]] = field(default_factory=list)
    #: (url, JSON body) of group budget alerts to POST to the groups' webhooks
    webhooks: list[tuple[str, dict]] = field(default_factory=list)
    #: (user, server, reason) stopped to start again in debug mode on the same disk (the
    #: hub starts it: hub/restarts.py): idle, a session cap, a lab window's end
    to_debug: list[tuple[str, str, str]] = field(default_factory=list)
    #: (user, server) stopped for reaching the cap its user set
    capped: list[tuple[str, str]] = field(default_factory=list)
    #: (reason, session id) of every server this pass stops or restarts in debug mode:
    #: credit, member_cap, cap, idle, lab (the stop counters count each session once)
    stopping: list[tuple[str, int]] = field(default_factory=list)


class HubClient:
    """The few hub API calls the meter makes, each with a timeout."""

    def __init__(self, api_url: str, token: str, timeout: float = 30, page_size: int = PAGE_SIZE):
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be between 1 and 1000, not {page_size}")
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.page_size = page_size
        self.http = AsyncHTTPClient()
        #: {(user, server name): epoch seconds} of each server's last activity as the hub
        #: last told it (JupyterHub's activity API: kernels, terminals, changes, busy GPUs)
        self.last_activity: dict[tuple[str, str], int] = {}

    def _request(self, method: str, path: str, **kwargs) -> HTTPRequest:
        return HTTPRequest(
            f"{self.api_url}{path}",
            method=method,
            headers={
                "Authorization": f"token {self.token}",
                "Accept": "application/jupyterhub-pagination+json",
            },
            request_timeout=self.timeout,
            allow_nonstandard_methods=True,
            **kwargs,
        )

    async def running_servers(self) -> dict[tuple[str, str], bool]:
        """{(user, server name): ready} for every server that is starting or running.

        Pages are read one after another, not as one snapshot: a server that stops meanwhile
        shifts the rest, so an absence here proves nothing (see `user_servers`).
        """
        servers: dict[tuple[str, str], bool] = {}
        offset = 0
        for _page in range(MAX_PAGES):
            response = await self.http.fetch(
                self._request("GET", f"/users?state=active&limit={self.page_size}&offset={offset}")
            )
            page = json.loads(response.body)
            for user in page["items"]:
                for name, ready in _active_servers(user).items():
                    servers[(user["name"], name)] = ready
                self._note_activity(user)
            following = (page.get("_pagination") or {}).get("next")
            if not following:
                return servers
            offset = following["offset"]
        raise RuntimeError("too many pages of users")

    async def _user(self, name: str) -> dict | None:
        try:
            response = await self.http.fetch(self._request("GET", f"/users/{quote(name, safe='')}"))
        except HTTPClientError as e:
            if e.code == 404:
                return None
            raise
        return json.loads(response.body)

    async def user_servers(self, name: str) -> dict[str, bool] | None:
        """{server name: ready} of one user's running or pending servers; None: no such user."""
        user = await self._user(name)
        if user is None:
            return None
        self._note_activity(user)
        return _active_servers(user)

    def _note_activity(self, user: dict) -> None:
        for name, server in (user.get("servers") or {}).items():
            at = _epoch(server.get("last_activity"))
            if at is not None:
                self.last_activity[(user["name"], name)] = at

    async def user_exists(self, name: str) -> bool:
        return await self._user(name) is not None

    async def group_members(self, name: str) -> list[str] | None:
        """The members of the hub group of exactly this name; None: no such group (the
        billing service reads groups with `read:groups`)."""
        try:
            response = await self.http.fetch(
                self._request("GET", f"/groups/{quote(name, safe='')}")
            )
        except HTTPClientError as e:
            if e.code == 404:
                return None
            raise
        return list(json.loads(response.body).get("users") or [])

    async def stop_server(self, user: str, server_name: str) -> None:
        try:
            await self.http.fetch(self._request("DELETE", _server_path(user, server_name)))
        except HTTPClientError as e:
            if e.code not in (400, 404):  # already stopped or stopping
                raise


def _server_path(user: str, server_name: str) -> str:
    path = f"/users/{quote(user, safe='')}/server"
    if server_name:
        path = f"/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
    return path


def _epoch(timestamp: str | None) -> int | None:
    """Epoch seconds of one of the hub's ISO 8601 timestamps ("2026-12-03T17:40:24.5Z")."""
    if not timestamp:
        return None
    try:
        at = datetime.fromisoformat(timestamp)  # Python 3.11 reads the "Z"
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp())


def _active_servers(user: dict) -> dict[str, bool]:
    """{server name: ready} from a hub user model: servers ready or with an action pending."""
    return {
        name: bool(server.get("ready"))
        for name, server in (user.get("servers") or {}).items()
        if server.get("ready") or server.get("pending") or not server.get("stopped", False)
    }


class Meter:
    def __init__(
        self,
        ledger: Ledger,
        hub: HubClient,
        interval_seconds: int = 60,
        warn_minutes: list[int] | None = None,
        clock: Callable[[], int] = utcnow,
        alert_balances_micros: list[int] | None = None,
        alert_runway_days: int = 7,
        webhook_timeout_seconds: float = 10,
        catalog=None,
        metrics: MeterMetrics | None = None,
    ):
        self.ledger = ledger
        #: pass durations, failures, stops and warnings, for the billing service's /metrics
        self.metrics = metrics or MeterMetrics()
        #: the profiles' idle policies and labels (spawner.catalog.Catalog); None: no
        #: server is ever idle (tests of other things)
        self.catalog = catalog
        #: each profile's idle policy, read once (traitlets are slow to read per session)
        self.policies = {} if catalog is None else {s: catalog.idle(s) for s in catalog.slugs()}
        self.idle_warn_seconds = 0 if catalog is None else catalog.idle_warn_seconds
        #: group balances under which group admins are told (each once per top-up)
        self.alert_balances_micros = sorted(alert_balances_micros or [], reverse=True)
        #: group admins are told when the runway at the last 7 days' burn falls under this
        self.alert_runway_days = alert_runway_days
        self.webhook_timeout_seconds = webhook_timeout_seconds
        self.hub = hub
        self.interval_seconds = interval_seconds
        self.warn_minutes = sorted(warn_minutes or [30, 10, 2], reverse=True)
        #: a wallet with credit for at least this many seconds is warned of nothing
        self._quiet_seconds = (self.warn_minutes[0] * 60 if self.warn_minutes else 0) + 1
        self.clock = clock
        self.started_at = clock()
        #: when the last pass completed (None: none yet); what the health check reads
        self.last_pass_at: int | None = None

    def health(self, now: int | None = None) -> dict:
        """Whether a pass completed within the last UNHEALTHY_AFTER_INTERVALS intervals
        (counted from start-up before the first pass), with the facts an operator needs."""
        now = self.clock() if now is None else now
        since = self.last_pass_at if self.last_pass_at is not None else self.started_at
        limit = UNHEALTHY_AFTER_INTERVALS * self.interval_seconds
        return {
            "ok": now - since < limit,
            "last_pass_at": self.last_pass_at,
            "seconds_since_pass": now - since,
            "unhealthy_after_seconds": limit,
        }

    def healthy(self, now: int | None = None) -> bool:
        return self.health(now)["ok"]

    async def run_forever(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                # the database or the hub is down: charges catch up on a later pass
                log.exception("Meter pass failed; retrying next interval")
            jitter = random.uniform(-0.1, 0.1) * self.interval_seconds
            await asyncio.sleep(max(0.5, self.interval_seconds + jitter))

    async def tick(self) -> PassResult:
        """One pass, timed and counted (a failed one too) for the metrics."""
        started = time.monotonic()
        try:
            result = await self._pass()
        except Exception:
            self.metrics.pass_failed()
            raise
        self.metrics.pass_completed(result, time.monotonic() - started)
        return result

    async def _pass(self) -> PassResult:
        snapshot_at = self.clock()
        # a listing that fails raises here, before anything is charged or closed
        servers = await self.hub.running_servers()
        listed = dict(servers)
        open_rows = await asyncio.to_thread(self.ledger.open_session_rows)
        missed, gone = await self._confirm_absent(servers, open_rows, snapshot_at)
        result = await asyncio.to_thread(
            self.charge_pass, servers, snapshot_at, gone, dict(self.hub.last_activity)
        )
        await asyncio.to_thread(self._record_missed, missed, result)
        for user, server_name, reason in dict.fromkeys(result.to_debug):
            log.warning(
                "Stopping %s/%s to restart it in debug mode (%s); the hub starts it again",
                user,
                server_name,
                reason,
            )
            await self.hub.stop_server(user, server_name)
        for user, server_name in dict.fromkeys(result.to_stop):
            log.warning(
                "Stopping %s/%s: out of credit, idle, at a cap or after its lab window",
                user,
                server_name,
            )
            await self.hub.stop_server(user, server_name)
        for url, body in result.webhooks:
            await self._post_webhook(url, body)
        await self._stop_unbilled(listed, open_rows, result)
        self.last_pass_at = self.clock()
        return result

    async def _confirm_absent(
        self, servers: dict[tuple[str, str], bool], open_rows: list, snapshot_at: int
    ) -> tuple[list, set[int]]:
        """Ask the hub about each user with an open session absent from the listing.

        A server the hub still runs goes back into `servers` (charged as usual); a session
        is returned as gone only when the hub confirms its server is not running. A user the
        hub cannot answer for keeps their sessions open and uncharged until a later pass.
        """
        absent: dict[str, list] = {}
        for row in open_rows:
            if (row.user_name, row.server_name) in servers:
                continue
            if row.started_at >= snapshot_at - SNAPSHOT_GRACE_SECONDS:
                continue  # just opened: the spawn may not be in the hub's answer yet
            absent.setdefault(row.user_name, []).append(row)
        missed, gone = [], set()
        for user in _limited(absent, "absent sessions"):
            try:
                running = await self.hub.user_servers(user)
            except Exception:
                log.exception("Cannot confirm %s's servers; their sessions stay open", user)
                continue
            for row in absent[user]:
                if running is not None and row.server_name in running:
                    servers[(user, row.server_name)] = running[row.server_name]
                    missed.append(row)
                else:
                    gone.add(row.id)
        return missed, gone

    def _record_missed(self, missed: list, result: PassResult) -> None:
        for row in missed:
            log.warning(
                "%s/%s was missing from the hub's listing but runs; session %s kept",
                row.user_name,
                row.server_name,
                row.id,
            )
            self.ledger.reconciled(
                MISSED,
                row.user_name,
                row.server_name,
                row.id,
                "absent from the hub's listing of active servers; the hub's own answer for"
                " the user says it runs: session kept",
            )
            result.missed.append(row.id)

    async def _stop_unbilled(
        self, listed: dict[tuple[str, str], bool], open_rows: list, result: PassResult
    ) -> None:
        """Stop ready servers the ledger has no open session for: none may run free.

        Before stopping, the hub must still say the server is ready and the ledger, read
        again, must still have no open session for it (one may have opened meanwhile).
        """
        metered = {(row.user_name, row.server_name) for row in open_rows}
        candidates: dict[str, list[str]] = {}
        for (user, server_name), ready in listed.items():
            if ready and (user, server_name) not in metered:
                candidates.setdefault(user, []).append(server_name)
        for user in _limited(candidates, "servers without a session"):
            try:
                running = await self.hub.user_servers(user) or {}
            except Exception:
                log.exception("Cannot confirm %s's servers; checked again next pass", user)
                continue
            sessions = await asyncio.to_thread(self.ledger.open_sessions, user)
            now_metered = {s.server_name for s in sessions}
            for server_name in candidates[user]:
                if not running.get(server_name) or server_name in now_metered:
                    continue
                log.warning("Stopping %s/%s: it runs with no billing session", user, server_name)
                await self.hub.stop_server(user, server_name)
                await asyncio.to_thread(
                    self.ledger.reconciled,
                    UNBILLED,
                    user,
                    server_name,
                    None,
                    "ready on the hub with no open billing session: stopped (files kept)",
                )
                result.unbilled.append((user, server_name))

    def charge_pass(
        self,
        servers: dict[tuple[str, str], bool],
        snapshot_at: int,
        gone: Collection[int] = (),
        activity: dict[tuple[str, str], int] | None = None,
    ) -> PassResult:
        """The database half of a pass (blocking; runs in a thread).

        Charges the ready servers in `servers`; closes the sessions in `gone` (absent from
        the hub, confirmed) at the time they were last seen running. An open session in
        neither is left as it is: its next window covers the time.
        """
        now = self.clock()
        gone = set(gone)
        result = PassResult()
        ready = []
        for session in self.ledger.open_session_rows():
            where = (session.user_name, session.server_name)
            if where in servers:
                if servers[where]:
                    ready.append(session.id)
                # still starting: free
            elif session.id in gone and session.started_at < snapshot_at - SNAPSHOT_GRACE_SECONDS:
                # gone without a stop we heard of: charge only until it was last seen running
                end = session.last_seen_running or session.started_at
                self.ledger.close_session(session.id, at=end)
                self.ledger.reconciled(
                    VANISHED,
                    session.user_name,
                    session.server_name,
                    session.id,
                    "absent from the hub's listing and from the user's own servers: closed at"
                    f" its last sight running ({end})",
                )
                result.closed.append(session.id)
        views = {}
        for i in range(0, len(ready), BATCH):
            # the batch locks its wallets and sessions: a second meter waits, then finds
            # metered_through already advanced and charges only what is new
            views.update(self.ledger.charge_running(ready[i : i + BATCH], now))
        result.charged = len(ready)
        # then allowances: renewed for a period that has begun (after the charge for the
        # time before it), or returned to an expired course, whose students' servers then
        # stop at zero below
        for wid, balance in self.ledger.settle_allowances(now).items():
            if wid in views:
                views[wid].balance_micros = balance
        groups = [wid for wid, view in views.items() if view.kind == "group"]
        caps: dict[int, list[CapState]] = {}
        for state in self.ledger.cap_states(groups, now):
            caps.setdefault(state.wallet_id, []).append(state)
        courses = None
        for wid, view in views.items():
            self._check_credit(view, result)
            if wid in caps:
                self._check_caps(view, caps[wid], result)
            if view.kind == "allowance" and view.paying:
                if courses is None:
                    courses = {c.name: c for c in self.ledger.courses()}
                course = courses.get(view.user.partition("/")[0])
                if course is not None and course.windows:
                    self._check_window(course, view, now, result)
        for facts in self.ledger.alert_facts(groups, now):
            self._group_alerts(facts, result)
        for view in views.values():
            for session, spent in view.capped:
                self._check_session_cap(view, session, spent, now, result)
        # a server already being stopped (credit, caps, a lab's end) is not idle on top
        stopping = {*result.to_stop, *((u, s) for u, s, _ in result.to_debug)}
        for view in views.values():
            for session in view.sessions:
                if (session.user_name, session.server_name) not in stopping:
                    self._check_idle(view, session, activity or {}, now, result)
        return result

    def _policy(self, profile: str):
        """The profile's idle policy (one the catalog no longer lists: the defaults)."""
        found = self.policies.get(profile)
        return found if found is not None else self.catalog.idle(profile)

    def _label(self, session) -> str:
        """ "1 × A800", "debug mode (no GPU)": how the spawn page named the choice."""
        if self.catalog is not None:
            try:
                return self.catalog.choice(session.profile, session.gpus).label
            except Exception:
                pass
        # a profile the catalog no longer lists: said as the catalog says debug mode
        return f"{session.gpus} × {session.profile}" if session.gpus else _("debug mode (no GPU)")

    def _fall_back(self, view, session, reason: str, action: str, result: PassResult) -> bool:
        """Stop the session's server; for action "debug" (a GPU server) queue its restart in
        debug mode on the same disk, paid by the same wallet. True if it restarts."""
        where = (session.user_name, session.server_name)
        result.stopping.append((reason, session.id))
        if action == "debug" and session.gpus > 0:
            self.ledger.request_restart(
                session.user_name,
                session.server_name,
                session.id,
                wallet_option(view.kind, view.user),
                reason,
                session.environment,
            )
            result.to_debug.append((*where, reason))
            return True
        result.to_stop.append(where)
        return False

    def _check_idle(self, view, session, activity: dict, now: int, result: PassResult) -> None:
        """Stop (or restart in debug mode) a server idle for its profile's timeout, and warn
        `idle_warn_seconds` before. Idle: no activity the hub was told of (kernels,
        terminals, changes, busy GPUs) since max(last activity, ready)."""
        if self.catalog is None or session.ready_at is None:
            return
        policy = self._policy(session.profile)
        limit = policy.idle_seconds
        if limit <= 0:
            return
        last = max(activity.get((session.user_name, session.server_name), 0), session.ready_at)
        idle = now - last
        if idle < limit - self.idle_warn_seconds:
            return
        currency = self.ledger.currency
        rate = format_money(session.rate_micros_per_hour, currency)
        debug = policy.on_idle == "debug" and session.gpus > 0

        def said() -> dict:
            return {
                "server": server_phrase(session.server_name),
                "label": self._label(session),
                "rate": rate,
                "idle": format_duration(idle),
            }

        if idle >= limit:
            restarted = self._fall_back(view, session, "idle", policy.on_idle, result)
            if restarted:

                def message() -> str:
                    return _(
                        "Your %(server)s (%(label)s, %(rate)s/h) was idle for %(idle)s — no"
                        " kernel, terminal or GPU activity — so it was restarted in debug mode"
                        " on the same disk (%(debug_rate)s/h): the GPU is free for others and"
                        " you stop paying %(rate)s/h. Your files are there; start on a GPU"
                        " again from the Hub Control Panel when you need one.",
                        debug_rate=self._debug_rate(),
                        **said(),
                    )
            else:

                def message() -> str:
                    return _(
                        "Your %(server)s (%(label)s, %(rate)s/h) was idle for %(idle)s — no"
                        " kernel, terminal or GPU activity — so it was stopped. Your files are"
                        " kept; start it again from the Hub Control Panel.",
                        **said(),
                    )

            self.ledger.notify(
                session.user_name,
                f"idle-stopped:{session.id}",
                "restarted" if restarted else "stopped",
                message,
            )
            return
        key = f"idle-warn:{session.id}:{last}"

        def warning() -> str:
            if debug:
                return _(
                    "Your %(server)s (%(label)s, %(rate)s/h) has been idle for %(idle)s: it"
                    " restarts in debug mode on the same disk in %(left)s unless you use it —"
                    " run a cell, type in a terminal, or click Keep running. Your files are"
                    " kept.",
                    left=format_duration(limit - idle),
                    **said(),
                )
            return _(
                "Your %(server)s (%(label)s, %(rate)s/h) has been idle for %(idle)s: it stops"
                " in %(left)s unless you use it — run a cell, type in a terminal, or click"
                " Keep running. Your files are kept.",
                left=format_duration(limit - idle),
                **said(),
            )

        if self.ledger.notify(session.user_name, key, "idle-warning", warning):
            result.notified.append(key)

    def _debug_rate(self) -> str:
        if self.catalog is None:
            return _("debug mode")
        try:
            return format_money(
                to_micros(self.catalog.choice("debug").rate_per_hour), self.ledger.currency
            )
        except Exception:
            return _("debug mode")

    def _check_session_cap(self, view, session, spent: int, now: int, result: PassResult):
        """Stop (or restart in debug mode) a session at the cap its user set ("stop after
        ¥X / N hours"); warn at `warn_minutes` before. Charging never passes the cap
        (billing_hooks.postings.capped_end), and the time after it is not charged, so the
        stop is asked for one meter interval ahead: at the last pass before the cap."""
        left = cap_left_seconds(session, spent, now)
        if left is None:
            return
        currency = self.ledger.currency
        action = self._policy(session.profile).on_cap if self.catalog else "stop"

        def said() -> dict:
            return {
                "server": server_phrase(session.server_name),
                "label": self._label(session),
                "caps": cap_phrase(session, currency),
                "cost": format_money(spent, currency),
            }

        # the next pass would come after the cap: stop now (the user pays to the stop)
        if left <= self.interval_seconds:
            restarted = self._fall_back(view, session, "cap", action, result)
            result.capped.append((session.user_name, session.server_name))

            def message() -> str:
                if restarted:
                    return _(
                        "Your %(server)s (%(label)s) came to the limit you set for it"
                        " (%(caps)s), so it was restarted in debug mode on the same disk. Your"
                        " files are there. It had cost %(cost)s; you never pay more than your"
                        " limit.",
                        **said(),
                    )
                return _(
                    "Your %(server)s (%(label)s) came to the limit you set for it (%(caps)s),"
                    " so it was stopped. Your files are kept. It had cost %(cost)s; you never"
                    " pay more than your limit.",
                    **said(),
                )

            self.ledger.notify(
                session.user_name,
                f"session-cap:{session.id}",
                "restarted" if restarted else "stopped",
                message,
            )
            return
        debug = action == "debug" and bool(session.gpus)

        def warning() -> str:
            if debug:
                return _(
                    "Your %(server)s reaches the limit you set for it (%(caps)s) in %(left)s"
                    " and restarts in debug mode then; it has cost %(cost)s so far. Your files"
                    " are kept.",
                    left=format_duration(left),
                    **said(),
                )
            return _(
                "Your %(server)s reaches the limit you set for it (%(caps)s) in %(left)s and"
                " stops then; it has cost %(cost)s so far. Your files are kept.",
                left=format_duration(left),
                **said(),
            )

        for minutes in self.warn_minutes:
            if left <= minutes * 60:
                key = f"warn-session-cap:{session.id}:{minutes}"
                if self.ledger.notify(session.user_name, key, "cap-warning", warning):
                    result.notified.append(key)

    async def _post_webhook(self, url: str, body: dict) -> None:
        """POST a group's budget alert; a failure is logged (the in-hub notification stays)."""
        try:
            await self.hub.http.fetch(
                HTTPRequest(
                    url,
                    method="POST",
                    headers={"Content-Type": "application/json"},
                    body=json.dumps(body),
                    request_timeout=self.webhook_timeout_seconds,
                    follow_redirects=False,
                )
            )
        except Exception as e:
            log.warning("Budget alert webhook %s failed: %s", url, e)

    def _check_caps(self, view, states: list[CapState], result: PassResult) -> None:
        """Stop (and before that, warn) members whose cap on this group wallet is spent,
        as the wallet's zero stops everyone: the same path, per member."""
        currency = self.ledger.currency
        by_member: dict[str, list] = {}
        for session in view.paying:
            by_member.setdefault(session.user_name, []).append(session)
        for state in states:
            mine = by_member.get(state.user)
            if not mine:
                continue
            left = state.cap_micros - state.spent_micros
            if left <= 0:
                for session in mine:
                    result.to_stop.append((session.user_name, session.server_name))
                    result.stopping.append(("member_cap", session.id))

                    def stopped(state=state, session=session) -> str:
                        return _(
                            "Your %(group)s cap %(period)s (%(cap)s) is used up, so your"
                            " %(server)s was stopped. Your files are kept; ask the group's admin"
                            " to raise it, or start again paying from your own wallet.",
                            group=view.user,
                            period=period_phrase(state.period),
                            cap=format_money(state.cap_micros, currency),
                            server=server_phrase(session.server_name),
                        )

                    self.ledger.notify(
                        session.user_name, f"cap-stopped:{session.id}", "stopped", stopped
                    )
                continue
            rate = sum(s.rate_micros_per_hour for s in mine)
            seconds = seconds_covered(left, rate)

            def warning(state=state, seconds=seconds, left=left, rate=rate) -> str:
                return _(
                    "%(time)s left of your %(group)s cap %(period)s (%(left)s at %(rate)s/h) —"
                    " your server will stop; your files are kept.",
                    time=format_duration(seconds or 0),
                    group=view.user,
                    period=period_phrase(state.period),
                    left=format_money(left, currency),
                    rate=format_money(rate, currency),
                )

            for minutes in self.warn_minutes:
                if seconds is not None and seconds <= minutes * 60:
                    for session in mine:
                        key = f"warn-cap:{session.id}:{minutes}"
                        if self.ledger.notify(session.user_name, key, "warning", warning):
                            result.notified.append(key)

    def _group_alerts(self, group: AlertFacts, result: PassResult) -> None:
        """Tell a group's admins (and its webhook) when its balance falls under a threshold
        or its runway under `alert_runway_days`: once each until the next top-up."""
        if not group.admins and not group.webhook_url:
            return
        currency = self.ledger.currency
        balance = group.balance_micros
        runway = group.runway_seconds
        armed = group.last_credit_entry
        alerts: list[tuple[str, str, Callable[[], str]]] = []
        for threshold in reversed(self.alert_balances_micros):  # the lowest first
            if balance < threshold or (threshold == 0 and balance <= 0):

                def below(threshold=threshold) -> str:
                    values = {
                        "group": group.name,
                        "balance": format_money(balance, currency),
                        "threshold": format_money(threshold, currency),
                    }
                    if runway is None:
                        return _(
                            "The %(group)s group's balance is %(balance)s, under %(threshold)s.",
                            **values,
                        )
                    return _(
                        "The %(group)s group's balance is %(balance)s, under %(threshold)s."
                        " %(runway)s at the last %(days)s days' spend.",
                        runway=runway_phrase(runway),
                        days=RUNWAY_DAYS,
                        **values,
                    )

                alerts.append((f"below:{threshold}", "balance", below))
                break  # the lowest threshold crossed says it all
        if runway is not None and runway < self.alert_runway_days * 86_400:

            def short() -> str:
                return _(
                    "The %(group)s group's credit (%(balance)s) lasts %(runway)s at the last"
                    " %(days)s days' spend.",
                    group=group.name,
                    balance=format_money(balance, currency),
                    runway=runway_phrase(runway),
                    days=RUNWAY_DAYS,
                )

            alerts.append(("runway", "runway", short))
        for tag, kind, compose in alerts:
            for admin in group.admins:
                key = f"group-alert:{group.name}:{tag}:{armed}:{admin}"
                if self.ledger.notify(admin, key, "group-alert", compose):
                    result.notified.append(f"group-alert:{group.name}:{tag}")
            marker = f"group-alert:{group.name}:{tag}:{armed}:webhook"
            # a notification of no user marks the webhook sent, once per alert and top-up
            if group.webhook_url and self.ledger.notify("", marker, "webhook", compose):
                messages = in_every_language(compose)
                body = {
                    "group": group.name,
                    "alert": kind,
                    "message": messages[DEFAULT_LANGUAGE],
                    # the same in every language meterhub speaks, for a chat in another
                    "messages": messages,
                    "balance": format_money(balance, currency, symbol=False),
                    "runway_seconds": runway,
                }
                result.webhooks.append((group.webhook_url, body))

    def _check_window(self, course, view, now: int, result: PassResult) -> None:
        """Warn the course's students before its lab window ends, and stop what the course
        pays for only during windows (GPUs; debug too if the course says so) once it has."""
        lines = course.windows.splitlines()
        current = labwindows.current(lines, course.timezone, now)
        for session in view.paying:
            if session.gpus == 0 and course.debug_outside_windows:
                continue
            gpu = session.gpus > 0
            restart = course.at_window_end == "debug" and course.debug_outside_windows and gpu
            if current is None:
                self._fall_back(view, session, "lab", "debug" if restart else "stop", result)

                def ended(gpu=gpu, restart=restart) -> str:
                    values = {"course": course.name, "when": lab_phrase(course, now)}
                    if restart:
                        return _(
                            "The %(course)s lab is over (%(when)s), so your GPU server paid by"
                            " the course was restarted in debug mode on the same disk: your"
                            " files are there.",
                            **values,
                        )
                    if course.debug_outside_windows:
                        return _(
                            "The %(course)s lab is over (%(when)s), so your GPU server paid by"
                            " the course was stopped. Your files are kept; debug mode stays"
                            " open.",
                            **values,
                        )
                    if gpu:
                        return _(
                            "The %(course)s lab is over (%(when)s), so your GPU server paid by"
                            " the course was stopped. Your files are kept.",
                            **values,
                        )
                    return _(
                        "The %(course)s lab is over (%(when)s), so your server paid by the"
                        " course was stopped. Your files are kept.",
                        **values,
                    )

                self.ledger.notify(session.user_name, f"lab-ended:{session.id}", "stopped", ended)
                continue
            end = current[1]

            def ending(gpu=gpu, restart=restart, end=end) -> str:
                values = {
                    "course": course.name,
                    "end": labwindows.phrase(end, course.timezone, now),
                    "left": format_duration(end - now),
                }
                if restart:
                    return _(
                        "The %(course)s lab ends at %(end)s, in %(left)s: your GPU server paid"
                        " by the course restarts in debug mode then, on the same disk.",
                        **values,
                    )
                if course.debug_outside_windows:
                    return _(
                        "The %(course)s lab ends at %(end)s, in %(left)s: your GPU server paid"
                        " by the course stops then. Your files are kept; debug mode stays open.",
                        **values,
                    )
                if gpu:
                    return _(
                        "The %(course)s lab ends at %(end)s, in %(left)s: your GPU server paid"
                        " by the course stops then. Your files are kept.",
                        **values,
                    )
                return _(
                    "The %(course)s lab ends at %(end)s, in %(left)s: your server paid by the"
                    " course stops then. Your files are kept.",
                    **values,
                )

            for minutes in self.warn_minutes:
                if end - now <= minutes * 60:
                    key = f"lab-end:{session.id}:{end}:{minutes}"
                    if self.ledger.notify(session.user_name, key, "warning", ending):
                        result.notified.append(key)

    def _check_credit(self, view, result: PassResult) -> None:
        currency = self.ledger.currency
        for session, ended in view.ended_passes:

            def pass_ended(session=session, ended=ended) -> str:
                return _(
                    "Your %(period)s pass has ended; this server now costs %(rate)s/h from your"
                    " credit.",
                    period=pass_period_name(ended.period),
                    rate=format_money(session.rate_micros_per_hour, currency),
                )

            self.ledger.notify(
                session.user_name,
                f"pass-ended:{session.id}:{ended.id}",
                "pass-ended",
                pass_ended,
            )
        if not view.paying:
            return
        balance = view.balance_micros
        rate = sum(s.rate_micros_per_hour for s in view.paying)
        available = balance + self.ledger.overdraft_micros
        if available > 0 and available * SECONDS_PER_HOUR >= rate * self._quiet_seconds:
            return  # credit for longer than the first warning: nothing to say (most wallets)
        owner = view.user.partition("/")[0] if view.kind == "allowance" else view.user
        if balance + self.ledger.overdraft_micros <= 0:
            for session in view.paying:
                result.to_stop.append((session.user_name, session.server_name))
                result.stopping.append(("credit", session.id))

                def ran_out(session=session) -> str:
                    values = {
                        "owner": owner,
                        "balance": format_money(balance, currency),
                        "server": server_phrase(session.server_name),
                    }
                    if view.kind == "group":
                        return _(
                            "The %(owner)s group's credit ran out (%(balance)s), so your"
                            " %(server)s was stopped. Your files are kept; ask the group's admin"
                            " to top it up, or start again paying from your own wallet.",
                            **values,
                        )
                    if view.kind == "allowance":
                        return _(
                            "Your allowance from %(owner)s ran out (%(balance)s), so your"
                            " %(server)s was stopped. Your files are kept; ask your instructor,"
                            " or start again paying from your own wallet.",
                            **values,
                        )
                    return _(
                        "Your credit ran out (%(balance)s), so your %(server)s was stopped. Your"
                        " files are kept; top up to start again.",
                        **values,
                    )

                self.ledger.notify(session.user_name, f"stopped:{session.id}", "stopped", ran_out)
            return
        left = seconds_covered(balance + self.ledger.overdraft_micros, rate)

        def running_low() -> str:
            values = {
                "time": format_duration(left or 0),
                "owner": owner,
                "balance": format_money(balance, currency),
                "rate": format_money(rate, currency),
            }
            if view.kind == "group":
                return _(
                    "%(time)s of the %(owner)s group's credit left (%(balance)s at %(rate)s/h) —"
                    " your server will stop; your files are kept.",
                    **values,
                )
            if view.kind == "allowance":
                return _(
                    "%(time)s of your allowance from %(owner)s left (%(balance)s at"
                    " %(rate)s/h) — your server will stop; your files are kept.",
                    **values,
                )
            return _(
                "%(time)s of credit left (%(balance)s at %(rate)s/h) — your server will stop;"
                " your files are kept.",
                **values,
            )

        for minutes in self.warn_minutes:
            if left is not None and left <= minutes * 60:
                for session in view.paying:
                    key = f"warn:{session.id}:{minutes}"
                    if self.ledger.notify(session.user_name, key, "warning", running_low):
                        result.notified.append(key)


def server_phrase(name: str) -> str:
    """ "server", or "server 'gpu'" for a named server: how a message names it."""
    return _("server %(name)s", name=repr(name)) if name else _("server")


def _limited(users: dict, what: str) -> Iterable[str]:
    """At most MAX_CONFIRMATIONS users a pass; the others are asked about next pass."""
    if len(users) > MAX_CONFIRMATIONS:
        log.warning(
            "%d users with %s; asking the hub about %d this pass",
            len(users),
            what,
            MAX_CONFIRMATIONS,
        )
    return list(users)[:MAX_CONFIRMATIONS]
