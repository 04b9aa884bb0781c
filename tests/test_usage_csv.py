"""The usage exports (a user's, the Wallet page's and `meterhub usage --csv`; a group's or a
course's statement): times are ISO 8601 moments with their UTC offset, never Unix seconds,
and a session still running has an empty stop."""

from __future__ import annotations

import csv
import datetime
import io

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.money import MICROS, to_micros

from .billing_support import make_ledger

#: Friday 4 December 2026, 18:20:00 UTC
START = int(datetime.datetime(2026, 12, 4, 18, 20, tzinfo=datetime.UTC).timestamp())


def rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def moment(text: str) -> datetime.datetime:
    parsed = datetime.datetime.fromisoformat(text)
    assert parsed.tzinfo is not None and parsed.utcoffset() == datetime.timedelta(0), text
    return parsed


def a_month_of_use():
    """amy: one closed A800 session, one still running in debug mode; one on lab's wallet."""
    ledger, clock = make_ledger()
    clock.now = START
    ledger.grant("amy", 50 * MICROS, "grant:amy", "", "cli:root")
    closed = ledger.open_session("amy", "", "a800", 1, to_micros("4.50"), 60).session_id
    ledger.mark_ready(closed)
    clock.advance(90)
    ledger.charge_running([closed], clock.now)
    ledger.close_session(closed)
    ledger.create_group("lab", "cli:root")
    ledger.grant("group:lab", 20 * MICROS, "grant:lab", "", "cli:root")
    paid = ledger.open_session(
        "amy", "g", "debug", 0, to_micros("0.10"), 60, wallet="group:lab", environment="minimal"
    ).session_id
    ledger.mark_ready(paid)
    clock.advance(60)
    running = ledger.open_session("amy", "dbg", "debug", 0, to_micros("0.10"), 60).session_id
    return ledger, clock, closed, running


def test_a_users_usage_csv_has_iso_times_with_their_offset():
    ledger, _clock, closed, running = a_month_of_use()
    got = {int(r["session"]): r for r in rows(actions.usage_csv(ledger, "amy"))}
    assert set(got) >= {closed, running}
    first = got[closed]
    assert first["started_at"] == "2026-12-04T18:20:00+00:00"
    assert moment(first["stopped_at"]) - moment(first["started_at"]) == datetime.timedelta(
        seconds=90
    )
    assert got[running]["stopped_at"] == ""  # still running: no stop yet
    # what each ran: none recorded (a session from before environments) reads empty
    assert (first["environment"], got[running]["environment"]) == ("", "")
    moment(got[running]["started_at"])
    for row in got.values():
        assert not row["started_at"].isdigit()


def test_a_groups_statement_csv_has_iso_times_with_their_offset():
    ledger, _clock, _closed, _running = a_month_of_use()
    (row,) = rows(actions.group_usage_csv(ledger, "lab"))
    assert row["member"] == "amy" and row["profile"] == "debug"
    assert row["environment"] == "minimal"
    assert list(row)[-1] == "environment"  # after the columns scripts read by position
    assert moment(row["started_at"]) == datetime.datetime(
        2026, 12, 4, 18, 21, 30, tzinfo=datetime.UTC
    )
    assert row["stopped_at"] == ""


def test_csv_time_is_utc_with_offset():
    assert actions.csv_time(START) == "2026-12-04T18:20:00+00:00"
    assert actions.csv_time("") == ""
