"""`meterhub voucher …`: codes an operator hands out, each redeemed once for credit.

`create` prints the codes once (the ledger keeps only their hashes): one per line on
standard output, so that `> codes.txt` keeps them and nothing else; what was made goes to
standard error. `list` shows which were used, by whom and when; `revoke` revokes unused
ones (a whole batch, if the codes were lost).
"""

from __future__ import annotations

import datetime
import sys
from decimal import Decimal

from meterhub.billing_hooks import topup_actions
from meterhub.billing_hooks.actions import ActionError
from meterhub.billing_hooks.money import format_money
from meterhub.billing_hooks.vouchers import STATES, state_of
from meterhub.i18n import _

from .billing_cli import CliError, cli_actor, load_settings


def _moment(epoch: int | None) -> str:
    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")


def voucher_create(args) -> int:
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    try:
        made = topup_actions.create_vouchers(
            ledger,
            args.amount,
            args.count,
            args.expires,
            args.note or "",
            Decimal(settings.max_grant),
            cli_actor(),
        )
    except ActionError as e:
        raise CliError(e.message) from None
    for new in made:
        print(new.code)
    sys.stdout.flush()
    first = made[0].voucher
    amount = format_money(first.amount_micros, settings.currency)
    if first.expires_at is None:
        summary = _(
            "made %(count)s voucher(s) of %(amount)s, batch %(batch)s, never expiring; the"
            " codes are shown only now",
            count=len(made),
            amount=amount,
            batch=first.batch,
        )
    else:
        summary = _(
            "made %(count)s voucher(s) of %(amount)s, batch %(batch)s, expiring at"
            " %(until)s; the codes are shown only now",
            count=len(made),
            amount=amount,
            batch=first.batch,
            until=_moment(first.expires_at),
        )
    print(summary, file=sys.stderr)
    return 0


def voucher_list(args) -> int:
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    now = ledger.clock()
    rows = ledger.vouchers(state=args.state, batch=args.batch)
    print(
        f"{'id':>6}  {'code':<8} {'amount':>12}  {'state':<9} {'expires':<17} {'redeemed by':<16}"
        f" {'redeemed':<17} {'batch':<12}  note"
    )
    for v in rows:
        amount = format_money(v.amount_micros, settings.currency, symbol=False).split()[0]
        print(
            f"{v.id:>6}  …{v.hint:<7} {amount:>12}  {state_of(v, now):<9}"
            f" {_moment(v.expires_at):<17} {v.redeemed_by or '-':<16}"
            f" {_moment(v.redeemed_at):<17} {v.batch:<12}  {v.note}"
        )
    counts = {state: 0 for state in STATES}
    for v in rows:
        counts[state_of(v, now)] += 1
    print(
        _(
            "%(total)s voucher(s): %(unused)s unused, %(used)s used, %(expired)s expired,"
            " %(revoked)s revoked",
            total=len(rows),
            **counts,
        )
    )
    return 0


def voucher_revoke(args) -> int:
    ids = []
    for raw in args.ids:
        if not (raw.isascii() and raw.isdigit() and 0 < len(raw) <= 18):
            raise CliError(
                _("a voucher id is a whole number, e.g. 42 (got %(raw)s)", raw=repr(raw))
            )
        ids.append(int(raw))
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    try:
        revoked, kept = topup_actions.revoke(ledger, cli_actor(), ids=ids, batch=args.batch)
    except ActionError as e:
        raise CliError(e.message) from None
    now = ledger.clock()
    for v in revoked:
        print(_("revoked voucher %(id)s (…%(hint)s)", id=v.id, hint=v.hint))
    for v in kept:
        if v.redeemed_at is not None:
            print(
                _(
                    "voucher %(id)s (…%(hint)s) was already redeemed by %(user)s: its credit"
                    " stays (take it back with `meterhub credit adjust`)",
                    id=v.id,
                    hint=v.hint,
                    user=v.redeemed_by,
                )
            )
        else:
            print(
                _(
                    "voucher %(id)s (…%(hint)s) was already %(state)s",
                    id=v.id,
                    hint=v.hint,
                    state=state_of(v, now),
                )
            )
    return 0


def add_commands(commands) -> None:
    voucher = commands.add_parser(
        "voucher", help="codes users redeem once for credit (on the Wallet page or the API)"
    ).add_subparsers(dest="action", required=True)
    create = voucher.add_parser(
        "create",
        help="make redeemable codes; prints each once, one a line",
        description="The ledger keeps only each code's hash: keep the printed codes. Redirect"
        " standard output to a file to keep them (the summary goes to standard error).",
    )
    create.add_argument("amount", metavar="AMOUNT", help="credit per code, e.g. 50.00")
    create.add_argument("--count", default="1", help="how many codes (1 to 1000; default 1)")
    create.add_argument(
        "--expires",
        metavar="DATE",
        help="last day it may be redeemed (2027-01-31, UTC) or a moment (2027-01-31T18:00+08:00);"
        " default: never",
    )
    create.add_argument("--note", default="", help="kept with each code and on its entry")
    create.set_defaults(func=voucher_create)
    listing = voucher.add_parser(
        "list", help="every voucher: unused, used (by whom, when), expired or revoked"
    )
    listing.add_argument("--state", choices=STATES, help="only these")
    listing.add_argument("--batch", help="only the codes one `create` made")
    listing.set_defaults(func=voucher_list)
    revoke = voucher.add_parser(
        "revoke",
        help="revoke unused vouchers by id (from `voucher list`) or a whole --batch",
    )
    revoke.add_argument("ids", nargs="*", metavar="ID")
    revoke.add_argument("--batch", help="every unused voucher of this batch")
    revoke.set_defaults(func=voucher_revoke)
    for parser in (create, listing, revoke):
        parser.add_argument("--config", help="site config (YAML); default: the embedded default")
