"""The meter: charges every running server each interval and stops those out of credit.

It runs in the billing service, a JupyterHub-managed service whose token can only list and
read users and servers and stop servers. Each pass reads real server state from the hub,
then, off the event loop, charges each ready server for [metered_through, now) (one
transaction a window, keyed per window), closes sessions of servers that vanished at the
time they were last seen running, writes warnings at the configured minutes left, and
finally asks the hub to stop the servers of wallets at zero (their disks are kept).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .clock import utcnow
from .ledger import Ledger
from .money import format_duration, format_money, seconds_covered

log = logging.getLogger("meterhub.meter")

#: a session opened this recently may not be in the hub's answer yet (spawn just began)
SNAPSHOT_GRACE_SECONDS = 5
PAGE_SIZE = 200
#: sessions charged in one transaction
BATCH = 1000
MAX_PAGES = 1000


@dataclass
class PassResult:
    charged: int = 0
    closed: list[int] = field(default_factory=list)
    to_stop: list[tuple[str, str]] = field(default_factory=list)
    notified: list[str] = field(default_factory=list)


class HubClient:
    """The few hub API calls the meter makes, each with a timeout."""

    def __init__(self, api_url: str, token: str, timeout: float = 30):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.http = AsyncHTTPClient()

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
        """{(user, server name): ready} for every server that is starting or running."""
        servers: dict[tuple[str, str], bool] = {}
        offset = 0
        for _ in range(MAX_PAGES):
            response = await self.http.fetch(
                self._request("GET", f"/users?state=active&limit={PAGE_SIZE}&offset={offset}")
            )
            page = json.loads(response.body)
            for user in page["items"]:
                for name, server in (user.get("servers") or {}).items():
                    servers[(user["name"], name)] = bool(server.get("ready"))
            following = (page.get("_pagination") or {}).get("next")
            if not following:
                return servers
            offset = following["offset"]
        raise RuntimeError("too many pages of users")

    async def user_exists(self, name: str) -> bool:
        try:
            await self.http.fetch(self._request("GET", f"/users/{quote(name, safe='')}"))
        except HTTPClientError as e:
            if e.code == 404:
                return False
            raise
        return True

    async def stop_server(self, user: str, server_name: str) -> None:
        path = f"/users/{quote(user, safe='')}/server"
        if server_name:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
        try:
            await self.http.fetch(self._request("DELETE", path))
        except HTTPClientError as e:
            if e.code not in (400, 404):  # already stopped or stopping
                raise


class Meter:
    def __init__(
        self,
        ledger: Ledger,
        hub: HubClient,
        interval_seconds: int = 60,
        warn_minutes: list[int] | None = None,
        clock: Callable[[], int] = utcnow,
    ):
        self.ledger = ledger
        self.hub = hub
        self.interval_seconds = interval_seconds
        self.warn_minutes = sorted(warn_minutes or [30, 10, 2], reverse=True)
        self.clock = clock

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
        snapshot_at = self.clock()
        servers = await self.hub.running_servers()
        result = await asyncio.to_thread(self.charge_pass, servers, snapshot_at)
        for user, server_name in result.to_stop:
            log.warning("Stopping %s/%s: out of credit", user, server_name)
            await self.hub.stop_server(user, server_name)
        return result

    def charge_pass(self, servers: dict[tuple[str, str], bool], snapshot_at: int) -> PassResult:
        """The database half of a pass (blocking; runs in a thread)."""
        now = self.clock()
        result = PassResult()
        ready = []
        for session in self.ledger.open_session_rows():
            where = (session.user_name, session.server_name)
            if where in servers:
                if servers[where]:
                    ready.append(session.id)
                # still starting: free
            elif session.started_at < snapshot_at - SNAPSHOT_GRACE_SECONDS:
                # gone without a stop we heard of: charge only until it was last seen running
                end = session.last_seen_running or session.started_at
                self.ledger.close_session(session.id, at=end)
                result.closed.append(session.id)
        views = {}
        for i in range(0, len(ready), BATCH):
            # the batch locks its wallets and sessions: a second meter waits, then finds
            # metered_through already advanced and charges only what is new
            views.update(self.ledger.charge_running(ready[i : i + BATCH], now))
        result.charged = len(ready)
        for view in views.values():
            self._check_credit(view, result)
        return result

    def _check_credit(self, view, result: PassResult) -> None:
        currency = self.ledger.currency
        for session, ended in view.ended_passes:
            self.ledger.notify(
                view.user,
                f"pass-ended:{session.id}:{ended.id}",
                "pass-ended",
                f"Your {ended.period} pass has ended; this server now costs"
                f" {format_money(session.rate_micros_per_hour, currency)}/h from your credit.",
            )
        if not view.paying:
            return
        balance = view.balance_micros
        rate = sum(s.rate_micros_per_hour for s in view.paying)
        if balance + self.ledger.overdraft_micros <= 0:
            for session in view.paying:
                result.to_stop.append((session.user_name, session.server_name))
                server = f"server {session.server_name!r}" if session.server_name else "server"
                self.ledger.notify(
                    view.user,
                    f"stopped:{session.id}",
                    "stopped",
                    f"Your credit ran out ({format_money(balance, currency)}), so your {server}"
                    " was stopped. Your files are kept; top up to start again.",
                )
            return
        left = seconds_covered(balance + self.ledger.overdraft_micros, rate)
        for minutes in self.warn_minutes:
            if left is not None and left <= minutes * 60:
                for session in view.paying:
                    key = f"warn:{session.id}:{minutes}"
                    if self.ledger.notify(
                        view.user,
                        key,
                        "warning",
                        f"{format_duration(left)} of credit left ({format_money(balance, currency)}"
                        f" at {format_money(rate, currency)}/h) — your server will stop; your files"
                        " are kept.",
                    ):
                        result.notified.append(key)
