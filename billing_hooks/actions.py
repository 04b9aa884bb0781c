"""What people do with credit, once: the REST API, the CLI and the hub's pages call these.

Each raises ActionError with an HTTP status and a message for people; nothing is written
when it does.
"""

from __future__ import annotations

import csv
import datetime
import io
from collections.abc import Iterable
from decimal import Decimal

from meterhub.i18n import _
from meterhub.spawner.catalog import PASS_PERIODS, InvalidChoice

from .ledger import (
    SYSTEM,
    InsufficientCredit,
    KeyConflict,
    Ledger,
    LedgerError,
    NoCapacity,
    Posted,
    UnknownWallet,
)
from .money import AmountError, format_money, parse_amount, to_micros
from .orm import CAP_PERIODS
from .wallets import WalletRefError, parse_wallet

MAX_KEY = 120
MAX_NOTE = 500


class ActionError(Exception):
    """A refusal: its HTTP status, its message, and headers of its own (Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def check_key(key: object) -> str:
    """An idempotency key: 1 to 120 printable ASCII characters (checked before anything
    else is looked at). One key names one request of one source (API, page, CLI), whatever
    its kind: the same key for a grant and then an adjustment is a conflict."""
    if (
        not isinstance(key, str)
        or not 0 < len(key) <= MAX_KEY
        or not all(33 <= ord(ch) < 127 for ch in key)
    ):
        raise ActionError(
            400,
            _(
                "the idempotency key must be 1 to %(most)s printable ASCII characters",
                most=MAX_KEY,
            ),
        )
    return key


def _text(value: object, field: str, required: bool = False) -> str:
    if not isinstance(value, str) or len(value) > MAX_NOTE:
        raise ActionError(
            400,
            _("%(field)s: must be text of at most %(most)s characters", field=field, most=MAX_NOTE),
        )
    if any(ord(ch) < 32 and ch not in "\t\n" or 0xD800 <= ord(ch) < 0xE000 for ch in value):
        raise ActionError(400, _("%(field)s: must not hold control characters", field=field))
    if required and not value.strip():
        raise ActionError(400, _("%(field)s: must not be empty", field=field))
    return value


#: the most a cap or an allowance may be
MAX_LIMIT = Decimal("100000000")


def limit_amount(value: object, field: str = "amount") -> int:
    """A cap's or an allowance's amount in micros (positive, at most MAX_LIMIT); 400 else."""
    return _amount(value, field, MAX_LIMIT)


def _amount(value: object, field: str, maximum: Decimal, signed: bool = False) -> int:
    try:
        return parse_amount(value, maximum=maximum, signed=signed, where=field)
    except AmountError as e:
        raise ActionError(400, str(e)) from None


def grant(
    ledger: Ledger,
    user: str,
    amount,
    note,
    key,
    max_grant: Decimal,
    source: str,
    actor: str = SYSTEM,
) -> Posted:
    """Add credit to `user`'s wallet; `key` makes a retry harmless. Returns Posted(entry)."""
    key = check_key(key)
    micros = _amount(amount, "amount", max_grant)
    note = _text(note, "note")
    try:
        return ledger.grant(user, micros, f"{source}:{key}", note, actor=actor)
    except KeyConflict:
        raise ActionError(409, _("That key was already used for a different grant")) from None
    except UnknownWallet as e:
        raise ActionError(404, str(e)) from None


def adjust(
    ledger: Ledger, user: str, amount, reason, key, max_grant: Decimal, source: str, actor: str
) -> Posted:
    """A signed correction with its reason ("-1.50" takes credit back). Returns Posted(entry)."""
    key = check_key(key)
    micros = _amount(amount, "amount", max_grant, signed=True)
    reason = _text(reason, "reason", required=True)
    try:
        return ledger.adjust(user, micros, f"{source}:{key}", reason, actor)
    except KeyConflict:
        raise ActionError(409, _("That key was already used for a different adjustment")) from None
    except UnknownWallet as e:
        raise ActionError(404, str(e)) from None
    except LedgerError as e:
        raise ActionError(400, str(e)) from None


def refund(
    ledger: Ledger,
    session_id: int,
    amount,
    reason,
    key,
    max_grant: Decimal,
    source: str,
    actor: str,
) -> Posted:
    """Give back (part of) a session's charges, never more than it was charged. `amount`
    None refunds everything not yet refunded. Returns Posted(entry)."""
    key = check_key(key)
    micros = None if amount is None else _amount(amount, "amount", max_grant)
    reason = _text(reason, "reason", required=True)
    if ledger.session(session_id) is None:
        raise ActionError(404, _("No session %(id)s", id=session_id))
    try:
        return ledger.refund(session_id, micros, f"{source}:{key}", reason, actor)
    except KeyConflict:
        raise ActionError(409, _("That key was already used for a different refund")) from None
    except LedgerError as e:
        raise ActionError(409, str(e)) from None


def pass_offers(
    catalog, capacity: dict[str, int] | None = None, groups: Iterable[str] | None = None
) -> list[dict]:
    """Every pass one can buy: GPU profile × count × period, with its price. With
    `capacity` (GPUs per type the site has), only passes the site could ever honour; with
    `groups` (the buyer's), only choices the buyer may start (`profiles.*.allowed_groups`)."""
    offers = []
    for slug, profile in catalog.profiles().items():
        if profile.is_debug:
            continue
        for gpus in profile.counts:
            if capacity is not None and gpus > capacity.get(slug, 0):
                continue
            if groups is not None and catalog.refusal(catalog.choice(slug, gpus), set(groups)):
                continue
            for period in PASS_PERIODS:
                offers.append(
                    {
                        "profile": slug,
                        "display_name": profile.display_name,
                        "gpus": gpus,
                        "period": period,
                        "price": str(catalog.pass_price(slug, gpus, period)),
                    }
                )
    return offers


def buy_pass(
    ledger: Ledger,
    catalog,
    user: str,
    profile,
    gpus,
    period,
    key,
    source: str,
    actor: str = SYSTEM,
    capacity: dict[str, int] | None = None,
    groups: Iterable[str] | None = None,
) -> Posted:
    """Buy a pass from the wallet at the catalog's price. Returns Posted(pass).

    `capacity` (GPUs per type, on the local backend): the pass must fit beside every other
    valid pass; None sells without a reservation check. `groups` (the buyer's own): a
    choice limited to other groups is refused, as its spawn would be; None: not checked (a
    billing admin buying for someone)."""
    key = check_key(key)
    try:
        choice = catalog.parse({"profile": profile, "gpus": gpus})
        price = catalog.pass_price(choice.profile.slug, choice.gpus, period)
    except InvalidChoice as e:
        raise ActionError(400, str(e)) from None
    refusal = "" if groups is None else catalog.refusal(choice, set(groups))
    if refusal:
        raise ActionError(403, refusal)
    try:
        return ledger.buy_pass(
            user,
            choice.profile.slug,
            choice.gpus,
            period,
            to_micros(price),
            PASS_PERIODS[period][0],
            f"{source}:{key}",
            choice.label,
            actor=actor,
            capacity=None if capacity is None else capacity.get(choice.profile.slug, 0),
        )
    except InsufficientCredit as e:
        raise ActionError(402, str(e)) from None
    except NoCapacity as e:
        raise ActionError(409, str(e)) from None
    except KeyConflict:
        raise ActionError(409, _("That key was already used for a different purchase")) from None


def wallet_ref(text: object) -> str:
    """A wallet reference as people type it (`group:vision`, `user:amy`, `amy`), checked and
    spelt the ledger's way; 400 when it cannot be read."""
    try:
        return str(parse_wallet(text))
    except WalletRefError as e:
        raise ActionError(400, str(e)) from None


def set_cap(ledger: Ledger, group: str, user: str, amount, period, actor: str):
    """Set a member's cap on a group wallet (`amount` "none" or None removes it)."""
    if period not in CAP_PERIODS:
        raise ActionError(400, _("period: one of %(periods)s", periods=", ".join(CAP_PERIODS)))
    micros = None
    if amount is not None and amount != "none":
        micros = limit_amount(amount)
    try:
        return ledger.set_cap(group, user, micros, period, actor)
    except UnknownWallet as e:
        raise ActionError(404, str(e)) from None
    except LedgerError as e:
        raise ActionError(400, str(e)) from None


def _label(session) -> str:
    return session.profile if session.profile == "debug" else f"{session.gpus}x{session.profile}"


def _seconds(session) -> int:
    if not session.ready_at:
        return 0
    assert session.metered_through is not None  # set together with ready_at
    return session.metered_through - session.ready_at


def group_usage_rows(
    ledger: Ledger, group: str, since: int | None = None, until: int | None = None
) -> list[tuple]:
    """(session, member, profile label, started, stopped or "", seconds, cost, environment
    or ""), oldest first: what the group's wallet paid for (started in [since, until))."""
    try:
        pairs = ledger.group_sessions(group, since, until)
    except UnknownWallet as e:
        raise ActionError(404, str(e)) from None
    return [
        (
            s.id,
            s.user_name,
            _label(s),
            s.started_at,
            s.stopped_at or "",
            _seconds(s),
            cost,
            s.environment or "",
        )
        for s, cost in reversed(pairs)
    ]


def csv_time(epoch: int | str) -> str:
    """A time in a CSV export: ISO 8601 in UTC with its offset, `2026-12-04T18:20:00+00:00`
    (what spreadsheets and `datetime.fromisoformat` read as a moment, unlike Unix
    seconds); "" stays "" (a session still running has no stop)."""
    if epoch == "" or epoch is None:
        return ""
    return datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).isoformat()


def group_usage_csv(
    ledger: Ledger, group: str, since: int | None = None, until: int | None = None
) -> str:
    """A group's statement: every session its wallet paid for, with the member who ran it."""
    return _usage_csv(ledger.currency, group_usage_rows(ledger, group, since, until), "member")


def _usage_csv(currency: str, rows: list[tuple], *who: str) -> str:
    """A usage CSV: a session a row, with `who` ran it (the member of a group statement)
    between the session and its profile; times as ISO 8601, amounts as plain decimals."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "session",
            *who,
            "profile",
            "started_at",
            "stopped_at",
            "seconds",
            f"cost_{currency}",
            "environment",
        ]
    )
    for sid, *named, label, started, stopped, seconds, cost, environment in rows:
        amount = format_money(cost, currency, symbol=False).split()[0]
        writer.writerow(
            [sid, *named, label, csv_time(started), csv_time(stopped), seconds, amount, environment]
        )
    return out.getvalue()


def usage_rows(ledger: Ledger, user: str) -> list[tuple]:
    """(session, profile label, started, stopped or "", seconds, cost in micros, environment
    or ""), oldest first."""
    return [
        (s.id, _label(s), s.started_at, s.stopped_at or "", _seconds(s), cost, s.environment or "")
        for s, cost in ledger.sessions_with_cost(user)
    ]


def usage_csv(ledger: Ledger, user: str) -> str:
    """The usage export, the same from `meterhub usage --csv` and the Wallet page."""
    return _usage_csv(ledger.currency, usage_rows(ledger, user))
