"""The spawn form: one option per profile, with VRAM, prices and what is free now.

Plain HTML that works without JavaScript; the server validates whatever is posted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import jinja2
from jinja2 import select_autoescape
from markupsafe import Markup, escape

from meterhub.i18n import _

from .catalog import MAX_HOURS, Catalog, Choice, Profile
from .environments import Environment
from .options import nothing_allowed

#: what a deployment adds to each choice: (note shown beside it, reason it cannot start or "")
Annotate = Callable[[Choice], tuple[str, str]]


def _no_annotation(choice: Choice) -> tuple[str, str]:
    return "", ""


def _fill(message: str, **fields: Markup) -> Markup:
    """A translated sentence with form fields inside it: `{{ _("after %(amount)s spent") |
    fill(amount=field) }}`, the sentence escaped, the fields (Markup) put in as they are."""
    return Markup(escape(message)) % fields


_env = jinja2.Environment(
    autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True
)
# the language of the moment at each render (the request's), never at import
_env.globals["_"] = _
_env.filters["fill"] = _fill
_template = _env.from_string((Path(__file__).parent / "options_form.html").read_text())


@dataclass(frozen=True)
class PayerOption:
    """Who may pay for the server (the deployment's wallets), posted as `wallet`."""

    value: str
    label: str
    detail: str = ""
    disabled_reason: str = ""


@dataclass(frozen=True)
class EnvironmentOption:
    """An environment the form offers, posted as `environment`; GPU-only ones are disabled
    in debug mode by the page (and refused by the server whatever is posted)."""

    environment: Environment
    disabled_reason: str = ""


def _always_ready(environment: Environment) -> str:
    return ""


def environment_options(
    catalog: Catalog, not_ready: Callable[[Environment], str] = _always_ready
) -> list[EnvironmentOption]:
    """The catalog's environments, each with why this backend cannot start it now (an
    environment that is not built), or ""."""
    return [EnvironmentOption(e, not_ready(e)) for e in catalog.environments_offered().values()]


@dataclass(frozen=True)
class CountOption:
    count: int
    price_per_hour: Decimal
    disabled_reason: str
    note: str = ""


@dataclass(frozen=True)
class ProfileOption:
    profile: Profile
    total: int | None
    free: int | None
    counts: tuple[CountOption, ...]
    disabled_reason: str
    note: str = ""


def profile_options(
    catalog: Catalog,
    availability: dict[str, tuple[int, int]] | None,
    annotate: Annotate = _no_annotation,
    groups: frozenset[str] = frozenset(),
) -> list[ProfileOption]:
    """What the form offers; `availability` is (total, free) per GPU type, None if unknown.

    `annotate` lets the hub add, per choice, a note (the estimated run time) and a reason
    it cannot start (not enough credit) without the spawner knowing about money. Choices
    that the user's `groups` may not use are disabled with the reason.
    """
    options = []
    for profile in catalog.profiles().values():
        if profile.is_debug:
            choice = Choice(profile, 0)
            note, reason = annotate(choice)
            reason = _not_allowed(catalog, choice, groups) or reason
            options.append(ProfileOption(profile, None, None, (), reason, note))
            continue
        total, free = (availability or {}).get(profile.slug, (None, None))
        counts = []
        for count in profile.counts:
            choice = Choice(profile, count)
            note, reason = annotate(choice)
            if free is not None and count > free:
                reason = _("only %(free)s free", free=free) if free else _("none free")
            reason = _not_allowed(catalog, choice, groups) or reason
            counts.append(CountOption(count, profile.price_per_hour * count, reason, note))
        if catalog.profile_refusal(profile, groups):
            only = ", ".join(sorted(catalog.allowed_groups[profile.slug], key=str.casefold))
            reason = _("Not allowed for your group (only for %(groups)s)", groups=only)
        elif total == 0:
            reason = _("No %(gpu)s on this machine", gpu=profile.display_name)
        elif free == 0:
            reason = _(
                "All %(total)s %(gpu)s GPUs are in use", total=total, gpu=profile.display_name
            )
        elif all(c.disabled_reason for c in counts):
            reason = counts[0].disabled_reason.capitalize()
        else:
            reason = ""
        options.append(ProfileOption(profile, total, free, tuple(counts), reason))
    return options


def _not_allowed(catalog: Catalog, choice: Choice, groups: frozenset[str]) -> str:
    return _("not allowed for your group") if catalog.refusal(choice, groups) else ""


def render_options_form(
    catalog: Catalog,
    availability: dict[str, tuple[int, int]] | None,
    currency_symbol: str = "¥",
    annotate: Annotate = _no_annotation,
    summary: str = "",
    groups: frozenset[str] = frozenset(),
    payers: Sequence[PayerOption] = (),
    payer_checked: str = "",
    price: Callable[[Decimal], str] | None = None,
    environments: Sequence[EnvironmentOption] | None = None,
) -> str:
    """The form's HTML; when the user's `groups` may start nothing at all, it says so (and
    whom to ask) above the choices, all disabled. `price` writes an amount as people read
    it (the hub passes billing's `format_money`); by default the symbol and the amount.
    `environments`: what the backend says of each environment (default: all startable)."""
    options = profile_options(catalog, availability, annotate, groups)
    first_enabled = next((o.profile.slug for o in options if not o.disabled_reason), None)
    if environments is None:
        environments = environment_options(catalog)
    startable = [o for o in environments if not o.disabled_reason]
    environment_checked = next(
        (o.environment.slug for o in startable if o.environment.default),
        startable[0].environment.slug if startable else None,
    )
    return _template.render(
        options=options,
        checked=first_enabled,
        currency=currency_symbol,
        price=price or (lambda amount: f"{currency_symbol}{amount}"),
        summary=summary,
        nothing_allowed=nothing_allowed(catalog, groups),
        payers=payers,
        payer_checked=payer_checked,
        max_hours=MAX_HOURS,
        environments=environments,
        environment_checked=environment_checked,
    )
