"""The SSH front door: `ssh -p 8022 alice@host`, with a JupyterHub token as the password,
lands in a shell inside alice's running server; commands, SFTP, rsync and port forwarding
(VS Code Remote-SSH) work the same way.

This gateway terminates SSH (asyncssh) and decides from the token's scopes, as the hub
reports them: access to alice's server (`access:servers`, filtered to her, her server or a
group of hers) and `custom:meterhub:ssh` (for her), which the `user` role gives every
user for their own servers and a server's own token (what a kernel holds) never has. Each
channel then goes, with that token, over a websocket to the server's own endpoint
(extensions/ssh.py), which checks the token again and runs the command inside the server:
its sandbox or pod, its user, its disk, its GPUs. The gateway itself runs nothing.

The hub runs it as a managed service (site config `ssh`); on Kubernetes the chart runs it as
a Deployment of its own (`ssh.enabled`). Billing is unchanged: the server is charged while
it runs, however it is reached.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import quote

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from meterhub import i18n
from meterhub.billing_hooks.money import format_money, to_micros
from meterhub.billing_hooks.scopes import SSH_SCOPE
from meterhub.i18n import _

log = logging.getLogger("meterhub.ssh")

#: how long one call to the hub or a server may take, seconds
HTTP_TIMEOUT_SECONDS = 20
#: an SSH client has this long to authenticate
LOGIN_TIMEOUT_SECONDS = 60
#: failed passwords for one user from one address within FAILURE_WINDOW_SECONDS before
#: their next is refused without asking the hub (tokens cannot be guessed; this keeps the
#: hub out of a flood)
MAX_FAILURES = 10
FAILURE_WINDOW_SECONDS = 60
#: (address, user) pairs remembered at most before expired ones are swept
MAX_TRACKED = 10_000
#: connections that have not authenticated yet, in all and from one address
MAX_UNAUTHENTICATED = 200
MAX_UNAUTHENTICATED_PER_ADDRESS = 20
#: a client that stops answering is dropped after this many keepalives this far apart
KEEPALIVE_SECONDS = 30
KEEPALIVE_COUNT = 4
#: the token a server is given for a connection's channels lives this long; it is made
#: again before it ends while the connection lasts, and deleted when the connection ends
SERVER_TOKEN_SECONDS = 3600
#: how often an open connection's token is checked again (a revoked one ends it)
RECHECK_SECONDS = 60
#: the largest websocket message relayed (a read is at most 64 KiB and a tag)
MAX_MESSAGE_BYTES = 1024 * 1024
#: hosts a client may forward to: the server's own ports
LOOPBACK = ("localhost", "127.0.0.1", "::1")
STDOUT, STDERR = 1, 2


@dataclass(frozen=True)
class GatewaySettings:
    #: the hub's REST API and this service's own token (read users' servers and groups)
    hub_api: str
    service_token: str
    #: where servers are reached from here: the proxy (`http://127.0.0.1:8000`)
    server_url: str
    #: what people open to start a server (the hub's public address), for the messages
    public_url: str
    host: str
    port: int
    host_key: str
    #: the billing API, for "what it costs" when no server runs ("" to leave it out)
    billing_api: str = ""


def may_ssh(scopes: set[str] | frozenset[str], user: str, groups: set[str]) -> bool:
    """Whether a token with `scopes` may open SSH channels into `user`'s default server:
    access to that server (as JupyterHub grants it: unfiltered, for the user, the server or
    a group of the user's) and the SSH scope, unfiltered or for that user (the server checks
    the same again; it knows its user, not their groups)."""
    access = {
        "access:servers",
        f"access:servers!user={user}",
        f"access:servers!server={user}/",
        *(f"access:servers!group={g}" for g in groups),
    }
    ssh = {SSH_SCOPE, f"{SSH_SCOPE}!user={user}"}
    return bool(access & scopes) and bool(ssh & scopes)


class LoginLimits:
    """Limits on logins, in memory, as sshd's MaxStartups and a lockout per account do:

    - failed passwords per (client address, user name) in a sliding window, attempts in
      flight counted too: past `MAX_FAILURES` the hub is not asked and the login fails. A
      token the hub accepts is never refused for other people's failures from a shared
      address (a campus NAT) or other accounts' from the same one;
    - connections not yet authenticated: `MAX_UNAUTHENTICATED` in all and
      `MAX_UNAUTHENTICATED_PER_ADDRESS` from one address, so idle TCP connections cannot
      use up the gateway's descriptors before the login timeout ends them.
    """

    def __init__(
        self,
        limit: int = MAX_FAILURES,
        window: float = FAILURE_WINDOW_SECONDS,
        pending_limit: int = MAX_UNAUTHENTICATED,
        pending_per_address: int = MAX_UNAUTHENTICATED_PER_ADDRESS,
    ):
        self.limit, self.window = limit, window
        self.failures: dict[tuple[str, str], collections.deque] = {}
        self.trying: collections.Counter = collections.Counter()
        self.pending_limit, self.pending_per_address = pending_limit, pending_per_address
        self.pending: collections.Counter = collections.Counter()

    def _recent(self, key: tuple[str, str], now: float) -> int:
        seen = self.failures.get(key)
        while seen and now - seen[0] > self.window:
            seen.popleft()
        if seen is not None and not seen:
            del self.failures[key]
        return len(seen) if seen else 0

    def begin(self, address: str, user: str, now: float | None = None) -> bool:
        """Whether to ask the hub about this login (then `end` says how it went)."""
        now = time.monotonic() if now is None else now
        key = (address, user)
        if self._recent(key, now) + self.trying[key] >= self.limit:
            return False
        self.trying[key] += 1
        return True

    def end(self, address: str, user: str, ok: bool, now: float | None = None) -> None:
        key = (address, user)
        self.trying[key] -= 1
        if self.trying[key] <= 0:
            del self.trying[key]
        if not ok:
            self.failures.setdefault(key, collections.deque()).append(
                time.monotonic() if now is None else now
            )
        if len(self.failures) > MAX_TRACKED:  # forget those whose window has passed
            for old in list(self.failures)[: len(self.failures) // 2]:
                self._recent(old, time.monotonic() if now is None else now)

    def connect(self, address: str) -> bool:
        """Whether a new connection may wait for its login (then `settled` ends its wait:
        it logged in, or it is gone)."""
        if sum(self.pending.values()) >= self.pending_limit:
            return False
        if self.pending[address] >= self.pending_per_address:
            return False
        self.pending[address] += 1
        return True

    def settled(self, address: str) -> None:
        self.pending[address] -= 1
        if self.pending[address] <= 0:
            del self.pending[address]


class Gateway:
    """Authenticates SSH clients with the hub and relays their channels to servers."""

    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        self.http = AsyncHTTPClient()
        self.limits = LoginLimits()
        self.acceptor: asyncssh.SSHAcceptor | None = None

    # ------------------------------------------------------------------ the hub

    async def _call(
        self, url: str, token: str, method: str = "GET", body: dict | None = None
    ) -> dict | None:
        """A call to the hub (or the billing API) with `token`: its JSON answer, {} for
        none (204), None when it is refused (400: asks for more than its owner has, 401,
        403) or there is nothing (404)."""
        try:
            response = await self.http.fetch(
                HTTPRequest(
                    url,
                    method=method,
                    headers={"Authorization": f"token {token}"},
                    body=None if body is None else json.dumps(body),
                    request_timeout=HTTP_TIMEOUT_SECONDS,
                    connect_timeout=HTTP_TIMEOUT_SECONDS,
                )
            )
        except HTTPClientError as e:
            if e.code in (400, 401, 403, 404):
                return None
            raise
        return json.loads(response.body) if response.body else {}

    async def authenticate(self, user: str, token: str) -> bool:
        """Whether `token` may reach `user`'s server over SSH (its scopes decide)."""
        if not token or len(token) > 512:
            return False
        model = await self._call(f"{self.settings.hub_api}/user", token)
        if model is None:
            return False
        account = await self.user_model(user)
        if account is None:
            return False
        return may_ssh(frozenset(model.get("scopes") or ()), user, set(account["groups"]))

    async def server_token(self, user: str, token: str, note: str) -> tuple[str, str | None]:
        """(a token for the server's end, its id): made with the user's own token, able to
        reach that one server and SSH into it and nothing else, for SERVER_TOKEN_SECONDS.
        Anything a server is sent can be read by code running in it; the user's own token
        (which may start servers and spend credit) must never be. A token that cannot make
        tokens (no `tokens` scope: already a narrow one) is passed on as it is."""
        tokens = f"{self.settings.hub_api}/users/{quote(user, safe='')}/tokens"
        body = {
            "note": note,
            "scopes": [f"access:servers!server={user}/", f"{SSH_SCOPE}!user={user}"],
            "expires_in": SERVER_TOKEN_SECONDS,
        }
        made = await self._call(tokens, token, "POST", body)
        if made is None:
            return token, None
        return made["token"], made["id"]

    async def delete_token(self, user: str, token: str, token_id: str) -> None:
        tokens = f"{self.settings.hub_api}/users/{quote(user, safe='')}/tokens"
        with contextlib.suppress(Exception):
            await self._call(f"{tokens}/{token_id}", token, "DELETE")

    async def user_model(self, user: str) -> dict | None:
        """The user's groups and servers, as this service may read them."""
        model = await self._call(
            f"{self.settings.hub_api}/users/{quote(user, safe='')}", self.settings.service_token
        )
        if model is None:
            return None
        return {"groups": model.get("groups") or [], "servers": model.get("servers") or {}}

    async def running_server(self, user: str) -> dict | None:
        account = await self.user_model(user)
        server = (account or {}).get("servers", {}).get("")
        return server if server and server.get("ready") else None

    async def not_running(self, user: str, token: str) -> str:
        """What to do when `user` has no running server, with what it costs."""
        spawn = f"{self.settings.public_url.rstrip('/')}/hub/spawn"
        cost = ""
        if self.settings.billing_api:
            with contextlib.suppress(Exception):
                wallet = await self._call(f"{self.settings.billing_api}/wallet", token)
                listed = await self._call(f"{self.settings.billing_api}/prices", token)
                if wallet and listed:
                    cost = " " + costs_phrase(listed, wallet)
        return (
            _(
                "%(user)s has no running server. Start one at %(url)s, then connect again:"
                " SSH reaches a running server and never starts one.",
                user=user,
                url=spawn,
            )
            + cost
        )

    # ------------------------------------------------------------------ channels

    async def open_channel(self, owner: SessionOwner, request: dict) -> WebSocketClientConnection:
        """A websocket to the server's SSH endpoint that runs `request`, with the server's
        narrow token; ValueError with what to say when no server runs."""
        server = await self.running_server(owner.user)
        if server is None:
            # said with the user's own token (prices, balance), which stays here
            raise ValueError(await self.not_running(owner.user, owner.token))
        token = await owner.channel_token()
        base = self.settings.server_url.rstrip("/")
        url = base.replace("http", "ws", 1) + server["url"] + "meterhub/ssh"
        connection = await websocket_connect(
            HTTPRequest(
                url,
                headers={"Authorization": f"token {token}"},
                connect_timeout=HTTP_TIMEOUT_SECONDS,
                request_timeout=HTTP_TIMEOUT_SECONDS,
                validate_cert=not _loopback_url(url),
            ),
            max_message_size=MAX_MESSAGE_BYTES,
        )
        await connection.write_message(json.dumps(request))
        return connection

    async def run_process(self, process: asyncssh.SSHServerProcess) -> None:
        """A session channel: a shell, a command or the SFTP subsystem, in the server."""
        owner: SessionOwner = process.get_extra_info("connection").get_owner()
        language = i18n.environment_language(dict(process.env))
        with i18n.using(language):
            subsystem = process.subsystem
            if subsystem not in (None, "sftp"):
                process.stderr.write(
                    _("meterhub: no subsystem %(name)s here\n", name=subsystem).encode()
                )
                process.exit(1)
                return
            term = process.get_terminal_type()
            cols, rows = process.get_terminal_size()[:2]
            request = {
                "kind": "sftp" if subsystem else ("shell" if process.command is None else "exec"),
                "command": process.command,
                "env": dict(process.env),
                "pty": {"term": term, "cols": cols or 80, "rows": rows or 24} if term else None,
            }
            try:
                channel = await self.open_channel(owner, request)
            except ValueError as e:
                process.stderr.write(f"meterhub: {e}\n".encode())
                process.exit(1)
                return
            except Exception as e:
                log.warning("SSH: %s's server did not take a channel: %s", owner.user, e)
                process.stderr.write(
                    _(
                        "meterhub: your server did not answer (%(error)s); try again\n", error=e
                    ).encode()
                )
                process.exit(1)
                return
        await relay_session(process, channel)

    async def run_forward(
        self,
        owner: SessionOwner,
        port: int,
        reader: asyncssh.SSHReader,
        writer: asyncssh.SSHWriter,
    ) -> None:
        """A forwarded connection (`ssh -L`, VS Code): to a port of the server itself."""
        try:
            channel = await self.open_channel(
                owner, {"kind": "forward", "host": "localhost", "port": port}
            )
        except Exception as e:
            log.info("SSH: %s's forwarding to port %s refused: %s", owner.user, port, e)
            writer.close()
            return
        await relay_forward(reader, writer, channel)

    # ------------------------------------------------------------------ listening

    async def start(self) -> None:
        self.acceptor = await asyncssh.listen(
            self.settings.host,
            self.settings.port,
            server_host_keys=[self.settings.host_key],
            server_factory=lambda: SessionOwner(self),
            encoding=None,
            line_editor=False,
            login_timeout=LOGIN_TIMEOUT_SECONDS,
            keepalive_interval=KEEPALIVE_SECONDS,
            keepalive_count_max=KEEPALIVE_COUNT,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_scp=False,
        )
        log.info("SSH front door on %s:%s", self.settings.host or "*", self.settings.port)

    def close(self) -> None:
        if self.acceptor is not None:
            self.acceptor.close()


class SessionOwner(asyncssh.SSHServer):
    """One SSH connection: who it is once the hub has accepted their token, and the narrow
    token its channels give the server."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.user = ""
        self.token = ""
        self.address = ""
        self.conn: asyncssh.SSHServerConnection | None = None
        self.waiting = False
        #: the server's token: (token, id or None, when made)
        self.for_server: tuple[str, str | None, float] | None = None
        self.minting: asyncio.Lock | None = None
        self.watch: asyncio.Task | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("?",)
        self.address = str(peer[0])
        self.waiting = self.gateway.limits.connect(self.address)
        if not self.waiting:
            log.warning("SSH: too many connections waiting to log in (%s); closed", self.address)
            conn.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiting:
            self.gateway.limits.settled(self.address)
            self.waiting = False
        if self.watch is not None:
            self.watch.cancel()
        if self.for_server is not None and self.for_server[1] is not None:
            _keep(asyncio.ensure_future(
                self.gateway.delete_token(self.user, self.token, self.for_server[1])
            ))  # fmt: skip

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    async def validate_password(self, username: str, password: str) -> bool:
        limits = self.gateway.limits
        if not limits.begin(self.address, username):
            log.warning(
                "SSH: too many failed logins for %s from %s; refused", username, self.address
            )
            return False
        ok = False
        try:
            ok = await self.gateway.authenticate(username, password)
        except Exception:
            log.exception("SSH: the hub did not answer %s's login", username)
            return False
        finally:
            limits.end(self.address, username, ok)
        if not ok:
            log.info("SSH: refused %s from %s", username, self.address)
            return False
        self.user, self.token = username, password
        log.info("SSH: %s signed in from %s", username, self.address)
        return True

    def auth_completed(self) -> None:
        if self.waiting:
            self.gateway.limits.settled(self.address)
            self.waiting = False
        self.minting = asyncio.Lock()
        self.watch = asyncio.ensure_future(self._recheck())

    async def channel_token(self) -> str:
        """The token the server gets for this connection's channels (made once, then again
        before it expires)."""
        assert self.minting is not None
        async with self.minting:
            now = time.monotonic()
            current = self.for_server
            if current is None or (
                current[1] is not None
                and now - current[2] > SERVER_TOKEN_SECONDS - RECHECK_SECONDS * 5
            ):
                token, token_id = await self.gateway.server_token(
                    self.user, self.token, f"meterhub SSH from {self.address}"
                )
                self.for_server = (token, token_id, now)
                if current is not None and current[1] is not None:
                    await self.gateway.delete_token(self.user, self.token, current[1])
            return self.for_server[0]

    async def _recheck(self) -> None:
        """End the connection once its token no longer may (revoked, expired, its user gone
        or its scopes changed): a connection is not a way to keep what was taken away."""
        while True:
            await asyncio.sleep(RECHECK_SECONDS * random.uniform(0.9, 1.1))
            try:
                ok = await self.gateway.authenticate(self.user, self.token)
            except Exception:
                continue  # the hub did not answer: ask again later
            if not ok:
                log.info(
                    "SSH: %s's token no longer may; connection from %s closed",
                    self.user,
                    self.address,
                )
                if self.conn is not None:
                    self.conn.close()
                return

    def session_requested(self) -> RelayedProcess:
        return RelayedProcess(self.gateway.run_process, None, asyncssh.sftp.MIN_SFTP_VERSION, False)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int):
        if dest_host not in LOOPBACK:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                "only ports of your server itself (localhost) can be forwarded",
            )

        async def handler(reader, writer):
            await self.gateway.run_forward(self, dest_port, reader, writer)

        return handler

    def server_requested(self, listen_host: str, listen_port: int):
        return False  # remote forwarding would listen on the gateway's machine

    def unix_connection_requested(self, dest_path: str):
        return False


#: tasks started and not awaited (a token's deletion after a connection ended)
_KEPT: set[asyncio.Future] = set()


def _keep(task: asyncio.Future) -> None:
    _KEPT.add(task)
    task.add_done_callback(_KEPT.discard)


class RelayedProcess(asyncssh.SSHServerProcess):
    """A session channel whose every request goes to the server: a shell, a command, and
    the SFTP subsystem too, which the server answers with OpenSSH's sftp-server (asyncssh
    would otherwise serve SFTP itself, from the gateway's own files). Written against
    asyncssh 2.24's SSHServerStreamSession; tests/test_ssh.py runs SFTP through it."""

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "sftp"

    def session_started(self) -> None:
        stdin = asyncssh.SSHReader(self, self._chan)
        stdout = asyncssh.SSHWriter(self, self._chan)
        stderr = asyncssh.SSHWriter(self, self._chan, EXTENDED_DATA_STDERR)
        handler = self._start_process(stdin, stdout, stderr)
        if inspect.isawaitable(handler):
            self._conn.create_task(handler, stdin.logger)


async def relay_session(
    process: asyncssh.SSHServerProcess, channel: WebSocketClientConnection
) -> None:
    """Bytes both ways between an SSH session and its server's websocket, then its exit."""

    async def upstream():
        while True:
            try:
                data = await process.stdin.read(64 * 1024)
            except asyncssh.TerminalSizeChanged as e:
                await channel.write_message(json.dumps({"resize": [e.width, e.height]}))
                continue
            except asyncssh.BreakReceived:
                await channel.write_message(json.dumps({"signal": "INT"}))
                continue
            except asyncssh.SignalReceived as e:
                await channel.write_message(json.dumps({"signal": e.signal}))
                continue
            if not data:
                await channel.write_message(json.dumps({"eof": True}))
                return
            await channel.write_message(data, binary=True)

    async def downstream() -> dict:
        while True:
            message = await channel.read_message()
            if message is None:
                return {"exit": 255}
            if isinstance(message, bytes):
                stream = process.stderr if message[:1] == bytes([STDERR]) else process.stdout
                stream.write(message[1:])
                await stream.drain()
                continue
            with contextlib.suppress(ValueError):
                control = json.loads(message)
                if "exit" in control or "exit_signal" in control:
                    return control

    sending = asyncio.ensure_future(upstream())
    receiving = asyncio.ensure_future(downstream())
    # the client gone (its channel closed, the connection lost) ends the command, as sshd
    # hangs up a session: the server's end hangs up what runs when its websocket closes
    gone = asyncio.ensure_future(process.channel.wait_closed())
    outcome: dict = {"exit": 255}
    try:
        while not receiving.done():
            done, _pending = await asyncio.wait(
                {receiving, sending, gone} - {t for t in (sending,) if t.done()},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if gone in done or (sending in done and sending.exception() is not None):
                break
        if receiving.done() and not receiving.cancelled() and receiving.exception() is None:
            outcome = receiving.result()
        elif receiving.done() and receiving.exception() is not None:
            log.info("SSH channel ended: %s", receiving.exception())
    finally:
        for task in (sending, receiving, gone):
            task.cancel()
        await asyncio.gather(sending, receiving, gone, return_exceptions=True)
        channel.close()
    if process.channel.is_closing():
        return
    if "exit_signal" in outcome:
        process.exit_with_signal(str(outcome["exit_signal"]))
    else:
        status = outcome.get("exit")
        process.exit(status if isinstance(status, int) and 0 <= status <= 255 else 255)


async def relay_forward(reader, writer, channel: WebSocketClientConnection) -> None:
    async def upstream():
        while data := await reader.read(64 * 1024):
            await channel.write_message(data, binary=True)
        await channel.write_message(json.dumps({"eof": True}))

    sending = asyncio.ensure_future(upstream())
    try:
        while (message := await channel.read_message()) is not None:
            if isinstance(message, bytes) and message[:1] == bytes([STDOUT]):
                writer.write(message[1:])
                await writer.drain()
            elif isinstance(message, bytes):  # the server's why (nothing listens there)
                log.info("SSH forwarding refused: %s", message[1:].decode(errors="replace").strip())
            elif "exit" in message:
                break
    except Exception as e:
        log.info("SSH forwarding ended: %s", e)
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        channel.close()
        writer.close()


def _loopback_url(url: str) -> bool:
    """A server reached on this machine (the local proxy, maybe with its own certificate)."""
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK


def costs_phrase(listed: dict, wallet: dict) -> str:
    """ "Debug mode costs ¥0.10 per hour, a GPU from ¥1.25 per GPU-hour; your balance is
    ¥7.12." from the billing API's prices and the user's wallet."""
    currency = listed["currency"]
    prices = {slug: Decimal(p["price_per_hour"]) for slug, p in listed["prices"].items()}
    gpu = min((price for slug, price in prices.items() if slug != "debug"), default=None)
    return _(
        "Debug mode costs %(debug)s per hour, a GPU from %(gpu)s per GPU-hour; your balance"
        " is %(balance)s.",
        debug=format_money(to_micros(prices["debug"]), currency),
        gpu="-" if gpu is None else format_money(to_micros(gpu), currency),
        balance=format_money(int(wallet["balance_micros"]), currency),
    )


def ensure_host_key(path: str) -> str:
    """The gateway's host key, made once (ed25519) and kept: clients see the same key after
    a restart."""
    if not os.path.exists(path):
        key = asyncssh.generate_private_key("ssh-ed25519", comment="meterhub")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key())
        with open(f"{path}.pub", "wb") as f:
            f.write(key.export_public_key())
    return path


async def serve(settings: GatewaySettings) -> None:
    from meterhub.billing_hooks.service import until_stopped

    gateway = Gateway(settings)
    await gateway.start()
    try:
        stopped_by = await until_stopped(asyncio.Event().wait())
        log.info("SSH front door stopped on %s", stopped_by)
    finally:
        gateway.close()


#: what the hub (hub/app.py) or the chart (helm/meterhub/templates/ssh-deployment.yaml)
#: tells the gateway, besides JupyterHub's JUPYTERHUB_API_URL and JUPYTERHUB_API_TOKEN
SERVER_URL_ENV = "METERHUB_SSH_SERVER_URL"
PUBLIC_URL_ENV = "METERHUB_PUBLIC_URL"
IP_ENV = "METERHUB_SSH_IP"
HOST_KEY_ENV = "METERHUB_SSH_HOST_KEY"
BILLING_URL_ENV = "METERHUB_BILLING_URL"
HOST_KEY_FILE = "ssh_host_ed25519_key"


def settings_from(site: dict, environ=os.environ) -> GatewaySettings:
    """The gateway's settings: the site config's `ssh` section and what its runner said."""
    ssh = site["ssh"]
    server_url = environ.get(SERVER_URL_ENV) or "http://127.0.0.1:8000"
    host_key = environ.get(HOST_KEY_ENV) or ssh.get("host_key")
    return GatewaySettings(
        hub_api=environ["JUPYTERHUB_API_URL"].rstrip("/"),
        service_token=environ["JUPYTERHUB_API_TOKEN"],
        server_url=server_url,
        public_url=environ.get(PUBLIC_URL_ENV) or server_url,
        host=ssh.get("ip") or environ.get(IP_ENV) or "",
        port=int(ssh["port"]),
        host_key=host_key or ensure_host_key(os.path.join(site["data_dir"], HOST_KEY_FILE)),
        billing_api=environ.get(BILLING_URL_ENV, "").rstrip("/"),
    )


def main(site: dict) -> int:
    """`meterhub ssh serve`: run the gateway until SIGINT or SIGTERM (the hub's stop)."""
    import signal

    from meterhub.billing_hooks.service import STOP_SIGNALS, _die_with_the_hub, _interrupt

    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"
    )
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    _die_with_the_hub()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    settings = settings_from(site)
    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        log.info("SSH front door stopped while starting")
    except OSError as e:
        # a port in use: the hub restarts its managed services; say why each time
        log.error("SSH front door cannot listen on %s:%s: %s", settings.host, settings.port, e)
        return 1
    return 0
