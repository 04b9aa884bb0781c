"""The billing REST API under /services/billing/api/v1/, authenticated through the hub.

`openapi.yaml` beside this file is the contract: its request schemas are what bodies are
validated against, and `ROUTES` below is the one table of paths, handlers and who may call
each method — the authorization tests are generated from it.

What a request may do is decided from the scopes JupyterHub reports for its token
(billing_hooks/scopes.py), never from who owns the token. Every `/users/{name}` route
answers 404 for a user the hub does not have. Bad bodies get a 4xx that names the field,
bodies over 64 KiB a 413, unknown methods a 405 with `Allow`; nothing is written then.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import json
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path

import jsonschema
import yaml
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated, UserNotAllowed
from jupyterhub.utils import url_path_join
from prometheus_client import CONTENT_TYPE_LATEST
from tornado import web

from meterhub.i18n import _
from meterhub.spawner.catalog import PASS_PERIODS

from . import actions, course_actions, topup_actions, topups
from .courses import lab_phrase
from .groups import month_bounds, runway, runway_phrase
from .ledger import Ledger
from .money import (
    AmountError,
    format_duration,
    format_money,
    from_micros,
    parse_amount,
    seconds_covered,
)
from .orm import Entry, MeteredSession
from .postings import cap_left_seconds, cap_phrase
from .scopes import (
    administers,
    instructs,
    is_billing_admin,
    may_read_metrics,
    may_spend,
    teaches,
)
from .settings import BillingSettings, billing_settings_of, priced_catalog
from .wallets import GROUP_NAME, fold

MAX_PAGE = 500
MAX_BODY = 64 * 1024
MAX_PRICE = Decimal("1000000")
#: JSON integers longer than this are refused before Python converts them
MAX_INT_DIGITS = 18
MAX_NAME = 255

#: who may call a method (ROUTES' rules)
PUBLIC = "public"  # no token
ANY = "any"  # any token that reaches the billing service
OWN = "own"  # the token's owner, or a billing admin
OWNER = "owner"  # the token's owner only (not even an admin)
SPEND = "spend"  # the owner with custom:meterhub:spend, or a billing admin
ADMIN = "admin"  # a billing admin: custom:meterhub:admin or admin:users
MEMBER = "member"  # a member of the group (their token may read their groups), or GROUP_ADMIN
GROUP_ADMIN = "group-admin"  # custom:meterhub:group-admin!group=NAME, or a billing admin
COURSE_STAFF = "course-staff"  # custom:meterhub:course-staff!group=NAME, or a billing admin
COURSE_INSTRUCTOR = "course-instructor"  # custom:meterhub:course-instructor!group=NAME, or admin
METRICS = "metrics"  # JupyterHub's read:metrics (a Prometheus service), with or without access

OPENAPI_PATH = Path(__file__).with_name("openapi.yaml")


@cache
def _document() -> dict:
    return yaml.safe_load(OPENAPI_PATH.read_text())


def _money(micros: int) -> str:
    return str(from_micros(micros).quantize(Decimal("0.01")))


def _time(epoch: int | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


def wallet_json(ledger: Ledger, user: str, warn_minutes: Sequence[int] = ()) -> dict | None:
    """A user's wallet as the API, the pages and JupyterLab show it (blocking)."""
    balance = ledger.balance(user)
    if balance is None:
        return None
    # what the user's own credit pays for: a group's servers run on the group's
    running = ledger.sessions_with_cost(user, open_only=True, own_wallet=True)
    rate = sum(s.rate_micros_per_hour for s, _cost in running)
    seconds = seconds_covered(balance + ledger.overdraft_micros, rate)
    currency = ledger.currency
    summary = format_money(balance, currency)
    if rate and seconds is not None:
        summary = _(
            "%(balance)s · %(rate)s/h · %(time)s left",
            balance=summary,
            rate=format_money(rate, currency),
            time=format_duration(seconds),
        )
    return {
        "user": user,
        "currency": currency,
        "balance": _money(balance),
        "balance_micros": balance,
        "rate_per_hour": _money(rate),
        "minutes_left": None if seconds is None else seconds // 60,
        "summary": summary,
        "running": [_session_json(s, cost) for s, cost in running],
        # every server of the user's that runs, whoever pays, with the cap its user set
        "servers": [
            {**_session_json(s, cost), "cap": cap_json(s, cost, ledger.clock(), currency)}
            for s, cost in ledger.sessions_with_cost(user, open_only=True)
        ],
        # the site's billing.warn_minutes: JupyterLab colours its status by them
        "warn_minutes": sorted(warn_minutes, reverse=True),
    }


def cap_json(session: MeteredSession, cost: int, now: int, currency: str) -> dict | None:
    """The cap a user set on a running session ("stop after ¥X / N hours") and what is
    left of it: money, and seconds at its rate (the sooner of the two); None: no cap."""
    if session.max_cost_micros is None and session.max_seconds is None:
        return None
    left = None if session.ready_at is None else cap_left_seconds(session, cost, now)
    cap = session.max_cost_micros
    return {
        "max_cost": None if cap is None else _money(cap),
        "max_hours": None if session.max_seconds is None else session.max_seconds // 3600,
        "cost_left": None if cap is None else _money(max(0, cap - cost)),
        "left_seconds": None if left is None else max(0, left),
        "summary": cap_phrase(session, currency, cost),
    }


def _session_json(session: MeteredSession, cost: int) -> dict:
    return {
        "id": session.id,
        "server": session.server_name,
        "profile": session.profile,
        "gpus": session.gpus,
        "rate_per_hour": _money(session.rate_micros_per_hour),
        "started": _time(session.started_at),
        "ready": _time(session.ready_at),
        "stopped": _time(session.stopped_at),
        "seconds": _metered_seconds(session),
        "cost": _money(cost),
        "cost_micros": cost,
        "environment": session.environment,
    }


def _metered_seconds(session: MeteredSession) -> int:
    if session.ready_at is None or session.metered_through is None:
        return 0
    return session.metered_through - session.ready_at


def usage_json(ledger: Ledger, user: str, limit: int) -> list[dict]:
    pairs = ledger.sessions_with_cost(user, limit=limit, newest_first=True)
    return [_session_json(session, cost) for session, cost in pairs]


def _entry_json(entry: Entry) -> dict:
    return {
        "id": entry.id,
        "kind": entry.kind,
        "amount": _money(entry.amount_micros),
        "balance": _money(entry.balance_after_micros),
        "actor": entry.actor,
        "note": entry.note,
        "session": entry.session_id,
    }


def _pass_json(held) -> dict:
    return {
        "id": held.id,
        "profile": held.profile,
        "gpus": held.gpus,
        "period": held.period,
        "price": _money(held.price_micros),
        "starts": _time(held.starts_at),
        "ends": _time(held.ends_at),
    }


def _after_refusal(method):
    """`method`, run only if prepare() kept no refusal."""

    @functools.wraps(method)
    async def run(self, *args):
        if self._refusal is not None:
            raise self._refusal
        result = method(self, *args)
        if inspect.isawaitable(result):
            await result

    return run


def _strict_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"a number of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """An object whose keys are unique: with two "amount"s, which one was meant?"""
    body: dict = {}
    for key, value in pairs:
        if key in body:
            raise ValueError(f"the key {key[:40]!r} appears twice")
        body[key] = value
    return body


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


@web.stream_request_body
class BillingHandler(HubOAuthenticated, web.RequestHandler):
    """Authentication, limits, parsing and refusals every billing route shares.

    `access` maps each method to a rule (PUBLIC, ANY, OWN, OWNER, SPEND, ADMIN); a method
    not in it is a 405. A `/users/{name}` route names the user as its first argument.
    """

    access: dict[str, str] = {}
    path: str = ""  # the route in openapi.yaml, for the request schema
    #: ask the hub about the token on every request, GETs too (a cached answer would show
    #: a group to someone removed from it, or a PI demoted, for minutes)
    fresh_auth = False

    # ------------------------------------------------------------------ settings

    @property
    def ledger(self) -> Ledger:
        return self.settings["ledger"]

    @property
    def max_grant(self) -> Decimal:
        return self.settings["max_grant"]

    # ------------------------------------------------------------------ refusals

    def write_error(self, status_code, **kwargs):
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if status_code == 405:
            self.set_header("Allow", ", ".join(sorted(self.access)))
        for name, value in getattr(exc, "headers", {}).items():  # Retry-After, WWW-Authenticate
            self.set_header(name, value)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def send(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    # ------------------------------------------------------------------ request

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("get", "post", "put", "patch", "delete"):
            if name in cls.__dict__:
                setattr(cls, name, _after_refusal(cls.__dict__[name]))

    async def prepare(self):
        """Before the body is read: the token and the rule. A refusal is kept and answered
        once the body has been read (by every method, see __init_subclass__): answering
        early would close a connection the proxy is still writing to, and the proxy's next
        request on it would fail."""
        self._chunks: list[bytes] = []
        self._size = 0
        self._refusal: web.HTTPError | None = None
        rule = self.access.get(self.request.method)
        if rule is None or rule == PUBLIC:
            return  # a method without a rule is tornado's 405 (with Allow, see write_error)
        try:
            token = self.hub_auth.get_token(self, in_cookie=False)
            if token and (self.request.method != "GET" or self.fresh_auth):
                # money moves: ask the hub now (a cached answer would let a revoked token
                # act for minutes)
                model = await self.hub_auth.user_for_token(token, use_cache=False, sync=False)
            else:
                model = await self.hub_auth.get_user(self, sync=False)
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed:
            self._hub_auth_user_cache = None
        if self.current_user is None:
            self._refusal = web.HTTPError(
                403, "A JupyterHub token that may reach the billing service is needed"
            )

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= MAX_BODY:
            self._chunks.append(chunk)

    @property
    def scopes(self) -> set[str]:
        return set((self.current_user or {}).get("scopes", ()))

    @property
    def actor(self) -> str:
        """Who wrote an entry: a user's name, or `service:<name>`."""
        model = self.current_user or {}
        kind = model.get("kind", "user")
        return model["name"] if kind == "user" else f"{kind}:{model['name']}"

    def owns(self, name: str | None) -> bool:
        model = self.current_user or {}
        return model.get("kind", "user") == "user" and model.get("name") == name

    async def authorize(self, name: str | None = None) -> None:
        """Apply the method's rule to `name` (the `/users/{name}` in the path), then
        refuse users the hub does not have."""
        rule = self.access[self.request.method]
        admin = is_billing_admin(self.scopes)
        if rule == ADMIN and not admin:
            raise web.HTTPError(
                403, "This needs the custom:meterhub:admin (or admin:users) scope on the token"
            )
        if rule == OWN and not (admin or self.owns(name)):
            raise web.HTTPError(403, "%s", _("You can only see your own wallet"))
        if rule == OWNER and not self.owns(name):
            raise web.HTTPError(
                403, "%s", _("Only the owner can do this to their own notifications")
            )
        if rule == METRICS and not may_read_metrics(self.scopes):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "Reading the billing metrics needs JupyterHub's read:metrics scope on the"
                    " token (a Prometheus service's role has it)."
                ),
            )
        if rule == SPEND:
            if not (admin or self.owns(name)):
                raise web.HTTPError(403, "%s", _("You can only spend your own credit"))
            if not may_spend(self.scopes):
                raise web.HTTPError(
                    403,
                    "Spending credit needs the custom:meterhub:spend scope; this token"
                    " (a server's own token?) may only read",
                )
        if name is not None:
            if len(name) > MAX_NAME or not await self.settings["user_exists"](name):
                raise web.HTTPError(404, "%s", _("No such user: %(name)s", name=name))

    async def authorize_group(self, group: str) -> tuple[str, list[str]]:
        """Apply a group route's rule: (the group's name, lower case, and its members).

        Managing is decided from the token's scopes: the group-admin scope filtered to this
        group (or a billing admin's). Reading (MEMBER) is also open to any token of a member,
        as any token reads its owner's own wallet: the group view only reads. A group without
        a wallet, or that the hub does not have, is a 404 once the caller may know.
        """
        rule = self.access[self.request.method]
        name = fold(group)
        admin = GROUP_NAME.match(name) is not None and administers(self.scopes, name)
        # exact, as the group admin's !group= filter is: a hub group "Lab" is not "lab"
        mine = set((self.current_user or {}).get("groups") or ())
        if rule == GROUP_ADMIN and not admin:
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "This needs custom:meterhub:group-admin!group=%(group)s (the group's admin)"
                    " or a billing admin's scope on the token",
                    group=name[:64],
                ),
            )
        if rule == MEMBER and not (admin or name in mine):
            raise web.HTTPError(
                403, "%s", _("Only the group's members and admins can see its wallet")
            )
        if rule == ADMIN and not is_billing_admin(self.scopes):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "Granting credit needs the custom:meterhub:admin (or admin:users) scope:"
                    " a group's admin moves the group's credit with caps, never makes money"
                ),
            )
        settings = await asyncio.to_thread(self.ledger.group, name)
        members = await self.settings["group_members"](name) if settings is not None else None
        if settings is None or members is None:
            raise web.HTTPError(404, "%s", _("No group %(name)s with a wallet", name=name[:64]))
        if self.request.method == "PUT":
            # a cap also binds whom the group still pays for (a member removed since)
            view = await asyncio.to_thread(self.ledger.group_view, name, members)
            members = sorted({*members, *(s.user_name for s, _cost in view.running)})
        return name, members

    async def authorize_course(self, course: str) -> str:
        """Apply a course route's rule (COURSE_STAFF: its TAs and instructors, from the
        token's scopes, or a billing admin); the course's name, lower case. 404 for a course
        the ledger does not have, once the caller may know."""
        name = fold(course)
        if not (GROUP_NAME.match(name) and teaches(self.scopes, name)):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "This needs custom:meterhub:course-staff!group=%(course)s (the course's TAs"
                    " and instructors) or a billing admin's scope on the token",
                    course=name[:64],
                ),
            )
        if self.access[self.request.method] == COURSE_INSTRUCTOR and not instructs(
            self.scopes, name
        ):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "Changing a course needs custom:meterhub:course-instructor!group=%(course)s"
                    " (its instructors; a TA's role has the console only)",
                    course=name,
                ),
            )
        if await asyncio.to_thread(self.ledger.course, name) is None:
            raise web.HTTPError(404, "%s", _("No course %(name)s", name=name[:64]))
        return name

    def body(self) -> dict:
        """The JSON body, validated against the route's schema in openapi.yaml."""
        if self._size > MAX_BODY:
            raise web.HTTPError(413, "The body is larger than %d bytes", MAX_BODY)
        raw = b"".join(self._chunks)
        try:
            body = json.loads(
                raw.decode("utf-8") if raw else "{}",
                parse_int=_strict_int,
                parse_constant=_no_constant,
                object_pairs_hook=_no_duplicates,
            )
        except (ValueError, RecursionError) as e:
            raise web.HTTPError(400, "Malformed JSON: %s", str(e)[:200]) from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "Expected a JSON object")
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise web.HTTPError(400, "Malformed JSON: text with a lone surrogate") from None
        schema = request_schema(self.path, self.request.method.lower())
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft7Validator(schema).iter_errors(body)
        )
        if error is not None:
            field = ".".join(str(p) for p in error.absolute_path) or "body"
            raise web.HTTPError(400, "%s: %s", field, error.message[:300])
        return body

    def idempotency_key(self, body: dict) -> tuple[str, bool]:
        """(key, given): the `Idempotency-Key` header (or the body's `key`), checked before
        anything else is looked at; a fresh one when none is given."""
        header = self.request.headers.get("Idempotency-Key")
        key = body.get("key")
        if header is not None and key is not None and header != key:
            raise web.HTTPError(400, "Idempotency-Key and the body's key differ")
        key = header if header is not None else key
        if key is None:
            return str(uuid.uuid4()), False
        try:
            return actions.check_key(key), True
        except actions.ActionError as e:
            raise web.HTTPError(e.status, "%s", e.message) from None

    async def act(self, function, *args, **kwargs):
        """Run an action off the event loop; its refusal becomes the HTTP answer."""
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except actions.ActionError as e:
            if e.headers:
                raise HeadedError(e.status, e.message, e.headers) from None
            raise web.HTTPError(e.status, "%s", e.message) from None

    def send_posted(self, posted, as_json) -> None:
        """201 for a new write, 200 for a replay of the same request (the same entry)."""
        self.send(as_json(posted.value), status=200 if posted.replayed else 201)

    async def catalog(self):
        """The catalog at today's prices (the site's, with admins' changes applied)."""
        return await asyncio.to_thread(priced_catalog, self.settings["config"], self.ledger)


# ---------------------------------------------------------------------- routes


class HealthHandler(BillingHandler):
    access = {"GET": PUBLIC}

    def get(self):
        meter = self.settings.get("meter")
        if meter is None:  # an app without a meter: up is healthy
            self.send({"ok": True})
            return
        health = meter.health()
        # 503 once the meter has not completed a pass for three intervals: nothing is charged
        self.send({"ok": health["ok"], "meter": health}, status=200 if health["ok"] else 503)


class MetricsHandler(BillingHandler):
    """The Prometheus metrics (billing_hooks/metrics.py), for tokens with read:metrics."""

    access = {"GET": METRICS}

    def check_hub_user(self, model):
        # a scraper's token may have read:metrics alone, as for the hub's /hub/metrics: it
        # reaches these metrics without access:services (and nothing else of billing)
        if may_read_metrics(model.get("scopes")):
            model.setdefault("kind", "user")
            return model
        return super().check_hub_user(model)

    async def get(self):
        await self.authorize()
        metrics = self.settings["metrics"]
        async with self.settings["metrics_lock"]:  # one scrape reads the ledger at a time
            body = await asyncio.to_thread(metrics.exposition)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)


class OpenAPIHandler(BillingHandler):
    access = {"GET": PUBLIC}

    async def get(self):
        self.send(openapi(self.settings["prefix"], await self.catalog()))


async def _wallet(handler: BillingHandler, name: str) -> dict | None:
    warn = handler.settings.get("warn_minutes", [])
    return await asyncio.to_thread(wallet_json, handler.ledger, name, warn)


class MeHandler(BillingHandler):
    access = {"GET": ANY}

    async def get(self):
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise web.HTTPError(400, "Use /users/<name>/wallet with a service token")
        name = model["name"]
        await asyncio.to_thread(self.ledger.ensure_user, name)
        self.send(await _wallet(self, name))


class WalletHandler(BillingHandler):
    access = {"GET": OWN}

    async def get(self, name):
        await self.authorize(name)
        if self.owns(name):
            await asyncio.to_thread(self.ledger.ensure_user, name)
        wallet = await _wallet(self, name)
        if wallet is None:
            raise web.HTTPError(
                404, "%s", _("%(name)s has no wallet yet (they have not signed in)", name=name)
            )
        self.send(wallet)


class UsageHandler(BillingHandler):
    access = {"GET": OWN}

    async def get(self, name):
        await self.authorize(name)
        limit = self.get_argument("limit", "100")
        if not (limit.isascii() and limit.isdigit() and 1 <= int(limit[:6]) <= MAX_PAGE):
            raise web.HTTPError(400, "limit: a whole number from 1 to %d", MAX_PAGE)
        sessions = await asyncio.to_thread(usage_json, self.ledger, name, int(limit))
        self.send({"sessions": sessions})


class NotificationsHandler(BillingHandler):
    access = {"GET": OWN}

    async def get(self, name):
        await self.authorize(name)
        unread = self.get_argument("unread", "false")
        if unread not in ("true", "false", "1", "0"):
            raise web.HTTPError(400, "unread: true or false")
        notes = await asyncio.to_thread(self.ledger.notifications, name, unread in ("true", "1"))
        self.send(
            {
                "notifications": [
                    {
                        "id": n.id,
                        "kind": n.kind,
                        # in the reader's language (Accept-Language, ?lang=)
                        "message": n.text(),
                        "created": _time(n.created_at),
                        "read": _time(n.read_at),
                    }
                    for n in notes
                ]
            }
        )


class ReadHandler(BillingHandler):
    """JupyterLab has shown these notifications: a reload does not show them again."""

    access = {"POST": OWNER}
    path = "/users/{name}/notifications/read"

    async def post(self, name):
        await self.authorize(name)
        ids = self.body()["ids"]
        marked = await asyncio.to_thread(self.ledger.mark_read, name, ids)
        self.send({"marked": marked})


class EntryHandler(BillingHandler):
    """A billing admin's POST that writes one ledger entry through an action, under an
    idempotency key: a grant, an adjustment or a refund."""

    access = {"POST": ADMIN}
    #: the function of billing_hooks/actions.py that writes the entry
    action: Callable[..., actions.Posted]

    async def subject(self, target: str):
        """Whose wallet or which session the path names (checked)."""
        await self.authorize(target)
        return target

    def fields(self, body: dict) -> tuple:
        raise NotImplementedError

    async def post(self, target):
        await self.authorize()  # the rule first: a stranger learns nothing from the body
        body = self.body()
        key, _replayed = self.idempotency_key(body)
        subject = await self.subject(target)
        posted = await self.act(
            type(self).action,
            self.ledger,
            subject,
            *self.fields(body),
            key,
            self.max_grant,
            "api",
            self.actor,
        )
        self.send_posted(posted, _entry_json)


class GrantHandler(EntryHandler):
    path = "/users/{name}/grants"
    action = staticmethod(actions.grant)

    def fields(self, body: dict) -> tuple:
        return body["amount"], body.get("note", "")


class AdjustmentHandler(EntryHandler):
    path = "/users/{name}/adjustments"
    action = staticmethod(actions.adjust)

    def fields(self, body: dict) -> tuple:
        return body["amount"], body["reason"]


class RefundHandler(EntryHandler):
    path = "/sessions/{session_id}/refunds"
    action = staticmethod(actions.refund)

    async def subject(self, target: str) -> int:
        if not (target.isascii() and target.isdigit() and len(target) < 16 and int(target)):
            raise web.HTTPError(404, "No session %s", target[:40])
        return int(target)

    def fields(self, body: dict) -> tuple:
        return body.get("amount"), body["reason"]


class PassesHandler(BillingHandler):
    """A user's passes and what they can buy; buying takes the price from the catalog."""

    access = {"GET": OWN, "POST": SPEND}
    path = "/users/{name}/passes"

    async def get(self, name):
        await self.authorize(name)
        held = await asyncio.to_thread(self.ledger.passes, name)
        catalog = await self.catalog()
        offers = [
            {k: offer[k] for k in ("profile", "gpus", "period", "price")}
            for offer in actions.pass_offers(catalog, self.settings["capacity"], self.groups(name))
        ]
        self.send({"passes": [_pass_json(p) for p in held], "offers": offers})

    async def post(self, name):
        await self.authorize()  # the rule first: a stranger learns nothing from the body
        body = self.body()
        key, _replayed = self.idempotency_key(body)
        await self.authorize(name)
        catalog = await self.catalog()
        posted = await self.act(
            actions.buy_pass,
            self.ledger,
            catalog,
            name,
            body["profile"],
            str(body["gpus"]),
            body["period"],
            key,
            "api",
            actor=self.actor,
            capacity=self.settings["capacity"],
            groups=self.groups(name),
        )
        self.send_posted(posted, _pass_json)

    def groups(self, name: str) -> list[str] | None:
        """The owner's own groups, which limit what they may start (and so buy a pass for);
        None for a billing admin acting on someone else's wallet."""
        if not self.owns(name):
            return None
        return list((self.current_user or {}).get("groups") or ())

    async def authorize(self, name: str | None = None) -> None:
        if name is None and self.request.method == "POST":
            # before the body: only whether this token may spend at all
            if not may_spend(self.scopes):
                raise web.HTTPError(
                    403,
                    "Spending credit needs the custom:meterhub:spend scope; this token"
                    " (a server's own token?) may only read",
                )
            return
        await super().authorize(name)


class HeadedError(web.HTTPError):
    """A refusal with headers of its own (write_error sets them after clearing the reply)."""

    def __init__(self, status: int, message: str, headers: dict[str, str]):
        super().__init__(status, "%s", message)
        self.headers = headers


def billing_settings(handler: BillingHandler) -> BillingSettings:
    """The site's billing settings, made once for the application's config."""
    return billing_settings_of(handler.settings["config"])


class RedeemHandler(BillingHandler):
    """A user redeems a voucher code into their own wallet. It needs the spend scope: a
    server's own token (what any code in a notebook holds) reads the wallet only, and must
    not be able to use up a code, nor guess at codes in the user's name."""

    access = {"POST": SPEND}
    path = "/wallet/redeem"

    async def post(self):
        model = self.current_user
        if not may_spend(self.scopes):
            raise web.HTTPError(
                403,
                "%s",
                _(
                    "Redeeming a voucher needs the custom:meterhub:spend scope; this token (a"
                    " server's own token?) may only read"
                ),
            )
        if model.get("kind", "user") != "user":
            raise web.HTTPError(400, "%s", _("A voucher is redeemed with a user's own token"))
        name = model["name"]
        await self.authorize(name)
        code = self.body()["code"]
        limits = billing_settings(self).redeem_limits
        posted = await self.act(topup_actions.redeem, self.ledger, name, code, self.actor, limits)
        self.send_posted(posted, _entry_json)


class TopUpHandler(BillingHandler):
    """A payment provider's webhook: credit a user once per transaction. Authenticated by
    the HMAC of its body (billing_hooks/topups.py), never by a JupyterHub token."""

    access = {"POST": PUBLIC}
    path = "/topups"

    async def secret(self) -> bytes:
        """The webhook's key, read once (the file may be on a slow disk): 503 without one."""
        if "topup_secret" not in self.settings:
            try:
                self.settings["topup_secret"] = await asyncio.to_thread(
                    billing_settings(self).topup_key
                )
            except (OSError, ValueError) as e:
                # the reason names the file or the length, never the secret
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                self.settings["topup_secret"] = None
                self.settings["topup_secret_problem"] = reason
        key = self.settings["topup_secret"]
        if key is None:
            problem = self.settings.get("topup_secret_problem")
            raise web.HTTPError(
                503,
                "Top-ups are not set up on this site: %s",
                problem or "billing.topup_secret (or topup_secret_file) is not set",
            )
        return key

    async def post(self):
        key = await self.secret()
        if self._size > MAX_BODY:
            raise web.HTTPError(413, "The body is larger than %d bytes", MAX_BODY)
        headers = self.request.headers
        try:
            topups.verify(
                key,
                headers.get(topups.TIMESTAMP_HEADER),
                headers.get(topups.SIGNATURE_HEADER),
                b"".join(self._chunks),
                self.ledger.clock(),
            )
        except topups.SignatureError as e:
            raise HeadedError(
                401, str(e), {"WWW-Authenticate": f'{topups.SIGNATURE_HEADER} realm="top-ups"'}
            ) from None
        body = self.body()
        user = body["user"]
        if len(user) > MAX_NAME or not await self.settings["user_exists"](user):
            raise web.HTTPError(404, "No such user: %s", user[:MAX_NAME])
        maximum = Decimal(billing_settings(self).max_topup)
        posted = await self.act(topup_actions.topup, self.ledger, body, maximum)
        self.send(
            {**_entry_json(posted.value), "user": user, "transaction": body["transaction"]},
            status=200 if posted.replayed else 201,
        )


def _price_json(profile, overrides: dict) -> dict:
    return {
        "profile": profile.slug,
        "price_per_hour": str(profile.price_per_hour),
        "per": "hour" if profile.is_debug else "GPU-hour",
        "set_by_admin": profile.slug in overrides,
    }


class PricesHandler(BillingHandler):
    """Prices per hour (per GPU-hour for GPU profiles)."""

    access = {"GET": ANY}

    async def get(self):
        catalog = await self.catalog()
        overrides = await asyncio.to_thread(self.ledger.price_overrides)
        prices = {
            slug: {k: v for k, v in _price_json(profile, overrides).items() if k != "profile"}
            for slug, profile in catalog.profiles().items()
        }
        self.send({"currency": self.ledger.currency, "prices": prices})


class PriceHandler(BillingHandler):
    """One profile's price; billing admins change it for new sessions."""

    access = {"GET": ANY, "PUT": ADMIN}
    path = "/prices/{profile}"

    async def _profile(self, slug: str):
        catalog = await self.catalog()
        profile = catalog.profiles().get(slug)
        if profile is None:
            raise web.HTTPError(
                404, "No such profile: %s; known: %s", slug[:64], ", ".join(catalog.profiles())
            )
        return profile

    async def get(self, slug):
        profile = await self._profile(slug)
        overrides = await asyncio.to_thread(self.ledger.price_overrides)
        self.send(_price_json(profile, overrides))

    async def put(self, slug):
        await self.authorize()
        await self._profile(slug)
        body = self.body()
        try:
            micros = parse_amount(body["price_per_hour"], maximum=MAX_PRICE, where="price_per_hour")
        except AmountError as e:
            raise web.HTTPError(400, "%s", str(e)) from None
        await asyncio.to_thread(self.ledger.set_price, slug, micros, self.actor)
        catalog = await self.catalog()
        overrides = await asyncio.to_thread(self.ledger.price_overrides)
        self.send(_price_json(catalog.profiles()[slug], overrides))


def group_json(view, currency: str, administered: bool) -> dict:
    """A group's wallet as the API and the group page show it."""
    return {
        "group": view.name,
        "wallet": f"group:{view.name}",
        "currency": currency,
        "balance": _money(view.balance_micros),
        "runway_seconds": view.runway_seconds,
        "runway": runway_phrase(view.runway_seconds),
        "default_for_members": view.default_for_members,
        "admins": view.admins,
        "members": [
            {
                "name": m.user,
                "spent": _money(m.spent_micros),
                "period": m.period,
                "cap": None if m.cap_micros is None else _money(m.cap_micros),
                "left": None if m.left_micros is None else _money(m.left_micros),
            }
            for m in view.members
        ],
        "running": [
            {
                "id": s.id,
                "member": s.user_name,
                "server": s.server_name,
                "profile": s.profile,
                "gpus": s.gpus,
                "rate_per_hour": _money(s.rate_micros_per_hour),
                "cost": _money(cost),
            }
            for s, cost in view.running
        ],
        "administered": administered,
    }


class GroupHandler(BillingHandler):
    fresh_auth = True
    access = {"GET": MEMBER}

    async def get(self, group):
        name, members = await self.authorize_group(group)
        view = await asyncio.to_thread(self.ledger.group_view, name, members)
        self.send(group_json(view, self.ledger.currency, administers(self.scopes, name)))


class GroupGrantHandler(BillingHandler):
    """A billing admin's grant to a group's wallet (a group admin cannot make money)."""

    access = {"POST": ADMIN}
    path = "/groups/{group}/grants"

    async def post(self, group):
        await self.authorize()  # the rule first: a stranger learns nothing from the body
        body = self.body()
        key, _replayed = self.idempotency_key(body)
        name, _members = await self.authorize_group(group)
        posted = await self.act(
            actions.grant,
            self.ledger,
            f"group:{name}",
            body["amount"],
            body.get("note", ""),
            key,
            self.max_grant,
            "api",
            self.actor,
        )
        self.send_posted(posted, _entry_json)


class GroupCapHandler(BillingHandler):
    """A group admin sets what a member may spend from the group per period."""

    access = {"PUT": GROUP_ADMIN}
    path = "/groups/{group}/caps/{name}"

    async def put(self, group, user):
        name, members = await self.authorize_group(group)
        body = self.body()
        if user not in members:
            raise web.HTTPError(
                404,
                "%s",
                _(
                    "%(user)s is not a member of the group %(group)s",
                    user=user[:64],
                    group=name,
                ),
            )
        period = body.get("period", "month")
        cap = await self.act(
            actions.set_cap, self.ledger, name, user, body["amount"], period, self.actor
        )
        self.send(
            {
                "group": name,
                "name": user,
                "cap": None if cap is None else _money(cap.amount_micros),
                "period": period,
            }
        )


def course_json(view, currency: str, signed_up: Sequence[str], instructor: bool, now: int) -> dict:
    """A course as its console and the API show it: the wallet, the settings, and each
    person on the roster with what they run, spend and have left."""
    course = view.course
    signed = set(signed_up)
    now_lab = lab_phrase(course, now) if course.windows else ""
    return {
        "course": course.name,
        "wallet": f"course:{course.name}",
        "currency": currency,
        "balance": _money(view.balance_micros),
        "in_allowances": _money(view.in_allowances_micros),
        "runway": runway_phrase(runway(view.balance_micros, view.burn_micros)),
        "allowance": None
        if course.allowance_micros is None
        else {
            "amount": _money(course.allowance_micros),
            "per": course.allowance_period,
            "expires": _time(course.expires_at),
        },
        "profiles": course.profiles.split(),
        "timezone": course.timezone,
        "windows": course.windows.splitlines(),
        "lab": now_lab,
        "debug_outside_windows": course.debug_outside_windows,
        "at_window_end": course.at_window_end,
        "roster": [
            {
                "name": r.user,
                "role": r.role,
                "full_name": r.full_name,
                "email": r.email,
                "signed_up": r.role != "student" or r.user in signed,
                "running": [
                    {
                        "id": s.id,
                        "server": s.server_name,
                        "profile": s.profile,
                        "gpus": s.gpus,
                        "rate_per_hour": _money(s.rate_micros_per_hour),
                        "cost": _money(cost),
                    }
                    for s, cost in r.running
                ],
                "spent": _money(r.spent_micros),
                "left": None if r.left_micros is None else _money(r.left_micros),
                "last_active": _time(r.last_active),
            }
            for r in view.roster
        ],
        "instructor": instructor,
    }


class CourseHandler(BillingHandler):
    """A course's console data, for its TAs and instructors; its instructors change it."""

    fresh_auth = True
    access = {"GET": COURSE_STAFF, "PATCH": COURSE_INSTRUCTOR}
    path = "/courses/{course}"

    async def get(self, course):
        await self.send_course(await self.authorize_course(course))

    async def patch(self, course):
        name = await self.authorize_course(course)
        body = self.body()
        catalog = await self.catalog()
        await self.act(course_actions.change_course, self.ledger, catalog, name, body)
        await self.send_course(name)

    async def send_course(self, name: str) -> None:
        view = await asyncio.to_thread(self.ledger.course_view, name)
        signed_up = await self.settings["group_members"](name) or []
        self.send(
            course_json(
                view,
                self.ledger.currency,
                signed_up,
                instructs(self.scopes, name),
                self.ledger.clock(),
            )
        )


class CourseRosterHandler(BillingHandler):
    """An instructor imports the roster (the students are exactly these; staff named are
    added or updated)."""

    fresh_auth = True
    access = {"PUT": COURSE_INSTRUCTOR}
    path = "/courses/{course}/roster"

    async def put(self, course):
        name = await self.authorize_course(course)
        body = self.body()
        change = await self.act(
            course_actions.import_roster, self.ledger, name, body["roster"], self.actor
        )
        self.send(
            {
                "course": name,
                "added": change.added,
                "removed": change.removed,
                "changed": change.changed,
                "unchanged": change.unchanged,
            }
        )


class GroupUsageHandler(BillingHandler):
    """The group's statement, as JSON or CSV, for its admins."""

    fresh_auth = True
    access = {"GET": GROUP_ADMIN}

    async def get(self, group):
        name, _members = await self.authorize_group(group)
        await self.statement(name)

    async def statement(self, name: str) -> None:
        """What `name`'s wallet (a course's: its allowances) paid for, JSON or CSV."""
        form = self.get_argument("format", "json")
        if form not in ("json", "csv"):
            raise web.HTTPError(400, "%s", _("format: json or csv"))
        month = self.get_argument("month", "")
        try:
            since, until = month_bounds(month) if month else (None, None)
        except ValueError as e:
            raise web.HTTPError(400, "%s", str(e)) from None
        if form == "csv":
            text = await self.act(actions.group_usage_csv, self.ledger, name, since, until)
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            suffix = f"-{month}" if month else ""
            self.set_header(
                "Content-Disposition", f'attachment; filename="meterhub-{name}{suffix}.csv"'
            )
            self.finish(text)
            return
        pairs = await asyncio.to_thread(self.ledger.group_sessions, name, since, until)
        self.send(
            {
                "sessions": [
                    {
                        "id": s.id,
                        "member": s.user_name,
                        "profile": s.profile,
                        "gpus": s.gpus,
                        "started": _time(s.started_at),
                        "stopped": _time(s.stopped_at),
                        "seconds": _metered_seconds(s),
                        "cost": _money(cost),
                    }
                    for s, cost in reversed(pairs)
                ]
            }
        )


class CourseUsageHandler(GroupUsageHandler):
    """The course's statement: every session its students' allowances paid for."""

    access = {"GET": COURSE_STAFF}

    async def get(self, course):
        await self.statement(await self.authorize_course(course))


#: (path in openapi.yaml, URL pattern under api/v1/, handler): the one table of routes
ROUTES: list[tuple[str, str, type[BillingHandler]]] = [
    ("/health", "health", HealthHandler),
    ("/openapi.json", "openapi.json", OpenAPIHandler),
    ("/wallet", "wallet", MeHandler),
    ("/wallet/redeem", "wallet/redeem", RedeemHandler),
    ("/topups", "topups", TopUpHandler),
    ("/users/{name}/wallet", r"users/([^/]+)/wallet", WalletHandler),
    ("/users/{name}/usage", r"users/([^/]+)/usage", UsageHandler),
    ("/users/{name}/notifications", r"users/([^/]+)/notifications", NotificationsHandler),
    ("/users/{name}/notifications/read", r"users/([^/]+)/notifications/read", ReadHandler),
    ("/users/{name}/grants", r"users/([^/]+)/grants", GrantHandler),
    ("/users/{name}/adjustments", r"users/([^/]+)/adjustments", AdjustmentHandler),
    ("/users/{name}/passes", r"users/([^/]+)/passes", PassesHandler),
    ("/prices", "prices", PricesHandler),
    ("/prices/{profile}", r"prices/([^/]+)", PriceHandler),
    ("/sessions/{session_id}/refunds", r"sessions/([^/]+)/refunds", RefundHandler),
    ("/groups/{group}", r"groups/([^/]+)", GroupHandler),
    ("/groups/{group}/grants", r"groups/([^/]+)/grants", GroupGrantHandler),
    ("/groups/{group}/caps/{name}", r"groups/([^/]+)/caps/([^/]+)", GroupCapHandler),
    ("/groups/{group}/usage", r"groups/([^/]+)/usage", GroupUsageHandler),
    ("/courses/{course}", r"courses/([^/]+)", CourseHandler),
    ("/courses/{course}/usage", r"courses/([^/]+)/usage", CourseUsageHandler),
    ("/courses/{course}/roster", r"courses/([^/]+)/roster", CourseRosterHandler),
]


#: (path under the service's prefix, URL pattern, handler): routes outside the REST API
SERVICE_ROUTES: list[tuple[str, str, type[BillingHandler]]] = [
    ("/metrics", "metrics", MetricsHandler),
]


def request_schema(path: str, method: str) -> dict:
    """The JSON schema of a route's body, references resolved, from openapi.yaml."""
    document = _document()
    operation = document["paths"][path][method]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    return _resolve(schema, document)


def _resolve(node, document):
    if isinstance(node, dict):
        if "$ref" in node:
            target = document
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return _resolve(target, document)
        return {k: _resolve(v, document) for k, v in node.items() if not k.startswith("x-")}
    if isinstance(node, list):
        return [_resolve(v, document) for v in node]
    return node


def openapi(prefix: str, catalog=None) -> dict:
    """The document as served: the service's URL, the catalog's profiles filled in."""
    document = copy.deepcopy(_document())
    document["servers"] = [{"url": url_path_join(prefix, "api/v1")}]
    if catalog is not None:
        gpu_profiles = [s for s, p in catalog.profiles().items() if not p.is_debug]
        schema = document["paths"]["/users/{name}/passes"]["post"]["requestBody"]
        schema["content"]["application/json"]["schema"]["properties"]["profile"]["enum"] = (
            gpu_profiles
        )
    schema = document["paths"]["/users/{name}/passes"]["post"]["requestBody"]
    periods = schema["content"]["application/json"]["schema"]["properties"]["period"]
    periods["enum"] = list(PASS_PERIODS)
    return document


def make_handlers(prefix: str) -> list:
    api = url_path_join(prefix, "api/v1")
    return (
        [(url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler)]
        + [(url_path_join(prefix, pattern), handler) for _path, pattern, handler in SERVICE_ROUTES]
        + [(url_path_join(api, pattern), handler) for _path, pattern, handler in ROUTES]
    )
