"""Exact money arithmetic: micros, parsing, and windows that telescope."""

from decimal import Decimal

import pytest

from meterhub.billing_hooks.money import (
    AmountError,
    accrued,
    format_duration,
    format_money,
    parse_amount,
    seconds_covered,
    to_micros,
    window_charge,
)


def test_micros_are_exact():
    assert to_micros(Decimal("6.67")) == 6_670_000
    assert to_micros("0.10") == 100_000
    with pytest.raises(AmountError):
        to_micros("0.0000001")


NOT_AN_AMOUNT = "expected an amount like"


@pytest.mark.parametrize(
    "text, why",
    [
        ("0", "must be positive"),
        ("0.00", "must be positive"),
        ("-5", NOT_AN_AMOUNT),
        ("1.234", "at most two decimals"),
        ("abc", NOT_AN_AMOUNT),
        ("NaN", NOT_AN_AMOUNT),
        ("Infinity", NOT_AN_AMOUNT),
        ("1e400", NOT_AN_AMOUNT),
        ("1e-400", NOT_AN_AMOUNT),
        # only ASCII digits, no sign, no spaces, no separators, no leading zeros
        ("١٢", NOT_AN_AMOUNT),
        ("１２", NOT_AN_AMOUNT),
        ("1_000", NOT_AN_AMOUNT),
        ("+5", NOT_AN_AMOUNT),
        (" 5 ", NOT_AN_AMOUNT),
        ("05", NOT_AN_AMOUNT),
        ("5.", NOT_AN_AMOUNT),
        (".5", NOT_AN_AMOUNT),
        ("1" * 13, NOT_AN_AMOUNT),
        (True, "as a string"),
        (1.5, "as a string"),
        (12, "as a string"),
        ("100000", "below"),
    ],
)
def test_bad_amounts_say_why(text, why):
    with pytest.raises(AmountError, match=why):
        parse_amount(text, maximum=Decimal("100000"))


def test_parse_amount_accepts_currency_amounts():
    assert parse_amount("12.50") == 12_500_000
    assert parse_amount("3") == 3_000_000
    assert parse_amount("0.01") == 10_000
    assert parse_amount("99999.99", maximum=Decimal("100000")) == 99_999_990_000
    # a sign only where one is allowed, and never zero
    assert parse_amount("-1.50", signed=True) == -1_500_000
    with pytest.raises(AmountError, match="non-zero"):
        parse_amount("-0.00", signed=True)
    with pytest.raises(AmountError, match="below"):
        parse_amount("-100000", signed=True, maximum=Decimal("100000"))


def test_config_amounts_may_be_yaml_numbers_read_exactly():
    from meterhub.spawner.amounts import parse_decimal

    assert parse_decimal(4.5, allow_numbers=True) == Decimal("4.50")
    assert parse_decimal(12, allow_numbers=True) == Decimal("12.00")
    with pytest.raises(AmountError, match="at most two"):
        parse_decimal(0.1 + 0.2, allow_numbers=True)  # 0.30000000000000004


def test_windows_telescope_to_the_total_however_cut():
    rate = to_micros("6.67")  # not a whole number of micros per second
    origin = 1_000
    cuts = [
        origin,
        origin + 1,
        origin + 7,
        origin + 61,
        origin + 3599,
        origin + 3601,
        origin + 7300,
    ]
    total = sum(window_charge(rate, origin, a, b) for a, b in zip(cuts, cuts[1:], strict=False))
    assert total == accrued(rate, 7300) == rate * 7300 // 3600
    per_second = sum(window_charge(rate, origin, t, t + 1) for t in range(origin, origin + 7300))
    assert per_second == total
    with pytest.raises(ValueError):
        window_charge(rate, origin, origin - 1, origin)


def test_display_helpers():
    assert format_money(7_124_999) == "¥7.12"
    assert format_money(7_125_000) == "¥7.13"
    assert format_money(-50_000) == "-¥0.05"
    assert format_money(9_870_000, symbol=False) == "9.87 CNY"
    assert seconds_covered(to_micros("7.12"), to_micros("4.50")) == 5696  # 1 h 34 min
    assert format_duration(5696) == "1 h 34 min"
    assert format_duration(600) == "10 min"
    assert seconds_covered(5, 0) is None
