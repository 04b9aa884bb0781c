"""The meterhub JupyterHub application: site config in, a running hub out.

`MeterHub` is JupyterHub with the site config as its only configuration source and a GPU
allocation check after the hub has looked at the servers that survived a restart.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import os
import secrets
import shutil
import socket
import sys

from jupyterhub import orm
from jupyterhub.app import JupyterHub
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import selectinload
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.ioloop import PeriodicCallback
from traitlets import Int
from traitlets.config import Config

from meterhub.billing_hooks.hooks import register_trial_credit
from meterhub.billing_hooks.scopes import BILLING_SERVICE, billing_admin_role, user_role
from meterhub.billing_hooks.settings import BillingSettings, billing_settings_of
from meterhub.i18n import _
from meterhub.spawner import disk_archive
from meterhub.spawner.local import LocalGPUSpawner, announce_resource_limits, stop_orphans
from meterhub.spawner.sandbox import bwrap_works

from .accounts import AccountError, add_user
from .config import (
    TOPUP_SECRET_ENV,
    ConfigError,
    apply_config,
    apply_config_d,
    billing_api,
    billing_host,
    demo_pool_dir,
    template_vars,
)
from .demo_pool import ensure_demo_pool
from .disk_cli import Refused, archive_user_disk, newest_use
from .group_sync import group_admin_roles, sync_groups
from .restarts import run_restarts
from .stop_cli import (
    clear_server_stop,
    find_hub,
    pid_file_path,
    remove_if_names,
    server_stop_requested,
    stop_servers_path,
    write_pid_file,
)

ADMIN_SERVICE = "meterhub-admin"
#: the longest the sign-in line waits for the billing service's first meter pass, seconds
SIGN_IN_WAIT_SECONDS = 30


class MeterHub(JupyterHub):
    name = "meterhub"
    description = "meterhub: GPU notebooks by the hour"

    group_sync_interval_seconds = Int(
        5,
        min=1,
        help="""
        How often the hub applies the group changes queued by the CLI (membership) and
        makes the group admins' roles match the ledger. Seconds.
        """,
    ).tag(config=True)

    disk_archive_after_days = Int(
        30,
        min=0,
        help="""
        Archive the disk of a user who has no server running or starting and whose last use
        is older than this many days (`disks.archive_after_days`, docs/idle.md). Last
        use: the newest `last_activity` or start time of the user's servers in the hub's
        database, else the disk folder's modification time. The archive is restored at the
        user's next start; nothing is deleted. 0: never. Local backend only.
        """,
    ).tag(config=True)

    disk_archive_interval_seconds = Int(
        3600,
        min=1,
        help="""
        How often the hub looks for idle disks to archive; the first look comes a minute
        after the hub starts (or after this interval, when shorter). Seconds.
        """,
    ).tag(config=True)

    service_interrupt_timeout_seconds = Int(
        5,
        min=1,
        help="""
        When the hub shuts down, how long it waits for a managed service (the billing
        service) to exit after SIGINT before it sends SIGTERM (and SIGKILL 30 s after that).
        The billing service stops at once on either; this bounds a stop that hangs. Seconds
        (JupyterHub's own default is 30).
        """,
    ).tag(config=True)

    #: what `meterhub serve` prints, last, once the hub is healthy (`announce_sign_in`)
    sign_in_message = ""

    def load_config_file(self, *args, **kwargs):
        """The site config is the only source of configuration; ignore jupyterhub_config.py."""

    def init_db(self):
        super().init_db()
        register_trial_credit(self.config)

    async def init_role_creation(self):
        """The group admins' roles are config roles too (JupyterHub deletes any other role at
        start-up): one per group with a wallet, from the ledger."""
        try:
            ledger = BillingSettings(config=self.config).ledger()
            extra = await asyncio.to_thread(group_admin_roles, ledger)
        except DBAPIError as e:
            self.log.warning("Group admins' roles not loaded, the ledger does not answer: %s", e)
            extra = []
        present = {role["name"] for role in self.load_roles}
        for role in extra:
            # JupyterHub would create an account a role names; an admin deleted since is not
            role["users"] = [u for u in role["users"] if orm.User.find(self.db, u) is not None]
        self.load_roles = self.load_roles + [r for r in extra if r["name"] not in present]
        await super().init_role_creation()

    async def start(self):
        await super().start()
        self._group_sync = PeriodicCallback(
            self.sync_groups, self.group_sync_interval_seconds * 1000, jitter=0.1
        )
        self._group_sync.start()
        self.start_disk_archiving()
        await self.sync_groups()
        self._sign_in = asyncio.ensure_future(self.announce_sign_in())
        # what start-up built (modules, config, mappers, the users' objects) stays: out of
        # the collector's way, so that its full collections walk only what came later (its
        # garbage collected first, not kept for good)
        gc.collect()
        gc.freeze()

    async def announce_sign_in(self) -> None:
        """Print `sign_in_message` as the console's last start-up line: after the hub is
        healthy (`start` has returned) and the billing service has made its first meter
        pass (at most SIGN_IN_WAIT_SECONDS), whose log lines would otherwise bury it."""
        if not self.sign_in_message:
            return
        service = self._service_map.get(BILLING_SERVICE)
        if service is not None and service.managed and service.url:
            health = f"{service.url.rstrip('/')}{service.prefix}api/v1/health"
            await first_meter_pass(health, SIGN_IN_WAIT_SECONDS)
        print(f"\n{self.sign_in_message}", file=sys.stderr, flush=True)

    def write_pid_file(self):
        """The pid file `meterhub stop` finds the hub by: private, written atomically."""
        if self.pid_file:
            write_pid_file(self.pid_file, os.getpid())

    async def cleanup(self):
        """Shut down; after `meterhub stop --servers`, stop users' servers too, this once.

        JupyterHub's own `cleanup_servers` path awaits each server's stop, post-stop hook
        (billing's `settle_stop`, which closes the session at the stop) included, before
        the hub exits.
        """
        # nothing periodic runs into the shutdown: JupyterHub's service check would read the
        # billing service's server after `Service.stop` removed it (an AttributeError)
        for callback in [*self._periodic_callbacks.values(), *self._own_periodic_callbacks()]:
            callback.stop()
        sign_in = getattr(self, "_sign_in", None)
        if sign_in is not None:
            sign_in.cancel()
        for service in self._service_map.values():
            if service.managed and service.spawner is not None:
                service.spawner.interrupt_timeout = self.service_interrupt_timeout_seconds
        data_dir = os.path.dirname(self.pid_file) if self.pid_file else ""
        if data_dir and server_stop_requested(data_dir, os.getpid()):
            self.log.info("meterhub stop --servers: stopping users' servers before exiting")
            self.cleanup_servers = True
        try:
            await super().cleanup()
        finally:
            if data_dir:
                remove_if_names(stop_servers_path(data_dir), os.getpid())

    def _own_periodic_callbacks(self) -> list[PeriodicCallback]:
        names = ("_group_sync", "_disk_archiving")
        return [cb for cb in (getattr(self, name, None) for name in names) if cb is not None]

    async def sync_groups(self) -> None:
        """Apply the CLI's group changes and the admins' roles in the hub's own session."""
        try:
            ledger = await billing_settings_of(self.config).ledger_async()
            applied = await sync_groups(self.db, ledger)
        except Exception:
            self.log.exception("Could not apply group changes; trying again")
            return
        if applied:
            self.log.info("Applied %d group change(s)", applied)
        try:
            # servers the meter stopped to start again in debug mode (the billing service
            # may not start servers; the hub does, with a token of the user's)
            await run_restarts(self, ledger)
        except Exception:
            self.log.exception("Could not restart servers in debug mode; trying again")

    def start_disk_archiving(self) -> None:
        """Look for idle disks every `disk_archive_interval_seconds` (local backend, unless
        `disk_archive_after_days` is 0)."""
        if not (issubclass(self.spawner_class, LocalGPUSpawner) and self.disk_archive_after_days):
            return
        seconds = self.disk_archive_interval_seconds
        self._disk_archiving = PeriodicCallback(self.archive_idle_disks, seconds * 1000, jitter=0.1)
        self._disk_archiving.start()

        def first() -> None:
            self._first_disk_archiving = asyncio.ensure_future(self.archive_idle_disks())

        asyncio.get_running_loop().call_later(min(60, seconds), first)

    _archiving_disks = False

    def _has_server(self, orm_user: orm.User) -> bool:
        """A server of the user's is running, starting or stopping (the database's view and
        this hub's spawners)."""
        if any(s.server is not None for s in orm_user.orm_spawners.values()):
            return True
        user = dict.get(self.users, orm_user.id)  # the cache only: creates no User
        return user is not None and any(s.active for s in dict.values(user.spawners))

    async def archive_idle_disks(self) -> int:
        """Archive, one at a time and off the event loop, the disk of every user with no
        server whose last use is older than `disk_archive_after_days`; how many were. Each
        user is checked again just before: the archive then holds the disk's lock and looks
        at the runtime records, and a start waits for that lock (spawner/local.py)."""
        if self._archiving_disks:
            return 0
        self._archiving_disks = True
        archived = 0
        try:
            local = LocalGPUSpawner(config=self.config)  # config only, no user
            idle = datetime.timedelta(days=self.disk_archive_after_days)
            idle_before = disk_archive.utcnow() - idle
            candidates = []
            users = self.db.query(orm.User).options(
                selectinload(orm.User._orm_spawners).selectinload(orm.Spawner.server)
            )
            for orm_user in users:
                times = [
                    t for s in orm_user.orm_spawners.values() for t in (s.last_activity, s.started)
                ]
                newest = newest_use(times)
                if newest is not None and newest > idle_before:
                    continue  # used lately: nothing to look at on disk
                if not self._has_server(orm_user):
                    candidates.append((orm_user, orm_user.name, times))
            for orm_user, name, times in candidates:
                try:
                    if self._has_server(orm_user):
                        continue  # started while an earlier disk was being archived
                    marker = await asyncio.to_thread(
                        archive_user_disk,
                        local.data_dir,
                        local.disk_root,
                        name,
                        disk_archive.utcnow(),
                        idle_before,
                        times,
                    )
                except (Refused, disk_archive.ArchiveBusy) as e:
                    self.log.debug("Not archiving the disk of %s: %s", name, e)
                    continue
                except (disk_archive.ArchiveError, OSError) as e:
                    self.log.error("Could not archive the disk of %s: %s", name, e)
                    continue
                except Exception:
                    # one user's disk never holds up everyone else's
                    self.log.exception("Could not archive the disk of %s", name)
                    continue
                if marker is not None:
                    archived += 1
                    self.log.info(
                        "Archived the idle disk of %s (%s) as %s",
                        name,
                        disk_archive.gib(marker.disk_bytes),
                        marker.archive,
                    )
        except Exception:
            self.log.exception("Could not look for idle disks; trying again later")
        finally:
            self._archiving_disks = False
        return archived

    async def init_spawners(self):
        result = await super().init_spawners()
        if issubclass(self.spawner_class, LocalGPUSpawner):
            await self.reconcile_gpus()
            local = LocalGPUSpawner(config=self.config)  # config only, no user
            await announce_resource_limits(local.resource_limits, self.log)
        return result

    async def reconcile_gpus(self):
        """Stop servers the hub does not know as running (a spawn a crash interrupted: its
        process runs, its state was never saved), then release the GPUs of every server that
        is not running. GPUs of a process that cannot be stopped stay allocated."""
        active = {
            spawner.owner_key
            for user in self.users.values()
            for spawner in user.spawners.values()
            if isinstance(spawner, LocalGPUSpawner) and spawner.active
        }
        local = LocalGPUSpawner(config=self.config)  # config only, no user
        survivors = await stop_orphans(local.data_dir, active, self.log)
        released = await asyncio.to_thread(local.allocator.reconcile, active | survivors)
        for owner, indices in released.items():
            self.log.warning("Released GPUs %s held by %s, which is not running", indices, owner)


async def first_meter_pass(health_url: str, timeout_seconds: float) -> bool:
    """Wait until the billing service's health check reports a completed meter pass;
    False when `timeout_seconds` passed first (the line is printed anyway)."""
    client = AsyncHTTPClient()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    wait = 0.1
    while loop.time() < deadline:
        try:
            response = await client.fetch(health_url, request_timeout=5, raise_error=False)
            if response.code == 200 and json.loads(response.body)["meter"]["last_pass_at"]:
                return True
        except (HTTPClientError, OSError, ValueError, KeyError, TypeError):
            pass  # not up yet, or an app without a meter: try again until the deadline
        await asyncio.sleep(wait)
        wait = min(1.0, wait * 2)
    return False


def _secret_file(path: str, nbytes: int = 32) -> tuple[str, bool]:
    """Read a secret kept in a 0600 file, creating it on first use; (secret, created)."""
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip(), False
    secret = secrets.token_urlsafe(nbytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret, True


def find_proxy() -> str:
    """configurable-http-proxy: on PATH, or installed by `make` into the environment."""
    for candidate in (
        shutil.which("configurable-http-proxy"),
        os.path.join(sys.prefix, "node_modules", ".bin", "configurable-http-proxy"),
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    raise ConfigError(
        "configurable-http-proxy not found: install it with"
        " `npm install --prefix .venv configurable-http-proxy@5.2.0` (make does this)"
    )


def sandbox_warning(site: dict) -> str:
    mode = site["local"]["sandbox"]
    if mode == "bwrap":
        return ""
    why = "sandbox is off in the site config" if mode == "off" else bwrap_works()
    if not why:
        return ""
    return (
        f"Servers run WITHOUT a sandbox ({why}): each can read the hub's data directory"
        " and, unless the hub runs as root, other users' disks. Install bubblewrap."
    )


def admin_scopes() -> list[str]:
    """The scopes of JupyterHub's own admin role."""
    from jupyterhub.roles import get_default_roles

    return next(r["scopes"] for r in get_default_roles() if r["name"] == "admin")


def billing_service(site: dict, config_path: str | None) -> tuple[list[dict], list[dict]]:
    """The managed billing service and its least-privilege role: read servers, stop them."""
    command = [sys.executable, "-m", "meterhub.hub.cli", "billing", "service"]
    if config_path:
        command += ["--config", os.path.abspath(config_path)]
    service = {
        "name": BILLING_SERVICE,
        "command": command,
        "url": f"http://{billing_host(site)}:{site['hub']['billing_port']}",
        "cwd": os.getcwd(),
        "environment": {
            "PYTHONUNBUFFERED": "1",
            # a managed service sees none of the hub's environment but what it is given
            **{k: os.environ[k] for k in (TOPUP_SECRET_ENV,) if os.environ.get(k)},
        },
        # the navigation bar links the Wallet page instead
        "display": False,
    }
    role = {
        "name": "meterhub-billing",
        "description": "The meter: list and read users, groups and servers, stop servers;"
        " never start them.",
        "scopes": ["list:users", "read:users", "read:servers", "delete:servers", "read:groups"],
        "services": [BILLING_SERVICE],
    }
    # users reach the billing API (their own wallet) with their own tokens and cookies, and
    # may spend their own credit; hub admins (admin:users) are billing admins already
    return [service], [role, user_role(), billing_admin_role()]


#: the SSH front door's service (hub/ssh.py) and its role
SSH_SERVICE = "ssh"


def local_address(ip: str) -> str:
    """Where this machine reaches the hub's public address: the address itself, or loopback
    when the hub listens on all of them."""
    return "127.0.0.1" if ip in ("", "0.0.0.0") else "::1" if ip == "::" else ip


def public_host(ip: str) -> str:
    """The hub's host as people reach it: its address, or this machine's name when it
    listens on all of them."""
    return socket.getfqdn() if ip in ("", "0.0.0.0", "::") else ip


def _url(site: dict, host: str, port: int) -> str:
    scheme = "https" if site.get("https") else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def ssh_service(site: dict, config_path: str | None, ip: str, port: int) -> tuple[list, list]:
    """The SSH front door as a managed service, with a role that reads users' servers and
    groups (never their tokens, never starts anything); none when `ssh.enabled` is false."""
    if not site["ssh"]["enabled"]:
        return [], []
    from .ssh import BILLING_URL_ENV, IP_ENV, PUBLIC_URL_ENV, SERVER_URL_ENV

    command = [sys.executable, "-m", "meterhub.hub.cli", "ssh", "serve"]
    if config_path:
        command += ["--config", os.path.abspath(config_path)]
    service = {
        "name": SSH_SERVICE,
        "command": command,
        "cwd": os.getcwd(),
        "environment": {
            "PYTHONUNBUFFERED": "1",
            SERVER_URL_ENV: _url(site, local_address(ip), port),
            PUBLIC_URL_ENV: _url(site, public_host(ip), port),
            IP_ENV: ip,
            BILLING_URL_ENV: billing_api(site),
        },
        "display": False,
    }
    role = {
        "name": "meterhub-ssh",
        "description": "The SSH front door: read users' groups and servers; it opens a server"
        " only with its user's own token.",
        "scopes": ["read:users:name", "read:users:groups", "read:servers"],
        "services": [SSH_SERVICE],
    }
    return [service], [role]


def ssh_line(site: dict, ip: str, port: int) -> str:
    """How people reach their running servers over SSH, for the console."""
    host = public_host(ip)
    return "meterhub: " + _(
        "SSH into a running server: ssh -p %(port)s USER@%(host)s, with a token from"
        " %(url)s/hub/token as the password",
        port=site["ssh"]["port"],
        host=host,
        url=_url(site, host, port),
    )


def runtime_config(
    site: dict, c: Config, ip: str, port: int, environ, config_path: str | None = None
) -> dict:
    """Add what depends on this machine and its secrets; returns facts to tell the operator."""
    data_dir = site["data_dir"]
    c.JupyterHub.ip = ip
    c.JupyterHub.port = port
    c.ConfigurableHTTPProxy.command = [find_proxy()]
    c.ConfigurableHTTPProxy.auth_token = _secret_file(os.path.join(data_dir, "proxy-token"))[0]
    admin = site["admin_users"][0]
    password_file = os.path.join(data_dir, "admin-password")
    password, created = _secret_file(password_file)
    if site["auth"]["type"] == "native":
        # the first admin signs in on the normal login page with the printed password
        try:
            add_user(site, admin, password, admin=True, replace=created)
        except AccountError:
            pass  # made earlier; its password may have been changed since
    services, roles = billing_service(site, config_path)
    ssh_services, ssh_roles = ssh_service(site, config_path, ip, port)
    services += ssh_services
    roles += ssh_roles
    token = environ.get("METERHUB_ADMIN_TOKEN")
    if token:
        services.append({"name": ADMIN_SERVICE, "api_token": token})
        # the operator's token gets the admin role's scopes through a role of its own: a
        # load_roles entry for "admin" would make JupyterHub strip the admins it keeps in
        # its database (made by `meterhub user add --admin` or the admin page)
        roles.append(
            {
                "name": "meterhub-operator",
                "description": "The operator's METERHUB_ADMIN_TOKEN: what a hub admin may do.",
                "scopes": admin_scopes(),
                "services": [ADMIN_SERVICE],
            }
        )
    c.JupyterHub.services = services
    c.JupyterHub.load_roles = roles
    warning = sandbox_warning(site)
    c.JupyterHub.template_vars = template_vars(site, warning)
    return {
        "admin": admin,
        "password": password if created else None,
        "password_file": password_file,
        "warning": warning,
    }


def servers_traverse_data_dir(site: dict) -> str:
    """Why servers must traverse the data directory to reach their disks, or "": only when
    they run without the sandbox as uids of their own (the hub is root)."""
    if site["backend"] != "local" or os.geteuid() != 0:
        return ""
    mode = site["local"]["sandbox"]
    why = "sandbox is off" if mode == "off" else "" if mode == "bwrap" else bwrap_works()
    return f"servers run without the sandbox ({why}) as uids of their own" if why else ""


def database_files(site: dict) -> list[str]:
    """The SQLite files under the hub's care: JupyterHub's, the GPU allocations, the ledger."""
    data_dir = site["data_dir"]
    files = [os.path.join(data_dir, "jupyterhub.sqlite")]
    if site["backend"] == "local":
        files.append(os.path.join(data_dir, "gpu-allocations.sqlite"))
    url = site["billing"]["db_url"]
    if url.startswith("sqlite:///"):
        files.append(url[len("sqlite:///") :].split("?")[0])
    return files


def protect_databases(files: list[str]) -> None:
    """Make the databases readable by the hub's user only. SQLite creates the -wal and -shm
    files with the main file's mode, so a missing main file is created (empty: SQLite takes
    it for a new database) with mode 0600 before anything opens it."""
    for path in files:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except FileNotFoundError:
            continue  # its folder does not exist yet: whatever makes it makes the database
        for name in (path, path + "-wal", path + "-shm", path + "-journal"):
            if os.path.exists(name):
                os.chmod(name, 0o600)


def prepare(site: dict) -> None:
    """Create the data directory (private, with private databases) and, for the embedded
    default, the demo pool."""
    if "public_dir" in site and not os.path.isdir(site["public_dir"]):
        raise ConfigError(f"public_dir: {site['public_dir']} is not a directory")
    data_dir = site["data_dir"]
    traverse = servers_traverse_data_dir(site)
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    os.chmod(data_dir, 0o711 if traverse else 0o700)
    if traverse:
        print(
            f"meterhub: {data_dir} is mode 0711 (traversable, not listable), not 0700:"
            f" {traverse} and must pass through it to reach their disks",
            file=sys.stderr,
        )
    protect_databases(database_files(site))
    if "public_dir" not in site and ensure_demo_pool(demo_pool_dir(site)):
        print(f"meterhub: generated the demo pool in {demo_pool_dir(site)}", file=sys.stderr)


def check_ledger(c: Config) -> None:
    """Refuse to start on a ledger schema mismatch; start anyway if the database is down."""
    try:
        BillingSettings(config=c).ledger()
    except DBAPIError as e:
        print(
            f"meterhub: WARNING: the billing database does not answer ({e.orig});"
            " spawns are refused until it does",
            file=sys.stderr,
        )


def sign_in_line(url: str, admin: str, password_file: str, password: str | None = None) -> str:
    """How the first admin signs in: with the password when it was just made (shown once),
    else where it is kept."""
    if password:
        text = _(
            "sign in at %(url)s as %(admin)s with password %(password)s (kept in %(file)s)",
            url=url,
            admin=repr(admin),
            password=password,
            file=password_file,
        )
    else:
        text = _(
            "sign in at %(url)s as %(admin)s with the password in %(file)s",
            url=url,
            admin=repr(admin),
            file=password_file,
        )
    return f"meterhub: {text}"


def shown_path(path: str) -> str:
    """`path` relative to the working directory when it lies below it (shorter to read:
    `meterhub-data/admin-password`), else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


README = "README"


def write_data_dir_readme(data_dir: str, sign_in: str) -> None:
    """The data directory's README: what the folder is, and how to sign in (no secret)."""
    text = "\n".join(
        (
            _("meterhub keeps its databases, the users' disks and its secrets here."),
            _("Keep a backup; see docs/operations.md."),
            sign_in,
            "",
        )
    )
    path = os.path.join(data_dir, README)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def serve(site: dict, ip: str, port: int, config_path: str | None = None) -> None:
    """Run the hub in the foreground for a completed site config (see `load_site_config`)."""
    running, _stale = find_hub(site["data_dir"])
    if running is not None:
        raise ConfigError(
            f"meterhub serve already runs for {site['data_dir']} (pid {running.pid});"
            f" stop it first with `meterhub stop{' --config ' + config_path if config_path else ''}`"
        )
    prepare(site)
    c = apply_config(site, Config())
    check_ledger(c)
    facts = runtime_config(site, c, ip, port, os.environ, config_path)
    # the operator's jupyterhub_config.d/*.py beside the site config, last: they win
    apply_config_d(config_path, c)
    scheme = "https" if c.JupyterHub.get("ssl_cert") else "http"
    url = f"{scheme}://{ip}:{port}/hub/login"
    password_file = shown_path(facts["password_file"])
    # the same line, without the password, beside the password for whoever lost the console
    write_data_dir_readme(site["data_dir"], sign_in_line(url, facts["admin"], password_file))
    message = sign_in_line(url, facts["admin"], password_file, facts["password"])
    if site["ssh"]["enabled"]:
        message = f"{ssh_line(site, ip, port)}\n{message}"
    if facts["warning"]:
        # at once (the hub may never come up), and again above the sign-in line
        warning = _("WARNING: %(warning)s", warning=facts["warning"])
        print(f"meterhub: {warning}", file=sys.stderr)
        message = f"meterhub: {warning}\n{message}"
    # after the operator's config: `meterhub stop` finds the hub by this file
    pid_file = c.JupyterHub.pid_file = pid_file_path(site["data_dir"])
    # a request left by a `meterhub stop --servers` for an earlier hub is not for this one
    clear_server_stop(site["data_dir"])
    hub = MeterHub.instance(config=c)
    hub.sign_in_message = message  # printed once the hub is healthy (announce_sign_in)
    try:
        MeterHub.launch_instance([])
    finally:
        remove_if_names(pid_file, os.getpid())  # JupyterHub removes it only at a clean exit
