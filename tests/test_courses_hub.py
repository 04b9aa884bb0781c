"""Courses through a real hub: the roster mirrored into the hub group (a student who signs
in later joins), staff roles, students paying from their allowance (named or by default),
the course's profiles and lab windows refusing what it does not pay for, the meter
stopping a student at the end of their allowance, and the course's usage.

The CLI makes the course; servers are real debug servers (and one on a fake RTX 4090);
the meter runs every second. Allowance periods and expiry across time are in
tests/test_courses_ledger.py, on a fake clock.
"""

from __future__ import annotations

import csv
import datetime
import io

import pytest
import requests

from meterhub.billing_hooks import labwindows
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.wallets import allowance_ref

from .hubprocess import until
from .test_groups_hub import cli, ok

COURSE = "ml101"
TZ = "Asia/Shanghai"
ROSTER = """username,name,email,role
amy,Amy A,amy@uni.edu,student
bob,Bob B,,student
newbie,New B,,
tara,Tara T,,ta
"""


def refused(out, words: str) -> str:
    assert out.returncode != 0, out.stdout
    assert words in out.stderr, out.stderr
    return out.stderr


def members(hub) -> set[str]:
    r = hub.api("GET", f"/groups/{COURSE}")
    return set(r.json()["users"]) if r.status_code == 200 else set()


def roles(hub, name: str) -> set[str]:
    return set(hub.api("GET", f"/users/{name}").json()["roles"])


@pytest.fixture(scope="module")
def course(hub_factory, tmp_path_factory):
    hub = hub_factory(
        {
            "gpus": [{"type": "rtx4090", "count": 1}],
            "profiles": {"debug": {"price_per_hour": "36.00"}},  # 0.01 per second
            "billing": {
                "trial_credit": "0.50",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
                "warn_minutes": [1],
            },
            "groups": {"sync_interval_seconds": 1},
        },
        name="courses",
    )
    for name in ("amy", "bob", "prof", "tara", "eve"):
        hub.ensure_user(name)
    ok(cli(hub, "course", "create", "ML101", "--instructor", "prof", "--ta", "tara", "--tz", TZ))
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text(ROSTER)
    hub.roster = roster
    out = ok(cli(hub, "course", "roster", COURSE, str(roster)))
    assert "3 added, 0 removed, 1 changed, 0 unchanged" in out, out  # tara: her name
    ok(cli(hub, "credit", "grant", f"course:{COURSE}", "100.00", "--key", "course-po-1"))
    ok(cli(hub, "course", "allowance", COURSE, "5.00", "--per", "week"))
    ok(cli(hub, "course", "profiles", COURSE, "debug", "rtx4090:1"))
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    return hub


def test_the_roster_is_the_hub_group_and_a_late_student_joins_at_sign_up(course):
    until(lambda: members(course) == {"amy", "bob"}, "the hub to mirror the roster")
    assert "meterhub-course-instructor-ml101" in roles(course, "prof")
    assert "meterhub-course-ta-ml101" in roles(course, "tara")
    course.ensure_user("newbie")  # signs in for the first time
    until(lambda: members(course) == {"amy", "bob", "newbie"}, "newbie to join the group")
    again = ok(cli(course, "course", "roster", COURSE, str(course.roster)))
    assert "0 added, 0 removed, 0 changed, 4 unchanged" in again
    # the instructor's role reaches the course's students, and may not start their servers
    r = course.api("POST", "/users/prof/tokens", json={"note": "course"})
    token = r.json()["token"]
    assert course.api("GET", "/users/amy", token=token).status_code == 200
    assert course.api("GET", "/users/eve", token=token).status_code == 404
    # JupyterHub answers 404 where the token may see the user but not start the server
    assert course.api("POST", "/users/amy/server", token=token, json={}).status_code == 404
    assert course.server("amy") is None


def test_a_student_pays_from_the_allowance_by_default_and_the_course_wallet_funds_it(course):
    amy_before = course.ledger.balance("amy")
    course.spawn("amy", {"profile": "debug"})  # no wallet named: the course's, by default
    (session,) = course.ledger.open_sessions("amy")
    wallet = allowance_ref(COURSE, "amy")
    until(
        lambda: course.ledger.balance(wallet) < to_micros("5.00"),
        "a charge to amy's allowance",
        timeout=30,
    )
    course.stop_server("amy")
    assert course.ledger.balance("amy") == amy_before  # her own wallet paid nothing
    assert course.ledger.balance(f"course:{COURSE}") == to_micros("95.00")  # carved once
    usage = ok(cli(course, "usage", f"course:{COURSE}", "--csv"))
    (row,) = list(csv.DictReader(io.StringIO(usage)))
    assert (row["session"], row["member"], row["profile"]) == (str(session.id), "amy", "debug")
    spent = to_micros("5.00") - course.ledger.balance(wallet)
    assert to_micros(row[f"cost_{course.ledger.currency}"]) == spent > 0
    assert course.ledger.audit() == []


def test_who_and_what_the_course_does_not_pay_for_is_refused_saying_why(course):
    # amy in the hub group ml101 (mirrored from the roster), so that the ledger, not the
    # membership check before it, refuses her "group:ml101" (this test may run first)
    until(lambda: "amy" in members(course), "the hub to mirror the roster")
    refusals = [
        ("eve", {"profile": "debug", "wallet": "course:ml101"}, 403, "not a student"),
        ("prof", {"profile": "debug", "wallet": "course:ml101"}, 403, "not a student"),
        ("tara", {"profile": "debug", "wallet": "course:ML101"}, 403, "not a student"),
        ("amy", {"profile": "debug", "wallet": "course:nope"}, 403, "not a student"),
        ("amy", {"profile": "debug", "wallet": "group:ml101"}, 403, "There is no group"),
        (
            "amy",
            {"profile": "h800", "gpus": "1", "wallet": "course:ml101"},
            403,
            "ml101 pays for debug, rtx4090:1 only",
        ),
    ]
    for user, options, status, words in refusals:
        r = course.api("POST", f"/users/{user}/server", json=options)
        assert r.status_code == status, (user, options, r.text)
        assert words in r.json()["message"], (user, options, r.text)
    assert course.ledger.open_sessions() == []


def test_outside_the_lab_window_gpus_are_refused_with_the_next_lab_and_debug_stays(course):
    now = datetime.datetime.now(labwindows.zone(TZ))
    later = now + datetime.timedelta(days=2)
    day = labwindows.DAYS[later.weekday()]
    ok(cli(course, "course", "window", COURSE, "--clear", "--weekly", f"{day} 14:00-16:00"))
    r = course.api(
        "POST",
        "/users/bob/server",
        json={"profile": "rtx4090", "gpus": "1", "wallet": f"course:{COURSE}"},
    )
    assert r.status_code == 403, r.text
    assert f"next lab: {day} 14:00 CST" in r.json()["message"]
    assert "Debug mode is open at any time" in r.json()["message"]
    # his own money buys the GPU; the course's, debug mode
    r = course.api("POST", "/users/bob/server", json={"profile": "debug"})
    assert r.status_code in (201, 202), r.text
    until(lambda: (s := course.server("bob")) and s["ready"], "bob's debug server")
    (session,) = course.ledger.open_sessions("bob")
    assert session.wallet_id == course.ledger.wallet_id(allowance_ref(COURSE, "bob"))
    course.stop_server("bob")
    # during a window (today and tomorrow, all day: no midnight in between) the GPU starts
    days = [labwindows.DAYS[(now + datetime.timedelta(days=d)).weekday()] for d in (0, 1)]
    args = [a for d in days for a in ("--weekly", f"{d} 00:00-24:00")]
    out = ok(cli(course, "course", "window", COURSE, "--clear", *args, "--gpus", "rtx4090:1"))
    assert "lab now, until" in out and "reserved for the class during windows: rtx4090:1" in out
    refused(cli(course, "course", "window", COURSE, "--gpus", "rtx4090:2"), "this deployment has 1")
    # the class's GPU is kept from everyone else, even paying their own money
    r = course.api("POST", "/users/eve/server", json={"profile": "rtx4090", "gpus": "1"})
    assert r.status_code == 409 and "reserved for pass holders or a lab class" in r.text, r.text
    until(lambda: course.server("eve") is None, "eve's refused spawn to clear")
    course.spawn("bob", {"profile": "rtx4090", "gpus": "1", "wallet": f"course:{COURSE}"})
    (session,) = course.ledger.open_sessions("bob")
    assert (session.profile, session.gpus) == ("rtx4090", 1)
    course.stop_server("bob")
    ok(cli(course, "course", "window", COURSE, "--clear", "--gpus", "none"))
    assert course.ledger.audit() == []


def test_the_meter_stops_a_student_at_the_end_of_the_allowance(course):
    # newbie's first week: 0.04 (four seconds of debug)
    ok(cli(course, "course", "allowance", COURSE, "0.04", "--per", "week"))
    course.spawn("newbie", {"profile": "debug", "wallet": f"course:{COURSE}"})
    until(lambda: course.server("newbie") is None, "the meter to stop newbie", timeout=60)
    notes = [n.message for n in course.ledger.notifications("newbie")]
    assert any("Your allowance from ml101 ran out" in n for n in notes), notes
    spent = to_micros("0.04") - course.ledger.balance(allowance_ref(COURSE, "newbie"))
    assert to_micros("0.04") <= spent <= to_micros("0.04") + to_micros("0.10")
    r = course.api("POST", "/users/newbie/server", json={"profile": "debug"})
    # nothing left in the course's allowance: by default his own (trial) wallet pays
    assert r.status_code in (201, 202), r.text
    until(lambda: (s := course.server("newbie")) and s["ready"], "newbie's own server")
    (session,) = course.ledger.open_sessions("newbie")
    assert session.wallet_id == course.ledger.wallet_id("newbie")
    course.stop_server("newbie")
    ok(cli(course, "course", "allowance", COURSE, "5.00", "--per", "week"))
    assert course.ledger.audit() == []


def test_bad_course_commands_say_why_and_write_nothing(course, tmp_path):
    bad_roster = tmp_path / "bad.csv"
    bad_roster.write_text("username,role\ncy,student\ndan,professor\n")
    refused(cli(course, "course", "roster", COURSE, str(bad_roster)), "line 3: role 'professor'")
    no_header = tmp_path / "none.csv"
    no_header.write_text("amy,bob\n")
    refused(cli(course, "course", "roster", COURSE, str(no_header)), "names its columns")
    refused(cli(course, "course", "roster", COURSE, str(tmp_path / "missing.csv")), "cannot read")
    refused(cli(course, "course", "roster", "nope", str(bad_roster)), "no course 'nope'")
    refused(cli(course, "course", "window", COURSE, "--weekly", "Tue 16:00-14:00"), "ends after")
    refused(cli(course, "course", "window", COURSE, "--tz", "Mars/Base"), "unknown time zone")
    refused(cli(course, "course", "profiles", COURSE, "a100"), "no profile 'a100'")
    refused(cli(course, "course", "profiles", COURSE, "rtx4090:3"), "not 3")
    refused(cli(course, "course", "allowance", COURSE, "-5", "--per", "week"), "amount")
    refused(
        cli(course, "course", "allowance", COURSE, "5", "--per", "week", "--expires", "soon"),
        "--expires",
    )
    refused(cli(course, "course", "create", "ml101"), "exists already")
    refused(
        cli(
            course,
            "course",
            "set",
            COURSE,
            "--at-window-end",
            "debug",
            "--debug-outside-windows",
            "no",
        ),
        "debug mode must stay open outside windows",
    )
    refused(cli(course, "group", "show", COURSE), "no group")
    assert [m.user_name for m in course.ledger.roster(COURSE)] == [
        "amy",
        "bob",
        "newbie",
        "prof",
        "tara",
    ]
    shown = ok(cli(course, "course", "show", COURSE))
    assert "allowance: 5.00 CNY per week" in shown and "pays for: debug, rtx4090:1" in shown


def test_the_console_api_shows_the_staff_who_runs_what_and_refuses_students(course):
    def token(name):
        r = course.api("POST", f"/users/{name}/tokens", json={"note": "console"})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def get(who, path, **params):
        return requests.get(
            f"{course.url}/services/billing/api/v1{path}",
            headers={"Authorization": f"token {token(who)}"},
            params=params,
            timeout=60,
        )

    course.spawn("amy", {"profile": "debug", "wallet": f"course:{COURSE}"})
    try:
        r = get("prof", f"/courses/{COURSE}")
        assert r.status_code == 200, r.text
        console = r.json()
        assert console["instructor"] is True and console["wallet"] == "course:ml101"
        assert console["allowance"] == {"amount": "5.00", "per": "week", "expires": None}
        assert console["profiles"] == ["debug", "rtx4090:1"] and console["timezone"] == TZ
        rows = {row["name"]: row for row in console["roster"]}
        assert set(rows) == {"amy", "bob", "newbie", "prof", "tara"}
        (server,) = rows["amy"]["running"]
        assert server["profile"] == "debug" and server["rate_per_hour"] == "36.00"
        assert rows["amy"]["signed_up"] and rows["amy"]["last_active"]
        assert rows["amy"]["full_name"] == "Amy A" and rows["amy"]["email"] == "amy@uni.edu"
        assert rows["prof"]["left"] is None and rows["tara"]["role"] == "ta"
        assert get("tara", f"/courses/{COURSE}").json()["instructor"] is False  # a TA
        usage = get("tara", f"/courses/{COURSE}/usage", format="csv")
        assert usage.status_code == 200 and usage.headers["content-type"].startswith("text/csv")
        assert {row["member"] for row in csv.DictReader(io.StringIO(usage.text))} >= {"amy"}
        for who in ("amy", "eve"):  # a student, a stranger
            assert get(who, f"/courses/{COURSE}").status_code == 403
            assert get(who, f"/courses/{COURSE}/usage").status_code == 403
        assert get("prof", "/courses/nope").status_code == 403  # not its staff: no 404 leak
    finally:
        course.stop_server("amy")


def test_instructors_change_the_course_through_the_api_and_tas_cannot(course):
    def call(who, method, path, **kwargs):
        token = course.api("POST", f"/users/{who}/tokens", json={"note": "change"}).json()["token"]
        return requests.request(
            method,
            f"{course.url}/services/billing/api/v1{path}",
            headers={"Authorization": f"token {token}"},
            timeout=60,
            **kwargs,
        )

    until(
        lambda: (
            "meterhub-course-instructor-ml101" in roles(course, "prof")
            and "meterhub-course-ta-ml101" in roles(course, "tara")
        ),
        "the staff's roles",
    )
    change = {
        "allowance": {"amount": "8.00", "per": "month", "expires": "2099-06-30"},
        "profiles": ["debug", "rtx4090:1"],
        "windows": {"weekly": ["Wed 09:00-11:00"], "clear": True, "timezone": "Asia/Shanghai"},
        "debug_outside_windows": True,
    }
    r = call("prof", "PATCH", f"/courses/{COURSE}", json=change)
    assert r.status_code == 200, r.text
    assert r.json()["allowance"]["amount"] == "8.00" and r.json()["windows"] == [
        "weekly Wed 09:00-11:00"
    ]
    assert r.json()["allowance"]["expires"].startswith("2099-06-30T16:00:00")  # 24:00 CST
    assert call("tara", "PATCH", f"/courses/{COURSE}", json=change).status_code == 403
    # bad input: 400 naming the field, and nothing changes
    for bad, words in (
        ({"allowance": {"amount": "-1"}}, "allowance.amount"),
        ({"profiles": ["a100"]}, "no profile 'a100'"),
        ({"windows": {"weekly": ["Wed 11:00-09:00"]}}, "ends after it starts"),
        ({"windows": {"timezone": "Mars/Base"}}, "unknown time zone"),
        ({"allowance": {"amount": "5", "expires": "2027-02-30"}}, "expires"),
        ({"nothing": 1}, "nothing"),
        ({}, "body"),
    ):
        r = call("prof", "PATCH", f"/courses/{COURSE}", json=bad)
        assert r.status_code == 400 and words in r.json()["message"], (bad, r.text)
    after = call("prof", "GET", f"/courses/{COURSE}").json()
    assert after["allowance"]["amount"] == "8.00" and after["windows"] == ["weekly Wed 09:00-11:00"]
    # the roster from the LMS's export, as JSON
    roster = {
        "roster": [
            {"username": "amy", "name": "Amy A", "email": "amy@uni.edu"},
            {"username": "bob", "name": "Bob B"},
            {"username": "newbie", "name": "New B", "role": "student"},
        ]
    }
    r = call("prof", "PUT", f"/courses/{COURSE}/roster", json=roster)
    assert r.status_code == 200 and r.json()["unchanged"] == 3, r.text
    assert call("tara", "PUT", f"/courses/{COURSE}/roster", json=roster).status_code == 403
    r = call(
        "prof", "PUT", f"/courses/{COURSE}/roster", json={"roster": [{"username": "Bad Name"}]}
    )
    assert r.status_code == 400 and "invalid user name" in r.json()["message"]
    ok(cli(course, "course", "window", COURSE, "--clear"))
    ok(cli(course, "course", "allowance", COURSE, "5.00", "--per", "week"))


def test_at_a_windows_end_a_gpu_server_restarts_in_debug_mode_on_the_same_disk(course):
    ok(cli(course, "course", "set", COURSE, "--at-window-end", "debug"))
    # the billing service stops servers and never starts them: the hub restarts them
    r = course.api("GET", "/services/billing")
    assert r.status_code == 200 and r.json()["roles"] == ["meterhub-billing"], r.text
    # a window from this minute to the next (or the one after, when this one is nearly
    # over): the GPU starts inside it, and the meter acts at its end
    now = datetime.datetime.now(labwindows.zone(TZ))
    start = now.replace(second=0, microsecond=0)
    end = start + datetime.timedelta(minutes=1 if now.second < 30 else 2)
    if end.date() != start.date():
        pytest.skip("the window would span midnight")
    ok(
        cli(
            course,
            "course",
            "window",
            COURSE,
            "--clear",
            "--on",
            f"{start:%Y-%m-%dT%H:%M}/{end:%H:%M}",
        )
    )
    course.spawn("bob", {"profile": "rtx4090", "gpus": "1", "wallet": f"course:{COURSE}"})
    (gpu,) = course.ledger.open_sessions("bob")
    assert gpu.profile == "rtx4090"

    def restarted():
        sessions = course.ledger.open_sessions("bob")
        server = course.server("bob")
        return sessions and sessions[0].profile == "debug" and server and server["ready"]

    until(restarted, "bob's server to restart in debug mode", timeout=180)
    (debug,) = course.ledger.open_sessions("bob")
    assert debug.wallet_id == course.ledger.wallet_id(allowance_ref(COURSE, "bob"))
    notes = [n.message for n in course.ledger.notifications("bob")]
    assert any("restarted in debug mode on the same disk" in n for n in notes), notes
    course.stop_server("bob")
    ok(cli(course, "course", "window", COURSE, "--clear"))
    ok(cli(course, "course", "set", COURSE, "--at-window-end", "stop"))
    (restart,) = course.ledger.restarts("bob")
    assert (restart.reason, restart.outcome) == ("lab", "") and restart.applied_at
    assert course.ledger.audit() == []
