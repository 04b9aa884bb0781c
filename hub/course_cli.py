"""`meterhub course …`: course labs from the command line (a hub admin's tool).

The roster is the ledger's (students may have no account yet); the hub mirrors its students
into the JupyterHub group of the course's name and gives its staff their roles, in its own
process, within `groups.sync_interval_seconds` (hub/group_sync.py).
"""

from __future__ import annotations

import csv
import datetime
import io

from meterhub.billing_hooks import actions, course_actions, labwindows
from meterhub.billing_hooks.courses import RosterLine, lab_phrase
from meterhub.billing_hooks.ledger import LedgerError
from meterhub.billing_hooks.money import format_money
from meterhub.billing_hooks.orm import AT_WINDOW_END, CAP_PERIODS
from meterhub.i18n import N_, _

from .billing_cli import CliError, cli_actor, load_settings
from .group_cli import _applied, hub_group_properties

#: a roster file's size
MAX_ROSTER_BYTES = 2 * 1024 * 1024
#: what happens at a lab window's end, as a person reads it
AT_WINDOW_END_NAMES = {"stop": N_("stop"), "debug": N_("debug")}


def _course(ledger, name: str):
    course = ledger.course(name)
    if course is None:
        raise CliError(
            _(
                "no course %(name)s: create it with `meterhub course create %(plain)s`",
                name=repr(name),
                plain=name,
            )
        )
    return course


def _ledger_call(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except (LedgerError, labwindows.WindowError) as e:
        raise CliError(str(e)) from None


def course_create(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    existing = hub_group_properties(c, args.name.lower())
    if existing is not None and not existing.get("course"):
        raise CliError(
            _(
                "the hub has a group named %(name)s already: a course of that name would"
                " replace its members with the roster; choose another name",
                name=repr(args.name.lower()),
            )
        )
    made = _ledger_call(
        ledger.create_course,
        args.name,
        cli_actor(),
        args.instructor or (),
        args.ta or (),
        args.tz,
    )
    staff = [_("%(user)s (instructor)", user=u) for u in args.instructor or ()]
    staff += [_("%(user)s (TA)", user=u) for u in args.ta or ()]
    print(
        _(
            "created course %(name)s (wallet course:%(name)s; time zone %(zone)s; staff:"
            " %(staff)s); %(applied)s",
            name=made.name,
            zone=made.timezone,
            staff=", ".join(staff) or _("none"),
            applied=_applied(c),
        )
    )
    return 0


def read_roster(text: str) -> list[RosterLine]:
    """A roster CSV: a header with `username` and optionally `name`, `email`, `role`;
    CliError names the line of the first problem (course_actions.roster_lines checks the
    rows, as for the API's JSON)."""
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip().lower() for f in reader.fieldnames or ()]
    if "username" not in fields:
        raise CliError(_("the roster's first line names its columns: username[,name,email,role]"))
    reader.fieldnames = fields
    rows = []
    for number, row in enumerate(reader, start=2):
        if None in row:
            raise CliError(_("line %(number)s: more fields than the header names", number=number))
        rows.append(row)
    try:
        # the row's number goes where {} is
        return course_actions.roster_lines(rows, first=2, where=_("line %(number)s", number="{}"))
    except actions.ActionError as e:
        raise CliError(e.message) from None


def course_roster(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    course = _course(ledger, args.name)
    try:
        with open(args.file, "rb") as f:
            raw = f.read(MAX_ROSTER_BYTES + 1)
    except OSError as e:
        raise CliError(
            _("cannot read %(file)s: %(error)s", file=args.file, error=e.strerror)
        ) from None
    if len(raw) > MAX_ROSTER_BYTES:
        raise CliError(
            _("%(file)s is over %(n)s MiB", file=args.file, n=MAX_ROSTER_BYTES // 1024 // 1024)
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CliError(_("%(file)s is not UTF-8 text", file=args.file)) from None
    change = _ledger_call(ledger.import_roster, course.name, read_roster(text), cli_actor())
    print(
        _(
            "%(course)s: %(added)s added, %(removed)s removed, %(changed)s changed,"
            " %(unchanged)s unchanged",
            course=course.name,
            added=len(change.added),
            removed=len(change.removed),
            changed=len(change.changed),
            unchanged=change.unchanged,
        )
    )
    if change.added:
        print("  " + _("added: %(users)s", users=", ".join(change.added)))
    if change.removed:
        print("  " + _("removed: %(users)s", users=", ".join(change.removed)))
    print(
        _(
            "students join the hub group %(course)s when they have an account; %(applied)s",
            course=course.name,
            applied=_applied(c),
        )
    )
    return 0


def course_allowance(args) -> int:
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    course = _course(ledger, args.name)
    micros = None
    if args.amount != "none":
        try:
            micros = actions.limit_amount(args.amount)
        except actions.ActionError as e:
            raise CliError(e.message) from None
    expires = None
    if args.expires:
        try:
            expires = course_actions.expiry(args.expires, course.timezone)
        except actions.ActionError:
            raise CliError(
                _("--expires: a date, YYYY-MM-DD (the last day of the allowance)")
            ) from None
    _ledger_call(ledger.set_allowance, course.name, micros, args.per, expires)
    if micros is None:
        print(
            _("%(course)s: no allowance; students cannot pay from the course", course=course.name)
        )
        return 0
    print(
        allowance_set(
            course.name,
            format_money(micros, ledger.currency, symbol=False),
            args.per,
            args.expires,
            course.timezone,
        )
    )
    return 0


def allowance_set(course: str, amount: str, per: str, last_day: str | None, zone: str) -> str:
    """What `course allowance` says it did, one whole sentence per period."""
    values = {"course": course, "amount": amount, "day": last_day, "zone": zone}
    if last_day:
        if per == "week":
            return _(
                "%(course)s: each student may spend %(amount)s for each week, until the end of"
                " %(day)s (%(zone)s), carved from the course wallet",
                **values,
            )
        if per == "month":
            return _(
                "%(course)s: each student may spend %(amount)s for each month, until the end of"
                " %(day)s (%(zone)s), carved from the course wallet",
                **values,
            )
        return _(
            "%(course)s: each student may spend %(amount)s, until the end of %(day)s"
            " (%(zone)s), carved from the course wallet",
            **values,
        )
    if per == "week":
        return _(
            "%(course)s: each student may spend %(amount)s for each week, carved from the"
            " course wallet",
            **values,
        )
    if per == "month":
        return _(
            "%(course)s: each student may spend %(amount)s for each month, carved from the"
            " course wallet",
            **values,
        )
    return _(
        "%(course)s: each student may spend %(amount)s, carved from the course wallet", **values
    )


def course_profiles(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    course = _course(ledger, args.name)
    from meterhub.spawner.catalog import Catalog

    try:
        choices = course_actions.course_choices(Catalog(config=c), args.choices)
    except actions.ActionError as e:
        raise CliError(e.message) from None
    updated = _ledger_call(ledger.set_course_profiles, course.name, choices)
    print(
        _(
            "%(course)s pays for: %(profiles)s",
            course=course.name,
            profiles=", ".join(updated.profiles.split()) or _("any profile"),
        )
    )
    return 0


def window_gpus_arg(c, items: list[str]) -> dict[str, int]:
    """--gpus rtx4090:2 (repeatable; `none` for none), checked against the catalog's GPU
    types and what the machine has (a class cannot be promised more than there is)."""
    from meterhub.billing_hooks.settings import pass_capacity
    from meterhub.spawner.catalog import Catalog

    if items == ["none"]:
        return {}
    types = Catalog(config=c).types()
    capacity = pass_capacity(c)
    result: dict[str, int] = {}
    for item in items:
        gpu_type, _sep, count = item.lower().partition(":")
        if gpu_type not in types:
            raise CliError(
                _(
                    "--gpus: no GPU type %(type)s: one of %(types)s",
                    type=repr(gpu_type[:32]),
                    types=", ".join(types),
                )
            )
        if not count.isdigit() or int(count) < 1:
            raise CliError(_("--gpus %(item)s: TYPE:COUNT, e.g. rtx4090:2", item=item[:40]))
        result[gpu_type] = result.get(gpu_type, 0) + int(count)
        have = None if capacity is None else capacity.get(gpu_type, 0)
        if have is not None and result[gpu_type] > have:
            raise CliError(
                _(
                    "--gpus: %(asked)s %(type)s asked, this deployment has %(have)s",
                    asked=result[gpu_type],
                    type=gpu_type,
                    have=have,
                )
            )
    return result


def course_window(args) -> int:
    c, settings = load_settings(args)
    ledger = settings.ledger()
    course = _course(ledger, args.name)
    if not (args.weekly or args.on or args.clear or args.tz or args.gpus):
        raise CliError(_("say what to change: --weekly, --on, --clear, --tz or --gpus"))
    gpus = None if not args.gpus else window_gpus_arg(c, args.gpus)
    try:
        lines = [labwindows.weekly(w) for w in args.weekly or ()]
        lines += [labwindows.once(w) for w in args.on or ()]
    except labwindows.WindowError as e:
        raise CliError(str(e)) from None
    updated = _ledger_call(
        ledger.set_course_windows,
        course.name,
        lines,
        clear=args.clear,
        timezone=args.tz,
        gpus=gpus,
    )
    shown = "; ".join(w for w in updated.windows.splitlines()) or _("none (GPUs at any time)")
    print(
        _(
            "%(course)s lab windows (%(zone)s): %(windows)s",
            course=course.name,
            zone=updated.timezone,
            windows=shown,
        )
    )
    if updated.window_gpus:
        print("  " + reserved(updated.window_gpus))
    if updated.windows:
        print(f"  {lab_phrase(updated, ledger.clock())}")
    return 0


def course_set(args) -> int:
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    course = _course(ledger, args.name)
    debug = None if args.debug_outside_windows is None else args.debug_outside_windows == "yes"
    keeps_debug = course.debug_outside_windows if debug is None else debug
    if (args.at_window_end or course.at_window_end) == "debug" and not keeps_debug:
        raise CliError(
            _(
                "--at-window-end debug restarts GPU servers in debug mode after a window: debug"
                " mode must stay open outside windows (--debug-outside-windows yes)"
            )
        )
    updated = _ledger_call(
        ledger.set_course_options,
        course.name,
        debug_outside_windows=debug,
        at_window_end=args.at_window_end,
    )
    end = updated.at_window_end
    values = {
        "course": course.name,
        "end": _(AT_WINDOW_END_NAMES[end]) if end in AT_WINDOW_END_NAMES else end,
    }
    if updated.debug_outside_windows:
        print(
            _("%(course)s: debug mode outside lab windows yes, at a window's end %(end)s", **values)
        )
    else:
        print(
            _("%(course)s: debug mode outside lab windows no, at a window's end %(end)s", **values)
        )
    if args.at_window_end:
        print(
            _(
                "the meter's permission to restart servers follows; %(applied)s",
                applied=_applied(_c),
            )
        )
    return 0


def course_show(args) -> int:
    _c, settings = load_settings(args)
    ledger = settings.ledger()
    course = _course(ledger, args.name)

    def money(micros: int) -> str:
        return format_money(micros, ledger.currency, symbol=False)

    print(
        _(
            "course:%(name)s  balance %(balance)s  in allowances %(allowances)s",
            name=course.name,
            balance=money(ledger.course_balance(course.name)),
            allowances=money(ledger.allowances_total(course.name)),
        )
    )
    if course.allowance_micros is None:
        print(_("allowance: none"))
    else:
        print(allowance_line(course, money))
    print(
        _("pays for: %(profiles)s", profiles=", ".join(course.profiles.split()) or _("any profile"))
    )
    windows = "; ".join(course.windows.splitlines())
    print(
        _(
            "lab windows (%(zone)s): %(windows)s",
            zone=course.timezone,
            windows=windows or _("none (GPUs at any time)"),
        )
    )
    if course.window_gpus:
        print("  " + reserved(course.window_gpus))
    if windows:
        print(f"  {lab_phrase(course, ledger.clock())}")
    now = ledger.clock()
    for member in ledger.roster(course.name):
        # the role as the roster file writes it (student, ta, instructor)
        line = f"  {member.user_name:<20} {member.role:<10}"
        if member.role == "student":
            state = ledger.allowance_state(course.name, member.user_name, now)
            line += " " + _("left %(amount)s", amount=money(state.left_micros))
        print(line)
    return 0


def reserved(gpus: str) -> str:
    return _("reserved for the class during windows: %(gpus)s", gpus=gpus)


def allowance_line(course, money) -> str:
    """ "allowance: 5.00 CNY per week, ends 2027-06-30 23:59 CST" (course show)."""
    values = {"amount": money(course.allowance_micros)}
    period = course.allowance_period
    if course.expires_at is not None:
        end = datetime.datetime.fromtimestamp(course.expires_at, labwindows.zone(course.timezone))
        values["ends"] = f"{end:%Y-%m-%d %H:%M %Z}"
        if period == "week":
            return _("allowance: %(amount)s per week, ends %(ends)s", **values)
        if period == "month":
            return _("allowance: %(amount)s per month, ends %(ends)s", **values)
        return _("allowance: %(amount)s in total, ends %(ends)s", **values)
    if period == "week":
        return _("allowance: %(amount)s per week", **values)
    if period == "month":
        return _("allowance: %(amount)s per month", **values)
    return _("allowance: %(amount)s in total", **values)


def add_commands(commands) -> None:
    course = commands.add_parser(
        "course", help="course labs: roster, allowances, allowed profiles, lab windows"
    ).add_subparsers(dest="action", required=True)
    create = course.add_parser("create", help="create a course with an empty wallet")
    create.add_argument("name", help="lower-case letters, digits, . _ -")
    create.add_argument("--instructor", action="append", metavar="USER", help="repeatable")
    create.add_argument("--ta", action="append", metavar="USER", help="repeatable")
    create.add_argument("--tz", default="UTC", help="the course's time zone (default: UTC)")
    create.set_defaults(func=course_create)
    roster = course.add_parser(
        "roster", help="import the roster: a CSV with username[,name,email,role]"
    )
    roster.add_argument("name")
    roster.add_argument("file", metavar="FILE.csv")
    roster.set_defaults(func=course_roster)
    allowance = course.add_parser("allowance", help="each student's allowance from the course")
    allowance.add_argument("name")
    allowance.add_argument("amount", help="e.g. 30.00; `none` removes it")
    allowance.add_argument("--per", choices=CAP_PERIODS, required=True)
    allowance.add_argument("--expires", metavar="YYYY-MM-DD", help="its last day (course zone)")
    allowance.set_defaults(func=course_allowance)
    profiles = course.add_parser(
        "profiles", help="what the course pays for, e.g. debug rtx4090:1; `any` for any"
    )
    profiles.add_argument("name")
    profiles.add_argument("choices", nargs="+", metavar="CHOICE")
    profiles.set_defaults(func=course_profiles)
    window = course.add_parser("window", help="lab windows: GPUs paid by the course only then")
    window.add_argument("name")
    window.add_argument("--weekly", action="append", metavar='"Tue 14:00-16:00"')
    window.add_argument("--on", action="append", metavar="2027-01-12T14:00/16:00")
    window.add_argument("--clear", action="store_true", help="remove every window first")
    window.add_argument("--tz", help="the course's time zone, e.g. Asia/Shanghai")
    window.add_argument(
        "--gpus",
        action="append",
        metavar="TYPE:COUNT",
        help="GPUs reserved for the class during its windows (repeatable; `none` for none)",
    )
    window.set_defaults(func=course_window)
    options = course.add_parser("set", help="the course's settings")
    options.add_argument("name")
    options.add_argument("--debug-outside-windows", choices=("yes", "no"))
    options.add_argument("--at-window-end", choices=AT_WINDOW_END)
    options.set_defaults(func=course_set)
    show = course.add_parser("show", help="wallet, allowance, profiles, windows and roster")
    show.add_argument("name")
    show.set_defaults(func=course_show)
    for parser in course.choices.values():
        parser.add_argument("--config", help="site config (YAML); default: the embedded default")
