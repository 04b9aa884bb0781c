"""Course labs attacked from outside: each test reproduces a hole found by a hostile
student, TA or stranger, and fails while the hole is open.

- A student dropped from the roster while their server runs on the course keeps running
  on it, off the console (staff cannot see or stop it), and the meter renews their
  allowance from the course wallet at the next period.
- A course named like an existing hub group takes that group over: the sync replaces its
  members with the course's students (and `!group=` scopes and `allowed_groups` follow).
- A TA's role holds `delete:servers!group=COURSE`: through JupyterHub's REST API they stop
  a student's server that the student pays for themselves, which the console refuses.

The ledger tests run on a fake clock; the others on one real hub (debug servers).
"""

from __future__ import annotations

import pytest

from meterhub.billing_hooks.courses import RosterLine
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.wallets import allowance_ref

from .clirun import run_cli
from .hubprocess import until
from .test_courses_ledger import FEB_1, WEEK, moves, run_pass, setup, start
from .test_pages import PASSWORD

# ---------------------------------------------------------------------- the ledger


def test_a_student_dropped_from_the_roster_gets_no_new_allowance_from_the_course():
    ledger, clock, hub, meter = setup(start=FEB_1 + WEEK - 120)  # Sunday 23:58
    start(ledger, hub, "amy")
    ledger.import_roster("ml101", [RosterLine("bob")], "root")  # amy is dropped
    assert ledger.student_courses("amy") == []
    carved = moves(ledger, "amy")
    course_before = ledger.balance("course:ml101")
    clock.advance(120)  # Monday: a new week
    run_pass(meter)
    after = moves(ledger, "amy")[len(carved) :]
    assert all(amount < 0 for amount, _key in after), "the course renewed a dropped student"
    # what she held returns to the course in one pair; she holds nothing of it now
    assert len(after) == 1 and ledger.balance("course:ml101") > course_before
    assert ledger.balance(allowance_ref("ml101", "amy")) == 0
    assert ledger.audit() == []


def test_a_dropped_students_server_on_the_course_is_stopped_or_shown_to_its_staff():
    ledger, clock, hub, meter = setup()
    session = start(ledger, hub, "amy")
    ledger.import_roster("ml101", [RosterLine("bob")], "root")  # amy is dropped
    clock.advance(60)
    result = run_pass(meter)
    shown = {s.id for row in ledger.course_view("ml101").roster for s, _cost in row.running}
    # the course pays for it: the meter stops it, or the console lists it (Stop, Stop all)
    assert ("amy", "") in result.to_stop or session in shown, (
        "a dropped student runs on the course's money where no one can see or stop it"
    )


# ---------------------------------------------------------------------- a real hub


def cli(hub, *args, stdin: str | None = None):
    return run_cli([*args, "--config", str(hub.config_path)], cwd=hub.workdir, stdin=stdin)


def ok(out) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout


def roles(hub, name: str) -> set[str]:
    return set(hub.api("GET", f"/users/{name}").json()["roles"])


@pytest.fixture(scope="module")
def lab(hub_factory, tmp_path_factory):
    hub = hub_factory(
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "36.00"}},
            "billing": {"meter_interval_seconds": 1, "min_minutes_to_start": 0},
            "groups": {"sync_interval_seconds": 1},
        },
        name="courses-attack",
    )
    for name in ("amy", "prof", "tara", "pi"):
        ok(cli(hub, "user", "add", name, "--password-stdin", stdin=PASSWORD))
    ok(cli(hub, "course", "create", "ml101", "--instructor", "prof", "--ta", "tara"))
    roster = tmp_path_factory.mktemp("roster") / "ml101.csv"
    roster.write_text("username,role\namy,student\n")
    ok(cli(hub, "course", "roster", "ml101", str(roster)))
    ok(cli(hub, "credit", "grant", "course:ml101", "100", "--key", "po-attack"))
    ok(cli(hub, "course", "allowance", "ml101", "5.00", "--per", "week"))
    until(
        lambda: (
            "meterhub-course-ta-ml101" in roles(hub, "tara")
            and hub.api("GET", "/groups/ml101").json().get("users") == ["amy"]
        ),
        "the hub to mirror ml101",
    )
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    return hub


def test_a_course_named_like_an_existing_hub_group_does_not_take_it_over(lab, tmp_path):
    # an admin's hub group (the kind `allowed_groups` of a profile names), not the ledger's
    assert lab.api("POST", "/groups/staff").status_code == 201
    assert lab.api("POST", "/groups/staff/users", json={"users": ["pi"]}).status_code == 200
    made = cli(lab, "course", "create", "staff", "--instructor", "prof")
    assert made.returncode != 0 and "the hub has a group named 'staff'" in made.stderr
    # a course of that name made behind the CLI's back (the ledger itself): the sync that
    # gives prof the course's role still leaves the hub's group alone
    lab.ledger.create_course("staff", "test", instructors=["prof"])
    lab.ledger.import_roster("staff", [RosterLine("amy")], "test")
    until(lambda: "meterhub-course-instructor-staff" in roles(lab, "prof"), "a sync")
    users = lab.api("GET", "/groups/staff").json()["users"]
    assert users == ["pi"], f"the course took over the hub group 'staff': now {users}"


def test_a_ta_cannot_stop_a_students_own_money_server_through_the_hub_api(lab):
    lab.spawn("amy", {"profile": "debug", "wallet": "user:amy"})  # her own money
    try:
        (session,) = lab.ledger.open_sessions("amy")
        assert session.wallet_id == lab.ledger.wallet_id("amy")
        token = lab.api("POST", "/users/tara/tokens", json={"note": "ta"}).json()["token"]
        r = lab.api("DELETE", "/users/amy/server", token=token)
        assert r.status_code in (403, 404), (
            f"the TA stopped a server the course does not pay for: {r.status_code}"
        )
        assert lab.server("amy") is not None
    finally:
        if lab.server("amy") is not None:
            lab.stop_server("amy")
        until(lambda: lab.server("amy") is None, "amy's server to stop")
