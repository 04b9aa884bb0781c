"""The one way an amount of money is read from people: the API, the pages, the CLI, the config.

ASCII digits only ("１２", "١٢", "1_000", "1e1", " 5 " are refused), at most two decimals,
a sign only where one is allowed, and a maximum. Config files may hold YAML numbers: an int
is read as its digits, a float through its shortest repr (4.5 -> "4.5"), never by binary
arithmetic.
"""

from __future__ import annotations

import re
from decimal import Decimal

from meterhub.i18n import _

_AMOUNT = re.compile(r"(?P<sign>[-+]?)(?P<digits>0|[1-9][0-9]{0,11})(?:\.(?P<cents>[0-9]{1,2}))?\Z")


class AmountError(ValueError):
    """An amount that cannot be used; the message says why."""


def parse_decimal(
    value: object,
    *,
    where: str = "amount",
    signed: bool = False,
    maximum: Decimal | None = None,
    allow_numbers: bool = False,
) -> Decimal:
    """`value` as an exact Decimal with two decimals, or AmountError naming `where`.

    `signed`: a leading "-" is allowed (never "+"); the amount must then be non-zero.
    Otherwise it must be positive. `maximum` bounds the absolute value (exclusive).
    `allow_numbers`: YAML ints and floats and Decimals are accepted (config and code only).
    """
    example = "-1.50" if signed else "12.50"
    if allow_numbers and isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        value = repr(value) if isinstance(value, float) else str(value)
    if not isinstance(value, str):
        raise AmountError(
            _(
                "%(where)s: expected an amount as a string like %(example)s, got %(got)s",
                where=where,
                example=repr(example),
                got=repr(value),
            )
        )
    match = _AMOUNT.match(value)
    if match is None or (match["sign"] == "+") or (match["sign"] == "-" and not signed):
        if signed:
            message = _(
                "%(where)s: expected an amount like %(example)s (ASCII digits, at most two"
                " decimals, an optional minus sign), got %(got)s",
                where=where,
                example=repr(example),
                got=repr(value),
            )
        else:
            message = _(
                "%(where)s: expected an amount like %(example)s (ASCII digits, at most two"
                " decimals), got %(got)s",
                where=where,
                example=repr(example),
                got=repr(value),
            )
        raise AmountError(message)
    amount = Decimal(value).quantize(Decimal("0.01"))
    if amount == 0 and signed:
        raise AmountError(
            _("%(where)s: must be non-zero, got %(got)s", where=where, got=repr(value))
        )
    if amount == 0 or (amount < 0 and not signed):
        raise AmountError(
            _("%(where)s: must be positive, got %(got)s", where=where, got=repr(value))
        )
    if maximum is not None and abs(amount) >= maximum:
        raise AmountError(
            _(
                "%(where)s: must be below %(max)s, got %(got)s",
                where=where,
                max=maximum,
                got=repr(value),
            )
        )
    return amount
