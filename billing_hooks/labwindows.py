"""Lab windows: the hours a course's GPUs are for its class, in the course's time zone.

A window is written as an instructor says it:

- weekly: ``Tue 14:00-16:00`` (every Tuesday, 14:00 to 16:00 local time)
- once: ``2027-01-12T14:00/16:00`` (that day only)

The ledger keeps them as ``weekly Tue 14:00-16:00`` and ``on 2027-01-12T14:00/16:00``
lines with the course's zone (an IANA name such as ``Asia/Shanghai``). Local times become
UTC epoch seconds per date, so a daylight-saving change moves the window with the clock
on the wall, as the class does. A window ends before midnight; `24:00` may end one.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from meterhub.i18n import N_, _

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
#: the days as a person reads them (DAYS are what an instructor writes)
DAY_NAMES = (N_("Mon"), N_("Tue"), N_("Wed"), N_("Thu"), N_("Fri"), N_("Sat"), N_("Sun"))
_TIME = r"([0-9]{1,2}):([0-9]{2})"
WEEKLY = re.compile(rf"^([A-Za-z]{{3}})[a-z]*\s+{_TIME}\s*-\s*{_TIME}\Z")
ONCE = re.compile(rf"^([0-9]{{4}})-([0-9]{{2}})-([0-9]{{2}})T{_TIME}/{_TIME}\Z")
#: how far ahead the next window is looked for
HORIZON_DAYS = 400


class WindowError(ValueError):
    """A window or zone that cannot be read; the message is for people."""


def zone(name: str) -> ZoneInfo:
    try:
        if not name or len(name) > 64 or ".." in name or name.startswith("/"):
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowError(
            _(
                "unknown time zone %(zone)s: an IANA name such as Asia/Shanghai or UTC",
                zone=repr(name[:64]),
            )
        ) from None


def _minutes(hours: str, minutes: str, text: str) -> int:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and m):
        time = f"{hours}:{minutes}"
        raise WindowError(
            _(
                "%(text)s: %(time)s is not a time of day",
                text=repr(text),
                time=time,
            )
        )
    return h * 60 + m


def _span(match: re.Match, first: int, text: str) -> tuple[int, int]:
    start = _minutes(match[first], match[first + 1], text)
    end = _minutes(match[first + 2], match[first + 3], text)
    if end <= start:
        raise WindowError(
            _("%(text)s: a window ends after it starts, on the same day", text=repr(text))
        )
    return start, end


def weekly(text: str) -> str:
    """``Tue 14:00-16:00`` → the stored line; WindowError says what is wrong."""
    text = text.strip()
    match = WEEKLY.match(text)
    if match is None:
        raise WindowError(
            _("%(text)s: a weekly window is like 'Tue 14:00-16:00'", text=repr(text[:40]))
        )
    day = match[1].capitalize()
    if day not in DAYS:
        raise WindowError(
            _("%(text)s: the day is one of %(days)s", text=repr(text[:40]), days=", ".join(DAYS))
        )
    start, end = _span(match, 2, text)
    return f"weekly {day} {_hm(start)}-{_hm(end)}"


def once(text: str) -> str:
    """``2027-01-12T14:00/16:00`` → the stored line; WindowError says what is wrong."""
    text = text.strip()
    match = ONCE.match(text)
    if match is None:
        raise WindowError(
            _(
                "%(text)s: a one-off window is like '2027-01-12T14:00/16:00'",
                text=repr(text[:40]),
            )
        )
    try:
        datetime.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        date = f"{match[1]}-{match[2]}-{match[3]}"
        raise WindowError(
            _("%(text)s: %(date)s is no date", text=repr(text[:40]), date=date)
        ) from None
    start, end = _span(match, 4, text)
    return f"on {match[1]}-{match[2]}-{match[3]}T{_hm(start)}/{_hm(end)}"


def _hm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _at(day: datetime.date, minutes: int, tz: ZoneInfo) -> int:
    """`minutes` after midnight of `day` on the zone's wall clock (24:00: the next midnight),
    as UTC epoch seconds: a DST change that day moves it with the wall clock."""
    if minutes >= 24 * 60:
        day, minutes = day + datetime.timedelta(days=1), 0
    wall = datetime.datetime(day.year, day.month, day.day, minutes // 60, minutes % 60, tzinfo=tz)
    return int(wall.timestamp())


def occurrences(
    lines: Iterable[str], tz_name: str, since: int, days: int
) -> Iterator[tuple[int, int]]:
    """Every [start, end) (UTC epoch seconds) of these windows that ends after `since`,
    within `days` days of it, in no particular order."""
    tz = zone(tz_name)
    first = datetime.datetime.fromtimestamp(since, tz).date() - datetime.timedelta(days=1)
    for line in lines:
        kind, _sep, spec = line.partition(" ")
        if kind == "weekly":
            day_name, span = spec.split(" ")
            start_text, end_text = span.split("-")
            start, end = _clock(start_text), _clock(end_text)
            weekday = DAYS.index(day_name)
            for offset in range(days + 2):
                day = first + datetime.timedelta(days=offset)
                if day.weekday() == weekday:
                    window = (_at(day, start, tz), _at(day, end, tz))
                    if window[1] > since:
                        yield window
        elif kind == "on":
            date_text, span = spec.split("T")
            start_text, end_text = span.split("/")
            day = datetime.date.fromisoformat(date_text)
            window = (_at(day, _clock(start_text), tz), _at(day, _clock(end_text), tz))
            if window[1] > since:
                yield window


def _clock(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def current(lines: Iterable[str], tz_name: str, now: int) -> tuple[int, int] | None:
    """The window `now` is in (the one ending last, if two overlap), or None."""
    inside = [w for w in occurrences(lines, tz_name, now, 8) if w[0] <= now < w[1]]
    return max(inside, key=lambda w: w[1]) if inside else None


def upcoming(lines: Iterable[str], tz_name: str, now: int) -> tuple[int, int] | None:
    """The next window to start after `now`, or None (no window within HORIZON_DAYS)."""
    later = [w for w in occurrences(lines, tz_name, now, HORIZON_DAYS) if w[0] > now]
    return min(later) if later else None


def phrase(at: int, tz_name: str, now: int) -> str:
    """``Tue 14:00 CST`` within the coming week, else ``Tue 2027-01-12 14:00 CST`` (周二
    14:00 CST, 2027-01-12 周二 14:00 CST), in the language of the moment."""
    tz = zone(tz_name)
    local = datetime.datetime.fromtimestamp(at, tz)
    values = {
        "day": _(DAY_NAMES[local.weekday()]),
        "time": f"{local:%H:%M}",
        "zone": local.tzname(),
    }
    if at - now < 6 * 86_400:
        return _("%(day)s %(time)s %(zone)s", **values)
    return _("%(day)s %(date)s %(time)s %(zone)s", date=local.strftime("%Y-%m-%d"), **values)
