"""Hooks the hub runs around each server: authorize and open a session, note ready, settle.

`authorize_spawn` is the Spawner's pre_spawn_hook: it prices the choice from the catalog,
refuses (HTTP 402, saying the balance, the rate and what to do) unless the wallet covers
the minimum minutes, and opens the metered session with the rate captured now. Each refusal
is counted in the hub's own Prometheus registry (`meterhub_spawns_refused_total`, on
/hub/metrics): a refusal writes nothing to the ledger.
`settle_stop` is the post_stop_hook: it closes the session and charges its last window.
`billed_pre_spawn` and `billed_post_stop` are what the hub sets on meterhub's own spawner
classes: billing's hook first, then an operator's own (from c.Spawner or any other class the
spawner derives from), so an operator's hook adds to billing and never replaces it.
Ledger I/O runs in threads; the hub's event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from jupyterhub.utils import maybe_future
from prometheus_client import Counter
from sqlalchemy.exc import DBAPIError
from tornado import web

from meterhub.i18n import DEFAULT as DEFAULT_LANGUAGE
from meterhub.i18n import N_, _, chosen_language, using
from meterhub.spawner.catalog import InvalidChoice

from .courses import course_refusal
from .ledger import InsufficientCredit, UnknownWallet
from .money import format_duration, format_money, seconds_covered, to_micros
from .settings import BillingSettings, billing_settings_of, priced_catalog
from .wallets import WalletRef, WalletRefError, parse_wallet

#: the language a server starts in (its JupyterLab's default; extensions/server.py)
LANGUAGE_ENV = "METERHUB_LANGUAGE"

BILLING_DOWN = N_(
    "Billing is unavailable right now (its database does not answer), so no new server can"
    " start. Running servers are not affected. Try again in a minute."
)


#: a refusal's status → the reason label of the refusal counter
REFUSAL_REASONS = {
    402: "credit",  # the wallet (or a group member's cap) does not cover the minimum minutes
    403: "not_allowed",  # a wallet or course the user may not pay from, for this choice
    400: "invalid",  # a profile, limit or wallet reference that is not valid
    503: "billing_unavailable",  # the ledger's database does not answer
}
#: in the hub process's default registry, which JupyterHub serves at /hub/metrics (for
#: tokens with read:metrics): counting refusals here writes nothing to the ledger, however
#: often someone asks for a server they cannot pay for
SPAWNS_REFUSED = Counter(
    "meterhub_spawns_refused",
    "Spawns billing refused, by reason: credit (HTTP 402), not_allowed (403), invalid (400),"
    " billing_unavailable (503).",
    ["reason"],
)
for _reason in REFUSAL_REASONS.values():
    SPAWNS_REFUSED.labels(_reason)


def _settings(spawner) -> BillingSettings:
    return billing_settings_of(spawner.config)


async def authorize_spawn(spawner) -> None:
    """Authorize the spawn and open its session (below); a refusal is counted."""
    try:
        await _authorize_spawn(spawner)
    except web.HTTPError as e:
        SPAWNS_REFUSED.labels(REFUSAL_REASONS.get(e.status_code, "invalid")).inc()
        raise


async def _authorize_spawn(spawner) -> None:
    # what the thread reads of the hub's objects, read here on the event loop (a user's
    # groups are a relationship of the hub's ORM, which is not for other threads)
    asked = SpawnAsk(
        user=spawner.user.name,
        server=spawner.name,
        options=dict(spawner.user_options or {}),
        groups=member_groups(spawner.user),
        log_name=spawner._log_name,  # the user's name: a column of the hub's ORM too
    )
    # one hop to a thread for the whole decision: each hop costs the hub's event loop
    ledger, catalog, choice, wallet, auth = await asyncio.to_thread(_authorize, spawner, asked)
    # a backend that can limit a server's run time (a Slurm job's --time) reads it
    spawner.credit_seconds = auth.runway_seconds
    with using(DEFAULT_LANGUAGE):  # the log is English, whoever spawns
        label = choice.label
    spawner.log.info(
        "Billing session %s for %s: %s (%s) at %s/h, paid by %s",
        auth.session_id,
        asked.log_name,
        label,
        catalog.environment_of(choice).slug,
        choice.rate_per_hour,
        wallet or f"user:{asked.user}",
    )
    _keep(asyncio.ensure_future(_record_ready(spawner, ledger, auth.session_id)))


@dataclass(frozen=True)
class SpawnAsk:
    """Who asks for which server, with what options, as members of which hub groups."""

    user: str
    server: str
    options: dict
    groups: set[str]
    #: how the hub's log names the server (`Spawner._log_name`)
    log_name: str = ""


def _authorize(spawner, asked: SpawnAsk):
    """Price the choice, pick the wallet that pays, and open the session (blocking: in a
    thread). `spawner` is used for its configuration and log only (never its user: the
    hub's ORM objects are not for other threads). An HTTP error refuses."""
    settings = _settings(spawner)
    try:
        ledger = settings.ledger()
        reads = ledger.spawn_reads(asked.user)  # one transaction for what the choice needs
        catalog = priced_catalog(spawner.config, ledger, reads.prices)
    except DBAPIError:
        spawner.log.exception("Ledger database error while pricing %s", asked.log_name)
        raise web.HTTPError(503, _(BILLING_DOWN), reason="Billing unavailable") from None
    try:
        choice = catalog.parse(asked.options)
    except InvalidChoice as e:
        raise web.HTTPError(400, str(e), reason="Invalid profile") from None
    too_small = cap_refusal(choice, settings, ledger.currency)
    if too_small:
        raise web.HTTPError(400, too_small, reason="Limit too small")
    try:
        wallet = paying_wallet(
            ledger,
            asked.user,
            asked.groups,
            asked.options,
            choice.profile.slug,
            choice.gpus,
            reads.student_courses,
        )
        if wallet is not None and wallet.is_course:
            course = ledger.course(wallet.name)
            refusal = course and course_refusal(
                course, choice.profile.slug, choice.gpus, ledger.clock()
            )
            if refusal:
                raise web.HTTPError(403, refusal, reason="Not paid by the course")
        auth = ledger.open_session(
            asked.user,
            asked.server,
            choice.profile.slug,
            choice.gpus,
            to_micros(choice.rate_per_hour),
            settings.min_seconds_to_start,
            choice.label,
            wallet,
            None if choice.max_cost is None else to_micros(choice.max_cost),
            None if choice.max_hours is None else choice.max_hours * 3600,
            catalog.environment_of(choice).slug,
        )
    except InsufficientCredit as e:
        raise web.HTTPError(402, str(e), reason="Not enough credit") from None
    except UnknownWallet as e:
        raise web.HTTPError(403, str(e), reason="No such wallet") from None
    except DBAPIError:
        spawner.log.exception("Ledger database error while authorizing %s", asked.log_name)
        raise web.HTTPError(503, _(BILLING_DOWN), reason="Billing unavailable") from None
    return ledger, catalog, choice, wallet, auth


def cap_refusal(choice, settings: BillingSettings, currency: str) -> str:
    """Why a session's spend cap is too small to start with, or "". The server stops about
    when it reaches its cap, and a stop may take up to the grace period, unpaid: a cap must
    buy at least the minutes a spawn needs (`min_minutes_to_start`) and twice a meter
    interval plus the grace, or starting again and again with a tiny cap would run GPUs for
    next to nothing."""
    if choice.max_cost is None:
        return ""
    rate = to_micros(choice.rate_per_hour)
    seconds = seconds_covered(to_micros(choice.max_cost), rate)
    least = max(
        settings.min_seconds_to_start,
        2 * (settings.meter_interval_seconds + settings.stop_grace_seconds),
    )
    if seconds is None or seconds >= least:
        return ""
    return _(
        "max_cost: %(cost)s buys %(time)s of %(label)s at %(rate)s/h; a limit must allow at"
        " least %(least)s",
        cost=format_money(to_micros(choice.max_cost), currency),
        time=format_duration(seconds),
        label=choice.label,
        rate=format_money(rate, currency),
        least=format_duration(least),
    )


def member_groups(user) -> set[str]:
    """The JupyterHub groups of a hub user, by their exact names: a group wallet is paid from
    by the members of the hub group of its (lower-case) name only, the group its admins'
    `!group=` scopes name; a hub group "Lab" is another group."""
    return {group.name for group in getattr(user, "groups", None) or ()}


def paying_wallet(
    ledger,
    user: str,
    groups: set[str],
    options: dict | None = None,
    profile: str = "debug",
    gpus: int = 0,
    student_courses: Sequence[str] | None = None,
) -> WalletRef | None:
    """The wallet the user options name (`"wallet": "group:vision"`), checked against the
    user's JupyterHub `groups` (`member_groups`; a course: its roster) now; without one, a
    course of theirs with allowance left that pays for this choice now, else a group of
    theirs that pays for its members by default, else None (their own wallet). HTTP 400 for
    a malformed reference, 403 for a wallet they may not pay from (blocking: the ledger).
    `student_courses`: the courses they are a student of, when already read."""
    raw = (options or {}).get("wallet")
    if raw is None or raw == "":
        course = ledger.default_course(user, profile, gpus, student_courses=student_courses)
        if course:
            return WalletRef("course", course)
        defaults = ledger.default_group_wallets(groups)
        return WalletRef("group", defaults[0]) if defaults else None
    try:
        ref = parse_wallet(raw)
    except WalletRefError as e:
        raise web.HTTPError(400, _("wallet: %(error)s", error=e), reason="Invalid wallet") from None
    if ref.is_course:
        member = ledger.course_member(ref.name, user)
        if member is None or member.role != "student":
            raise web.HTTPError(
                403,
                _(
                    "You are not a student of the course %(course)s, so you cannot pay from"
                    " its allowances. Pay from your own wallet.",
                    course=repr(ref.name),
                ),
                reason="Not a student",
            )
        return ref
    if not ref.is_group:
        if ref.name != user:
            raise web.HTTPError(
                403,
                _("You can pay only from your own wallet or a group's you belong to"),
                reason="Not your wallet",
            )
        return None
    if ref.name not in groups:
        raise web.HTTPError(
            403,
            _(
                "You are not a member of the group %(group)s, so you cannot pay from its"
                " wallet. Pay from your own wallet, or ask the group's admin to add you.",
                group=repr(ref.name),
            ),
            reason="Not a member",
        )
    return ref


#: background tasks still running: the event loop keeps only weak references to tasks
_TASKS: set[asyncio.Future] = set()


def _keep(task: asyncio.Future) -> asyncio.Future:
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


async def _record_ready(spawner, ledger, session_id: int) -> None:
    """Charging starts when the spawn completes (the server answers through the proxy).

    JupyterHub keeps the spawn's future on the spawner; its completion is the ready time.
    A spawn that fails never becomes ready and costs nothing.
    """
    spawn = getattr(spawner, "_spawn_future", None)
    if spawn is not None:
        try:
            await asyncio.shield(spawn)
        except BaseException:
            return
        await asyncio.to_thread(ledger.mark_ready, session_id)
        return
    deadline = time.monotonic() + spawner.start_timeout + spawner.http_timeout + 60
    while time.monotonic() < deadline:  # a spawn without a future: watch for ready
        if spawner.ready:
            await asyncio.to_thread(ledger.mark_ready, session_id)
            return
        if not spawner.pending:
            return
        await asyncio.sleep(0.2)


async def settle_stop(spawner) -> None:
    """Close the server's sessions: at the stop, or, for a server the hub found dead, when
    it was last seen running (a backend that knows sets `exited_after`; one that found it
    dead without having seen it alive sets `exited_unseen`: the meter's last sight counts)."""
    died = getattr(spawner, "exited_after", None)
    unseen = bool(getattr(spawner, "exited_unseen", False))
    try:
        ledger = await _settings(spawner).ledger_async()
        closed = await asyncio.to_thread(
            ledger.close_server, spawner.user.name, spawner.name, died, at_last_seen=unseen
        )
    except DBAPIError:
        # the meter closes it once the database is back (the server is gone from the hub)
        spawner.log.exception("Ledger database error settling %s", spawner._log_name)
        return
    if closed:
        spawner.log.info("Settled billing sessions %s of %s", closed, spawner._log_name)


async def gpu_reservations(spawner) -> dict[str, dict]:
    """GPUs the local allocator keeps for pass holders, {gpu type: {user: count}}, and for
    the classes of courses in a lab window, {gpu type: {"course:NAME": (count, students)}}.
    A class gets at most what the inventory has beyond the passes' reservations: passes
    were sold first."""
    ledger = _settings(spawner).ledger()

    def read():
        reserved: dict[str, dict] = ledger.reservations()
        inventory: dict[str, int] = {}
        for gpu in getattr(getattr(spawner, "allocator", None), "inventory", ()):
            inventory[gpu.type] = inventory.get(gpu.type, 0) + 1
        for gpu_type, pools in ledger.window_reservations().items():
            left = inventory.get(gpu_type, 0) - sum(reserved.get(gpu_type, {}).values())
            for pool, (count, students) in pools.items():
                take = max(0, min(count, left))
                left -= take
                if take:
                    reserved.setdefault(gpu_type, {})[pool] = (take, students)
        return reserved

    return await asyncio.to_thread(read)


def register_trial_credit(config) -> None:
    """Give every new hub account its trial credit at creation, however it is made.

    An ORM hook on JupyterHub's users table, so it works in `meterhub serve` and in the
    z2jh hub alike; the ledger's key makes it exactly once per name, even if the account is
    created twice. The ledger write runs in a thread, off the hub's event loop.
    """
    from jupyterhub import orm
    from sqlalchemy import event

    log = logging.getLogger("meterhub.trial")

    def created(_mapper, _connection, user):
        name = user.name

        def trial():
            billing_settings_of(config).ledger().ensure_user(name)

        def report(task):
            if not task.cancelled() and task.exception():
                log.error(
                    "Could not open %s's wallet with trial credit: %s", name, task.exception()
                )

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # no event loop in this thread (a tool run in the hub's process): write it now
            try:
                trial()
            except Exception as e:
                log.error("Could not open %s's wallet with trial credit: %s", name, e)
            return
        _keep(asyncio.ensure_future(asyncio.to_thread(trial))).add_done_callback(report)

    event.listen(orm.User, "after_insert", created)
    _TRIAL_LISTENERS.append(created)


#: the listeners register_trial_credit added in this process
_TRIAL_LISTENERS: list = []


def unregister_trial_credit() -> None:
    """Remove every trial-credit listener this process added (tests configure many hubs)."""
    from jupyterhub import orm
    from sqlalchemy import event

    while _TRIAL_LISTENERS:
        listener = _TRIAL_LISTENERS.pop()
        if event.contains(orm.User, "after_insert", listener):
            event.remove(orm.User, "after_insert", listener)


# ------------------------------------------------------------ composition with operators' hooks


async def billed_pre_spawn(spawner) -> None:
    """Authorize and open the session, then run the operator's own pre_spawn_hook, if any.

    The hub sets this on meterhub's spawner class (c.KubeGPUSpawner, c.LocalGPUSpawner),
    the most specific config section: an operator's `c.Spawner.pre_spawn_hook` or
    `c.KubeSpawner.pre_spawn_hook`, set before or after, runs after it instead of replacing
    it. If the operator's hook fails, the spawn fails and the stop settles the session
    (nothing is charged for a server that never became ready).
    """
    await authorize_spawn(spawner)
    speak_the_users_language(spawner)
    theirs = operator_hook(spawner, "pre_spawn_hook")
    if theirs is not None:
        await maybe_future(theirs(spawner))


def speak_the_users_language(spawner) -> None:
    """Start the server in the language its user reads the hub in ($METERHUB_LANGUAGE: the
    server extension makes it JupyterLab's default, extensions/server.py). An API start
    without Accept-Language is English; the hub's own restart in debug mode asks in the
    language the server last started in (hub/restarts.py), and code that runs outside any
    request keeps that language too."""
    language = chosen_language() or spawner.environment.get(LANGUAGE_ENV) or DEFAULT_LANGUAGE
    spawner.environment = {**spawner.environment, LANGUAGE_ENV: language}


async def billed_post_stop(spawner) -> None:
    """Settle the server's sessions, then run the operator's own post_stop_hook, if any."""
    try:
        await settle_stop(spawner)
    finally:
        theirs = operator_hook(spawner, "post_stop_hook")
        if theirs is not None:
            await maybe_future(theirs(spawner))


#: billing's own hooks, never run twice as if they were an operator's
BILLING_HOOKS = (authorize_spawn, settle_stop, billed_pre_spawn, billed_post_stop)


def operator_hook(spawner, trait: str):
    """The operator's own hook for `trait`: the most specific config section of the
    spawner's classes that sets one that is not billing's (None if none does)."""
    config = spawner.config
    for cls in type(spawner).mro():
        section = cls.__name__
        if not dict.__contains__(config, section) or trait not in config[section]:
            continue
        hook = config[section][trait]
        if hook is not None and not any(hook is ours for ours in BILLING_HOOKS):
            return hook
    return None


def install_billing_hooks(section) -> None:
    """Set billing's composed hooks on a spawner class's config section (`c.KubeGPUSpawner`)."""
    section.pre_spawn_hook = billed_pre_spawn
    section.post_stop_hook = billed_post_stop
