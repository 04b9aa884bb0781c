"""`meterhub group …`: research groups from the command line (a hub admin's tool).

The ledger keeps what is billing's (the wallet, admins, caps, settings). Membership is
JupyterHub's: the CLI queues each change, and the hub applies it in its own process within
`groups.sync_interval_seconds` (at its next start when it is not running), because
JupyterHub expects no other writer of its database. Group admins' roles follow the same way.
"""

from __future__ import annotations

import re

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.groups import runway_phrase
from meterhub.billing_hooks.ledger import LedgerError
from meterhub.billing_hooks.money import format_money
from meterhub.billing_hooks.orm import CAP_PERIODS

from .billing_cli import CliError, cli_actor, load_settings, require_user

APPLIED = "the hub applies it within {seconds} s (at its next start if it is not running)"
#: a budget-alert webhook: http(s), no spaces, of a sane length
WEBHOOK = re.compile(r"^https?://[^\s]{1,2000}\Z")


def _applied(c) -> str:
    seconds = c.MeterHub.get("group_sync_interval_seconds", 5)
    return APPLIED.format(seconds=seconds)


def _group(ledger, name: str):
    settings = ledger.group(name)
    if settings is None:
        raise CliError(f"no group {name!r}: create it with `meterhub group create {name}`")
    return settings


def group_create(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    for admin in args.admin or ():
        require_user(c, admin)
    try:
        made = ledger.create_group(
            args.name, cli_actor(), args.admin or (), args.default_for_members
        )
    except LedgerError as e:
        raise CliError(str(e)) from None
    admins = ", ".join(args.admin or ()) or "none"
    print(f"created group {made.name} (wallet group:{made.name}; admins: {admins}); {_applied(c)}")
    return 0


def _not_managed(args) -> None:
    """Membership from an identity provider is refreshed at each sign-in: the CLI's
    changes would be undone, so they are refused."""
    from .config import load_site_config

    if load_site_config(args.config)["auth"].get("manage_groups"):
        raise CliError(
            "auth.manage_groups is on: membership comes from the identity provider at each"
            " sign-in; change it there"
        )


def group_add(args) -> int:
    _not_managed(args)
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    for user in args.users:
        require_user(c, user)
    for user in dict.fromkeys(args.users):
        ledger.queue_hub_change("add", group.name, user, cli_actor())
    print(f"adding {', '.join(dict.fromkeys(args.users))} to {group.name}; {_applied(c)}")
    return 0


def group_remove(args) -> int:
    _not_managed(args)
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    require_user(c, args.user)
    ledger.queue_hub_change("remove", group.name, args.user, cli_actor())
    print(
        f"removing {args.user} from {group.name}; {_applied(c)}. A server of theirs that"
        " runs on the group's wallet keeps it until it stops; new ones cannot use it."
    )
    return 0


def group_admins(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    users = [] if args.users == ["none"] else args.users
    for user in users:
        require_user(c, user)
    ledger.set_group_admins(group.name, users)
    shown = ", ".join(dict.fromkeys(users)) or "none"
    where = (
        "the hub's next start (JupyterHub loads roles at start-up)"
        if c.JupyterHub.get("spawner_class", "").endswith("KubeGPUSpawner")
        else _applied(c)
    )
    print(f"admins of {group.name}: {shown}; their role follows: {where}")
    return 0


def group_cap(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    require_user(c, args.user)
    paid = {s.user_name for s, _cost in ledger.group_view(group.name, ()).running}
    if args.user not in hub_members(c, group.name) and args.user not in paid:
        raise CliError(f"{args.user} is not a member of {group.name}: add them first")
    amount = None if args.amount == "none" else args.amount
    try:
        cap = actions.set_cap(ledger, group.name, args.user, amount, args.period, cli_actor())
    except actions.ActionError as e:
        raise CliError(e.message) from None
    if cap is None:
        print(f"{args.user} has no cap on {group.name}")
    else:
        money = format_money(cap.amount_micros, ledger.currency, symbol=False)
        print(f"{args.user} may spend {money} per {cap.period} from {group.name}")
    return 0


def group_set(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    default = None if args.default_for_members is None else args.default_for_members == "yes"
    webhook = args.webhook
    if webhook not in (None, "none") and not WEBHOOK.match(webhook):
        raise CliError("--webhook: an http:// or https:// URL, or none")
    ledger.set_group_options(
        group.name,
        default_for_members=default,
        webhook_url=None if webhook in (None, "none") else webhook,
        clear_webhook=webhook == "none",
    )
    updated = ledger.group(group.name)
    print(
        f"{group.name}: default for members {'yes' if updated.default_for_members else 'no'},"
        f" webhook {updated.webhook_url or 'none'}"
    )
    return 0


def group_show(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    view = ledger.group_view(group.name, hub_members(c, group.name))

    def money(micros: int) -> str:
        return format_money(micros, ledger.currency, symbol=False)

    runway = runway_phrase(view.runway_seconds)
    print(
        f"group:{view.name}  balance {money(view.balance_micros)}"
        + (f"  {runway}" if runway else "")
    )
    print(f"admins: {', '.join(view.admins) or 'none'}")
    for m in view.members:
        cap = "no cap" if m.cap_micros is None else f"cap {money(m.cap_micros)}/{m.period}"
        left = "" if m.left_micros is None else f"  left {money(m.left_micros)}"
        print(f"  {m.user:<20} spent {money(m.spent_micros):>12} ({m.period}){left}  {cap}")
    for session, cost in view.running:
        print(
            f"  running: {session.user_name}/{session.server_name or 'default'} {session.profile}"
            f" ×{session.gpus}  {money(cost)}"
        )
    return 0


def _hub_rows(c, sql: str, **params) -> list[tuple]:
    """Rows of a read-only query on the hub's database; [] when it has none yet (connecting
    to a missing SQLite file would create an empty one)."""
    import os

    from sqlalchemy import create_engine, text

    url = c.JupyterHub.db_url
    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///") :]):
        return []
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql), params)]
    except Exception:
        return []  # no hub database (or no tables) yet
    finally:
        engine.dispose()


def hub_group_properties(c, group: str) -> dict | None:
    """The properties of the hub's group `group` (exact name), or None when it has none."""
    import json

    rows = _hub_rows(c, "SELECT properties FROM groups WHERE name = :g", g=group)
    if not rows:
        return None
    value = rows[0][0]
    return (json.loads(value) if isinstance(value, str) else value) or {}


def hub_members(c, group: str) -> list[str]:
    """The members of a hub group, read from the hub's database."""
    rows = _hub_rows(
        c,
        "SELECT users.name FROM users"
        " JOIN user_group_map ON user_group_map.user_id = users.id"
        " JOIN groups ON groups.id = user_group_map.group_id"
        " WHERE lower(groups.name) = :g ORDER BY users.name",
        g=group,
    )
    return [row[0] for row in rows]


def add_commands(commands) -> None:
    group = commands.add_parser(
        "group", help="research groups: a shared wallet, member caps, group admins"
    ).add_subparsers(dest="action", required=True)
    create = group.add_parser("create", help="create a group with an empty wallet")
    create.add_argument("name", help="lower-case letters, digits, . _ -")
    create.add_argument(
        "--admin", action="append", metavar="USER", help="a group admin (repeatable)"
    )
    create.add_argument(
        "--default-for-members",
        action="store_true",
        help="members who name no wallet at spawn pay from the group",
    )
    create.set_defaults(func=group_create)
    add = group.add_parser("add", help="add members")
    add.add_argument("name")
    add.add_argument("users", nargs="+", metavar="USER")
    add.set_defaults(func=group_add)
    remove = group.add_parser(
        "remove", help="remove a member (their files in the shared folder stay)"
    )
    remove.add_argument("name")
    remove.add_argument("user")
    remove.set_defaults(func=group_remove)
    admins = group.add_parser("admins", help="set the group's admins (PIs); `none` for none")
    admins.add_argument("name")
    admins.add_argument("users", nargs="+", metavar="USER")
    admins.set_defaults(func=group_admins)
    cap = group.add_parser("cap", help="what a member may spend from the group per period")
    cap.add_argument("name")
    cap.add_argument("user")
    cap.add_argument("amount", help="e.g. 50.00; `none` removes the cap")
    cap.add_argument("--period", choices=CAP_PERIODS, default="month", help="default: month")
    cap.set_defaults(func=group_cap)
    options = group.add_parser("set", help="the group's settings")
    options.add_argument("name")
    options.add_argument("--default-for-members", choices=("yes", "no"))
    options.add_argument(
        "--webhook", metavar="URL", help="budget alerts POSTed as JSON; `none` removes it"
    )
    options.set_defaults(func=group_set)
    show = group.add_parser("show", help="balance, members' spend and caps, running servers")
    show.add_argument("name")
    show.set_defaults(func=group_show)
    for parser in group.choices.values():
        parser.add_argument("--config", help="site config (YAML); default: the embedded default")
