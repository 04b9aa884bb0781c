"""A Jupyter server extension in every meterhub server: `GET /api/meterhub/status`.

It answers what the notebook shows of the user's credit — balance, rate, minutes left, the
server's profile and GPUs, unread notifications — by asking the billing API with the
server's own token ($JUPYTERHUB_API_TOKEN, which the hub grants `access:services!service=
billing` and nothing more of billing). No admin token ever reaches a server.

Enabled by the spawner (`--ServerApp.jpserver_extensions=meterhub.extensions.server=True`), so it
runs in every single-user server meterhub starts.
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


def _billing_api() -> str:
    return os.environ.get("METERHUB_BILLING_URL", "").rstrip("/")


class StatusHandler(APIHandler):
    async def _fetch(self, path: str) -> dict:
        request = HTTPRequest(
            f"{_billing_api()}{path}",
            headers={"Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}"},
            request_timeout=10,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            raise web.HTTPError(502, f"The billing service answered {e.code}") from None
        except OSError as e:
            raise web.HTTPError(503, f"The billing service is unreachable: {e}") from None
        return json.loads(response.body)

    @web.authenticated
    async def get(self):
        if not _billing_api():
            raise web.HTTPError(503, "This server was started without METERHUB_BILLING_URL")
        wallet = await self._fetch("/wallet")
        user = quote(wallet["user"], safe="")
        notes = await self._fetch(f"/users/{user}/notifications?unread=1")
        self.finish(
            {
                "user": wallet["user"],
                "balance": wallet["balance"],
                "currency": wallet["currency"],
                "rate_per_hour": wallet["rate_per_hour"],
                "minutes_left": wallet["minutes_left"],
                "summary": wallet["summary"],
                "profile": os.environ.get("METERHUB_PROFILE", ""),
                "gpus": int(os.environ.get("METERHUB_GPUS") or 0),
                "notifications": notes["notifications"],
            }
        )


def _jupyter_server_extension_points():
    return [{"module": "meterhub.extensions.server"}]


def _load_jupyter_server_extension(serverapp):
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(
        ".*$", [(url_path_join(base, "api/meterhub/status"), StatusHandler)]
    )
    serverapp.log.info("meterhub: /api/meterhub/status enabled")
