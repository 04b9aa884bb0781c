"""Wallet references and cap periods: `user:NAME` (or a bare NAME), `group:NAME` and
`course:NAME`, spelt the same in the CLI, the API, user options, pages and the ledger.

A student paying from `course:NAME` pays from their allowance in it: a wallet of its own,
`allowance:NAME/USER`, that only the ledger names (never a user's option).

Group names compare case-insensitively: a reference is folded to lower case, as the
ledger keeps group names.
"""

from __future__ import annotations

import datetime
import re
from typing import NamedTuple

from meterhub.i18n import N_, _

#: a user name (the hub's rule, hub/accounts.py) and a group name
USER_NAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}\Z")
#: (a group's name is also in its admins' role name, which must end in a letter or digit)
GROUP_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z")
GROUP_RULE = N_(
    "lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or"
    " digit, at most 64 characters"
)
KINDS = ("user", "group", "course")


class WalletRefError(ValueError):
    """A wallet reference that cannot be read; the message is for people."""


class WalletRef(NamedTuple):
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def is_group(self) -> bool:
        return self.kind == "group"

    @property
    def is_course(self) -> bool:
        return self.kind == "course"


def allowance_ref(course: str, user: str) -> WalletRef:
    """The wallet of `user`'s allowance in `course` (names hold no "/")."""
    return WalletRef("allowance", f"{course}/{user}")


def parse_wallet(text: object) -> WalletRef:
    """`user:NAME`, a bare NAME (a user) or `group:NAME`; WalletRefError says what is wrong."""
    if not isinstance(text, str) or not text or len(text) > 80:
        raise WalletRefError(
            _("a wallet is 'user:NAME', 'group:NAME', 'course:NAME' or a user name")
        )
    kind, sep, name = text.partition(":")
    if not sep:
        kind, name = "user", text
    if kind not in KINDS:
        raise WalletRefError(
            _(
                "unknown wallet kind %(kind)s: a wallet is 'user:NAME', 'group:NAME' or"
                " 'course:NAME'",
                kind=repr(kind[:20]),
            )
        )
    if kind in ("group", "course"):
        name = fold(name)
        if not GROUP_NAME.match(name):
            raise WalletRefError(
                _("invalid group name %(name)s: %(rule)s", name=repr(name[:64]), rule=_(GROUP_RULE))
            )
    elif not USER_NAME.match(name):
        raise WalletRefError(_("invalid user name %(name)s", name=repr(name[:64])))
    return WalletRef(kind, name)


def fold(name: str) -> str:
    """A group name as it compares: ASCII letters lower-cased; any other name is kept as it
    is, so it never equals a wallet's name (ASCII, see GROUP_NAME). `str.casefold` would
    fold the Kelvin sign "\u212a" to "k": a group named with it would pay from "k…"."""
    return name.lower() if name.isascii() else name


def as_ref(owner: str | WalletRef) -> WalletRef:
    """A ledger method's owner argument: a WalletRef, a reference, or a bare user name
    (what every caller passed before groups; such names are not checked again here)."""
    if isinstance(owner, WalletRef):
        return owner
    if ":" in owner:
        return parse_wallet(owner)
    return WalletRef("user", owner)


def period_start(period: str, now: int, tz: datetime.tzinfo = datetime.UTC) -> int:
    """The start (epoch seconds) of the period holding `now`: Monday 00:00 of its week, the
    1st of its month 00:00, on the clock of `tz` (UTC for group caps; a course's zone for
    its allowances), or 0 for the total."""
    if period == "total":
        return 0
    day = datetime.datetime.fromtimestamp(now, tz).date()
    if period == "week":
        day -= datetime.timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    else:
        raise ValueError(f"unknown cap period {period!r}")
    return int(datetime.datetime(day.year, day.month, day.day, tzinfo=tz).timestamp())


PERIOD_PHRASES = {
    "week": N_("for this week"),
    "month": N_("for this month"),
    "total": N_("in total"),
}
PASS_PERIOD_NAMES = {"daily": N_("daily"), "weekly": N_("weekly"), "monthly": N_("monthly")}


def period_phrase(period: str) -> str:
    """'for this week', 'for this month', 'in total': "your vision cap for this month"."""
    return _(PERIOD_PHRASES[period])


def pass_period_name(period: str) -> str:
    """ "daily", "weekly", "monthly": a pass's period as a person reads it."""
    return _(PASS_PERIOD_NAMES[period]) if period in PASS_PERIOD_NAMES else period
