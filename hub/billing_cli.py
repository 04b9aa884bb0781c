"""`meterhub credit|usage|billing …`: the operator's view of the ledger, through the same code as the API."""

from __future__ import annotations

import sys
import uuid
from decimal import Decimal

from sqlalchemy import create_engine, select, text
from traitlets.config import Config

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.money import format_duration, format_money
from meterhub.billing_hooks.orm import Entry, Wallet
from meterhub.billing_hooks.settings import BillingSettings

from .config import ConfigError, apply_config, load_site_config


class CliError(Exception):
    """A readable one-line refusal; nothing was written."""


def _load(args) -> tuple[Config, BillingSettings]:
    site = load_site_config(args.config)
    c = apply_config(site, Config())
    return c, BillingSettings(config=c)


def _require_user(c: Config, name: str) -> None:
    engine = create_engine(c.JupyterHub.db_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM users WHERE name = :n"), {"n": name}).first()
    except Exception:
        found = None
    finally:
        engine.dispose()
    if not found:
        raise CliError(f"unknown user {name!r}: create the account first")


def credit_grant(args) -> int:
    c, settings = _load(args)
    _require_user(c, args.user)
    ledger = settings.ledger()
    try:
        entry = actions.grant(
            ledger,
            args.user,
            args.amount,
            args.note or "",
            str(uuid.uuid4()),
            Decimal(settings.max_grant),
            "cli",
        )
    except actions.ActionError as e:
        raise CliError(e.message) from None
    print(
        f"granted {format_money(entry.amount_micros, settings.currency, symbol=False)} to"
        f" {args.user}; balance"
        f" {format_money(entry.balance_after_micros, settings.currency, symbol=False)}"
    )
    return 0


def credit_show(args) -> int:
    c, settings = _load(args)
    _require_user(c, args.user)
    ledger = settings.ledger()
    ledger.ensure_user(args.user)
    with ledger.begin() as db:
        wallet = db.scalars(
            select(Wallet).where(Wallet.owner_kind == "user", Wallet.owner_name == args.user)
        ).one()
        entries = db.scalars(
            select(Entry).where(Entry.wallet_id == wallet.id).order_by(Entry.id)
        ).all()
        for entry in entries:
            print(
                f"{entry.id:>6}  {entry.kind:<10} {format_money(entry.amount_micros, wallet.currency, symbol=False):>14}"
                f"  {entry.note}"
            )
        print(f"{format_money(wallet.balance_micros, wallet.currency, symbol=False)}")
    return 0


def usage(args) -> int:
    c, settings = _load(args)
    _require_user(c, args.user)
    ledger = settings.ledger()
    if args.csv:
        sys.stdout.write(actions.usage_csv(ledger, args.user))
        return 0
    for sid, label, _started, stopped, seconds, cost in actions.usage_rows(ledger, args.user):
        state = "running" if stopped == "" else "stopped"
        print(
            f"{sid:>6}  {label:<12} {format_duration(seconds):>12}"
            f"  {format_money(cost, settings.currency, symbol=False):>12}  {state}"
        )
    return 0


def audit(args) -> int:
    _c, settings = _load(args)
    problems = settings.ledger().audit()
    for problem in problems:
        print(f"VIOLATION: {problem}")
    print("audit: ok" if not problems else f"audit: {len(problems)} violation(s)")
    return 1 if problems else 0


def upgrade_db(args) -> int:
    from meterhub.billing_hooks.db import upgrade

    _c, settings = _load(args)
    upgrade(settings.db_url)
    print("billing database is at the current schema")
    return 0


def service(args) -> int:
    from meterhub.billing_hooks.service import main

    c, settings = _load(args)
    main(settings, c)
    return 0


def add_commands(commands) -> None:
    credit = commands.add_parser("credit", help="grant or show a user's credit").add_subparsers(
        dest="action", required=True
    )
    grant = credit.add_parser("grant", help="add credit to a user's wallet")
    grant.add_argument("user")
    grant.add_argument("amount", help="e.g. 12.50 (positive, at most two decimals)")
    grant.add_argument("--note", default="")
    grant.set_defaults(func=credit_grant)
    show = credit.add_parser("show", help="a user's ledger entries; the last line is the balance")
    show.add_argument("user")
    show.set_defaults(func=credit_show)
    use = commands.add_parser("usage", help="a user's sessions with profile, duration and cost")
    use.add_argument("user")
    use.add_argument("--csv", action="store_true")
    use.set_defaults(func=usage)
    billing = commands.add_parser("billing", help="ledger maintenance").add_subparsers(
        dest="action", required=True
    )
    billing.add_parser(
        "audit", help="check every ledger invariant; non-zero exit on a violation"
    ).set_defaults(func=audit)
    billing.add_parser(
        "upgrade-db", help="migrate the billing database to the current schema"
    ).set_defaults(func=upgrade_db)
    billing.add_parser("service", help="run the billing service (the hub starts it)").set_defaults(
        func=service
    )
    for parser in (grant, show, use, *billing.choices.values()):
        parser.add_argument("--config", help="site config (YAML); default: the embedded default")


__all__ = ["CliError", "ConfigError", "add_commands"]
