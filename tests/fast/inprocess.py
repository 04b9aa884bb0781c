"""An in-process meterhub for fast tests; the fixtures are in conftest.py."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import jupyterhub
import pytest
import requests
import yaml
from jupyterhub.proxy import Proxy
from jupyterhub.services.auth import HubOAuth
from sqlalchemy import event
from tornado import httpserver, web
from traitlets.config import Config

from meterhub.billing_hooks import service
from meterhub.billing_hooks.api import MAX_BODY
from meterhub.billing_hooks.clock import FakeClock
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.meter import HubClient
from meterhub.billing_hooks.scopes import BILLING_SERVICE
from meterhub.billing_hooks.settings import BillingSettings, _engine
from meterhub.hub import app as hub_app
from meterhub.hub.accounts import add_user
from meterhub.hub.config import load_site_config
from meterhub.spawner.allocator import NotEnoughGpus
from meterhub.spawner.local import LocalGPUSpawner

from ..hubprocess import ADMIN_TOKEN, free_port

#: the real BillingSettings.ledger, and the fake clock of each in-process hub's ledger
_LEDGER = BillingSettings.ledger
_CLOCKS: dict[str, FakeClock] = {}


def _ledger_on_fake_clock(settings: BillingSettings) -> Ledger:
    """BillingSettings.ledger while in-process hubs run: the hub's clock, not the wall's."""
    ledger = _LEDGER(settings)
    ledger.clock = _CLOCKS.get(settings.db_url, ledger.clock)
    return ledger


#: every test module here: the `fast` marker, and the module's event loop (the hub's)
FAST = [pytest.mark.fast, pytest.mark.asyncio(loop_scope="module")]

#: the billing service's own token (what the hub generates for a managed service)
BILLING_TOKEN = "fast-billing-token-" + "y" * 16
PASSWORD = "correct-horse-battery-7"
MAX_WAIT_SECONDS = 10


# ---------------------------------------------------------------------------- the fakes


class RouteTable(Proxy):
    """A proxy that only remembers its routes: nothing listens on the public port."""

    should_start = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.routes: dict[str, dict] = {}

    async def add_route(self, routespec, target, data):
        routespec = self.validate_routespec(routespec)
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec):
        self.routes.pop(self.validate_routespec(routespec), None)

    async def get_all_routes(self):
        return dict(self.routes)


class _Answer(web.RequestHandler):
    """What the hub's readiness check sees of a single-user server."""

    def get(self, _path):
        self.set_header("X-JupyterHub-Version", jupyterhub.__version__)
        self.finish({"version": "fake"})


class AnsweringLocalGPUSpawner(LocalGPUSpawner):
    """LocalGPUSpawner up to the process: user options checked against the catalog and the
    user's groups, billing's pre-spawn and post-stop hooks (from c.LocalGPUSpawner), GPUs
    allocated exclusively in the same table; then an HTTP answer on the hub's loop instead
    of JupyterLab in a sandbox.

    The name keeps "LocalGPUSpawner": billing's `pass_capacity` recognises the local
    backend by the configured spawner class's name, and passes are then checked against the
    declared inventory as on a real local hub."""

    _answer: httpserver.HTTPServer | None = None

    async def start(self):
        choice = self.parse_options()
        self.choice = choice
        gpus = []
        if not choice.profile.is_debug:
            reserved = await self.current_reservations()
            try:
                gpus = await asyncio.to_thread(
                    self.allocator.allocate,
                    self.owner_key,
                    choice.profile.slug,
                    choice.gpus,
                    self.user.name,
                    reserved.get(choice.profile.slug, {}),
                )
            except NotEnoughGpus as e:
                raise web.HTTPError(409, str(e), reason="GPUs unavailable") from None
        self.gpu_indices = [gpu.index for gpu in gpus]
        port = free_port()
        self._answer = httpserver.HTTPServer(web.Application([(r"/(.*)", _Answer)]))
        self._answer.listen(port, "127.0.0.1")
        self.last_seen_alive, self.exited_after = int(time.time()), None
        return ("127.0.0.1", port)

    async def poll(self):
        return None if self._answer is not None else 0

    async def stop(self, now=False):
        if self._answer is not None:
            self._answer.stop()
            self._answer = None
        await asyncio.to_thread(self.allocator.release, self.owner_key)
        self.gpu_indices = []


class FastMeterHub(hub_app.MeterHub):
    """MeterHub on the test's loop: no signal handlers, logs to pytest, listeners undone."""

    def init_signal(self):
        pass

    def init_logging(self):
        super().init_logging()
        self.log.propagate = True  # pytest shows them for a failed test
        self.log.handlers.clear()

    _listeners: list[tuple] = []

    def init_db(self):
        # register_trial_credit listens on jupyterhub.orm.User, a class every hub in this
        # process shares: note what it adds, so that stopping removes it
        added = []
        listen = event.listen

        def noting(target, name, fn, *args, **kwargs):
            added.append((target, name, fn))
            return listen(target, name, fn, *args, **kwargs)

        event.listen = noting
        try:
            super().init_db()
        finally:
            event.listen = listen
        self._listeners = added

    async def stop_in_process(self) -> None:
        """Stop the servers (settling their sessions), then what `start()` started."""
        stops = [
            user.stop(name)
            for user in self.users.values()
            for name, spawner in list(user.spawners.items())
            if spawner.active
        ]
        await asyncio.gather(*stops, return_exceptions=True)
        await self.cleanup()
        if self.http_server:
            self.http_server.stop()
        self.metrics_collector.stop()
        gc.unfreeze()  # start() froze what the test process had built; let it go again
        for callback in self._periodic_callbacks.values():
            callback.stop()
        for target, name, fn in self._listeners:
            event.remove(target, name, fn)
        self.db.close()


# ---------------------------------------------------------------------------- the hub


class InProcessHub:
    """A meterhub hub and its billing service on the current event loop.

    `url` is the hub's own address (what the proxy would forward /hub/ to); `billing_url` the
    billing API. `ledger` reads the same database the hub writes, with the same fake clock.
    """

    def __init__(self, workdir: Path, site: dict, patch: pytest.MonkeyPatch):
        """`patch` holds the process-wide changes (environment, ledger clock) until the
        fixture that made this hub ends."""
        self.workdir = Path(workdir)
        self.clock = FakeClock(int(time.time()))
        self._patch = patch
        pool = self.workdir / "pool"
        pool.mkdir(parents=True, exist_ok=True)  # a pool of its own: no demo pool to generate
        self.site_input = {
            "data_dir": str(self.workdir / "data"),
            "public_dir": str(pool),
            "hub": {p: free_port() for p in ("api_port", "proxy_api_port", "billing_port")},
            # servers here are an HTTP answer, never sandboxed: no probing for bubblewrap
            "local": {"sandbox": "off"},
            **site,
        }
        config_path = self.workdir / "meterhub.yaml"
        config_path.write_text(yaml.safe_dump(self.site_input))
        self.site = load_site_config(config_path, cwd=str(self.workdir))
        ports = self.site["hub"]
        self.url = f"http://127.0.0.1:{ports['api_port']}"
        self.api_url = f"{self.url}/hub/api"
        self.billing_prefix = f"/services/{BILLING_SERVICE}/"
        self.billing_url = f"http://127.0.0.1:{ports['billing_port']}{self.billing_prefix}api/v1"
        self.app: FastMeterHub | None = None
        self._billing_server: httpserver.HTTPServer | None = None

    # -- start and stop
    def configure(self) -> Config:
        """`meterhub serve`'s configuration, then the in-process replacements."""
        hub_app.prepare(self.site)
        c = hub_app.apply_config(self.site, Config())
        hub_app.check_ledger(c)
        with pytest.MonkeyPatch.context() as patch:
            # runtime_config names the proxy's program; RouteTable needs none
            patch.setattr(hub_app, "find_proxy", lambda: "configurable-http-proxy-not-used")
            environ = {"METERHUB_ADMIN_TOKEN": ADMIN_TOKEN}
            hub_app.runtime_config(self.site, c, "127.0.0.1", free_port(), environ)
        c.JupyterHub.log_level = "INFO"
        c.JupyterHub.proxy_class = RouteTable
        c.JupyterHub.spawner_class = AnsweringLocalGPUSpawner
        # the billing service is this test's, not a process the hub starts
        (billing,) = (s for s in c.JupyterHub.services if s["name"] == BILLING_SERVICE)
        for managed in ("command", "cwd", "environment"):
            billing.pop(managed)
        billing["api_token"] = BILLING_TOKEN
        return c

    async def start(self) -> None:
        c = self.configure()
        settings = BillingSettings(config=c)
        # every ledger the hub, its hooks and pages and the billing service open reads
        # this hub's clock
        _CLOCKS[settings.db_url] = self.clock
        self._patch.setattr(BillingSettings, "ledger", _ledger_on_fake_clock)
        self.ledger = settings.ledger()
        self.config = c

        # the environment the hub gives a managed service; HubOAuth (a process-wide
        # singleton) is made from it on the billing service's first request
        HubOAuth.clear_instance()
        for key, value in {
            "JUPYTERHUB_API_URL": self.api_url,
            "JUPYTERHUB_API_TOKEN": BILLING_TOKEN,
            "JUPYTERHUB_SERVICE_NAME": BILLING_SERVICE,
            "JUPYTERHUB_SERVICE_PREFIX": self.billing_prefix,
            "JUPYTERHUB_CLIENT_ID": f"service-{BILLING_SERVICE}",
            "JUPYTERHUB_BASE_URL": "/",
        }.items():
            self._patch.setenv(key, value)
        billing = service.make_app(
            self.billing_prefix,
            self.ledger,
            Decimal(settings.max_grant),
            HubClient(self.api_url, BILLING_TOKEN),
            c,
            settings.warn_minutes,
        )
        # as `meterhub billing service` listens: bodies over the limit reach the handlers,
        # which answer 413
        self._billing_server = httpserver.HTTPServer(billing, max_body_size=16 * MAX_BODY)
        self._billing_server.listen(self.site["hub"]["billing_port"], "127.0.0.1")

        self.app = FastMeterHub(config=c)
        await self.app.initialize([])
        await self.app.start()

    async def stop(self) -> None:
        try:
            if self.app is not None:
                await self.app.stop_in_process()
        finally:
            if self._billing_server is not None:
                self._billing_server.stop()
            HubOAuth.clear_instance()
            _CLOCKS.pop(self.site["billing"]["db_url"], None)
            _engine(self.site["billing"]["db_url"]).dispose()

    # -- the hub's REST API and pages, through requests in a thread (the hub runs on this loop)
    async def request(self, method: str, url: str, session=None, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("allow_redirects", False)
        call = (session or requests).request
        return await asyncio.to_thread(call, method, url, **kwargs)

    async def api(self, method: str, path: str, token: str = ADMIN_TOKEN, **kwargs):
        headers = {"Authorization": f"token {token}", **kwargs.pop("headers", {})}
        return await self.request(method, f"{self.api_url}{path}", headers=headers, **kwargs)

    async def billing(self, method: str, path: str, token: str, **kwargs):
        headers = {"Authorization": f"token {token}", **kwargs.pop("headers", {})}
        return await self.request(method, f"{self.billing_url}{path}", headers=headers, **kwargs)

    async def ensure_user(self, name: str) -> None:
        if (await self.api("GET", f"/users/{name}")).status_code == 404:
            r = await self.api("POST", f"/users/{name}")
            assert r.status_code == 201, r.text
        # the trial credit is written off the loop after the user row: wait for it
        await eventually(lambda: self.ledger.balance(name) is not None, f"{name}'s wallet")

    async def user_token(self, name: str) -> str:
        await self.ensure_user(name)
        r = await self.api("POST", f"/users/{name}/tokens", json={"note": "fast test"})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    async def add_account(self, name: str, password: str = PASSWORD) -> None:
        """A local account that signs in on the login page (`meterhub user add`)."""
        # on the loop, not in a thread: the hub's trial-credit listener fires in whichever
        # thread inserts the user row, and schedules the ledger write on that thread's loop
        add_user(self.site, name, password)
        await self.ensure_user(name)

    async def sign_in(self, name: str, password: str = PASSWORD) -> requests.Session:
        """A browser's cookie session through the real login form (no token)."""
        s = requests.Session()
        r = await self.request("GET", f"{self.url}/hub/login", session=s)
        assert r.status_code == 200, r.status_code
        r = await self.request(
            "POST",
            f"{self.url}/hub/login",
            session=s,
            data={"username": name, "password": password, "_xsrf": s.cookies["_xsrf"]},
        )
        assert r.status_code == 302 and "/hub/login" not in r.headers["Location"], r.status_code
        return s

    def running(self, name: str) -> bool:
        """Whether `name`'s default server is starting or running, as the hub sees it."""
        user = self.app.users.get(name)
        spawner = None if user is None else user.spawners.get("")
        return spawner is not None and spawner.active


async def eventually(
    condition: Callable[[], Any], what: str, timeout: float = MAX_WAIT_SECONDS
) -> Any:
    """Await `condition` (blocking, run in a thread) until it is truthy; fail naming `what`.

    For work the hub finishes after answering (a ledger write off its loop), not for time
    to pass: billing's clock is `InProcessHub.clock`."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(condition)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
