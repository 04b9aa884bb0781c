"""What a course's instructors (and admins) change, once: the REST API, the console and the
CLI call these. Everything is checked before anything is written; ActionError carries the
HTTP status and a message for people.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from meterhub.i18n import _

from . import labwindows
from .actions import ActionError, limit_amount
from .courses import RosterChange, RosterLine
from .ledger import Ledger, LedgerError, UnknownWallet
from .orm import CAP_PERIODS, COURSE_ROLES, CourseSettings

#: lines in one roster import
MAX_ROSTER = 20_000


def course_choices(catalog, choices: Sequence[object]) -> list[str]:
    """Profile choices (`debug`, `a800`, `rtx4090:1`) checked against the catalog; `any`
    alone for any profile ([])."""
    if list(choices) == ["any"]:
        return []
    profiles = catalog.profiles()
    checked = []
    for choice in choices:
        if not isinstance(choice, str) or len(choice) > 40:
            raise ActionError(400, _("profiles: each is PROFILE or PROFILE:GPUS"))
        slug, _sep, count = choice.strip().lower().partition(":")
        if slug not in profiles:
            raise ActionError(
                400,
                _(
                    "profiles: no profile %(profile)s in the catalog: one of %(profiles)s",
                    profile=repr(slug[:32]),
                    profiles=", ".join(profiles),
                ),
            )
        if count and profiles[slug].is_debug:
            raise ActionError(
                400, _("profiles: %(profile)s has no GPUs: write it without a count", profile=slug)
            )
        if count and (not count.isdigit() or int(count) not in profiles[slug].counts):
            counts = ", ".join(str(n) for n in profiles[slug].counts)
            raise ActionError(
                400,
                _(
                    "profiles: %(profile)s starts with %(counts)s GPUs, not %(count)s",
                    profile=slug,
                    counts=counts,
                    count=count[:8],
                ),
            )
        checked.append(f"{slug}:{int(count)}" if count else slug)
    return checked


def expiry(date_text: object, timezone: str) -> int:
    """The end of the allowance's last day (YYYY-MM-DD) in the course's zone."""
    try:
        day = datetime.date.fromisoformat(str(date_text))
    except ValueError:
        raise ActionError(
            400, _("expires: a date, YYYY-MM-DD (the last day of the allowance)")
        ) from None
    try:
        tz = labwindows.zone(timezone)
    except labwindows.WindowError as e:
        raise ActionError(400, str(e)) from None
    end = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(0), tz)
    return int(end.timestamp())


def _windows(spec: object) -> tuple[list[str], bool, str | None]:
    if not isinstance(spec, dict):
        raise ActionError(400, _("windows: an object with weekly, on, clear, timezone"))
    try:
        lines = [labwindows.weekly(w) for w in _strings(spec.get("weekly", []), "weekly")]
        lines += [labwindows.once(w) for w in _strings(spec.get("on", []), "on")]
        timezone = spec.get("timezone")
        if timezone is not None:
            labwindows.zone(str(timezone))
    except labwindows.WindowError as e:
        raise ActionError(400, _("windows: %(error)s", error=str(e))) from None
    return lines, spec.get("clear") is True, None if timezone is None else str(timezone)


def _strings(value: object, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 50:
        raise ActionError(400, _("windows.%(field)s: a list of at most 50 windows", field=field))
    return value


def change_course(ledger: Ledger, catalog, name: str, body: dict) -> CourseSettings:
    """Apply an instructor's change: any of `allowance` ({"amount": "30.00" or null,
    "per": "week", "expires": "2027-06-30" or null}), `profiles` (["debug", "rtx4090:1"]
    or ["any"]), `windows` ({"weekly": [...], "on": [...], "clear": true, "timezone": ...})
    and `debug_outside_windows`. All is checked first; nothing is written on a refusal."""
    course = ledger.course(name)
    if course is None:
        raise ActionError(404, _("No course %(name)s", name=name[:64]))
    plans = []
    if "allowance" in body:
        allowance = body["allowance"]
        if not isinstance(allowance, dict):
            raise ActionError(400, _("allowance: an object with amount, per and expires"))
        amount = allowance.get("amount")
        micros = None if amount is None else limit_amount(amount, "allowance.amount")
        per = allowance.get("per", "total")
        if per not in CAP_PERIODS:
            raise ActionError(
                400, _("allowance.per: one of %(periods)s", periods=", ".join(CAP_PERIODS))
            )
        expires = allowance.get("expires")
        zone_name = course.timezone
        if isinstance(body.get("windows"), dict) and body["windows"].get("timezone"):
            zone_name = str(body["windows"]["timezone"])
        ends = None if expires is None else expiry(expires, zone_name)
        plans.append(lambda: ledger.set_allowance(course.name, micros, per, ends))
    if "profiles" in body:
        if not isinstance(body["profiles"], list):
            raise ActionError(400, _('profiles: a list such as ["debug", "rtx4090:1"]'))
        choices = course_choices(catalog, body["profiles"])
        plans.append(lambda: ledger.set_course_profiles(course.name, choices))
    if "windows" in body:
        lines, clear, timezone = _windows(body["windows"])
        plans.append(
            lambda: ledger.set_course_windows(course.name, lines, clear=clear, timezone=timezone)
        )
    if "debug_outside_windows" in body:
        debug = body["debug_outside_windows"]
        if not isinstance(debug, bool):
            raise ActionError(400, _("debug_outside_windows: true or false"))
        plans.append(lambda: ledger.set_course_options(course.name, debug_outside_windows=debug))
    if not plans:
        raise ActionError(
            400, _("say what to change: allowance, profiles, windows, debug_outside_windows")
        )
    try:
        for plan in plans:
            plan()
    except UnknownWallet as e:
        raise ActionError(404, str(e)) from None
    except LedgerError as e:
        raise ActionError(400, str(e)) from None
    updated = ledger.course(course.name)
    assert updated is not None
    return updated


def roster_lines(rows: object, first: int = 1, where: str = "roster[{}]") -> list[RosterLine]:
    """A roster as rows ([{"username", "name"?, "email"?, "role"?}], from JSON or a CSV),
    checked; an error names the row as `where` with its number (from `first`)."""
    if not isinstance(rows, list) or len(rows) > MAX_ROSTER:
        raise ActionError(400, _("roster: a list of at most %(n)s people", n=MAX_ROSTER))
    lines = []
    for number, row in enumerate(rows, start=first):
        at = where.format(number)
        if not isinstance(row, dict) or not isinstance(row.get("username"), str):
            raise ActionError(400, _("%(at)s: an object with a username", at=at))
        if not row["username"].strip():
            raise ActionError(400, _("%(at)s: no username", at=at))
        role = (row.get("role") or "student").strip().lower() or "student"
        if role not in COURSE_ROLES:
            raise ActionError(
                400,
                _(
                    "%(at)s: role %(role)s is not one of %(roles)s",
                    at=at,
                    role=repr(str(role)[:20]),
                    roles=", ".join(COURSE_ROLES),
                ),
            )
        full_name, email = row.get("name") or "", row.get("email") or ""
        if not isinstance(full_name, str) or not isinstance(email, str):
            raise ActionError(400, _("%(at)s: name and email are text", at=at))
        lines.append(
            RosterLine(
                row["username"].strip().lower(), role, full_name.strip()[:200], email.strip()[:200]
            )
        )
    return lines


def import_roster(ledger: Ledger, name: str, rows: object, actor: str) -> RosterChange:
    lines = roster_lines(rows)
    try:
        return ledger.import_roster(name, lines, actor)
    except UnknownWallet as e:
        raise ActionError(404, str(e)) from None
    except LedgerError as e:
        raise ActionError(400, str(e)) from None
