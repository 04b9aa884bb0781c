"""Courses in the ledger and the meter, on a fake clock: rosters, allowances carved from the
course wallet (spend, renewal across period boundaries, a course short of credit, expiry
returning what is left in one exact pair), the course's profiles, and lab windows in a
time zone (weekly, one-off, daylight saving)."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from sqlalchemy import select

from meterhub.billing_hooks import labwindows
from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.courses import RosterLine, allows, check_choices
from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import InsufficientCredit, LedgerError, UnknownWallet
from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.orm import Entry
from meterhub.billing_hooks.wallets import allowance_ref, parse_wallet

from .billing_support import make_ledger
from .test_groups_ledger import FakeHub

RATE = to_micros("36.00")  # a cent a second
MIN = 60
#: Monday 1 February 2027 00:00 UTC: a week and a month begin
FEB_1 = int(datetime.datetime(2027, 2, 1, tzinfo=datetime.UTC).timestamp())
WEEK = 7 * 86_400


def setup(
    start: int = FEB_1 + 86_400,
    allowance: str | None = "10.00",
    per="week",
    credit="100",
    url: str | None = None,
):
    engine = connect(url) if url else None
    ledger, clock = make_ledger(clock=FakeClock(start), engine=engine)
    ledger.create_course("ML101", "root", instructors=["prof"], tas=["tara"])
    ledger.import_roster("ml101", [RosterLine("amy"), RosterLine("bob")], "root")
    if credit:
        ledger.grant("course:ml101", to_micros(credit), key="po-1")
    if allowance:
        ledger.set_allowance("ml101", to_micros(allowance), per, None)
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, warn_minutes=[2], clock=clock)
    return ledger, clock, hub, meter


def start(ledger, hub, user, rate=RATE, server=""):
    auth = ledger.open_session(user, server, "a800", 1, rate, MIN, wallet="course:ml101")
    ledger.mark_ready(auth.session_id)
    hub.servers[(user, server)] = True
    return auth.session_id


def allowance(ledger, user) -> int:
    return ledger.balance(allowance_ref("ml101", user))


def moves(ledger, user) -> list[tuple[int, str]]:
    """The allowance's moves: (amount, key), oldest first."""
    with ledger.begin() as db:
        wallet_id = ledger._wallet(db, allowance_ref("ml101", user)).id
        return [
            (e.amount_micros, e.key)
            for e in db.scalars(
                select(Entry)
                .where(Entry.wallet_id == wallet_id, Entry.kind == "allowance")
                .order_by(Entry.id)
            )
        ]


def run_pass(meter):
    return asyncio.run(meter.tick())


# ---------------------------------------------------------------------- the registry


def test_a_course_is_a_group_name_with_a_wallet_staff_and_a_zone():
    ledger, _ = make_ledger()
    course = ledger.create_course("ML101", "root", instructors=["prof"], tas=["tara"])
    assert course.name == "ml101" and course.timezone == "UTC"
    assert ledger.group("ml101") is None  # not a research group
    assert ledger.group("ml101", kinds=("course",)).kind == "course"
    assert ledger.balance("course:ml101") == 0
    assert parse_wallet("course:ML101") == ("course", "ml101")
    assert {m.user_name: m.role for m in ledger.roster("ml101")} == {
        "prof": "instructor",
        "tara": "ta",
    }
    ledger.create_group("vision", "root")
    for taken in ("ml101", "VISION"):
        with pytest.raises(LedgerError, match="exists already"):
            ledger.create_course(taken, "root")
    with pytest.raises(Exception, match="unknown time zone"):
        ledger.create_course("cs2", "root", timezone="Mars/Olympus")
    with pytest.raises(LedgerError, match="invalid user name"):
        ledger.create_course("cs2", "root", instructors=["Bad Name"])
    assert [c.name for c in ledger.courses()] == ["ml101"]
    with pytest.raises(UnknownWallet, match="There is no course"):
        ledger.grant("course:cs2", 1, key="k")


def test_a_roster_import_adds_removes_and_changes_and_again_changes_nothing():
    ledger, _ = make_ledger()
    ledger.create_course("ml101", "root", instructors=["prof"])
    first = ledger.import_roster(
        "ml101",
        [RosterLine("amy", full_name="Amy A"), RosterLine("bob"), RosterLine("tara", "ta")],
        "root",
    )
    assert (first.added, first.removed, first.changed) == (["amy", "bob", "tara"], [], [])
    again = ledger.import_roster(
        "ml101",
        [RosterLine("amy", full_name="Amy A"), RosterLine("bob"), RosterLine("tara", "ta")],
        "root",
    )
    assert (again.added, again.removed, again.changed, again.unchanged) == ([], [], [], 3)
    # bob dropped, amy's email known now; prof (staff, not in the file) stays
    third = ledger.import_roster(
        "ml101",
        [RosterLine("amy", full_name="Amy A", email="amy@u.edu"), RosterLine("tara", "ta")],
        "root",
    )
    assert (third.added, third.removed, third.changed) == ([], ["bob"], ["amy"])
    assert ledger.course_rosters() == {
        "ml101": {"student": ["amy"], "ta": ["tara"], "instructor": ["prof"]}
    }
    assert ledger.student_courses("amy") == ["ml101"] and ledger.student_courses("bob") == []
    # a bad line anywhere writes nothing
    for bad, why in (
        ([RosterLine("cy"), RosterLine("Bad Name")], "invalid user name"),
        ([RosterLine("cy", "professor")], "is not one of"),
        ([RosterLine("cy"), RosterLine("cy", "ta")], "twice"),
    ):
        with pytest.raises(LedgerError, match=why):
            ledger.import_roster("ml101", bad, "root")
    assert [m.user_name for m in ledger.roster("ml101")] == ["amy", "prof", "tara"]


# ---------------------------------------------------------------------- allowances


def test_the_first_spawn_carves_the_allowance_and_the_student_spends_it():
    ledger, clock, hub, meter = setup()
    assert ledger.allowance_state("ml101", "amy").left_micros == to_micros("10.00")
    start(ledger, hub, "amy")
    assert allowance(ledger, "amy") == to_micros("10.00")
    assert ledger.balance("course:ml101") == to_micros("90.00")
    clock.advance(60)
    run_pass(meter)
    assert allowance(ledger, "amy") == to_micros("9.40")
    assert ledger.balance("course:ml101") == to_micros("90.00")  # the student pays, not it
    assert ledger.balance("amy") == to_micros("10.00")  # the trial, untouched
    assert ledger.audit() == []


def test_the_allowance_renews_each_week_by_exactly_what_was_spent(ledger_url):
    ledger, clock, hub, meter = setup(start=FEB_1 + WEEK - 120, url=ledger_url)  # Sun 23:58
    start(ledger, hub, "amy")
    clock.advance(120)  # Monday 8 Feb 00:00: a new week
    run_pass(meter)
    # spent 1.20 of last week's 10.00 (the window to the boundary), then renewed to 10.00
    # before this week's first charge: it now holds 10.00 less what this pass charged
    spent_before = to_micros("1.20")
    assert [m[0] for m in moves(ledger, "amy")] == [to_micros("10.00"), spent_before]
    assert ledger.balance("course:ml101") == to_micros("100") - to_micros("10.00") - spent_before
    assert allowance(ledger, "amy") == to_micros("10.00")
    clock.advance(60)
    run_pass(meter)
    assert allowance(ledger, "amy") == to_micros("9.40")
    run_pass(meter)  # the same week: nothing more is moved
    assert len(moves(ledger, "amy")) == 2
    assert ledger.audit() == []


def test_a_course_short_of_credit_carves_what_it_has_and_the_rest_after_a_top_up(ledger_url):
    ledger, clock, hub, meter = setup(credit="4", url=ledger_url)
    with pytest.raises(InsufficientCredit, match="Your allowance from ml101"):
        # 4.00 carved: enough for a minute of a800 (0.60) ...
        ledger.open_session("amy", "", "a800", 1, RATE * 100, MIN, wallet="course:ml101")
    start(ledger, hub, "amy")
    assert allowance(ledger, "amy") == to_micros("4.00")
    assert ledger.balance("course:ml101") == 0
    # bob gets nothing: the course is empty
    with pytest.raises(InsufficientCredit, match="Ask your instructor"):
        ledger.open_session("bob", "", "a800", 1, RATE, MIN, wallet="course:ml101")
    ledger.grant("course:ml101", to_micros("50"), key="po-2")
    clock.advance(60)
    run_pass(meter)  # amy's allowance is topped up to the week's 10.00, less the charge
    assert allowance(ledger, "amy") == to_micros("10.00") - to_micros("0.60")
    assert ledger.balance("course:ml101") == to_micros("50") - to_micros("6.00")
    start(ledger, hub, "bob")
    assert allowance(ledger, "bob") == to_micros("10.00")
    assert ledger.audit() == []


def test_expiry_returns_what_is_left_in_one_pair_and_the_meter_stops_the_server(ledger_url):
    ledger, clock, hub, meter = setup(url=ledger_url)
    ledger.set_allowance("ml101", to_micros("10.00"), "total", clock() + 300)
    start(ledger, hub, "amy")
    clock.advance(240)
    run_pass(meter)
    assert allowance(ledger, "amy") == to_micros("7.60")
    clock.advance(60)  # expired
    result = run_pass(meter)
    # the pass charges the last minute, then returns what is left, and stops the server
    assert ("amy", "") in result.to_stop
    returned = [m for m in moves(ledger, "amy") if "expired" in m[1]]
    assert returned == [(-to_micros("7.00"), returned[0][1])]
    ledger.close_server("amy", "", None)
    assert ledger.balance("course:ml101") == to_micros("97.00")
    assert allowance(ledger, "amy") == 0
    run_pass(meter)
    assert len(moves(ledger, "amy")) == 2  # returned once, never again
    with pytest.raises(InsufficientCredit, match="ended on"):
        ledger.open_session("amy", "", "debug", 0, RATE, MIN, wallet="course:ml101")
    assert ledger.audit() == []


def test_a_changed_allowance_or_period_applies_at_the_next_settle_by_what_was_spent():
    ledger, clock, hub, meter = setup()
    session = start(ledger, hub, "amy")
    clock.advance(400)
    run_pass(meter)  # 4.00 of the week's 10.00 spent
    ledger.close_session(session)
    hub.servers.clear()
    assert allowance(ledger, "amy") == to_micros("6.00")
    ledger.set_allowance("ml101", to_micros("5.00"), "week", None)  # lowered: 1.00 back
    ledger.settle_allowance("ml101", "amy")
    assert allowance(ledger, "amy") == to_micros("1.00")
    assert ledger.balance("course:ml101") == to_micros("95.00")
    # a new period: the allowance less nothing spent yet
    clock.advance(WEEK)
    assert ledger.allowance_state("ml101", "amy").left_micros == to_micros("5.00")
    ledger.settle_allowance("ml101", "amy")
    assert allowance(ledger, "amy") == to_micros("5.00")
    # switching week -> month counts what the month has spent: no refill from the switch
    ledger.set_allowance("ml101", to_micros("5.00"), "month", None)
    assert ledger.allowance_state("ml101", "amy").left_micros == to_micros("1.00")
    ledger.settle_allowance("ml101", "amy")
    assert allowance(ledger, "amy") == to_micros("1.00")
    assert ledger.audit() == []


def test_extending_an_ended_allowance_gives_back_what_was_left():
    ledger, clock, hub, meter = setup(per="total")
    ledger.set_allowance("ml101", to_micros("10.00"), "total", clock() + 300)
    session = start(ledger, hub, "amy")
    clock.advance(200)
    run_pass(meter)
    ledger.close_session(session)
    hub.servers.clear()
    clock.advance(200)  # ended: 8.00 returned
    run_pass(meter)
    assert allowance(ledger, "amy") == 0
    ledger.set_allowance("ml101", to_micros("10.00"), "total", clock() + 86_400)
    assert ledger.allowance_state("ml101", "amy").left_micros == to_micros("8.00")
    ledger.settle_allowance("ml101", "amy")
    assert allowance(ledger, "amy") == to_micros("8.00")
    assert ledger.balance("course:ml101") == to_micros("90.00")  # 100 - 2 spent - 8 held
    assert ledger.audit() == []


def test_no_allowance_or_an_unknown_course_starts_nothing():
    ledger, _clock, _hub, _meter = setup(allowance=None)
    with pytest.raises(InsufficientCredit, match="no allowance for its students"):
        ledger.open_session("amy", "", "a800", 1, RATE, MIN, wallet="course:ml101")
    with pytest.raises(UnknownWallet):
        ledger.open_session("amy", "", "a800", 1, RATE, MIN, wallet="course:nope")
    for bad in (("0", "week"), ("-1", "week"), ("1", "year")):
        with pytest.raises(LedgerError):
            ledger.set_allowance("ml101", to_micros(bad[0]), bad[1], None)
    assert ledger.course("ml101").allowance_micros is None
    assert ledger.audit() == []


# ---------------------------------------------------------------------- profiles


def test_course_choices_are_checked_and_matched():
    assert check_choices(["debug", "RTX4090:1", "a800", "a800"]) == ["debug", "rtx4090:1", "a800"]
    for bad in ("", "rtx:0", "rtx:x", "a b", "x" * 40):
        with pytest.raises(LedgerError):
            check_choices([bad])
    assert allows("", "h800", 8)
    assert allows("debug rtx4090:1", "rtx4090", 1)
    assert not allows("debug rtx4090:1", "rtx4090", 2)
    assert allows("debug a800", "a800", 4)
    assert not allows("debug", "a800", 1)


# ---------------------------------------------------------------------- lab windows


def at(text: str, tz: str) -> int:
    return int(
        datetime.datetime.fromisoformat(text).replace(tzinfo=labwindows.zone(tz)).timestamp()
    )


def test_windows_are_read_as_people_write_them_and_refused_clearly():
    assert labwindows.weekly("tue 14:00-16:00") == "weekly Tue 14:00-16:00"
    assert labwindows.weekly("Thursday 9:30 - 11:00") == "weekly Thu 09:30-11:00"
    assert labwindows.once("2027-01-12T14:00/16:00") == "on 2027-01-12T14:00/16:00"
    assert labwindows.weekly("Fri 22:00-24:00") == "weekly Fri 22:00-24:00"
    for bad, why in (
        ("Tue 16:00-14:00", "ends after it starts"),
        ("Tue 14:00", "like 'Tue 14:00-16:00'"),
        ("Xyz 14:00-16:00", "the day is one of"),
        ("Tue 25:00-26:00", "not a time of day"),
        ("Tue 14:60-15:00", "not a time of day"),
    ):
        with pytest.raises(labwindows.WindowError, match=why):
            labwindows.weekly(bad)
    for bad, why in (("2027-02-30T14:00/16:00", "is no date"), ("tomorrow", "like '2027")):
        with pytest.raises(labwindows.WindowError, match=why):
            labwindows.once(bad)


def test_the_current_and_next_window_in_the_course_zone():
    tz = "Asia/Shanghai"
    lines = ["weekly Tue 14:00-16:00", "on 2027-02-05T09:00/10:00"]
    tuesday_2pm = at("2027-02-02T14:00", tz)  # Tuesday
    assert labwindows.current(lines, tz, tuesday_2pm) == (tuesday_2pm, tuesday_2pm + 7200)
    assert labwindows.current(lines, tz, tuesday_2pm - 1) is None
    assert labwindows.current(lines, tz, tuesday_2pm + 7200) is None
    after = tuesday_2pm + 7200
    friday = at("2027-02-05T09:00", tz)
    assert labwindows.upcoming(lines, tz, after) == (friday, friday + 3600)
    assert labwindows.phrase(friday, tz, after) == "Fri 09:00 CST"
    next_tuesday = tuesday_2pm + WEEK
    assert labwindows.upcoming(lines, tz, friday + 3600) == (next_tuesday, next_tuesday + 7200)
    far = labwindows.phrase(next_tuesday + 4 * WEEK, tz, after)
    assert far == "Tue 2027-03-09 14:00 CST"
    assert labwindows.upcoming(["on 2020-01-01T10:00/11:00"], tz, after) is None


def test_a_weekly_window_keeps_its_wall_time_across_daylight_saving():
    tz = "America/New_York"  # DST began Sunday 14 March 2027
    lines = ["weekly Mon 09:00-10:00"]
    before = labwindows.upcoming(lines, tz, at("2027-03-06T00:00", tz))
    after = labwindows.upcoming(lines, tz, at("2027-03-13T00:00", tz))
    assert before[0] == at("2027-03-08T09:00", tz)
    assert after[0] == at("2027-03-15T09:00", tz)
    assert after[0] - before[0] == WEEK - 3600  # an hour less in UTC: the wall clock holds
    assert labwindows.phrase(after[0], tz, after[0] - 3600) == "Mon 09:00 EDT"


def test_the_audit_finds_an_allowance_move_without_its_pair():
    ledger, _clock, _hub, _meter = setup()
    ledger.settle_allowance("ml101", "amy")
    assert ledger.audit() == []
    with ledger.begin() as db:
        wallet = ledger._wallet(db, "course:ml101", lock=True)
        ledger._post(db, wallet, "allowance", -5, "allowance:ml101/amy:stray:course", "test")
    (problem,) = ledger.audit()
    assert "allowance move allowance:ml101/amy:stray: entries [-5] are not a pair" in problem


def test_before_a_lab_window_ends_gpu_students_are_warned_and_after_it_stopped():
    tz = "Asia/Shanghai"
    tuesday_2pm = at("2027-02-02T14:00", tz)
    ledger, clock, hub, meter = setup(start=tuesday_2pm + 60)
    ledger.set_course_windows("ml101", ["weekly Tue 14:00-16:00"], timezone=tz)
    cheap = to_micros("1.00")  # two hours well within the allowance
    start(ledger, hub, "amy", rate=cheap)  # a800, one GPU
    auth = ledger.open_session("bob", "", "debug", 0, cheap, MIN, wallet="course:ml101")
    ledger.mark_ready(auth.session_id)
    hub.servers[("bob", "")] = True
    clock.advance(7200 - 100 - 60)
    run_pass(meter)
    (warning,) = [n.message for n in ledger.notifications("amy") if n.kind == "warning"]
    assert warning.startswith("The ml101 lab ends at Tue 16:00 CST, in 1 min: your GPU server")
    assert not ledger.notifications("bob")
    clock.advance(100)
    result = run_pass(meter)
    assert ("amy", "") in result.to_stop and ("bob", "") not in result.to_stop
    stopped = [n.message for n in ledger.notifications("amy") if n.kind == "stopped"]
    assert stopped == [
        "The ml101 lab is over (next lab: Tue 2027-02-09 14:00 CST), so your GPU server paid"
        " by the course was stopped. Your files are kept; debug mode stays open."
    ]
    # a course that keeps debug mode to its windows stops that too
    ledger.set_course_options("ml101", debug_outside_windows=False)
    clock.advance(60)
    assert ("bob", "") in run_pass(meter).to_stop


def test_a_course_reserves_its_window_gpus_for_its_students_only_during_a_window():
    tz = "Asia/Shanghai"
    tuesday_2pm = at("2027-02-02T14:00", tz)
    ledger, clock, _hub, _meter = setup(start=tuesday_2pm - 60)
    ledger.set_course_windows("ml101", ["weekly Tue 14:00-16:00"], timezone=tz, gpus={"rtx4090": 2})
    assert ledger.window_reservations() == {}  # a minute before the lab
    clock.advance(60)
    assert ledger.window_reservations() == {"rtx4090": {"course:ml101": (2, ("amy", "bob"))}}
    clock.advance(7200)
    assert ledger.window_reservations() == {}
    ledger.set_course_windows("ml101", gpus={})
    assert ledger.course("ml101").window_gpus == ""
    with pytest.raises(LedgerError, match="TYPE:COUNT"):
        ledger.set_course_windows("ml101", gpus={"rtx4090": -1})


def test_a_course_that_restarts_in_debug_mode_asks_the_meter_to_and_says_so():
    tz = "Asia/Shanghai"
    tuesday_2pm = at("2027-02-02T14:00", tz)
    ledger, clock, hub, meter = setup(start=tuesday_2pm + 60)
    ledger.set_course_windows("ml101", ["weekly Tue 14:00-16:00"], timezone=tz)
    ledger.set_course_options("ml101", at_window_end="debug")
    start(ledger, hub, "amy", rate=to_micros("1.00"))
    clock.advance(7200 - 60 - 60)
    run_pass(meter)
    (warning,) = [n.message for n in ledger.notifications("amy") if n.kind == "warning"]
    assert warning.endswith("restarts in debug mode then, on the same disk.")
    clock.advance(60)
    result = meter.charge_pass({("amy", ""): True}, clock())
    assert result.to_debug == [("amy", "", "lab")] and result.to_stop == []
    (notice,) = [n.message for n in ledger.notifications("amy") if n.kind == "stopped"]
    assert notice.endswith("was restarted in debug mode on the same disk: your files are there.")


def test_a_weekly_allowance_renews_at_monday_midnight_on_the_courses_clock():
    tz = "Asia/Shanghai"
    monday = at("2027-02-08T00:00", tz)  # Sunday 16:00 UTC
    ledger, clock, hub, meter = setup(start=monday - 120)
    ledger.set_course_windows("ml101", timezone=tz)
    start(ledger, hub, "amy")
    clock.advance(120)
    run_pass(meter)  # 1.20 spent in the old week, then renewed at midnight in Shanghai
    assert [m[0] for m in moves(ledger, "amy")] == [to_micros("10.00"), to_micros("1.20")]
    assert allowance(ledger, "amy") == to_micros("10.00")
    clock.advance(8 * 3600 - 60)  # Monday 00:00 UTC: no second renewal
    run_pass(meter)
    assert len(moves(ledger, "amy")) == 2
    assert ledger.audit() == []


def test_the_spawn_pages_pay_from_offers_each_course_with_what_it_pays_for_and_when():
    from meterhub.hub.spawn_form import course_options, payer_options

    tz = "Asia/Shanghai"
    tuesday_3pm = at("2027-02-02T15:00", tz)
    ledger, clock, _hub, _meter = setup(start=tuesday_3pm)
    ledger.set_course_profiles("ml101", ["debug", "rtx4090:1"])
    ledger.set_course_windows("ml101", ["weekly Tue 14:00-16:00"], timezone=tz, gpus={"rtx4090": 2})
    ((option, left),), default = course_options(ledger, "amy")
    assert (option.value, option.label, option.disabled_reason) == (
        "course:ml101",
        "Course ml101",
        "",
    )
    assert option.detail == (
        "¥10.00 of your ¥10.00 allowance for this week left; pays for debug, rtx4090:1;"
        " lab now, until Tue 16:00 CST; 2 rtx4090 GPU(s) reserved for the class"
    )
    assert left == to_micros("10.00") and default == "ml101"
    payers, checked, available = payer_options(ledger, "amy", 0, set())
    assert [p.value for p in payers] == ["user:amy", "course:ml101"] and checked == "course:ml101"
    assert available == to_micros("10.00")
    # a stranger is offered no course; an ended allowance is offered, disabled
    assert course_options(ledger, "eve") == ([], "")
    ledger.set_allowance("ml101", to_micros("10.00"), "week", clock() - 1)
    ((option, _left),), default = course_options(ledger, "amy")
    assert option.disabled_reason == "the allowance has ended" and default == ""
