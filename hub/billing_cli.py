"""`meterhub credit|usage|billing …`: the operator's view of the ledger, through the same code as the API.

Every command that moves credit takes an idempotency `--key`; without one it makes one and
prints it first, so an operator whose command died half-way can run it again with that key
and be sure it happens once. Entries it writes name their actor `cli:<os user>`.
"""

from __future__ import annotations

import getpass
import os
import sys
import time
import uuid
from decimal import Decimal

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from traitlets.config import Config

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.money import format_duration, format_money
from meterhub.billing_hooks.settings import BillingSettings
from meterhub.i18n import _

from .config import ConfigError, apply_config, load_site_config

#: the most digits a session id may have (ids are 64-bit integers)
MAX_SESSION_DIGITS = 18
#: the longest OS user name recorded as an actor; longer (or odd) names record the uid
MAX_ACTOR_NAME = 64


class CliError(Exception):
    """A readable one-line refusal; nothing was written. Exit status 2."""

    exit_code = 2


class DatabaseUnreadable(CliError):
    """A database that did not answer: the same exit status as the ledger's (3)."""

    exit_code = 3


def cli_actor() -> str:
    """`cli:<os user>`, recorded on every entry the CLI writes; `cli:uid=N` when the OS
    has no usable name for us (a container's bare uid)."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError, ImportError):
        name = ""
    if not 0 < len(name) <= MAX_ACTOR_NAME or not all(33 <= ord(ch) < 127 for ch in name):
        name = f"uid={os.getuid()}"
    return f"cli:{name}"


def load_settings(args) -> tuple[Config, BillingSettings]:
    site = load_site_config(args.config)
    c = apply_config(site, Config())
    return c, BillingSettings(config=c)


def _shown_url(url: str) -> str:
    """A database URL fit for a message: never its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except SQLAlchemyError:
        return url.split("@")[-1] if "@" in url else url


def require_user(c: Config, name: str) -> None:
    """Refuse a user the hub does not know. A hub database that cannot be read is said to
    be that, never "unknown user"."""
    url = c.JupyterHub.db_url
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if not os.path.lexists(path):  # connecting would create an empty database
            raise CliError(
                _(
                    "unknown user %(name)s: create the account first (no hub database at"
                    " %(path)s yet)",
                    name=repr(name),
                    path=path,
                )
            )
    try:
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                found = conn.execute(
                    text("SELECT 1 FROM users WHERE name = :n"), {"n": name}
                ).first()
        finally:
            engine.dispose()
    except (SQLAlchemyError, OSError, ImportError) as e:
        reason = e.orig if isinstance(e, DBAPIError) else e
        raise DatabaseUnreadable(
            _(
                "cannot read the hub database (%(url)s): %(reason)s",
                url=_shown_url(url),
                reason=reason,
            )
        ) from None
    if not found:
        raise CliError(_("unknown user %(name)s: create the account first", name=repr(name)))


def _require_wallet(c: Config, ledger, reference: str) -> str:
    """A wallet reference the CLI may act on: a user the hub has, a group or a course;
    returns it spelt the ledger's way (`group:vision`, or the user's bare name)."""
    try:
        ref = actions.wallet_ref(reference)
    except actions.ActionError as e:
        raise CliError(e.message) from None
    kind, _sep, name = ref.partition(":")
    if kind == "user":
        require_user(c, name)
        return name
    found = ledger.group(name, kinds=("group", "course"))
    if found is None or found.kind != kind:
        if kind == "group":
            raise CliError(
                _(
                    "no group %(name)s: create it with `meterhub group create %(bare)s`",
                    name=repr(name),
                    bare=name,
                )
            )
        raise CliError(
            _(
                "no course %(name)s: create it with `meterhub course create %(bare)s`",
                name=repr(name),
                bare=name,
            )
        )
    return ref


def _key(args) -> str:
    """The operator's --key, or a new one printed first: the handle for a safe retry."""
    if args.key is not None:
        return args.key
    key = str(uuid.uuid4())
    print(f"key: {key}", flush=True)
    return key


def _money(micros: int, settings: BillingSettings) -> str:
    return format_money(micros, settings.currency, symbol=False)


def _write(args, settings, ledger, action, subject, *fields, done) -> int:
    """Write one entry through an action under the operator's (or a new, printed) key, and
    say what it did: `done(entry)` then the balance; a replay says so instead."""
    key = _key(args)
    try:
        posted = action(
            ledger, subject, *fields, key, Decimal(settings.max_grant), "cli", cli_actor()
        )
    except actions.ActionError as e:
        raise CliError(e.message) from None
    entry = posted.value
    if posted.replayed:
        print(f"already done (key {key}): entry {entry.id}")
    else:
        balance = _money(entry.balance_after_micros, settings)
        print(f"{done(entry)}; balance {balance} (entry {entry.id})")
    return 0


def credit_grant(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    wallet = _require_wallet(c, ledger, args.user)

    def done(entry):
        return f"granted {_money(entry.amount_micros, settings)} to {wallet}"

    return _write(
        args, settings, ledger, actions.grant, wallet, args.amount, args.note or "", done=done
    )


def credit_adjust(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    wallet = _require_wallet(c, ledger, args.user)

    def done(entry):
        return f"adjusted {wallet} by {_money(entry.amount_micros, settings)}"

    return _write(
        args, settings, ledger, actions.adjust, wallet, args.amount, args.reason, done=done
    )


def billing_refund(args) -> int:
    raw = args.session_id
    if not (raw.isascii() and raw.isdigit() and 0 < len(raw) <= MAX_SESSION_DIGITS):
        raise CliError(_("session id must be a whole number, e.g. 42 (got %(raw)s)", raw=repr(raw)))
    session_id = int(raw)
    _c, settings = load_settings(args)
    ledger = settings.ledger()

    def done(entry):
        user = ledger.session(session_id).user_name
        amount = _money(entry.amount_micros, settings)
        return f"refunded {amount} of session {session_id} to {user}"

    return _write(
        args, settings, ledger, actions.refund, session_id, args.amount, args.reason, done=done
    )


def credit_show(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    wallet = _require_wallet(c, ledger, args.user)
    if ":" not in wallet:
        ledger.ensure_user(wallet)
    for entry in ledger.wallet_entries(wallet):
        amount = format_money(entry.amount_micros, ledger.currency, symbol=False)
        print(
            f"{entry.id:>6}  {entry.kind:<10} {amount:>14}  {entry.actor or '-':<16}  {entry.note}"
        )
    print(format_money(ledger.balance(wallet), ledger.currency, symbol=False))
    return 0


def usage(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    wallet = _require_wallet(c, ledger, args.user)
    if ":" in wallet:  # a group or a course: what it paid for, with the member who ran it
        group = wallet.partition(":")[2]
        if args.csv:
            sys.stdout.write(actions.group_usage_csv(ledger, group))
            return 0
        for sid, member, label, _s, stopped, seconds, cost, _env in actions.group_usage_rows(
            ledger, group
        ):
            state = "running" if stopped == "" else "stopped"
            print(
                f"{sid:>6}  {member:<16} {label:<12} {format_duration(seconds):>12}"
                f"  {format_money(cost, settings.currency, symbol=False):>12}  {state}"
            )
        return 0
    if args.csv:
        sys.stdout.write(actions.usage_csv(ledger, wallet))
        return 0
    for sid, label, _s, stopped, seconds, cost, environment in actions.usage_rows(ledger, wallet):
        state = "running" if stopped == "" else "stopped"
        print(
            f"{sid:>6}  {label:<12} {environment:<10} {format_duration(seconds):>12}"
            f"  {format_money(cost, settings.currency, symbol=False):>12}  {state}"
        )
    return 0


def audit(args) -> int:
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    problems = ledger.audit()
    for problem in problems:
        print(f"VIOLATION: {problem}")
    # what the meter corrected against the hub's view (a missed listing, a vanished or an
    # unbilled server): not violations, but an operator should see them
    for line in ledger.reconciliation_report():
        print(f"reconciled: {line}")
    print("audit: ok" if not problems else f"audit: {len(problems)} violation(s)")
    return 1 if problems else 0


def upgrade_db(args) -> int:
    from meterhub.billing_hooks.db import upgrade

    _c, settings = load_settings(args)
    upgrade(settings.db_url)
    print("billing database is at the current schema")
    return 0


def migrate(args) -> int:
    from meterhub.billing_hooks.db import connect
    from meterhub.billing_hooks.migrate import MigrationError
    from meterhub.billing_hooks.migrate import migrate as copy_ledger

    _c, settings = load_settings(args)
    source_url, target_url = settings.db_url, args.to
    if source_url.startswith("sqlite:///") and not os.path.isfile(source_url[len("sqlite:///") :]):
        raise CliError(
            _(
                "no billing database at %(url)s: nothing to migrate",
                url=_shown_url(source_url),
            )
        )
    try:
        same = make_url(target_url) == make_url(source_url)
    except SQLAlchemyError:
        raise CliError(_("--to: not a database URL: %(url)s", url=repr(target_url))) from None
    if same:
        raise CliError(_("--to is the configured billing database itself"))
    source = connect(source_url, create=False, config_hint=_config_hint(args))
    try:
        result = copy_ledger(source, target_url, int(time.time()))
    except MigrationError as e:
        raise CliError(f"{_shown_url(target_url)}: {e}") from None
    finally:
        source.dispose()
    for table, rows in result.rows.items():
        print(f"{table:<16} {rows:>9} rows copied")
    print(
        f"audit and {result.wallets} balances identical"
        f" ({len(result.audit)} violation(s) on both sides)"
    )
    print(f"now set billing.db_url to {_shown_url(target_url)} and start the hub")
    return 0


def _config_hint(args) -> str:
    return f" --config {args.config}" if args.config else ""


def service(args) -> int:
    from meterhub.billing_hooks.service import main

    c, settings = load_settings(args)
    main(settings, c)
    return 0


WALLET_HELP = "a user name (or user:NAME), group:NAME or course:NAME"
KEY_HELP = (
    "idempotency key, 1 to 120 printable ASCII characters: the same key again is a no-op;"
    " without one a new key is made and printed first"
)


def add_commands(commands) -> None:
    credit = commands.add_parser(
        "credit", help="grant, correct or show a wallet's credit (a user's or a group's)"
    ).add_subparsers(dest="action", required=True)
    grant = credit.add_parser("grant", help="add credit to a wallet")
    grant.add_argument("user", metavar="WALLET", help=WALLET_HELP)
    grant.add_argument("amount", help="e.g. 12.50 (positive, at most two decimals)")
    grant.add_argument("--note", default="")
    grant.add_argument("--key", help=KEY_HELP)
    grant.set_defaults(func=credit_grant)
    adjust = credit.add_parser(
        "adjust",
        help="correct a user's balance by a signed amount, with the reason",
        description="A negative AMOUNT (e.g. -1.50) takes credit back.",
    )
    adjust.add_argument("user", metavar="WALLET", help=WALLET_HELP)
    adjust.add_argument("amount", help="e.g. 2.00 or -1.50 (at most two decimals, not zero)")
    adjust.add_argument("--reason", required=True, help="why (kept on the entry)")
    adjust.add_argument("--key", help=KEY_HELP)
    adjust.set_defaults(func=credit_adjust)
    show = credit.add_parser(
        "show", help="a wallet's ledger entries with their actor; the last line is the balance"
    )
    show.add_argument("user", metavar="WALLET", help=WALLET_HELP)
    show.set_defaults(func=credit_show)
    use = commands.add_parser(
        "usage",
        help="a wallet's sessions with profile, duration and cost (a group's: with the member)",
    )
    use.add_argument("user", metavar="WALLET", help=WALLET_HELP)
    use.add_argument("--csv", action="store_true")
    use.set_defaults(func=usage)
    billing = commands.add_parser("billing", help="ledger maintenance").add_subparsers(
        dest="action", required=True
    )
    refund = billing.add_parser(
        "refund",
        help="give back (part of) what a session was charged, never more",
        description="Session ids are in `meterhub usage USER`.",
    )
    refund.add_argument("session_id", metavar="SESSION_ID")
    refund.add_argument(
        "--amount", help="e.g. 1.20; default: everything the session was charged and not refunded"
    )
    refund.add_argument("--reason", required=True, help="why (kept on the entry)")
    refund.add_argument("--key", help=KEY_HELP)
    refund.set_defaults(func=billing_refund)
    billing.add_parser(
        "audit", help="check every ledger invariant; non-zero exit on a violation"
    ).set_defaults(func=audit)
    billing.add_parser(
        "upgrade-db", help="migrate the billing database to the current schema"
    ).set_defaults(func=upgrade_db)
    move = billing.add_parser(
        "migrate",
        help="copy the ledger into another, empty database (e.g. SQLite to PostgreSQL)",
        description="Stop the hub first. Every table is copied with its ids and checked; then"
        " set billing.db_url to the target. A target that holds a ledger is refused.",
    )
    move.add_argument("--to", required=True, metavar="URL", help="SQLAlchemy URL of the target")
    move.set_defaults(func=migrate)
    billing.add_parser("service", help="run the billing service (the hub starts it)").set_defaults(
        func=service
    )
    for parser in (grant, adjust, show, use, *billing.choices.values()):
        parser.add_argument("--config", help="site config (YAML); default: the embedded default")


__all__ = [
    "CliError",
    "ConfigError",
    "DatabaseUnreadable",
    "add_commands",
    "cli_actor",
    "require_user",
]
