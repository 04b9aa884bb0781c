"""`meterhub group …`: research groups from the command line (a hub admin's tool).

The ledger keeps what is billing's (the wallet, admins, caps, settings). Membership is
JupyterHub's: the CLI queues each change, and the hub applies it in its own process within
`groups.sync_interval_seconds` (at its next start when it is not running), because
JupyterHub expects no other writer of its database. Group admins' roles follow the same way.
"""

from __future__ import annotations

import re

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.groups import cap_period_name, runway_phrase
from meterhub.billing_hooks.ledger import LedgerError
from meterhub.billing_hooks.money import format_money
from meterhub.billing_hooks.orm import CAP_PERIODS
from meterhub.i18n import _

from .billing_cli import CliError, cli_actor, load_settings, require_user

#: a budget-alert webhook: http(s), no spaces, of a sane length
WEBHOOK = re.compile(r"^https?://[^\s]{1,2000}\Z")


def _applied(c) -> str:
    """When the hub applies a queued change: a phrase for the end of a sentence."""
    seconds = c.MeterHub.get("group_sync_interval_seconds", 5)
    return _(
        "the hub applies it within %(seconds)s s (at its next start if it is not running)",
        seconds=seconds,
    )


def _group(ledger, name: str):
    settings = ledger.group(name)
    if settings is None:
        raise CliError(
            _(
                "no group %(name)s: create it with `meterhub group create %(plain)s`",
                name=repr(name),
                plain=name,
            )
        )
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
    admins = ", ".join(args.admin or ()) or _("none")
    print(
        _(
            "created group %(name)s (wallet group:%(name)s; admins: %(admins)s); %(applied)s",
            name=made.name,
            admins=admins,
            applied=_applied(c),
        )
    )
    return 0


def _not_managed(args) -> None:
    """Membership from an identity provider is refreshed at each sign-in: the CLI's
    changes would be undone, so they are refused."""
    from .config import load_site_config

    if load_site_config(args.config)["auth"].get("manage_groups"):
        raise CliError(
            _(
                "auth.manage_groups is on: membership comes from the identity provider at each"
                " sign-in; change it there"
            )
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
    print(
        _(
            "adding %(users)s to %(group)s; %(applied)s",
            users=", ".join(dict.fromkeys(args.users)),
            group=group.name,
            applied=_applied(c),
        )
    )
    return 0


def group_remove(args) -> int:
    _not_managed(args)
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    require_user(c, args.user)
    ledger.queue_hub_change("remove", group.name, args.user, cli_actor())
    print(
        _(
            "removing %(user)s from %(group)s; %(applied)s. A server of theirs that runs on the"
            " group's wallet keeps it until it stops; new ones cannot use it.",
            user=args.user,
            group=group.name,
            applied=_applied(c),
        )
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
    shown = ", ".join(dict.fromkeys(users)) or _("none")
    where = (
        _("the hub's next start (JupyterHub loads roles at start-up)")
        if c.JupyterHub.get("spawner_class", "").endswith("KubeGPUSpawner")
        else _applied(c)
    )
    print(
        _(
            "admins of %(group)s: %(admins)s; their role follows: %(where)s",
            group=group.name,
            admins=shown,
            where=where,
        )
    )
    return 0


def group_cap(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    require_user(c, args.user)
    paid = {s.user_name for s, _cost in ledger.group_view(group.name, ()).running}
    if args.user not in hub_members(c, group.name) and args.user not in paid:
        raise CliError(
            _(
                "%(user)s is not a member of %(group)s: add them first",
                user=args.user,
                group=group.name,
            )
        )
    amount = None if args.amount == "none" else args.amount
    try:
        cap = actions.set_cap(ledger, group.name, args.user, amount, args.period, cli_actor())
    except actions.ActionError as e:
        raise CliError(e.message) from None
    if cap is None:
        print(_("%(user)s has no cap on %(group)s", user=args.user, group=group.name))
        return 0
    values = {
        "user": args.user,
        "amount": format_money(cap.amount_micros, ledger.currency, symbol=False),
        "group": group.name,
    }
    if cap.period == "week":
        print(_("%(user)s may spend %(amount)s per week from %(group)s", **values))
    elif cap.period == "month":
        print(_("%(user)s may spend %(amount)s per month from %(group)s", **values))
    else:
        print(_("%(user)s may spend %(amount)s in total from %(group)s", **values))
    return 0


def group_set(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    default = None if args.default_for_members is None else args.default_for_members == "yes"
    webhook = args.webhook
    if webhook not in (None, "none") and not WEBHOOK.match(webhook):
        raise CliError(_("--webhook: an http:// or https:// URL, or none"))
    ledger.set_group_options(
        group.name,
        default_for_members=default,
        webhook_url=None if webhook in (None, "none") else webhook,
        clear_webhook=webhook == "none",
    )
    updated = ledger.group(group.name)
    values = {"group": group.name, "webhook": updated.webhook_url or _("none")}
    if updated.default_for_members:
        print(_("%(group)s: default for members yes, webhook %(webhook)s", **values))
    else:
        print(_("%(group)s: default for members no, webhook %(webhook)s", **values))
    return 0


def group_show(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    group = _group(ledger, args.name)
    view = ledger.group_view(group.name, hub_members(c, group.name))

    def money(micros: int) -> str:
        return format_money(micros, ledger.currency, symbol=False)

    runway = runway_phrase(view.runway_seconds)
    balance = _(
        "group:%(name)s  balance %(balance)s", name=view.name, balance=money(view.balance_micros)
    )
    print(balance + (f"  {runway}" if runway else ""))
    print(_("admins: %(admins)s", admins=", ".join(view.admins) or _("none")))
    for m in view.members:
        period = cap_period_name(m.period)
        if m.cap_micros is None:
            cap = _("no cap")
        else:
            cap = _("cap %(amount)s/%(period)s", amount=money(m.cap_micros), period=period)
        left = ""
        if m.left_micros is not None:
            left = "  " + _("left %(amount)s", amount=money(m.left_micros))
        amount = money(m.spent_micros).rjust(12)
        spent = _("spent %(amount)s (%(period)s)", amount=amount, period=period)
        print(f"  {m.user:<20} {spent}{left}  {cap}")
    for session, cost in view.running:
        server = f"{session.user_name}/{session.server_name or 'default'}"
        print(
            "  "
            + _(
                "running: %(server)s %(profile)s ×%(gpus)s  %(cost)s",
                server=server,
                profile=session.profile,
                gpus=session.gpus,
                cost=money(cost),
            )
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
