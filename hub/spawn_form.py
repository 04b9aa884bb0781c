"""The spawn form with credit: the catalog's options annotated with the balance and run time.

The spawner renders profiles and what is free; the hub adds what only billing knows — the
balance, "≈ 3 h 20 min at this profile" and "not enough credit" — through an annotation
callback, so spawner/ never learns about money.
"""

from __future__ import annotations

import asyncio

from meterhub.billing_hooks.money import (
    CURRENCY_SYMBOLS,
    accrued,
    format_duration,
    format_money,
    seconds_covered,
    to_micros,
)
from meterhub.billing_hooks.settings import BillingSettings, priced_catalog
from meterhub.spawner.catalog import Choice
from meterhub.spawner.form import render_options_form
from meterhub.spawner.options import group_names


def credit_annotation(available_micros: int, min_seconds: int):
    def annotate(choice: Choice) -> tuple[str, str]:
        rate = to_micros(choice.rate_per_hour)
        seconds = seconds_covered(available_micros, rate)
        note = f"≈ {format_duration(seconds)} at this profile" if seconds is not None else ""
        reason = "not enough credit" if available_micros < accrued(rate, min_seconds) else ""
        return note, reason

    return annotate


async def options_form(spawner) -> str:
    settings = BillingSettings(config=spawner.config)
    ledger = await settings.ledger_async()
    balance = await asyncio.to_thread(ledger.ensure_user, spawner.user.name)
    catalog = await asyncio.to_thread(priced_catalog, spawner.config, ledger)
    available = balance + ledger.overdraft_micros
    availability = None
    if hasattr(spawner, "allocator"):  # the local backend knows what is free
        reserved = await spawner.current_reservations()
        availability = await asyncio.to_thread(
            spawner.allocator.availability, spawner.user.name, reserved
        )
    return render_options_form(
        catalog,
        availability,
        currency_symbol=CURRENCY_SYMBOLS.get(settings.currency, settings.currency + " "),
        annotate=credit_annotation(available, settings.min_seconds_to_start),
        summary=f"Your balance: {format_money(balance, settings.currency)}",
        groups=group_names(spawner.user),
    )
