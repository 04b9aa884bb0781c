"""The group page: a research group's wallet for its members and its admins (PIs).

Members see the balance, the runway, each member's spend against their cap, a 30-day plot by
member and what runs on the group's money. Group admins also set caps, stop members' servers
and download monthly statements, with the scopes JupyterHub gives them for the group, never
a hub admin's. Membership is the hub's own (its ORM); the money is the ledger's.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from tornado import web

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.groups import CAP_PERIOD_NAMES, cap_period_name, runway_phrase
from meterhub.billing_hooks.groups import month_bounds as statement_month
from meterhub.billing_hooks.money import accrued, format_money
from meterhub.billing_hooks.orm import CAP_PERIODS
from meterhub.billing_hooks.scopes import administers, may_stop_in
from meterhub.billing_hooks.wallets import fold
from meterhub.i18n import _

from .group_sync import find_group
from .pages import PLOT_DAYS, MeterhubPage, member_colours, plot_svg, profile_name, when

#: statements offered on the page: the months of the last year that have sessions
STATEMENT_MONTHS = 12


def month_bounds(text: str) -> tuple[int, int]:
    """[start, end) of the UTC month written YYYY-MM; HTTP 400 otherwise."""
    try:
        return statement_month(text)
    except ValueError:
        raise web.HTTPError(400, "%s", _("month: YYYY-MM, e.g. 2026-03, or all")) from None


def recent_months(now: int, count: int = STATEMENT_MONTHS) -> list[str]:
    """YYYY-MM of this month and the `count - 1` before it, newest first."""
    today = datetime.fromtimestamp(now, UTC)
    months = []
    for back in range(count):
        index = today.year * 12 + today.month - 1 - back
        months.append(f"{index // 12:04d}-{index % 12 + 1:02d}")
    return months


def statement_months(ledger, group: str, now: int) -> list[str]:
    """The months of the last year in which the group's wallet paid for a session (blocking:
    one small query a month)."""
    return [
        month
        for month in recent_months(now)
        if ledger.group_sessions(group, *month_bounds(month), limit=1)
    ]


class GroupPage(MeterhubPage):
    """GET /hub/groups/NAME: the group's members and admins; everyone else 403."""

    template = "group.html"

    #: set by authorize_group: the group's name (lower case), the hub's members, and
    #: whether the request's scopes administer it
    group = ""
    members: tuple[str, ...] = ()
    administered = False

    async def authorize_group(self, group: str, admin_only: bool = False) -> None:
        """Decide from the request's scopes and the hub's groups; a group the caller may
        see but that has no wallet (or no hub group) is a 404."""
        name = fold(group)
        admin = administers(self.expanded_scopes, name)
        # membership is exact, as the PI's !group= filter is: a hub group "Lab" is not "lab"
        member = name in {g.name for g in self.current_user.groups}
        if not (admin or member):
            raise web.HTTPError(
                403, "%s", _("Only the group's members and admins can see its page")
            )
        if admin_only and not admin:
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "This needs the group's admin (custom:meterhub:group-admin!group=%(group)s)",
                    group=name[:64],
                ),
            )
        ledger = await self.billing.ledger_async()
        settings = await asyncio.to_thread(ledger.group, name)
        hub_group = find_group(self.db, name)  # the hub's session: on the event loop's thread
        if settings is None or hub_group is None:
            raise web.HTTPError(404, "%s", _("No group %(name)s with a wallet", name=name[:64]))
        self.group = settings.name
        self.members = tuple(sorted(user.name for user in hub_group.users))
        self.administered = admin

    async def paid_servers(self) -> set[tuple[str, str]]:
        """(user, server) the group's wallet pays for now, members or not (any longer)."""
        ledger = await self.billing.ledger_async()
        view = await asyncio.to_thread(ledger.group_view, self.group, self.members)
        return {(s.user_name, s.server_name) for s, _cost in view.running}

    async def page_data(self) -> dict:
        ledger = await self.billing.ledger_async()
        now = int(time.time())
        name, members, admin = self.group, self.members, self.administered
        may_stop = admin and may_stop_in(self.expanded_scopes, name)

        def read():
            view = ledger.group_view(name, members, now)
            daily = ledger.group_daily_costs(name, now, PLOT_DAYS)
            colours = member_colours({m.user for m in view.members} | {c["member"] for c in daily})
            running = []
            for session, cost in view.running:
                since = 0
                if session.ready_at is not None and session.metered_through is not None:
                    since = max(0, now - session.metered_through)
                label = profile_name(session.profile)
                if session.gpus:
                    label += f" × {session.gpus}"
                running.append(
                    {
                        "member": session.user_name,
                        "server": session.server_name,
                        "profile": label,
                        "since": when(session.ready_at or session.started_at),
                        "rate": self.money(session.rate_micros_per_hour),
                        "cost": self.money(cost + accrued(session.rate_micros_per_hour, since)),
                    }
                )
            return {
                "view": view,
                "runway": runway_phrase(view.runway_seconds),
                "members": set(members),
                "running": running,
                "plot": plot_svg(daily, now, ledger.currency, by="member", colours=colours),
                "legend": [(m, colours[m]) for m in sorted({c["member"] for c in daily})],
                "administered": admin,
                "may_stop": may_stop,
                "cap_periods": CAP_PERIODS,
                "period_names": {p: cap_period_name(p) for p in CAP_PERIOD_NAMES},
                # what the cap forms show: the amount as typed, without the currency
                "cap_amounts": {
                    m.user: format_money(m.cap_micros, ledger.currency, symbol=False).split()[0]
                    for m in view.members
                    if m.cap_micros is not None
                },
                "months": statement_months(ledger, name, now) if admin else [],
            }

        return await asyncio.to_thread(read)

    @web.authenticated
    async def get(self, group):
        await self.authorize_group(group)
        await self.show()


class GroupCapPage(GroupPage):
    """POST /hub/groups/NAME/caps: a group admin sets (or removes) a member's cap."""

    @web.authenticated
    async def post(self, group):
        await self.authorize_group(group, admin_only=True)
        user = self.get_body_argument("user", "").strip()
        paying = {member for member, _server in await self.paid_servers()}
        if user not in self.members and user not in paying:
            await self.show(error=not_a_member(user, self.group), status=404)
            return
        amount = self.get_body_argument("amount", "").strip()
        period = self.get_body_argument("period", "month")
        if not amount:
            await self.show(error=_("Enter an amount, or none to remove the cap."), status=400)
            return
        ledger = await self.billing.ledger_async()
        try:
            cap = await asyncio.to_thread(
                actions.set_cap,
                ledger,
                self.group,
                user,
                "none" if amount.casefold() == "none" else amount,
                period,
                self.current_user.name,
            )
        except actions.ActionError as e:
            await self.show(error=e.message, status=e.status)
            return
        if cap is None:
            await self.show(
                message=_("%(user)s has no cap on %(group)s now.", user=user, group=self.group)
            )
            return
        values = {"user": user, "amount": self.money(cap.amount_micros), "group": self.group}
        if cap.period == "week":
            message = _("%(user)s may spend %(amount)s a week from %(group)s.", **values)
        elif cap.period == "month":
            message = _("%(user)s may spend %(amount)s a month from %(group)s.", **values)
        else:
            message = _("%(user)s may spend %(amount)s in total from %(group)s.", **values)
        await self.show(message=message)


def not_a_member(user: str, group: str) -> str:
    return _("%(user)s is not a member of %(group)s.", user=repr(user[:64]), group=group)


class GroupStopPage(GroupPage):
    """POST /hub/groups/NAME/stop: a group admin stops a member's server. Stops only: the
    hub's own stop, as its API's DELETE /users/{name}/server does it."""

    @web.authenticated
    async def post(self, group):
        await self.authorize_group(group, admin_only=True)
        if not may_stop_in(self.expanded_scopes, self.group):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "Stopping members' servers needs delete:servers!group=%(group)s",
                    group=self.group,
                ),
            )
        name = self.get_body_argument("user", "").strip()
        server_name = self.get_body_argument("server", "")
        # a member's server, or one the group still pays for (a member removed since)
        if name not in self.members and (name, server_name) not in await self.paid_servers():
            await self.show(error=not_a_member(name, self.group), status=404)
            return
        message, error, status = await stop_server_for(self, name, server_name)
        await self.show(message=message, error=error, status=status)


async def stop_server_for(page, name: str, server_name: str) -> tuple[str, str, int]:
    """Stop `name`'s server `server_name` as the hub's API DELETE does it, for a page whose
    caller may (checked before): (message, error, status) to show."""
    user = page.find_user(name)
    where = f"{name}'s server" + (f" {server_name!r}" if server_name else "")
    if server_name:
        label = _("%(user)s's server %(server)s", user=name, server=repr(server_name))
    else:
        label = _("%(user)s's server", user=name)
    if user is None or server_name not in user.orm_spawners:
        return "", _("%(label)s is not running.", label=label), 404
    spawner = user.spawners[server_name]
    if spawner.pending == "stop":
        return _("%(label)s is stopping already.", label=label), "", 200
    if spawner.pending == "spawn":
        return "", _("%(label)s is spawning; try again.", label=label), 409
    if spawner.pending:
        busy = _("%(label)s is %(pending)sing; try again.", label=label, pending=spawner.pending)
        return "", busy, 409
    if not spawner.ready or await spawner.poll_and_notify() is not None:
        return "", _("%(label)s is not running.", label=label), 404
    page.log.info("%s stops %s", page.current_user.name, where)
    await page.stop_single_user(user, server_name)
    if spawner._stop_pending:
        return _("%(label)s is stopping (slowly); its files are kept.", label=label), "", 200
    return _("Stopped %(label)s; its files are kept.", label=label), "", 200


class GroupStatement(GroupPage):
    """GET /hub/groups/NAME/statement.csv?month=YYYY-MM (or all): the group's admins."""

    @web.authenticated
    async def get(self, group):
        await self.authorize_group(group, admin_only=True)
        month = self.get_argument("month", "all")
        since, until = (None, None) if month == "all" else month_bounds(month)
        ledger = await self.billing.ledger_async()
        try:
            text = await asyncio.to_thread(
                actions.group_usage_csv, ledger, self.group, since, until
            )
        except actions.ActionError as e:
            raise web.HTTPError(e.status, "%s", e.message) from None
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header(
            "Content-Disposition", f'attachment; filename="meterhub-{self.group}-{month}.csv"'
        )
        self.finish(text)
