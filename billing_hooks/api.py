"""The billing REST API under /services/billing/api/v1/, authenticated through the hub.

Users read their own wallet, usage and notifications (OAuth cookie or a token with
`access:services!service=billing`); admins (the `admin:users` scope) read anyone's and grant
credit. Bad JSON, bad amounts and other users' data get a 4xx with a message, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from meterhub.spawner.catalog import GPU_COUNTS, GPU_TYPES, PASS_PERIODS

from . import actions
from .ledger import Ledger
from .money import (
    AmountError,
    format_duration,
    format_money,
    from_micros,
    parse_amount,
    seconds_covered,
)
from .orm import MeteredSession
from .settings import priced_catalog

MAX_PAGE = 500


def _money(micros: int) -> str:
    return str(from_micros(micros).quantize(Decimal("0.01")))


def _time(epoch: int | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


def wallet_json(ledger: Ledger, user: str) -> dict | None:
    """A user's wallet as the API, the pages and JupyterLab show it (blocking)."""
    balance = ledger.balance(user)
    if balance is None:
        return None
    running = ledger.sessions_with_cost(user, open_only=True)
    rate = sum(s.rate_micros_per_hour for s, _cost in running)
    seconds = seconds_covered(balance + ledger.overdraft_micros, rate)
    currency = ledger.currency
    summary = f"{format_money(balance, currency)}"
    if rate:
        summary += f" · {format_money(rate, currency)}/h · {format_duration(seconds)} left"
    return {
        "user": user,
        "currency": currency,
        "balance": _money(balance),
        "balance_micros": balance,
        "rate_per_hour": _money(rate),
        "minutes_left": None if seconds is None else seconds // 60,
        "summary": summary,
        "running": [_session_json(s, cost) for s, cost in running],
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
        "seconds": (session.metered_through - session.ready_at) if session.ready_at else 0,
        "cost": _money(cost),
        "cost_micros": cost,
    }


def usage_json(ledger: Ledger, user: str, limit: int) -> list[dict]:
    pairs = ledger.sessions_with_cost(user, limit=limit, newest_first=True)
    return [_session_json(session, cost) for session, cost in pairs]


class BillingHandler(HubOAuthenticated, web.RequestHandler):
    @property
    def ledger(self) -> Ledger:
        return self.settings["ledger"]

    @property
    def max_grant(self) -> Decimal:
        return self.settings["max_grant"]

    def write_error(self, status_code, **kwargs):
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def send(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def is_admin(self) -> bool:
        model = self.current_user or {}
        return "admin:users" in set(model.get("scopes", [])) or bool(model.get("admin"))

    def check_user(self, name: str) -> None:
        model = self.current_user or {}
        if model.get("kind", "user") == "user" and model.get("name") == name:
            return
        if not self.is_admin():
            raise web.HTTPError(403, "You can only see your own wallet")

    async def catalog(self):
        """The catalog at today's prices (the site's, with admins' changes applied)."""
        return await asyncio.to_thread(priced_catalog, self.settings["config"], self.ledger)

    def json_body(self) -> dict:
        try:
            body = json.loads(self.request.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise web.HTTPError(400, "Malformed JSON: %s", str(e)) from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "Expected a JSON object")
        return body


class MeHandler(BillingHandler):
    @web.authenticated
    async def get(self):
        name = (self.current_user or {}).get("name")
        if (self.current_user or {}).get("kind", "user") != "user":
            raise web.HTTPError(400, "Use /users/<name>/wallet with a service token")
        wallet = await asyncio.to_thread(wallet_json, self.ledger, name)
        if wallet is None:
            await asyncio.to_thread(self.ledger.ensure_user, name)
            wallet = await asyncio.to_thread(wallet_json, self.ledger, name)
        self.send(wallet)


class WalletHandler(BillingHandler):
    @web.authenticated
    async def get(self, name):
        self.check_user(name)
        wallet = await asyncio.to_thread(wallet_json, self.ledger, name)
        if wallet is None:
            raise web.HTTPError(404, "No wallet for %s", name)
        self.send(wallet)


class UsageHandler(BillingHandler):
    @web.authenticated
    async def get(self, name):
        self.check_user(name)
        try:
            limit = min(int(self.get_argument("limit", "100")), MAX_PAGE)
        except ValueError:
            raise web.HTTPError(400, "limit must be a whole number") from None
        self.send(
            {"sessions": await asyncio.to_thread(usage_json, self.ledger, name, max(1, limit))}
        )


class NotificationsHandler(BillingHandler):
    @web.authenticated
    async def get(self, name):
        self.check_user(name)
        unread = self.get_argument("unread", "") in ("1", "true")
        notes = await asyncio.to_thread(self.ledger.notifications, name, unread)
        self.send(
            {
                "notifications": [
                    {
                        "id": n.id,
                        "kind": n.kind,
                        "message": n.message,
                        "created": _time(n.created_at),
                        "read": _time(n.read_at),
                    }
                    for n in notes
                ]
            }
        )


class GrantHandler(BillingHandler):
    @web.authenticated
    async def post(self, name):
        if not self.is_admin():
            raise web.HTTPError(403, "Granting credit needs the admin:users scope")
        body = self.json_body()
        if not await self.user_exists(name):
            raise web.HTTPError(404, "No such user: %s", name)
        try:
            entry = await asyncio.to_thread(
                actions.grant,
                self.ledger,
                name,
                body.get("amount"),
                body.get("note", ""),
                body.get("key") or str(uuid.uuid4()),
                self.max_grant,
                "api",
            )
        except actions.ActionError as e:
            raise web.HTTPError(e.status, "%s", e.message) from None
        self.send(
            {
                "id": entry.id,
                "amount": _money(entry.amount_micros),
                "balance": _money(entry.balance_after_micros),
            },
            status=201,
        )

    async def user_exists(self, name: str) -> bool:
        return await self.settings["user_exists"](name)


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


class PassesHandler(BillingHandler):
    """A user's passes and what they can buy; buying takes the price from the catalog."""

    @web.authenticated
    async def get(self, name):
        self.check_user(name)
        held = await asyncio.to_thread(self.ledger.passes, name)
        catalog = await self.catalog()
        offers = [
            {k: offer[k] for k in ("profile", "gpus", "period", "price")}
            for offer in actions.pass_offers(catalog)
        ]
        self.send({"passes": [_pass_json(p) for p in held], "offers": offers})

    @web.authenticated
    async def post(self, name):
        self.check_user(name)
        body = self.json_body()
        catalog = await self.catalog()
        try:
            held = await asyncio.to_thread(
                actions.buy_pass,
                self.ledger,
                catalog,
                name,
                body.get("profile"),
                body.get("gpus"),
                body.get("period"),
                body.get("key") or str(uuid.uuid4()),
                "api",
            )
        except actions.ActionError as e:
            raise web.HTTPError(e.status, "%s", e.message) from None
        self.send(_pass_json(held), status=201)


class PricesHandler(BillingHandler):
    """Prices per hour (per GPU-hour for GPU profiles); admins change them for new sessions."""

    @web.authenticated
    async def get(self):
        catalog = await self.catalog()
        overrides = await asyncio.to_thread(self.ledger.price_overrides)
        self.send(
            {
                "currency": self.ledger.currency,
                "prices": {
                    slug: {
                        "price_per_hour": str(profile.price_per_hour),
                        "per": "hour" if profile.is_debug else "GPU-hour",
                        "set_by_admin": slug in overrides,
                    }
                    for slug, profile in catalog.profiles().items()
                },
            }
        )

    @web.authenticated
    async def put(self, slug=None):
        if not self.is_admin():
            raise web.HTTPError(403, "Setting prices needs the admin:users scope")
        catalog = await self.catalog()
        if slug not in catalog.profiles():
            raise web.HTTPError(
                404, "No such profile: %s; known: %s", slug, ", ".join(catalog.profiles())
            )
        body = self.json_body()
        try:
            micros = parse_amount(body.get("price_per_hour"), maximum=Decimal("1000000"))
        except AmountError as e:
            raise web.HTTPError(400, "%s", str(e)) from None
        await asyncio.to_thread(self.ledger.set_price, slug, micros)
        self.send({"profile": slug, "price_per_hour": _money(micros)})


class OpenAPIHandler(web.RequestHandler):
    def get(self):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(openapi(self.settings["prefix"])))


def _json_body(required: list[str], properties: dict) -> dict:
    """An OpenAPI request body: a JSON object with these properties."""
    schema = {"type": "object", "required": required, "properties": properties}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def openapi(prefix: str) -> dict:
    user = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    ok = {"description": "OK"}
    errors = {
        str(code): {"description": why}
        for code, why in (
            (400, "bad input"),
            (403, "not yours or not admin"),
            (404, "no such wallet or user"),
        )
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "meterhub billing", "version": "1"},
        "servers": [{"url": url_path_join(prefix, "api/v1")}],
        "components": {
            "securitySchemes": {
                "token": {"type": "apiKey", "in": "header", "name": "Authorization"}
            }
        },
        "security": [{"token": []}],
        "paths": {
            "/wallet": {
                "get": {"summary": "The caller's wallet", "responses": {"200": ok, **errors}}
            },
            "/users/{name}/wallet": {
                "get": {
                    "summary": "A user's wallet (own, or admin)",
                    "parameters": [user],
                    "responses": {"200": ok, **errors},
                }
            },
            "/users/{name}/usage": {
                "get": {
                    "summary": "A user's sessions, newest first",
                    "parameters": [
                        user,
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "maximum": MAX_PAGE},
                        },
                    ],
                    "responses": {"200": ok, **errors},
                }
            },
            "/users/{name}/notifications": {
                "get": {
                    "summary": "Credit warnings and stops",
                    "parameters": [
                        user,
                        {"name": "unread", "in": "query", "schema": {"type": "boolean"}},
                    ],
                    "responses": {"200": ok, **errors},
                }
            },
            "/users/{name}/passes": {
                "get": {
                    "summary": "A user's passes and the passes on offer",
                    "parameters": [user],
                    "responses": {"200": ok, **errors},
                },
                "post": {
                    "summary": "Buy a pass from the wallet (own, or admin)",
                    "parameters": [user],
                    "requestBody": _json_body(
                        ["profile", "gpus", "period"],
                        {
                            "profile": {"type": "string", "enum": list(GPU_TYPES)},
                            "gpus": {"type": "string", "enum": [str(n) for n in GPU_COUNTS]},
                            "period": {"type": "string", "enum": list(PASS_PERIODS)},
                            "key": {"type": "string", "maxLength": 120},
                        },
                    ),
                    "responses": {
                        "201": {"description": "bought"},
                        "402": {"description": "not enough credit"},
                        "409": {"description": "key reused"},
                        **errors,
                    },
                },
            },
            "/prices": {"get": {"summary": "Prices per hour by profile", "responses": {"200": ok}}},
            "/prices/{profile}": {
                "put": {
                    "summary": "Set a profile's price for new sessions (admin:users)",
                    "parameters": [
                        {
                            "name": "profile",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": _json_body(
                        ["price_per_hour"],
                        {"price_per_hour": {"type": "string", "example": "4.80"}},
                    ),
                    "responses": {"200": ok, **errors},
                }
            },
            "/users/{name}/grants": {
                "post": {
                    "summary": "Grant credit (admin:users)",
                    "parameters": [user],
                    "requestBody": _json_body(
                        ["amount"],
                        {
                            "amount": {"type": "string", "example": "12.50"},
                            "note": {"type": "string"},
                            "key": {"type": "string", "maxLength": 120},
                        },
                    ),
                    "responses": {
                        "201": {"description": "granted"},
                        "409": {"description": "key reused with another amount"},
                        **errors,
                    },
                }
            },
        },
    }


def make_handlers(prefix: str) -> list:
    api = url_path_join(prefix, "api/v1")
    return [
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        (url_path_join(api, "openapi.json"), OpenAPIHandler),
        (url_path_join(api, "wallet"), MeHandler),
        (url_path_join(api, r"users/([^/]+)/wallet"), WalletHandler),
        (url_path_join(api, r"users/([^/]+)/usage"), UsageHandler),
        (url_path_join(api, r"users/([^/]+)/notifications"), NotificationsHandler),
        (url_path_join(api, r"users/([^/]+)/grants"), GrantHandler),
        (url_path_join(api, r"users/([^/]+)/passes"), PassesHandler),
        (url_path_join(api, "prices"), PricesHandler),
        (url_path_join(api, r"prices/([^/]+)"), PricesHandler),
    ]
