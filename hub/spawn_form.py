"""The spawn form with credit: the catalog's options annotated with the balance and run time.

The spawner renders profiles and what is free; the hub adds what only billing knows — the
balance, "≈ 3 h 20 min at this profile" and "not enough credit" — through an annotation
callback, so spawner/ never learns about money.
"""

from __future__ import annotations

import asyncio

from meterhub.billing_hooks import labwindows
from meterhub.billing_hooks.courses import lab_phrase, window_gpus
from meterhub.billing_hooks.groups import MemberSpend
from meterhub.billing_hooks.hooks import member_groups
from meterhub.billing_hooks.money import (
    CURRENCY_SYMBOLS,
    accrued,
    format_duration,
    format_money,
    seconds_covered,
    to_micros,
)
from meterhub.billing_hooks.settings import billing_settings_of, priced_catalog
from meterhub.billing_hooks.wallets import period_phrase
from meterhub.i18n import _
from meterhub.spawner.catalog import Choice
from meterhub.spawner.form import PayerOption, environment_options, render_options_form
from meterhub.spawner.options import group_names


def credit_annotation(available_micros: int, min_seconds: int):
    def annotate(choice: Choice) -> tuple[str, str]:
        rate = to_micros(choice.rate_per_hour)
        seconds = seconds_covered(available_micros, rate)
        note = ""
        if seconds is not None:
            note = _("≈ %(time)s at this profile", time=format_duration(seconds))
        reason = _("not enough credit") if available_micros < accrued(rate, min_seconds) else ""
        return note, reason

    return annotate


def group_available(balance: int, overdraft: int, allowance: MemberSpend) -> int:
    """What a member may spend from a group now: its balance (with the overdraft), and no
    more than their cap leaves."""
    available = balance + overdraft
    if allowance.left_micros is not None:
        available = min(available, allowance.left_micros)
    return available


def payer_options(ledger, user: str, balance: int, groups: set[str]) -> tuple[list, str, int]:
    """(the "Pay from" choices, the one checked, what it leaves to spend) — blocking.

    The user's own wallet and each of their groups with a wallet; checked: a group that
    pays for its members by default, else their own.
    """
    currency = ledger.currency
    own = f"user:{user}"
    payers = [PayerOption(own, _("Your wallet"), format_money(balance, currency))]
    available = {own: balance + ledger.overdraft_micros}
    for group in ledger.known_groups(groups):
        view = ledger.group(group)
        group_balance = ledger.balance(f"group:{group}") or 0
        allowance = ledger.member_allowance(group, user)
        left = group_available(group_balance, ledger.overdraft_micros, allowance)
        values = {
            "left": format_money(max(0, left), currency),
            "balance": format_money(group_balance, currency),
        }
        if allowance.cap_micros is None:
            detail = _("%(left)s to spend (group balance %(balance)s)", **values)
        else:
            detail = _(
                "%(left)s to spend (group balance %(balance)s; your cap %(period)s leaves"
                " %(cap_left)s)",
                period=period_phrase(allowance.period),
                cap_left=format_money(max(0, allowance.left_micros or 0), currency),
                **values,
            )
        reason = _("nothing left to spend") if left <= 0 else ""
        payers.append(
            PayerOption(f"group:{view.name}", _("Group %(name)s", name=view.name), detail, reason)
        )
        available[f"group:{view.name}"] = left
    course_payers, course_default = course_options(ledger, user)
    for option, left in course_payers:
        payers.append(option)
        available[option.value] = left
    defaults = [
        g for g in ledger.default_group_wallets(groups) if available.get(f"group:{g}", 0) > 0
    ]
    checked = (
        f"course:{course_default}"
        if course_default
        else f"group:{defaults[0]}"
        if defaults
        else own
    )
    return payers, checked, available[checked]


def course_options(ledger, user: str) -> tuple[list[tuple[PayerOption, int]], str]:
    """The "Pay from" choices of the courses `user` is a student of, with what each leaves
    to spend, and the course checked by default: the first with allowance left."""
    currency = ledger.currency
    now = ledger.clock()
    options, default = [], ""
    for name in ledger.student_courses(user):
        course = ledger.course(name)
        state = ledger.allowance_state(name, user, now)
        left = max(0, state.left_micros)
        parts = []
        if state.amount_micros is None:
            reason = _("no allowance yet")
        elif state.expired:
            reason = _("the allowance has ended")
        else:
            reason = "" if left > 0 else _("nothing left to spend")
            values = {
                "left": format_money(left, currency),
                "amount": format_money(state.amount_micros, currency),
            }
            if state.period == "total":
                parts.append(_("%(left)s of your %(amount)s allowance left", **values))
            else:
                parts.append(
                    _(
                        "%(left)s of your %(amount)s allowance %(period)s left",
                        period=period_phrase(state.period),
                        **values,
                    )
                )
        if course is not None and course.profiles:
            parts.append(_("pays for %(profiles)s", profiles=", ".join(course.profiles.split())))
        if course is not None and course.windows:
            parts.append(lab_phrase(course, now))
            reserved = window_gpus(course)
            if reserved and labwindows.current(course.windows.splitlines(), course.timezone, now):
                held = ", ".join(f"{n} {t}" for t, n in sorted(reserved.items()))
                parts.append(_("%(held)s GPU(s) reserved for the class", held=held))
        if not reason and not default:
            default = name
        label = _("Course %(name)s", name=name)
        # the parts are phrases of a list: "; " in English, "；" in Chinese
        detail = _("; ").join(parts)
        options.append((PayerOption(f"course:{name}", label, detail, reason), left))
    return options, default


async def options_form(spawner) -> str:
    settings = billing_settings_of(spawner.config)
    ledger = await settings.ledger_async()
    balance = await asyncio.to_thread(ledger.ensure_user, spawner.user.name)
    catalog = await asyncio.to_thread(priced_catalog, spawner.config, ledger)
    payers, checked, available = await asyncio.to_thread(
        payer_options, ledger, spawner.user.name, balance, member_groups(spawner.user)
    )
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
        summary=_("Your balance: %(balance)s", balance=format_money(balance, settings.currency)),
        groups=group_names(spawner.user),
        payers=payers,
        payer_checked=checked,
        price=lambda amount: format_money(to_micros(amount), settings.currency),
        environments=await asyncio.to_thread(
            environment_options, catalog, spawner.environment_refusal
        ),
    )
