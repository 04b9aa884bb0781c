"""Idle shutdown, the fall back to debug mode and session caps on a real hub with real
servers, and what the meter's (the culler's) own token may do: list users and stop servers,
nothing more.

Timeouts are seconds here (`idle_minutes: 0.2`): the site config takes fractions of a
minute, and the meter and the servers' activity reports run every second."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import accrued, to_micros

from .billing_support import charge_totals
from .hubprocess import until
from .test_authz_matrix import process_env

IDLE_SECONDS = 12


@pytest.fixture(scope="module")
def idle_hub(hub_factory):
    hub = hub_factory(
        {
            "gpus": [{"type": "a800", "count": 1}, {"type": "rtx4090", "count": 1}],
            "profiles": {
                "debug": {"idle_minutes": IDLE_SECONDS / 60},
                "a800": {"idle_minutes": IDLE_SECONDS / 60, "on_idle": "debug"},
                # ¥0.01 a second, never idle: the session cap alone stops it
                "rtx4090": {"idle_minutes": 0, "price_per_hour": "36.00"},
            },
            "idle": {"warn_minutes": 0.1, "check_interval_seconds": 1},
            # a cap must buy twice (meter interval + grace): ¥0.10 here, 10 s
            "stop_grace_seconds": 2,
            "billing": {
                "trial_credit": "100.00",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
            },
            "groups": {"sync_interval_seconds": 1},
        },
        name="idle",
    )
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    return hub


def charges(ledger: Ledger, session_id: int) -> int:
    """What the session's charge entries took (positive micros)."""
    with ledger.begin() as db:
        return charge_totals(db, [session_id]).get(session_id, 0)


def closed(ledger: Ledger, user: str, profile: str):
    sessions = [s for s in ledger.sessions_with_cost(user) if s[0].profile == profile]
    return sessions and sessions[-1][0].stopped_at is not None and sessions[-1]


def test_an_idle_debug_server_stops_at_its_timeout_and_its_charges_end_at_the_stop(idle_hub):
    hub, ledger = idle_hub, idle_hub.ledger
    hub.spawn("ida", {"profile": "debug"})
    until(lambda: hub.server("ida") is None, "ida's idle server to stop", timeout=90)
    session, cost = until(lambda: closed(ledger, "ida", "debug"), "ida's session to close")
    kinds = [n.kind for n in ledger.notifications("ida")]
    assert kinds[:1] == ["idle-warning"] and kinds[-1] == "stopped", kinds
    # it ran about the timeout (plus a pass and the stop), and paid exactly for it
    ran = session.stopped_at - session.ready_at
    assert IDLE_SECONDS <= ran <= IDLE_SECONDS + 15, ran
    assert session.metered_through == session.stopped_at
    expected = accrued(session.rate_micros_per_hour, session.stopped_at - session.ready_at)
    assert cost == expected == charges(ledger, session.id)
    assert ledger.audit() == []


def test_an_idle_gpu_server_falls_back_to_debug_mode_on_the_same_disk(idle_hub):
    hub, ledger = idle_hub, idle_hub.ledger
    hub.spawn("fay", {"profile": "a800", "gpus": "1"})
    disk = Path(hub.data_dir) / "disks" / "fay"
    (disk / "notes.txt").write_text("my results\n")

    def in_debug():
        server = hub.server("fay")
        sessions = ledger.open_sessions("fay")
        return server and server["ready"] and sessions and sessions[0].profile == "debug"

    until(in_debug, "fay's server to come back in debug mode", timeout=120)
    r = hub.api("GET", "/users/fay")
    assert r.json()["servers"][""]["user_options"]["profile"] == "debug"
    # the same disk: its file, through the restarted server
    url = f"{hub.url}/user/fay/api/contents/notes.txt"
    r = requests.get(url, headers={"Authorization": f"token {hub_admin_token()}"}, timeout=30)
    assert r.status_code == 200 and r.json()["content"] == "my results\n", r.text
    (restart,) = ledger.restarts("fay")
    assert (restart.reason, restart.outcome) == ("idle", "") and restart.applied_at
    note = next(n for n in ledger.notifications("fay") if n.kind == "restarted")
    assert "restarted in debug mode on the same disk" in note.message
    # the GPU is free for others at once
    hub.spawn("gus", {"profile": "a800", "gpus": "1"})
    hub.stop_server("gus")
    hub.stop_server("fay")
    assert ledger.audit() == []


def hub_admin_token() -> str:
    from .hubprocess import ADMIN_TOKEN

    return ADMIN_TOKEN


def test_a_session_cap_stops_the_server_and_never_charges_past_the_cap(idle_hub):
    hub, ledger = idle_hub, idle_hub.ledger
    hub.spawn("hal", {"profile": "rtx4090", "gpus": "1", "max_cost": "0.10"})
    (session,) = ledger.open_sessions("hal")
    assert session.max_cost_micros == to_micros("0.10")
    until(lambda: hub.server("hal") is None, "hal's capped server to stop", timeout=90)
    session, cost = until(lambda: closed(ledger, "hal", "rtx4090"), "hal's session to close")
    # ¥0.10 at ¥36.00/h is 10 s: the stop is asked for a meter pass (1 s) ahead, and
    # charged to the stop or to the cap, whichever came first, never past
    cap = to_micros("0.10")
    assert cap - accrued(session.rate_micros_per_hour, 1) <= cost <= cap
    assert cost == charges(ledger, session.id) == to_micros("100.00") - ledger.balance("hal")
    assert session.metered_through <= session.ready_at + 10
    assert session.metered_through == min(session.stopped_at, session.ready_at + 10)
    kinds = [n.kind for n in ledger.notifications("hal")]
    assert "cap-warning" in kinds and kinds[-1] == "stopped", kinds
    assert ledger.audit() == []


def test_a_spawn_with_a_bad_cap_is_refused_and_starts_nothing(idle_hub):
    hub = idle_hub
    hub.ensure_user("ivy")
    for options, words in (
        ({"profile": "debug", "max_cost": "-1"}, "max_cost"),
        ({"profile": "debug", "max_cost": "1.005"}, "max_cost"),
        ({"profile": "debug", "max_hours": "0"}, "max_hours"),
        ({"profile": "debug", "max_hours": 1.5}, "max_hours"),
        # a limit that buys less than two meter passes: starts and stops for next to nothing
        ({"profile": "rtx4090", "gpus": "1", "max_cost": "0.01"}, "a limit must allow"),
    ):
        r = hub.api("POST", "/users/ivy/server", json=options)
        assert r.status_code == 400 and words in r.json()["message"], (options, r.text)
    assert hub.server("ivy") is None and hub.ledger.open_sessions("ivy") == []


def test_the_meters_token_lists_users_and_stops_servers_and_nothing_more(idle_hub):
    """The meter is meterhub's culler. Its token: list and read users and servers, stop
    servers. It cannot start a server (not even in debug mode: the hub does that), open
    one, read a user's tokens, change users or groups, or post activity."""
    hub = idle_hub
    env = process_env(
        lambda e: (
            e.get("JUPYTERHUB_SERVICE_NAME") == "billing"
            and e.get("JUPYTERHUB_API_URL", "").endswith(f":{hub.site['hub']['api_port']}/hub/api")
        )
    )
    token = env["JUPYTERHUB_API_TOKEN"]
    r = hub.api("GET", "/services/billing")
    assert r.json()["roles"] == ["meterhub-billing"], r.text
    hub.spawn("jo", {"profile": "debug"})
    assert hub.api("GET", "/users", token=token).status_code == 200
    server = hub.api("GET", "/users/jo", token=token).json()["servers"][""]
    assert server["last_activity"] and server["ready"]
    for method, path, body in (
        ("POST", "/users/kim/server", {"profile": "debug"}),
        ("POST", "/users/jo/servers/second", {"profile": "debug"}),
        ("GET", "/users/jo/tokens", None),
        ("POST", "/users/jo/tokens", {}),
        ("POST", "/users/jo/activity", {"last_activity": "2030-01-01T00:00:00Z"}),
        ("PATCH", "/users/jo", {"admin": True}),
        ("POST", "/users/newcomer", None),
        ("DELETE", "/users/jo", None),
        ("POST", "/groups/anything", None),
        ("POST", "/shares/jo/", {"user": "kim"}),
    ):
        hub.ensure_user("kim")
        r = hub.api(method, path, token=token, json=body)
        assert r.status_code in (403, 404), (method, path, r.status_code, r.text)
    # its server is not the meter's to open
    r = requests.get(
        f"{hub.url}/user/jo/api/contents",
        headers={"Authorization": f"token {token}"},
        timeout=30,
        allow_redirects=False,
    )
    assert r.status_code in (302, 403), r.status_code
    assert hub.api("DELETE", "/users/jo/server", token=token).status_code in (202, 204)
    until(lambda: hub.server("jo") is None, "jo's server to stop")
