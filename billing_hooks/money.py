"""Exact money: integer micro-units of the currency, never float.

1 CNY = 1_000_000 micros. Prices are per hour; time is whole seconds. A session's charge
for the window [a, b) telescopes from its ready time t0 so that rounding never drifts:
charge(a, b) = floor(rate * (b - t0) / 3600) - floor(rate * (a - t0) / 3600), so the sum of
a session's windows is floor(rate * seconds / 3600) however the windows were cut.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from meterhub.i18n import _
from meterhub.spawner.amounts import AmountError, parse_decimal

MICROS = 1_000_000
SECONDS_PER_HOUR = 3600
CURRENCY_SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€"}


def to_micros(amount: Decimal | int | str) -> int:
    """An exact decimal amount in micros; refuses anything finer than a micro."""
    value = Decimal(amount) if not isinstance(amount, Decimal) else amount
    micros = value * MICROS
    if micros != micros.to_integral_value():
        raise AmountError(f"{amount} is finer than a micro-unit")
    return int(micros)


def parse_amount(
    text: object, maximum: Decimal | None = None, signed: bool = False, where: str = "amount"
) -> int:
    """A person's amount ("12.50", or "-1.50" where `signed`) in micros; AmountError names
    `where` and says what is wrong. The one parser (meterhub.spawner.amounts) everywhere."""
    return to_micros(parse_decimal(text, where=where, signed=signed, maximum=maximum))


def from_micros(micros: int) -> Decimal:
    return Decimal(micros) / MICROS


def format_money(micros: int, currency: str = "CNY", symbol: bool = True) -> str:
    """Two decimals, rounded half up for display only: ¥1,234.50 for a person (the same in
    every language), or 1234.50 CNY (no grouping: for a script or a CSV to read back)."""
    value = from_micros(micros).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    if symbol and currency in CURRENCY_SYMBOLS:
        sign = "-" if value < 0 else ""
        return f"{sign}{CURRENCY_SYMBOLS[currency]}{abs(value):,}"
    return f"{value} {currency}"


def accrued(rate_micros_per_hour: int, seconds: int) -> int:
    """What `seconds` of running at the rate cost, rounded down to the micro."""
    if seconds < 0:
        raise ValueError("negative duration")
    return rate_micros_per_hour * seconds // SECONDS_PER_HOUR


def window_charge(rate_micros_per_hour: int, origin: int, start: int, end: int) -> int:
    """The charge for [start, end) of a session that became ready at `origin` (seconds)."""
    if not origin <= start <= end:
        raise ValueError(f"window [{start}, {end}) does not follow origin {origin}")
    return accrued(rate_micros_per_hour, end - origin) - accrued(
        rate_micros_per_hour, start - origin
    )


def seconds_covered(balance_micros: int, rate_micros_per_hour: int) -> int | None:
    """Whole seconds the balance pays for at the rate; None for a free rate."""
    if rate_micros_per_hour <= 0:
        return None
    return max(0, balance_micros) * SECONDS_PER_HOUR // rate_micros_per_hour


def format_duration(seconds: int) -> str:
    """1 h 34 min, 12 min, 45 s (1 小时 34 分钟 …), in the language of the moment."""
    if seconds >= 3600:
        hours, rest = divmod(seconds, 3600)
        if rest >= 60:
            return _("%(hours)s h %(minutes)s min", hours=hours, minutes=rest // 60)
        return _("%(hours)s h", hours=hours)
    if seconds >= 60:
        return _("%(minutes)s min", minutes=seconds // 60)
    return _("%(seconds)s s", seconds=seconds)
