"""A Jupyter server extension in every meterhub server: the user's credit for JupyterLab, and
what counts as this server's activity for idle shutdown (docs/idle.md).

- `GET /api/meterhub/status`: balance, rate, minutes left, the site's warning thresholds
  (`warn_minutes`), the server's profile, GPUs and environment (its slug and `sys.prefix`),
  the unread notifications, how long the
  server has been idle of its limit (`idle`) and the soonest stop foreseeable (`stop`).
- `POST /api/meterhub/notifications/read` with `{"ids": [1, 2]}`: JupyterLab has shown those
  notifications, so they are marked read and a reload does not show them again.
- `POST /api/meterhub/activity` (204): the user is still here; counts as activity.
- `POST /api/meterhub/saving` (204): JupyterLab is about to save before a stop; neither this
  nor the saves of the next `SAVING_WINDOW_SECONDS` count as activity.

Activity is what jupyter_server reports (`ServerApp.last_activity()`, which
jupyterhub-singleuser sends to the hub every $JUPYTERHUB_ACTIVITY_INTERVAL seconds): kernels,
terminals, API requests that change something (not JupyterLab's polls), and this extension's
busy-GPU samples (a GPU turning busy is reported to the hub at once). On SIGTERM every kernel
gets SIGTERM at once and up to $METERHUB_STOP_GRACE_SECONDS less 5 s to exit before the
server shuts down, so training can checkpoint and the server still stops cleanly.

The status asks the billing API with the server's own token ($JUPYTERHUB_API_TOKEN, which
the hub grants `access:services!service=billing` and nothing more of billing); the billing
service answers only for that token's user. No admin token ever reaches a server.

Enabled in every server by the data file `jupyter-config/jupyter_server_config.d/meterhub.json`,
which installing meterhub puts into `{prefix}/etc/jupyter/jupyter_server_config.d/`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

#: how long one call to the billing API may take
BILLING_TIMEOUT_SECONDS = 10
#: the most notification ids one mark-read request may carry
MAX_READ_IDS = 100
#: after `POST /api/meterhub/saving`, saves do not count as activity for this long
SAVING_WINDOW_SECONDS = 30
#: methods that only read: an open JupyterLab tab sends them every few seconds by itself
READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: the method of a save through the contents API (a PATCH there is a rename)
SAVE_METHODS = frozenset({"PUT"})
#: $JUPYTERHUB_ACTIVITY_INTERVAL when the spawner set none (the catalog's default)
DEFAULT_ACTIVITY_INTERVAL_SECONDS = 60
#: jupyter_server counts every `settings` key ending in `_last_activity` as activity
GPU_ACTIVITY_KEY = "meterhub_gpu_last_activity"
#: monotonic deadline of the saving window (not an activity key: no `_last_activity` ending)
SAVING_UNTIL_KEY = "meterhub_saving_until"
#: idle actions a server can be told ($METERHUB_ON_IDLE)
IDLE_ACTIONS = ("stop", "debug")
#: jupyterhub-singleuser's server extension (`JupyterHubSingleUser.name`), which reports the
#: server's activity to the hub
SINGLEUSER_EXTENSION = "jupyterhub-singleuser"
#: what jupyter_server's own shutdown takes after the grace period: it asks the kernels to
#: shut down and kills them 5 s later, which must come before the spawner's SIGKILL
SERVER_SHUTDOWN_SECONDS = 5

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    """Now, UTC-aware, as jupyter_server stamps activity (tests may replace it)."""
    return datetime.now(UTC)


def monotonic() -> float:
    """The clock of the saving window and of the kernels' grace (tests may replace it)."""
    return time.monotonic()


def _env_int(environ: Mapping[str, str], name: str, default: int = 0) -> int:
    try:
        return int(environ.get(name) or default)
    except ValueError:
        return default


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


# ---------------------------------------------------------------------- activity


#: what an open JupyterLab tab writes by itself, with nobody at it: its workspace (the
#: layout), every 10 s while visible
BACKGROUND_WRITES = ("lab/api/workspaces",)


def counts_as_activity(
    method: str, path: str, base_url: str, saving_until: float, now: float
) -> bool:
    """Whether an API request is the user's activity (pure): one that changes something.

    Reads (GET, HEAD, OPTIONS) are not: an open JupyterLab tab polls kernels, sessions,
    terminals and the file browser by itself. Nor are the writes a tab makes by itself
    (`BACKGROUND_WRITES`: it saves its layout every 10 s while visible). A save (a PUT under
    `/api/contents`) before `saving_until` is not either: JupyterLab announced it saves because meterhub is
    about to stop the server, and that save must not cancel the stop.
    """
    if method.upper() in READ_ONLY_METHODS:
        return False
    for prefix in BACKGROUND_WRITES:
        under = url_path_join(base_url, prefix)
        if path == under or path.startswith(under + "/"):
            return False
    if now < saving_until and method.upper() in SAVE_METHODS:
        contents = url_path_join(base_url, "api/contents")
        if path == contents or path.startswith(contents + "/"):
            return False
    return True


_jupyter_update_api_activity = APIHandler.update_api_activity


def _update_api_activity(self: APIHandler) -> None:
    """jupyter_server's `APIHandler.update_api_activity`, for requests that change something."""
    if counts_as_activity(
        self.request.method or "",
        self.request.path,
        self.settings.get("base_url", "/"),
        self.settings.get(SAVING_UNTIL_KEY, 0.0),
        monotonic(),
    ):
        _jupyter_update_api_activity(self)


def patch_api_activity() -> None:
    """Count only API requests that change something as activity (see counts_as_activity).

    Why a patch: jupyter_server stamps `api_last_activity` on every authenticated API
    request, JupyterLab's constant GET polls included, so a forgotten tab would keep an idle
    GPU running (and charging) for ever. jupyter_server has no setting for it, only a
    per-handler-class `_track_activity` and a `no_track_activity` query argument JupyterLab
    does not send. This replaces that one method, which still does the stamping.
    """
    APIHandler.update_api_activity = _update_api_activity


class ActivityHandler(APIHandler):
    """`POST /api/meterhub/activity`: the user is still here (a POST: it counts)."""

    @web.authenticated
    def post(self):
        self.set_status(204)
        self.finish()


class SavingHandler(APIHandler):
    """`POST /api/meterhub/saving`: JupyterLab is about to save its dirty documents because
    a stop is near; neither this request nor the saves that follow count as activity."""

    _track_activity = False

    @web.authenticated
    def post(self):
        self.settings[SAVING_UNTIL_KEY] = monotonic() + SAVING_WINDOW_SECONDS
        self.set_status(204)
        self.finish()


# ---------------------------------------------------------------------- idle and stop


def idle_status(environ: Mapping[str, str], last_activity: datetime, now: datetime) -> dict | None:
    """The `idle` key of the status: None when the server is never idle-stopped
    ($METERHUB_IDLE_SECONDS 0 or absent), else how long it has been idle of its limit."""
    limit = _env_int(environ, "METERHUB_IDLE_SECONDS")
    if limit <= 0:
        return None
    action = environ.get("METERHUB_ON_IDLE", "stop")
    return {
        "idle_seconds": max(0, int((now - last_activity).total_seconds())),
        "limit_seconds": limit,
        "warn_seconds": max(0, _env_int(environ, "METERHUB_IDLE_WARN_SECONDS")),
        "action": action if action in IDLE_ACTIONS else "stop",
    }


def _whole(value) -> int | None:
    # bool is an int in Python; true is not a number of seconds
    return value if type(value) is int else None


def soonest_stop(idle: dict | None, wallet: Mapping, server_name: str) -> dict | None:
    """The `stop` key of the status (pure): the soonest stop foreseeable, or None.

    Candidates: the user's credit running out (`minutes_left` of the billing wallet), this
    server's session cap (the wallet's `servers` entry named `server_name`, "" for the
    default server: `cap.left_seconds`), and the idle deadline. On a tie credit wins, then
    the cap: activity would not put those off.
    """
    candidates: list[tuple[str, int]] = []
    minutes = _whole(wallet.get("minutes_left"))
    if minutes is not None:
        candidates.append(("credit", max(0, minutes * 60)))
    servers = wallet.get("servers")
    for entry in servers if isinstance(servers, list) else []:
        if isinstance(entry, dict) and entry.get("server") == server_name:
            cap = entry.get("cap")
            left = _whole(cap.get("left_seconds")) if isinstance(cap, dict) else None
            if left is not None:
                candidates.append(("cap", max(0, left)))
    if idle is not None and idle["limit_seconds"] > 0:
        candidates.append(("idle", max(0, idle["limit_seconds"] - idle["idle_seconds"])))
    if not candidates:
        return None
    reason, seconds = min(candidates, key=lambda candidate: candidate[1])
    return {"reason": reason, "in_seconds": seconds}


# ---------------------------------------------------------------------- GPU activity


def visible_devices(cuda_visible_devices: str | None) -> list[str] | None:
    """This server's GPUs as $CUDA_VISIBLE_DEVICES names them (UUIDs or indices); None when
    it is not set: every GPU NVML shows (a Kubernetes container sees only its own)."""
    if cuda_visible_devices is None:
        return None
    return [name.strip() for name in cuda_visible_devices.split(",") if name.strip()]


async def notify_hub(serverapp) -> None:
    """Have jupyterhub-singleuser report the server's activity (`last_activity()`, a busy GPU
    included) to the hub now instead of at its next interval, with its own token and retries.
    Nothing without it (a server not started by a hub) or without an activity URL."""
    point = serverapp.extension_manager.extension_points.get(SINGLEUSER_EXTENSION)
    singleuser = point.app if point is not None else None
    if singleuser is None or not getattr(singleuser, "hub_activity_url", ""):
        return
    try:
        await singleuser.notify_activity()
    except Exception as e:  # it retried for a minute; its next report tries again
        serverapp.log.warning("meterhub: could not report GPU activity to the hub: %s", e)


class GpuMonitor:
    """Samples this server's GPUs with NVML (the `pynvml` module) every `interval_seconds`,
    in a thread; while one is above `busy_percent` utilization it stamps the server's
    activity (`settings[GPU_ACTIVITY_KEY]`), which jupyterhub-singleuser reports to the hub
    with the rest. A GPU turning busy is reported to the hub at once (`notify()`, once the
    stamp is in place).

    Without NVML (no library, no GPU, an error) it logs once and the server runs on.
    """

    def __init__(
        self,
        settings: dict,
        devices: list[str] | None,
        busy_percent: int,
        interval_seconds: float,
        notify: Callable[[], Awaitable[None]] | None = None,
        logger: logging.Logger = log,
    ):
        self.settings = settings
        self.devices = devices
        self.busy_percent = busy_percent
        self.interval_seconds = interval_seconds
        self.log = logger
        self.notify = notify
        #: whether the last sample found a GPU busy
        self.busy = False
        self._nvml = None
        self._handles: list | None = None
        self._warned = False
        self._task: asyncio.Task | None = None

    def _open(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        try:
            if self.devices is None:
                count = pynvml.nvmlDeviceGetCount()
                handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            else:
                handles = [
                    pynvml.nvmlDeviceGetHandleByIndex(int(name))
                    if name.isdigit()
                    else pynvml.nvmlDeviceGetHandleByUUID(name)
                    for name in self.devices
                ]
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self._nvml, self._handles = pynvml, handles

    def _close(self) -> None:
        """Shut NVML down (it counts its initializations: each needs its shutdown)."""
        nvml, self._nvml, self._handles = self._nvml, None, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception as e:
                self.log.debug("meterhub: nvmlShutdown failed: %s", e)

    def utilization(self) -> list[int]:
        """Each of the server's GPUs' utilization in percent (blocking: NVML)."""
        if self._handles is None:
            self._open()
        try:
            return [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
        except Exception:
            self._close()  # open again next time: a GPU may have been reset
            raise

    async def sample(self) -> bool | None:
        """One sample: True (a GPU is busy), False, or None (NVML failed; logged once)."""
        try:
            percents = await asyncio.to_thread(self.utilization)
        except Exception as e:  # ImportError, NVMLError, ...: the server must run on
            if not self._warned:
                self._warned = True
                self.log.warning(
                    "meterhub: cannot read GPU utilization (%s: %s); a busy GPU will not"
                    " count as activity",
                    type(e).__name__,
                    e,
                )
            return None
        busy = any(percent > self.busy_percent for percent in percents)
        if busy:
            now = utcnow()
            self.settings[GPU_ACTIVITY_KEY] = now
            if not self.busy and self.notify is not None:
                await self.notify()
        self.busy = busy
        return busy

    async def run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval_seconds)

    def start(self) -> None:
        """Start sampling on the running event loop."""
        self._task = asyncio.ensure_future(self.run())


def gpu_monitor(
    settings: dict,
    environ: Mapping[str, str] = os.environ,
    notify: Callable[[], Awaitable[None]] | None = None,
    logger: logging.Logger = log,
) -> GpuMonitor | None:
    """The monitor of a server with GPUs ($METERHUB_GPUS > 0), from its environment."""
    if _env_int(environ, "METERHUB_GPUS") <= 0:
        return None
    interval = _env_int(environ, "JUPYTERHUB_ACTIVITY_INTERVAL", DEFAULT_ACTIVITY_INTERVAL_SECONDS)
    return GpuMonitor(
        settings,
        visible_devices(environ.get("CUDA_VISIBLE_DEVICES")),
        busy_percent=_env_int(environ, "METERHUB_GPU_BUSY_PERCENT", 5),
        interval_seconds=max(1, interval),
        notify=notify,
        logger=logger,
    )


# ---------------------------------------------------------------------- stopping


def install_graceful_stop(serverapp, grace_seconds: int) -> None:
    """On SIGTERM, SIGTERM every kernel at once and give them up to `grace_seconds` less
    `SERVER_SHUTDOWN_SECONDS` to exit before jupyter_server's own shutdown, which would
    interrupt them (SIGINT), ask them to shut down and kill them 5 s later: a training loop
    that checkpoints on SIGTERM gets the grace period, and the server still shuts down cleanly
    before the spawner (or the kubelet) kills what is left at its end. A second SIGTERM stops
    at once. Called after jupyter_server set its own handler."""
    stop = signal.getsignal(signal.SIGTERM)
    if grace_seconds <= 0 or not callable(stop):
        return
    loop = serverapp.io_loop.asyncio_loop
    wait_seconds = max(0, grace_seconds - SERVER_SHUTDOWN_SECONDS)
    stopping = False

    def on_sigterm(signum, frame):
        nonlocal stopping
        if stopping:
            stop(signum, frame)
            return
        stopping = True
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(terminate_then(signum)))

    async def terminate_then(signum):
        try:
            await terminate_kernels(serverapp.kernel_manager, wait_seconds, serverapp.log)
        finally:
            stop(signum, None)

    signal.signal(signal.SIGTERM, on_sigterm)


async def terminate_kernels(kernel_manager, grace_seconds: float, logger) -> None:
    """SIGTERM every kernel (their restarters stopped first, or a kernel that exits would be
    started again) and wait until none is alive, at most `grace_seconds`."""
    kernels = []
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
            kernel.stop_restarter()
            await ensure_async(kernel.signal_kernel(signal.SIGTERM))
            kernels.append(kernel)
        except Exception as e:  # gone meanwhile
            logger.debug("meterhub: could not SIGTERM kernel %s: %s", kernel_id, e)
    if not kernels:
        return
    logger.info(
        "meterhub: stopping: sent SIGTERM to %d kernels; up to %s s for them to exit",
        len(kernels),
        grace_seconds,
    )
    deadline = monotonic() + grace_seconds
    while monotonic() < deadline:
        alive = [kernel for kernel in kernels if await ensure_async(kernel.is_alive())]
        if not alive:
            return
        kernels = alive
        await asyncio.sleep(0.2)
    logger.warning("meterhub: %d kernels did not exit within %s s", len(kernels), grace_seconds)


# ---------------------------------------------------------------------- billing


class BillingAPIHandler(APIHandler):
    """Calls the billing API as this server, with the server's own token."""

    async def billing(self, path: str, body: dict | None = None) -> dict:
        """GET `path` of the billing API, or POST `body` to it as JSON; in the language
        JupyterLab shows (its `?lang=`), so that messages come back in it."""
        if not _billing_api():
            raise web.HTTPError(503, "This server was started without METERHUB_BILLING_URL")
        request = HTTPRequest(
            f"{_billing_api()}{path}",
            method="GET" if body is None else "POST",
            body=None if body is None else json.dumps(body),
            headers={
                "Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}",
                "Content-Type": "application/json",
                "Accept-Language": lab_language(self.get_argument("lang", "")),
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


def _server_user() -> str:
    """The user this server belongs to ($JUPYTERHUB_USER); the billing service answers only
    for the token's user, so another name gets a 403 there, not someone else's data."""
    user = os.environ.get("JUPYTERHUB_USER", "")
    if not user:
        raise web.HTTPError(503, "This server was started without JUPYTERHUB_USER")
    return user


class StatusHandler(BillingAPIHandler):
    @web.authenticated
    async def get(self):
        user = _server_user()
        wallet, notes = await asyncio.gather(
            self.billing("/wallet"),
            self.billing(f"/users/{quote(user, safe='')}/notifications?unread=1"),
        )
        # the same activity jupyterhub-singleuser reports to the hub, busy GPUs included
        idle = idle_status(os.environ, self.application.last_activity(), utcnow())
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
                "gpus": _env_int(os.environ, "METERHUB_GPUS"),
                # what it runs: the environment chosen at spawn, and where it lives
                "environment": os.environ.get("METERHUB_ENVIRONMENT", ""),
                "prefix": sys.prefix,
                "notifications": notes["notifications"],
                "idle": idle,
                "stop": soonest_stop(idle, wallet, os.environ.get("JUPYTERHUB_SERVER_NAME", "")),
            }
        )


class ReadHandler(BillingAPIHandler):
    # the page marks what it showed by itself: marking an idle warning read must not
    # postpone the stop it warns of
    _track_activity = False

    @web.authenticated
    async def post(self):
        ids = read_ids(self.request.body)
        if not ids:
            self.finish({"marked": 0})
            return
        answer = await self.billing(
            f"/users/{quote(_server_user(), safe='')}/notifications/read", body={"ids": ids}
        )
        self.finish({"marked": int(answer.get("marked", 0))})


#: JupyterLab's defaults in every meterhub server (no news pop-up, no update check), and
#: those of each language a server may start in ($METERHUB_LANGUAGE): labconfig folders
#: added to JUPYTER_CONFIG_PATH, where JupyterLab reads `default_setting_overrides.json`
LABCONFIG = Path(__file__).parent / "labconfig"
LANGUAGE_TAG = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8}){0,2}\Z")


def lab_language(asked: str) -> str:
    """An Accept-Language header for the billing API from JupyterLab's language code
    (`zh-CN`, `en`); the server's own language when it asked for none or for nonsense."""
    for tag in (asked, os.environ.get("METERHUB_LANGUAGE", "")):
        if tag and LANGUAGE_TAG.match(tag):
            return tag.replace("_", "-")
    return "en"


def lab_config_path(environ: Mapping[str, str]) -> str:
    """JUPYTER_CONFIG_PATH with meterhub's JupyterLab defaults first: the base ones, and the
    language's when the server starts in one meterhub ships defaults for."""
    folders = [str(LABCONFIG / "base")]
    language = environ.get("METERHUB_LANGUAGE", "")
    if language and (LABCONFIG / language).is_dir() and language.replace("_", "").isalnum():
        folders.insert(0, str(LABCONFIG / language))
    present = environ.get("JUPYTER_CONFIG_PATH", "")
    return os.pathsep.join([*folders, *([present] if present else [])])


def _jupyter_server_extension_points():
    return [{"module": "meterhub.extensions.server"}]


def _load_jupyter_server_extension(serverapp):
    # read per request by JupyterLab's settings (jupyterlab_server), so set before any
    os.environ["JUPYTER_CONFIG_PATH"] = lab_config_path(os.environ)
    base = serverapp.web_app.settings["base_url"]
    from .ssh import handlers as ssh_handlers

    serverapp.web_app.add_handlers(
        ".*$",
        [
            *ssh_handlers(base),
            (url_path_join(base, "api/meterhub/status"), StatusHandler),
            (url_path_join(base, "api/meterhub/notifications/read"), ReadHandler),
            (url_path_join(base, "api/meterhub/activity"), ActivityHandler),
            (url_path_join(base, "api/meterhub/saving"), SavingHandler),
        ],
    )
    patch_api_activity()
    grace = _env_int(os.environ, "METERHUB_STOP_GRACE_SECONDS")
    install_graceful_stop(serverapp, grace)
    monitor = gpu_monitor(
        serverapp.web_app.settings, notify=lambda: notify_hub(serverapp), logger=serverapp.log
    )
    if monitor is not None:
        # held for as long as the server runs: the event loop keeps only a weak reference to
        # the monitor's task (asyncio.ensure_future), which must not be collected mid-run
        serverapp.web_app.settings["meterhub_gpu_monitor"] = monitor
        serverapp.io_loop.add_callback(monitor.start)
    serverapp.log.info(
        "meterhub: /api/meterhub/{status,notifications/read,activity,saving} enabled;"
        " reads are not activity; %s; kernels get %s s on SIGTERM",
        f"GPUs sampled every {monitor.interval_seconds} s" if monitor else "no GPUs to sample",
        grace,
    )
