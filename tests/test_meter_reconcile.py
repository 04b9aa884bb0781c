"""The meter against a listing that is not a snapshot: it closes only what the hub confirms
gone, keeps what the listing missed, and stops what runs without a session.

The hub is a fake in this process (tornado on a free port) that answers like JupyterHub's
REST API: `/users?state=active` paginated, `/users/{name}`, and the server DELETEs. It can
run a hook after serving a page or before answering for a user, to move the world between
two of the meter's requests. Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from tornado import web
from tornado.httpclient import HTTPClientError

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.meter import MISSED, UNBILLED, VANISHED, HubClient, Meter
from meterhub.billing_hooks.money import MICROS, accrued, to_micros

from .billing_support import make_ledger as make_memory_ledger
from .hubprocess import free_port

A800 = to_micros("4.50")
TOKEN = "billing-service-token"
PAGINATION = "application/jupyterhub-pagination+json"


class FakeHubState:
    """Users in id order, each with {server name: ready}; what the meter asked to stop."""

    def __init__(self):
        self.users: dict[str, dict[str, bool]] = {}
        self.deleted: list[tuple[str, str]] = []
        #: offset -> called after that page of the listing was served
        self.after_page: dict[int, Callable[[], None]] = {}
        #: user -> called before /users/{name} answers
        self.before_user: dict[str, Callable[[], None]] = {}
        #: listing offsets and users that answer 500
        self.failing: set[int | str] = set()

    def active(self) -> list[str]:
        return [name for name, servers in self.users.items() if servers]

    def model(self, name: str) -> dict:
        servers = {
            server: {
                "name": server,
                "ready": ready,
                "pending": None if ready else "spawn",
                "stopped": False,
            }
            for server, ready in self.users[name].items()
        }
        return {"kind": "user", "name": name, "servers": servers}


class Handler(web.RequestHandler):
    def initialize(self, state: FakeHubState):
        self.state = state

    def prepare(self):
        if self.request.headers.get("Authorization") != f"token {TOKEN}":
            raise web.HTTPError(403)

    def reply(self, model, content_type: str = "application/json") -> None:
        self.set_header("Content-Type", content_type)
        self.finish(json.dumps(model))


class UsersHandler(Handler):
    def get(self):
        assert self.get_argument("state") == "active"
        offset = int(self.get_argument("offset", "0"))
        limit = int(self.get_argument("limit", "200"))
        if offset in self.state.failing:
            raise web.HTTPError(500)
        active = self.state.active()
        items = [self.state.model(name) for name in active[offset : offset + limit]]
        if PAGINATION not in self.request.headers.get("Accept", ""):
            self.reply(items)  # JupyterHub's unpaginated answer: a bare list
            return
        following = offset + limit
        self.reply(
            {
                "items": items,
                "_pagination": {
                    "offset": offset,
                    "limit": limit,
                    "total": len(active),
                    "next": (
                        {"offset": following, "limit": limit, "url": "unused"}
                        if following < len(active)
                        else None
                    ),
                },
            },
            PAGINATION,
        )
        hook = self.state.after_page.pop(offset, None)
        if hook:
            hook()


class UserHandler(Handler):
    def get(self, name):
        hook = self.state.before_user.pop(name, None)
        if hook:
            hook()
        if name in self.state.failing:
            raise web.HTTPError(500)
        if name not in self.state.users:
            raise web.HTTPError(404)
        self.reply(self.state.model(name))


class ServerHandler(Handler):
    def delete(self, name, server_name=""):
        servers = self.state.users.get(name)
        if servers is None or server_name not in servers:
            raise web.HTTPError(400)  # the hub's answer for a server that is not running
        self.state.deleted.append((name, server_name))
        del servers[server_name]
        self.set_status(204)


@pytest.fixture
async def fake_hub():
    state = FakeHubState()
    app = web.Application(
        [
            (r"/hub/api/users", UsersHandler, {"state": state}),
            (r"/hub/api/users/([^/]+)", UserHandler, {"state": state}),
            (r"/hub/api/users/([^/]+)/server", ServerHandler, {"state": state}),
            (r"/hub/api/users/([^/]+)/servers/([^/]+)", ServerHandler, {"state": state}),
        ]
    )
    port = free_port()
    server = app.listen(port, "127.0.0.1")
    state.url = f"http://127.0.0.1:{port}/hub/api"
    yield state
    server.stop()
    await server.close_all_connections()


@pytest.fixture
def make_ledger(ledger_url):
    """A factory of ledgers on a fresh database: SQLite, then PostgreSQL."""

    def make(**kwargs):
        return make_memory_ledger(engine=connect(ledger_url), **kwargs)

    return make


@pytest.fixture
def metered(make_ledger, fake_hub):
    ledger, clock = make_ledger()
    hub = HubClient(fake_hub.url, TOKEN, page_size=3)
    meter = Meter(ledger, hub, interval_seconds=60, clock=clock)
    yield ledger, clock, fake_hub, meter
    ledger.engine.dispose()


def run(ledger, state, user, server="", ready=True) -> int:
    """A server the hub runs, with its billing session (as the spawn hooks open it)."""
    auth = ledger.open_session(user, server, "a800", 1, A800, min_seconds=60)
    if ready:
        ledger.mark_ready(auth.session_id)
    state.users.setdefault(user, {})[server] = ready
    return auth.session_id


def kinds(ledger) -> list[tuple[str, str, int | None]]:
    return [(r.kind, r.user_name, r.session_id) for r in reversed(ledger.reconciliations())]


async def test_a_listing_that_shifts_mid_read_closes_nothing_that_runs(metered):
    ledger, clock, hub, meter = metered
    started = clock.now
    sessions = {f"u{i}": run(ledger, hub, f"u{i}") for i in range(10)}  # four pages of 3
    clock.advance(60)
    first_pass = clock.now

    def u1_stops():  # after page 1; no post-stop hook reached the ledger
        hub.users["u1"].clear()

    hub.after_page[0] = u1_stops
    result = await meter.tick()
    # page 2 began at offset 3 of the shifted list (u4): u3 was never listed, yet it runs
    assert result.closed == [] and result.missed == [sessions["u3"]]
    assert result.charged == 10
    assert {s.id for s in ledger.open_sessions()} == set(sessions.values())
    assert ledger.session(sessions["u3"]).metered_through == first_pass
    assert kinds(ledger) == [(MISSED, "u3", sessions["u3"])]

    clock.advance(60)
    result = await meter.tick()  # u1 is absent again, and /users/u1 says it runs nothing
    assert result.closed == [sessions["u1"]] and result.missed == []
    u1 = ledger.session(sessions["u1"])
    assert u1.stopped_at == first_pass == u1.last_seen_running
    assert ledger.balance("u1") == 10 * MICROS - accrued(A800, first_pass - started)
    for user in ("u0", "u3", "u9"):
        assert ledger.balance(user) == 10 * MICROS - accrued(A800, clock.now - started)
    assert len(ledger.open_sessions()) == 9
    assert kinds(ledger) == [
        (MISSED, "u3", sessions["u3"]),
        (VANISHED, "u1", sessions["u1"]),
    ]
    assert hub.deleted == []
    assert ledger.audit() == []
    report = ledger.reconciliation_report()
    assert len(report) == 2
    assert report[0].startswith("2027-01-15 08:02:00Z closed-vanished u1 session")
    assert "missed-listing u3 session" in report[1]


async def test_a_ready_server_without_a_session_is_stopped(metered):
    ledger, clock, hub, meter = metered
    paid = run(ledger, hub, "ann")
    hub.users["eve@lab"] = {"": True}  # the pre-spawn hook was bypassed
    hub.users["ida"] = {"gpu2": True}  # a named server, likewise
    hub.users["gus"] = {"": False}  # still starting: not yet billable
    hub.users["hal"] = {"": True}  # stops before the meter asks again
    hub.users["fay"] = {"": True}  # its session opens before the meter asks again
    hub.before_user["hal"] = lambda: hub.users["hal"].clear()
    late = []
    hub.before_user["fay"] = lambda: late.append(
        ledger.open_session("fay", "", "a800", 1, A800, min_seconds=60).session_id
    )
    clock.advance(60)
    result = await meter.tick()
    assert sorted(hub.deleted) == [("eve@lab", ""), ("ida", "gpu2")]
    assert sorted(result.unbilled) == sorted(hub.deleted)
    assert result.closed == [] and result.charged == 1
    assert [s.id for s in ledger.open_sessions()] == [paid, *late]
    assert sorted(kinds(ledger)) == [(UNBILLED, "eve@lab", None), (UNBILLED, "ida", None)]
    assert ledger.audit() == []
    # stopped, it is not stopped again
    clock.advance(60)
    await meter.tick()
    assert len(hub.deleted) == 2


async def test_a_listing_that_fails_closes_nothing(metered):
    ledger, clock, hub, meter = metered
    sessions = [run(ledger, hub, f"u{i}") for i in range(7)]
    hub.failing.add(3)  # page 2 answers 500
    clock.advance(60)
    with pytest.raises(HTTPClientError):
        await meter.tick()
    assert [s.id for s in ledger.open_sessions()] == sessions
    assert ledger.reconciliations() == [] and hub.deleted == []
    assert ledger.balance("u0") == 10 * MICROS


async def test_an_absent_user_the_hub_cannot_answer_for_keeps_the_session(metered):
    ledger, clock, hub, meter = metered
    started = clock.now
    session = run(ledger, hub, "kim")
    gone = run(ledger, hub, "lee")
    hub.users["kim"].clear()  # the listing misses it, and /users/kim fails
    hub.failing.add("kim")
    del hub.users["lee"]  # the user was deleted: 404
    clock.advance(60)
    result = await meter.tick()
    assert result.closed == [gone] and ledger.session(gone).stopped_at == started
    assert ledger.session(session).stopped_at is None
    assert ledger.balance("kim") == 10 * MICROS  # not charged while unknown
    hub.failing.discard("kim")
    hub.users["kim"][""] = True  # the listing sees it again: the window covers the gap
    clock.advance(60)
    await meter.tick()
    assert ledger.balance("kim") == 10 * MICROS - accrued(A800, clock.now - started)
    assert kinds(ledger) == [(VANISHED, "lee", gone)]
    assert ledger.audit() == []
