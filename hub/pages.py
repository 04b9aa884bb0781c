"""The hub's own pages beside JupyterHub's: the Wallet and the billing admin view.

Both are hub handlers (JupyterHub's templates, sign-in, XSRF checks on every form) that call
the same code as the CLI and the REST API (`billing_hooks.actions`). A user sees only their
own wallet; the admin view is for hub admins only.
"""

from __future__ import annotations

import asyncio
import html
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import quote

from jupyterhub.handlers import BaseHandler
from markupsafe import Markup
from tornado import web

from meterhub.billing_hooks import actions, topup_actions
from meterhub.billing_hooks.api import usage_json, wallet_json
from meterhub.billing_hooks.money import CURRENCY_SYMBOLS, accrued, format_money, to_micros
from meterhub.billing_hooks.scopes import GROUP_ADMIN_SCOPE, is_billing_admin, may_spend
from meterhub.billing_hooks.settings import (
    BillingSettings,
    billing_settings_of,
    pass_capacity,
    priced_catalog,
)
from meterhub.billing_hooks.wallets import pass_period_name
from meterhub.i18n import N_, _
from meterhub.spawner import disk_archive
from meterhub.spawner.catalog import PASS_PERIODS, Catalog
from meterhub.spawner.configured import per_config
from meterhub.spawner.local import GIB, LocalGPUSpawner

DAY = 86_400
PLOT_DAYS = 30
PROFILE_COLOURS = {
    "debug": "#8c8c8c",
    "rtx4090": "#2b8a3e",
    "a800": "#1864ab",
    "h800": "#c2255c",
}


def administered_groups(scopes) -> set[str]:
    """The groups these scopes name as administered (`custom:meterhub:group-admin!group=X`)."""
    prefix = f"{GROUP_ADMIN_SCOPE}!group="
    return {scope[len(prefix) :] for scope in scopes or () if scope.startswith(prefix)}


def when(epoch: int | None) -> str:
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def time_tag(value: int | str | None) -> Markup:
    """A moment as `<time datetime="…">2026-12-04 14:00 UTC</time>` (an epoch or ISO 8601
    text): page.html's script shows it in the browser's time zone; without JavaScript it
    reads in UTC."""
    if value is None or value == "":
        return Markup("")
    if isinstance(value, str):
        moment = datetime.fromisoformat(value)
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    else:
        moment = datetime.fromtimestamp(value, UTC)
    moment = moment.astimezone(UTC)
    return Markup('<time datetime="{}">{}</time>').format(
        moment.isoformat(timespec="seconds"), moment.strftime("%Y-%m-%d %H:%M UTC")
    )


#: ledger entry kinds as the billing admin page names them
ENTRY_KIND_NAMES = {
    "trial": N_("trial"),
    "grant": N_("grant"),
    "topup": N_("top-up"),
    "charge": N_("charge"),
    "pass": N_("pass"),
    "refund": N_("refund"),
    "adjustment": N_("adjustment"),
    "allowance": N_("allowance"),
}


def entry_kind(kind: str) -> str:
    return _(ENTRY_KIND_NAMES[kind]) if kind in ENTRY_KIND_NAMES else kind


def profile_name(slug: str) -> str:
    """A profile as pages name it in a table: the GPU type's slug, or "debug" translated."""
    return _("debug") if slug == "debug" else slug


#: member colours on a group's plot: a fixed palette, taken in order of the members' names
MEMBER_PALETTE = (
    "#1864ab",
    "#c2255c",
    "#2b8a3e",
    "#e67700",
    "#5f3dc4",
    "#0b7285",
    "#a61e4d",
    "#5c940d",
    "#862e9c",
    "#d9480f",
)


def member_colours(members) -> dict[str, str]:
    """A colour per member from MEMBER_PALETTE, in order of their names (it repeats after
    ten members)."""
    return {name: MEMBER_PALETTE[i % len(MEMBER_PALETTE)] for i, name in enumerate(sorted(members))}


def plot_svg(
    costs: list[dict],
    now: int,
    currency: str,
    days: int = PLOT_DAYS,
    by: str = "profile",
    colours: dict[str, str] | None = None,
) -> str:
    """A stacked bar per day, coloured by `by` (each cost's "profile", or "member" with
    `colours` from member_colours); plain SVG, no JavaScript."""
    colours = PROFILE_COLOURS if colours is None else colours
    width, height, left, bottom = 640, 180, 48, 22
    bar = (width - left) / days
    per_day: dict[int, int] = {}
    for c in costs:
        per_day[c["day"]] = per_day.get(c["day"], 0) + c["micros"]
    top = max(per_day.values(), default=0) or 1
    scale = (height - bottom - 8) / top
    parts = [
        f'<svg class="meterhub-plot" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="{html.escape(plot_label(days, by))}"'
        ' xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width}" y2="{height - bottom}"'
        ' stroke="currentColor" stroke-opacity="0.4"/>',
        f'<text x="{left - 4}" y="14" text-anchor="end" font-size="10" fill="currentColor">'
        f"{html.escape(format_money(top, currency))}</text>",
    ]
    stacked: dict[int, float] = {}
    for c in costs:
        h = c["micros"] * scale
        y = height - bottom - stacked.get(c["day"], 0) - h
        stacked[c["day"]] = stacked.get(c["day"], 0) + h
        colour = colours.get(c[by], "#666")
        parts.append(
            f'<rect x="{left + c["day"] * bar + 1:.1f}" y="{y:.1f}" width="{bar - 2:.1f}"'
            f' height="{h:.1f}" fill="{colour}"><title>{html.escape(c[by])}:'
            f" {html.escape(format_money(c['micros'], currency))}</title></rect>"
        )
    first = now // DAY - days + 1
    for day, anchor in ((0, "start"), (days // 2, "middle"), (days - 1, "end")):
        label = datetime.fromtimestamp((first + day) * DAY, UTC).strftime("%m-%d")
        x = left + day * bar + (bar if anchor == "end" else 0 if anchor == "start" else bar / 2)
        parts.append(
            f'<text x="{x:.1f}" y="{height - 6}" font-size="10"'
            f' text-anchor="{anchor}" fill="currentColor">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def plot_label(days: int, by: str) -> str:
    if by == "member":
        return _("Spending of the last %(days)s days by member", days=days)
    return _("Spending of the last %(days)s days by profile", days=days)


class MeterhubPage(BaseHandler):
    """A hub page that reads the ledger (in a thread, off the event loop)."""

    @property
    def billing(self) -> BillingSettings:
        return billing_settings_of(self.settings["config"])

    def money(self, micros: int) -> str:
        return format_money(micros, self.billing.currency)

    async def capacity(self) -> dict[str, int] | None:
        """GPUs per type passes may reserve (the local inventory), found once, off the event
        loop (finding GPUs may ask NVML)."""
        if "meterhub_capacity" not in self.settings:
            found = await asyncio.to_thread(pass_capacity, self.settings["config"])
            self.settings["meterhub_capacity"] = found
        return self.settings["meterhub_capacity"]

    #: the page's template, and what it shows (set by each page)
    template = ""

    async def page_data(self) -> dict:
        raise NotImplementedError

    async def show(self, message: str = "", error: str = "", status: int = 200):
        """Render the page, with the outcome of a form post when there was one."""
        data = await self.page_data()
        self.render_page(self.template, status=status, message=message, error=error, **data)

    async def act(self, action, *args):
        """Run a billing action off the event loop; when it is refused, show the page with
        the reason and its status, and return None."""
        try:
            return await asyncio.to_thread(action, *args)
        except actions.ActionError as e:
            for name, value in e.headers.items():
                self.set_header(name, value)
            await self.show(error=e.message, status=e.status)
            return None

    def render_page(self, template: str, status: int = 200, **ns):
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        settings = self.billing
        html = self.render_template(
            template,
            sync=True,
            status=status,
            money=self.money,
            # an amount the API gives as a decimal string ("2008.80"), as money reads: ¥2,008.80
            amount=lambda text: self.money(to_micros(text)),
            when=when,
            time_tag=time_tag,
            profile_name=profile_name,
            entry_kind=entry_kind,
            period_name=pass_period_name,
            currency=settings.currency,
            currency_symbol=CURRENCY_SYMBOLS.get(settings.currency, settings.currency + " "),
            **ns,
        )
        self.finish(html)


class WalletPage(MeterhubPage):
    template = "wallet.html"

    async def page_data(self) -> dict:
        user = self.current_user.name
        ledger = await self.billing.ledger_async()
        now = int(time.time())
        capacity = await self.capacity()
        scopes = self.expanded_scopes
        # the hub's ORM on the event loop's thread; the ledger in a thread
        member_of = [g.name for g in self.current_user.groups]
        groups = set(member_of) | administered_groups(scopes)

        def read():
            ledger.ensure_user(user)
            sessions = {s.id: s for s in ledger.open_sessions(user)}
            wallet = wallet_json(ledger, user, self.billing.warn_minutes)
            # the running cost to this second: charged so far plus what accrued since
            for running in wallet["running"]:
                session = sessions.get(running["id"])
                since, rate = 0, 0
                if session is not None and session.ready_at is not None:
                    since = max(0, now - session.metered_through)
                    rate = session.rate_micros_per_hour
                running["live_cost"] = self.money(running["cost_micros"] + accrued(rate, since))
            # the limit each server's user set at spawn ("stop after ¥X / N hours")
            caps = {s["id"]: s["cap"] for s in wallet["servers"] if s["cap"]}
            for running in wallet["running"]:
                running["cap"] = caps.get(running["id"])
            catalog = priced_catalog(self.settings["config"], ledger)
            return {
                "wallet": wallet,
                "usage": usage_json(ledger, user, 50),
                "passes": ledger.passes(user),
                # only what the site has and this user may start
                "offers": actions.pass_offers(catalog, capacity, member_of),
                "may_spend": may_spend(scopes),
                "notifications": ledger.notifications(user)[-10:],
                "groups": ledger.known_groups(groups),
                "courses": ledger.staff_courses(user),
                "plot": plot_svg(ledger.daily_costs(user, now, PLOT_DAYS), now, ledger.currency),
                "now": now,
                "purchase_key": str(uuid.uuid4()),
            }

        data = await asyncio.to_thread(read)
        data["disk"] = await self.disk_data()
        data["topup_link"] = topup_link(self.billing.topup_url, user)
        return data

    @web.authenticated
    async def get(self):
        await self.show()

    async def disk_data(self) -> dict | None:
        """The user's disk (local backend; None elsewhere): its size (measured at most once
        a minute, one walk a disk shared with its spawns, waited for a bounded time), over
        the quota or not, archived or not."""
        from meterhub.spawner.local import DISK_SIZE_WAIT_SECONDS

        spawner = self.current_user.spawner
        if not isinstance(spawner, LocalGPUSpawner):
            return None

        def read_marker() -> disk_archive.Archived | None:
            try:
                return disk_archive.archived(spawner.disk_archive_dir)
            except disk_archive.ArchiveError:
                return None

        marker = await asyncio.to_thread(read_marker)
        size: int | None = marker.disk_bytes if marker is not None else None
        if marker is None:
            walk = asyncio.wrap_future(disk_archive.measure(spawner.disk_path))
            try:
                size = await asyncio.wait_for(walk, DISK_SIZE_WAIT_SECONDS)
            except TimeoutError:
                size = None  # a big disk: measured on, shown at a later visit
        quota = spawner.disk_quota_gib
        return {
            "size": _("still being measured") if size is None else disk_archive.gib(size),
            "quota": None if quota is None else f"{quota:g}",
            "over": quota is not None and size is not None and size > quota * GIB,
            "archived_on": marker.day if marker else "",
        }


class WalletPassesPage(WalletPage):
    @web.authenticated
    async def post(self):
        if not may_spend(self.expanded_scopes):
            raise web.HTTPError(403, "%s", _("Buying passes needs the custom:meterhub:spend scope"))
        ledger = await self.billing.ledger_async()
        offer = self.get_body_argument("offer", "")
        try:
            profile, gpus, period = offer.split(":")
        except ValueError:
            await self.show(error=_("Choose a pass to buy."), status=400)
            return
        catalog = await asyncio.to_thread(priced_catalog, self.settings["config"], ledger)
        posted = await self.act(
            actions.buy_pass,
            ledger,
            catalog,
            self.current_user.name,
            profile,
            gpus,
            period,
            self.get_body_argument("key", ""),
            "page",
            self.current_user.name,
            await self.capacity(),
            [g.name for g in self.current_user.groups],
        )
        if posted is not None:
            held = posted.value
            label = catalog.choice(held.profile, held.gpus).label
            await self.show(
                message=_(
                    "Bought a %(period)s pass for %(label)s (%(price)s), valid until %(until)s.",
                    period=pass_period_name(held.period),
                    label=label,
                    price=self.money(held.price_micros),
                    until=when(held.ends_at),
                )
            )


class WalletRedeemPage(WalletPage):
    """The Wallet's "Redeem a voucher" form: the code credits the signed-in user's own
    wallet, through the same action and rate limit as the API."""

    @web.authenticated
    async def post(self):
        if not may_spend(self.expanded_scopes):
            raise web.HTTPError(
                403, "%s", _("Redeeming a voucher needs the custom:meterhub:spend scope")
            )
        ledger = await self.billing.ledger_async()
        user = self.current_user.name
        code = self.get_body_argument("code", "")
        posted = await self.act(
            topup_actions.redeem, ledger, user, code, user, self.billing.redeem_limits
        )
        if posted is None:
            return
        entry = posted.value
        if posted.replayed:
            message = _(
                "You redeemed this voucher on %(when)s: it gave %(amount)s.",
                when=when(entry.created_at),
                amount=self.money(entry.amount_micros),
            )
        else:
            message = _(
                "Voucher redeemed: %(amount)s added; your balance is %(balance)s.",
                amount=self.money(entry.amount_micros),
                balance=self.money(entry.balance_after_micros),
            )
        await self.show(message=message)


def topup_link(url: str, user: str) -> str:
    """The site's payment page for this user (`billing.topup_url`, `{user}` filled in,
    URL-encoded), or "" when the site has none."""
    return url.replace("{user}", quote(user, safe="")) if url else ""


class WalletCsv(MeterhubPage):
    @web.authenticated
    async def get(self):
        ledger = await self.billing.ledger_async()
        text = await asyncio.to_thread(actions.usage_csv, ledger, self.current_user.name)
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="meterhub-usage.csv"')
        self.finish(text)


class BillingAdminPage(MeterhubPage):
    template = "billing_admin.html"

    def check_admin(self) -> None:
        # from the request's scopes (a hub admin's admin:users, or custom:meterhub:admin)
        if not is_billing_admin(self.expanded_scopes):
            raise web.HTTPError(403, "%s", _("The billing admin view is for billing admins"))

    async def page_data(self) -> dict:
        ledger = await self.billing.ledger_async()
        config = self.settings["config"]
        warning = self.settings.get("template_vars", {}).get("meterhub_sandbox_warning", "")
        run_audit = self.request.method == "GET" and self.get_argument("audit", "") == "1"

        def read():
            wallets = ledger.user_wallets()
            entries = ledger.recent_entries(30)
            running = ledger.open_sessions()
            by_user: dict[str, list] = {}
            for session in running:
                by_user.setdefault(session.user_name, []).append(session)
            catalog = priced_catalog(config, ledger)
            # before an admin's first change of a profile, its site-config price was in effect
            configured = {
                slug: to_micros(p.price_per_hour)
                for slug, p in per_config(Catalog, config).profiles().items()
            }
            return {
                "wallets": wallets,
                "running": by_user,
                "entries": entries,
                "prices": list(catalog.profiles().values()),
                "price_history": [
                    (
                        change,
                        configured.get(change.profile)
                        if change.previous_micros is None
                        else change.previous_micros,
                    )
                    for change in ledger.price_history(20)
                ],
                # the whole ledger: on demand, not on every view; the service's scheduled run
                "problems": ledger.audit() if run_audit else None,
                "last_audit": ledger.latest_audit(),
                "reconciliations": ledger.reconciliations(20),
                "grant_key": str(uuid.uuid4()),
                "sandbox_warning": warning,
            }

        return await asyncio.to_thread(read)

    @web.authenticated
    async def get(self):
        self.check_admin()
        await self.show()


class BillingAdminGrant(BillingAdminPage):
    @web.authenticated
    async def post(self):
        self.check_admin()
        name = self.get_body_argument("user", "").strip()
        if self.find_user(name) is None:
            await self.show(error=_("No such user: %(name)s", name=repr(name)), status=404)
            return
        ledger = await self.billing.ledger_async()
        posted = await self.act(
            actions.grant,
            ledger,
            name,
            self.get_body_argument("amount", ""),
            self.get_body_argument("note", ""),
            self.get_body_argument("key", ""),
            Decimal(self.billing.max_grant),
            "page",
            self.current_user.name,
        )
        if posted is not None:
            entry = posted.value
            await self.show(
                message=_(
                    "Granted %(amount)s to %(name)s; balance %(balance)s.",
                    amount=self.money(entry.amount_micros),
                    name=name,
                    balance=self.money(entry.balance_after_micros),
                )
            )


class PricesPage(MeterhubPage):
    """/hub/prices: what each profile costs by the hour and as a pass, for anyone, signed in
    or not (the sign-in page links it). Prices only: nobody's data."""

    template = "prices.html"

    async def page_data(self) -> dict:
        ledger = await self.billing.ledger_async()
        config = self.settings["config"]

        def read():
            catalog = priced_catalog(config, ledger)
            rows = []
            for slug, profile in catalog.profiles().items():
                rows.append(
                    {
                        "slug": slug,
                        "name": _("debug mode (no GPU)")
                        if profile.is_debug
                        else profile.display_name,
                        "vram_gb": None if profile.is_debug else profile.gpu_type.vram_gb,
                        "price": self.money(to_micros(profile.price_per_hour)),
                        "passes": {}
                        if profile.is_debug
                        else {
                            period: self.money(to_micros(catalog.pass_price(slug, 1, period)))
                            for period in PASS_PERIODS
                        },
                    }
                )
            return {"rows": rows, "periods": list(PASS_PERIODS)}

        return await asyncio.to_thread(read)

    async def get(self):
        await self.show()
