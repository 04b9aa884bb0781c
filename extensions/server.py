"""A Jupyter server extension in every meterhub server: the user's credit for JupyterLab.

- `GET /api/meterhub/status`: balance, rate, minutes left, the site's warning thresholds
  (`warn_minutes`), the server's profile and GPUs, and the unread notifications.
- `POST /api/meterhub/notifications/read` with `{"ids": [1, 2]}`: JupyterLab has shown those
  notifications, so they are marked read and a reload does not show them again.

Both ask the billing API with the server's own token ($JUPYTERHUB_API_TOKEN, which the hub
grants `access:services!service=billing` and nothing more of billing); the billing service
answers only for that token's user. No admin token ever reaches a server.

Enabled in every server by the data file `jupyter-config/jupyter_server_config.d/meterhub.json`,
which installing meterhub puts into `{prefix}/etc/jupyter/jupyter_server_config.d/`.
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

#: how long one call to the billing API may take
BILLING_TIMEOUT_SECONDS = 10
#: the most notification ids one mark-read request may carry
MAX_READ_IDS = 100


def _billing_api() -> str:
    return os.environ.get("METERHUB_BILLING_URL", "").rstrip("/")


def read_ids(body: bytes) -> list[int]:
    """The ids of a mark-read request body, `{"ids": [1, 2]}`: at most `MAX_READ_IDS`
    positive integers. Anything else is a 400 that says what was expected."""
    expected = f'expected {{"ids": [...]}} with at most {MAX_READ_IDS} positive integers'
    try:
        data = json.loads(body or b"")
    except (ValueError, UnicodeDecodeError) as e:
        raise web.HTTPError(400, f"Malformed JSON ({e}): {expected}") from None
    if not isinstance(data, dict) or "ids" not in data:
        raise web.HTTPError(400, f"No ids: {expected}")
    unknown = sorted(str(key)[:40] for key in data if key != "ids")
    if unknown:
        raise web.HTTPError(400, f"Unknown key {unknown[0]!r}: {expected}")
    ids = data["ids"]
    if not isinstance(ids, list):
        raise web.HTTPError(400, f"ids is not a list: {expected}")
    if len(ids) > MAX_READ_IDS:
        raise web.HTTPError(400, f"{len(ids)} ids are too many: {expected}")
    for value in ids:
        # bool is an int in Python; true is not a notification id
        if type(value) is not int or value < 1:
            raise web.HTTPError(400, f"{json.dumps(value)[:40]} is not an id: {expected}")
    return ids


class BillingAPIHandler(APIHandler):
    """Calls the billing API as this server, with the server's own token."""

    async def billing(self, path: str, body: dict | None = None) -> dict:
        """GET `path` of the billing API, or POST `body` to it as JSON."""
        if not _billing_api():
            raise web.HTTPError(503, "This server was started without METERHUB_BILLING_URL")
        request = HTTPRequest(
            f"{_billing_api()}{path}",
            method="GET" if body is None else "POST",
            body=None if body is None else json.dumps(body),
            headers={
                "Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}",
                "Content-Type": "application/json",
            },
            request_timeout=BILLING_TIMEOUT_SECONDS,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            raise web.HTTPError(502, _billing_error(e)) from None
        except OSError as e:
            raise web.HTTPError(503, f"The billing service is unreachable: {e}") from None
        return json.loads(response.body)


def _billing_error(error: HTTPClientError) -> str:
    """What the billing service said, for a 502: its status and its message if it gave one."""
    said = ""
    if error.response is not None and error.response.body:
        try:
            said = json.loads(error.response.body).get("message") or ""
        except (ValueError, AttributeError):
            pass
    return f"The billing service answered {error.code}" + (f": {said}" if said else "")


class StatusHandler(BillingAPIHandler):
    @web.authenticated
    async def get(self):
        wallet = await self.billing("/wallet")
        user = quote(wallet["user"], safe="")
        notes = await self.billing(f"/users/{user}/notifications?unread=1")
        self.finish(
            {
                "user": wallet["user"],
                "balance": wallet["balance"],
                "currency": wallet["currency"],
                "rate_per_hour": wallet["rate_per_hour"],
                "minutes_left": wallet["minutes_left"],
                # the site's billing.warn_minutes: JupyterLab colours the status by them
                "warn_minutes": wallet.get("warn_minutes", []),
                "summary": wallet["summary"],
                "profile": os.environ.get("METERHUB_PROFILE", ""),
                "gpus": int(os.environ.get("METERHUB_GPUS") or 0),
                "notifications": notes["notifications"],
            }
        )


class ReadHandler(BillingAPIHandler):
    @web.authenticated
    async def post(self):
        ids = read_ids(self.request.body)
        if not ids:
            self.finish({"marked": 0})
            return
        user = os.environ.get("JUPYTERHUB_USER", "")
        if not user:
            raise web.HTTPError(503, "This server was started without JUPYTERHUB_USER")
        answer = await self.billing(
            f"/users/{quote(user, safe='')}/notifications/read", body={"ids": ids}
        )
        self.finish({"marked": int(answer.get("marked", 0))})


def _jupyter_server_extension_points():
    return [{"module": "meterhub.extensions.server"}]


def _load_jupyter_server_extension(serverapp):
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "api/meterhub/status"), StatusHandler),
            (url_path_join(base, "api/meterhub/notifications/read"), ReadHandler),
        ],
    )
    serverapp.log.info("meterhub: /api/meterhub/status and /notifications/read enabled")
