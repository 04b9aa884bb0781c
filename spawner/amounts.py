"""The one way an amount of money is read from people: the API, the pages, the CLI, the config.

ASCII digits only ("１２", "١٢", "1_000", "1e1", " 5 " are refused), at most two decimals,
a sign only where one is allowed, and a maximum. Config files may hold YAML numbers: an int
is read as its digits, a float through its shortest repr (4.5 -> "4.5"), never by binary
arithmetic.
"""

from __future__ import annotations

import re
from decimal import Decimal

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
            f"{where}: expected an amount as a string like {example!r}, got {value!r}"
        )
    match = _AMOUNT.match(value)
    if match is None or (match["sign"] == "+") or (match["sign"] == "-" and not signed):
        raise AmountError(
            f"{where}: expected an amount like {example!r} (ASCII digits, at most two"
            f" decimals{', an optional minus sign' if signed else ''}), got {value!r}"
        )
    amount = Decimal(value).quantize(Decimal("0.01"))
    if amount == 0 or (amount < 0 and not signed):
        raise AmountError(f"{where}: must be {'non-zero' if signed else 'positive'}, got {value!r}")
    if maximum is not None and abs(amount) >= maximum:
        raise AmountError(f"{where}: must be below {maximum}, got {value!r}")
    return amount
