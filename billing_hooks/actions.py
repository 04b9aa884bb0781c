"""What people do with credit, once: the REST API, the CLI and the hub's pages call these.

Each raises ActionError with an HTTP status and a message for people; nothing is written
when it does.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

from meterhub.spawner.catalog import PASS_PERIODS, InvalidChoice

from .ledger import InsufficientCredit, KeyConflict, Ledger
from .money import AmountError, format_money, parse_amount, to_micros

MAX_KEY = 120


class ActionError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        raise ActionError(400, f"the key must be a string of 1 to {MAX_KEY} characters")
    return key


def grant(ledger: Ledger, user: str, amount, note, key, max_grant: Decimal, source: str):
    """Add credit to `user`'s wallet; `key` makes a retry harmless. Returns the entry."""
    try:
        micros = parse_amount(amount, maximum=max_grant)
    except AmountError as e:
        raise ActionError(400, str(e)) from None
    if not isinstance(note, str) or len(note) > 500:
        raise ActionError(400, "the note must be text of at most 500 characters")
    try:
        return ledger.grant(user, micros, f"grant:{source}:{_key(key)}", note)
    except KeyConflict:
        raise ActionError(409, "That key was already used for a different grant") from None


def pass_offers(catalog) -> list[dict]:
    """Every pass one can buy: GPU profile × count × period, with its price."""
    offers = []
    for slug, profile in catalog.profiles().items():
        if profile.is_debug:
            continue
        for gpus in profile.counts:
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


def buy_pass(ledger: Ledger, catalog, user: str, profile, gpus, period, key, source: str):
    """Buy a pass from the wallet at the catalog's price. Returns the pass."""
    try:
        choice = catalog.parse({"profile": profile, "gpus": gpus})
        price = catalog.pass_price(choice.profile.slug, choice.gpus, period)
    except InvalidChoice as e:
        raise ActionError(400, str(e)) from None
    try:
        return ledger.buy_pass(
            user,
            choice.profile.slug,
            choice.gpus,
            period,
            to_micros(price),
            PASS_PERIODS[period][0],
            f"pass:{source}:{_key(key)}",
            choice.label,
        )
    except InsufficientCredit as e:
        raise ActionError(402, str(e)) from None
    except KeyConflict:
        raise ActionError(409, "That key was already used for a different purchase") from None


def usage_rows(ledger: Ledger, user: str) -> list[tuple]:
    """(session, profile label, started, stopped or "", seconds, cost in micros), oldest first."""
    rows = []
    for session, cost in ledger.sessions_with_cost(user):
        seconds = (session.metered_through - session.ready_at) if session.ready_at else 0
        label = (
            session.profile if session.profile == "debug" else f"{session.gpus}x{session.profile}"
        )
        rows.append(
            (session.id, label, session.started_at, session.stopped_at or "", seconds, cost)
        )
    return rows


def usage_csv(ledger: Ledger, user: str) -> str:
    """The usage export, the same from `meterhub usage --csv` and the Wallet page."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["session", "profile", "started_at", "stopped_at", "seconds", f"cost_{ledger.currency}"]
    )
    for sid, label, started, stopped, seconds, cost in usage_rows(ledger, user):
        amount = format_money(cost, ledger.currency, symbol=False).split()[0]
        writer.writerow([sid, label, started, stopped, seconds, amount])
    return out.getvalue()
