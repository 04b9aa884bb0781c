"""The hub's half of a debug-mode restart (billing_hooks/restarts.py): start again, in debug
mode on the same disk, a server the meter stopped for being idle, for reaching its user's
cap, or at the end of a lab window.

The billing service may stop servers, never start them. The hub starts these itself, in its
own process, once the server has stopped: through its own REST API, with a token of the
user's that lives two minutes and can start that one server only (`start:servers!server=U/S`),
deleted right after. So a restart is the user's own start, checked like any other: the
catalog, the wallet (the same one that paid), the course's rules, the credit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from functools import partial
from urllib.parse import quote

from jupyterhub import orm
from jupyterhub.utils import url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from meterhub.billing_hooks.hooks import LANGUAGE_ENV
from meterhub.i18n import LANGUAGES, N_, _, html_lang, using

log = logging.getLogger("meterhub.restarts")

#: a restart whose server has not stopped after this long is given up (files kept)
GIVE_UP_SECONDS = 600
#: the user's token for one restart lives this long
TOKEN_SECONDS = 120

#: why a restart did not happen: a message (marked with N_) and its values, said in each
#: reader's language when the notification is read and in English in the log and the ledger
Reason = tuple[str, dict[str, object]]


def said(reason: Reason) -> str:
    """`reason` in the language of the moment."""
    message, values = reason
    return _(message, **values)


def _server_path(user: str, server_name: str) -> str:
    path = f"api/users/{quote(user, safe='')}/server"
    if server_name:
        path = f"api/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
    return path


async def run_restarts(app, ledger) -> int:
    """Start the queued restarts whose servers have stopped; returns how many started.
    Ledger reads and writes run in threads; the hub's session on the event loop only."""
    pending = await asyncio.to_thread(ledger.pending_restarts)
    started = 0
    for restart in pending:
        reason = await _restart(app, restart, ledger.clock())
        if reason is None:
            continue  # still stopping: the next sync looks again
        outcome = ""
        if reason:
            with using("en"):
                outcome = said(reason)
            log.warning(
                "Not restarting %s/%s in debug mode: %s",
                restart.user_name,
                restart.server_name,
                outcome,
            )
            await asyncio.to_thread(
                ledger.notify,
                restart.user_name,
                f"restart-failed:{restart.id}",
                "stopped",
                partial(restart_failed, reason),
            )
        else:
            started += 1
        await asyncio.to_thread(ledger.restart_applied, restart.id, outcome)
    return started


def restart_headers(token: str, environment: dict) -> dict[str, str]:
    """The restart's request: as the user, in the language the server last started in (the
    hub starts a server in its request's language, and this request has no reader behind it:
    without the header every restarted server would come back in English)."""
    language = environment.get(LANGUAGE_ENV)
    return {
        "Authorization": f"token {token}",
        "Content-Type": "application/json",
        "Accept-Language": html_lang(language if language in LANGUAGES else "en"),
    }


def restart_failed(reason: Reason) -> str:
    """The user's notification of a restart that did not happen, in the language of the
    moment (the ledger keeps it in every language)."""
    return _(
        "Your server could not be started again in debug mode (%(reason)s). It is stopped;"
        " your files are kept. Start it from the Hub Control Panel.",
        reason=said(reason),
    )


async def _restart(app, restart, now: int) -> Reason | tuple[()] | None:
    """() when started, a reason when not, None to look again at the next sync."""
    if now - restart.created_at > GIVE_UP_SECONDS:
        # the hub was down, or the server would not stop: a restart this late would start
        # (and charge for) a server its user no longer expects
        return (
            N_("it was asked for more than %(minutes)s minutes ago"),
            {"minutes": GIVE_UP_SECONDS // 60},
        )
    try:
        user = app.users[restart.user_name]
    except KeyError:
        return (N_("the user no longer exists"), {})
    if restart.server_name and restart.server_name not in user.orm_spawners:
        return (N_("the server no longer exists"), {})
    spawner = user.spawners[restart.server_name]
    if spawner.active or spawner.pending:
        started = spawner.orm_spawner.started
        if spawner.ready and started is not None and started.timestamp() > restart.created_at:
            return (N_("its user started it again meanwhile"), {})
        return None
    token = user.new_api_token(
        note="meterhub: restart in debug mode",
        expires_in=TOKEN_SECONDS,
        # start only: `servers` would also stop and read it
        scopes=[f"start:servers!server={user.name}/{restart.server_name}"],
    )
    try:
        url = url_path_join(app.hub.url, _server_path(user.name, restart.server_name))
        await AsyncHTTPClient().fetch(
            HTTPRequest(
                url,
                method="POST",
                headers=restart_headers(token, spawner.environment),
                body=debug_options(spawner, restart.options),
                request_timeout=60,
            )
        )
    except HTTPClientError as e:
        return _refusal(e)
    except Exception as e:
        return (N_("the hub did not answer: %(error)s"), {"error": e})
    finally:
        found = orm.APIToken.find(app.db, token)
        if found is not None:
            app.db.delete(found)
            app.db.commit()
    log.info(
        "Restarted %s/%s in debug mode (%s): %s",
        user.name,
        restart.server_name,
        restart.reason,
        json.loads(restart.options),
    )
    return ()


def debug_options(spawner, options: str) -> str:
    """The restart's user options, without an environment debug mode cannot run (a GPU-only
    one, or one the catalog no longer offers): it then starts in the default environment."""
    parsed = json.loads(options)
    slug = parsed.get("environment")
    catalog = getattr(spawner, "catalog", None)
    if slug and catalog is not None:
        environment = catalog.environments_offered().get(slug)
        if environment is None or environment.gpu_only:
            log.info("Restarting %s in debug mode: %s cannot run there", spawner._log_name, slug)
            del parsed["environment"]
    return json.dumps(parsed, sort_keys=True)


def _refusal(error: HTTPClientError) -> Reason:
    """The hub's refusal of the start (its message is the hub's, in English: no reader asked)."""
    message = ""
    if error.response is not None and error.response.body:
        try:
            message = json.loads(error.response.body).get("message") or ""
        except (ValueError, AttributeError):
            pass
    if message:
        return (
            N_("the hub answered %(code)s: %(message)s"),
            {"code": error.code, "message": message},
        )
    return (N_("the hub answered %(code)s"), {"code": error.code})
