"""Credit from outside, once: vouchers made and redeemed, a payment provider's top-ups.

The REST API, the CLI and the Wallet page call these, as they call billing_hooks.actions.
Each raises ActionError (RateLimited for the voucher rate limit) with an HTTP status and a
message for people; nothing is written when it does, except that a code which does not
redeem is counted against the rate limit.
"""

from __future__ import annotations

import datetime
from decimal import Decimal

from meterhub.i18n import _

from .actions import ActionError, _amount, _text, check_key
from .ledger import KeyConflict, Ledger, LedgerError, Posted
from .vouchers import (
    DEFAULT_LIMITS,
    MAX_VOUCHERS,
    MalformedCode,
    NewVoucher,
    RedeemLimited,
    RedeemLimits,
    UnknownVoucher,
    Voucher,
    VoucherRefused,
)

DAY = 86_400


class RateLimited(ActionError):
    """429: too many codes failed; `retry_after` seconds until one more may be tried."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(429, message, {"Retry-After": str(retry_after)})
        self.retry_after = retry_after


def parse_expiry(text: object, now: int) -> int:
    """When a voucher stops working, from what an operator types: a day `2027-01-31`
    (valid through that day, UTC) or a moment with its offset `2027-01-31T18:00+08:00`."""
    if not isinstance(text, str) or len(text) > 40:
        raise ActionError(400, _("--expires: a day like 2027-01-31, or 2027-01-31T18:00+08:00"))
    try:
        if len(text) == 10:
            day = datetime.date.fromisoformat(text)
            moment = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
            expires = int(moment.timestamp()) + DAY
        else:
            moment = datetime.datetime.fromisoformat(text)
            if moment.tzinfo is None:
                raise ValueError("no offset")
            expires = int(moment.timestamp())
    except ValueError:
        raise ActionError(
            400,
            _(
                "--expires: a day like 2027-01-31, or a moment with its offset like"
                " 2027-01-31T18:00+08:00; got %(text)s",
                text=repr(text),
            ),
        ) from None
    if expires <= now:
        raise ActionError(400, _("--expires: %(text)s is not in the future", text=text))
    return expires


def create_vouchers(
    ledger: Ledger,
    amount,
    count,
    expires,
    note,
    max_grant: Decimal,
    actor: str,
) -> list[NewVoucher]:
    """`count` vouchers of `amount` (below billing.max_grant, like a grant), expiring at
    `expires` (text, or None: never). Returns them with their codes, shown only now."""
    micros = _amount(amount, "amount", max_grant)
    if isinstance(count, str):
        count = int(count) if count.isascii() and count.isdigit() and len(count) < 6 else -1
    if not isinstance(count, int) or not 1 <= count <= MAX_VOUCHERS:
        raise ActionError(400, _("--count: a whole number from 1 to %(most)s", most=MAX_VOUCHERS))
    note = _text(note, "note")
    expires_at = None if expires is None else parse_expiry(expires, ledger.clock())
    try:
        return ledger.create_vouchers(micros, count, actor, expires_at=expires_at, note=note)
    except LedgerError as e:
        raise ActionError(400, str(e)) from None


def redeem(
    ledger: Ledger, user: str, code, actor: str, limits: RedeemLimits = DEFAULT_LIMITS
) -> Posted:
    """Redeem a voucher code into `user`'s own wallet. Returns Posted(entry); a retry by
    the same user is a replay of the same entry."""
    try:
        return ledger.redeem_voucher(user, code, actor, limits)
    except MalformedCode:
        raise ActionError(
            400,
            _(
                "A voucher code is 20 letters and digits, like 7KQ2M-X9D4R-0BN3S-W8TZE"
                " (dashes and spaces are optional)."
            ),
        ) from None
    except RedeemLimited as e:
        raise RateLimited(str(e), e.retry_after) from None
    except VoucherRefused as e:
        raise ActionError(e.status, str(e)) from None


def revoke(
    ledger: Ledger, actor: str, ids: list[int] | None = None, batch: str | None = None
) -> tuple[list[Voucher], list[Voucher]]:
    """Revoke unused vouchers by id or batch: (revoked, left as they were)."""
    if not ids and not batch:
        raise ActionError(400, _("name the vouchers to revoke: their ids, or --batch"))
    try:
        return ledger.revoke_vouchers(actor, ids=ids or None, batch=batch)
    except UnknownVoucher as e:
        raise ActionError(404, str(e)) from None


def topup(ledger: Ledger, body: dict, max_topup: Decimal) -> Posted:
    """A provider's top-up `{"transaction", "user", "amount", "currency"?, "note"?}`
    (validated against openapi.yaml before): once per transaction id."""
    transaction = check_key(body["transaction"])
    micros = _amount(body["amount"], "amount", max_topup)
    currency = body.get("currency", ledger.currency)
    if currency != ledger.currency:
        raise ActionError(
            400,
            _(
                "currency: this site bills in %(currency)s, not %(given)s",
                currency=ledger.currency,
                given=str(currency)[:8],
            ),
        )
    note = _text(body.get("note", ""), "note")
    try:
        return ledger.topup(body["user"], micros, transaction, note)
    except KeyConflict:
        raise ActionError(
            409,
            _(
                "transaction %(id)s was already credited with another user or amount",
                id=transaction,
            ),
        ) from None
    except LedgerError as e:
        raise ActionError(400, str(e)) from None
