"""The server's end of the SSH front door (hub/ssh.py): one websocket per SSH channel, at
`{base_url}meterhub/ssh`, that runs what the channel asks for inside this server (its
sandbox, its user, its disk, its GPUs) and relays the bytes.

The gateway opens it with the user's own token in the Authorization header; this handler
checks it again: the hub's access to this server (jupyterhub-singleuser's check) and the
`custom:meterhub:ssh` scope, which a browser's cookie and the server's own token (what a
kernel holds) never carry. The first message says what to run:

    {"kind": "shell" | "exec" | "sftp" | "forward", "command": "...", "env": {"LANG": ...},
     "pty": {"term": "xterm-256color", "cols": 80, "rows": 24} | null,
     "port": 8888}                                   # forward: a port of this server

then binary frames carry stdin (to the server) and stdout / stderr (from it, first byte 1
or 2); text frames carry `{"resize": [cols, rows]}`, `{"eof": true}`, `{"signal": "INT"}`
to it and `{"exit": status}` or `{"exit_signal": "TERM"}` from it. Closing the websocket
ends the command (SIGHUP, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import struct
import termios
import time

from jupyter_server._tz import utcnow
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

#: the scope a token needs, besides access to this server (billing_hooks/scopes.py's; this
#: package imports nothing of the hub side)
SSH_SCOPE = "custom:meterhub:ssh"
#: what one read from a command or a forwarded port passes on at most
CHUNK_BYTES = 64 * 1024
#: a terminal's output read ahead of the gateway, in reads, before reading pauses
PTY_READ_AHEAD = 16
#: how long a command gets after SIGHUP before SIGKILL, when its channel closes
HANGUP_SECONDS = 3
#: environment variables a client may set (OpenSSH's SendEnv LANG LC_*, and TERM)
CLIENT_ENV_NAME = re.compile(r"(?:LANG|LANGUAGE|TERM|LC_[A-Z]{1,20})\Z")
#: a terminal type as terminfo names them
TERM_NAME = re.compile(r"[A-Za-z0-9._+-]{1,64}\Z")
#: signals a client may send (RFC 4254's names), to the command or the terminal's foreground
CLIENT_SIGNALS = frozenset(
    {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGKILL,
     signal.SIGUSR1, signal.SIGUSR2}
)  # fmt: skip
#: where OpenSSH's SFTP server is on Debian, Ubuntu and Red Hat
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
#: an SSH channel's activity: jupyter_server counts every `settings` key ending so
ACTIVITY_KEY = "meterhub_ssh_last_activity"
#: a command of `exec` that runs counts as activity this often, output or not
RUNNING_ACTIVITY_SECONDS = 60
LOOPBACK = ("localhost", "127.0.0.1", "::1")
STDOUT, STDERR = 1, 2


def token_may_ssh(hub_user: dict, header: str) -> bool:
    """Whether a request authenticated as `hub_user` may open an SSH channel: a token in the
    Authorization header (never a cookie: a page the browser visits cannot set that header)
    with the SSH scope for this server's user."""
    if not header.lower().startswith(("token ", "bearer ")):
        return False
    scopes = set(hub_user.get("scopes") or ())
    owner = os.environ.get("JUPYTERHUB_USER", "")
    return bool({SSH_SCOPE, f"{SSH_SCOPE}!user={owner}"} & scopes)


def client_env(asked: object) -> dict[str, str]:
    """The client's variables this server accepts (language and terminal only)."""
    if not isinstance(asked, dict):
        return {}
    return {
        k: v
        for k, v in list(asked.items())[:32]
        if isinstance(k, str)
        and CLIENT_ENV_NAME.match(k)
        and isinstance(v, str)
        and len(v) <= 200
        and "\0" not in v
    }


def terminal_type(asked: object) -> str:
    return asked if isinstance(asked, str) and TERM_NAME.match(asked) else "xterm"


def session_groups(sid: int, proc: str = "/proc") -> set[int]:
    """The process groups of the session `sid` (what a command or a shell started, jobs
    included, whatever group they moved to)."""
    groups = set()
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            groups.add(int(fields[2]))
    return groups


def shell() -> str:
    return os.environ.get("SHELL") or "/bin/bash"


def sftp_server() -> str | None:
    for path in (*SFTP_SERVERS, shutil.which("sftp-server")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _bounded(value: object, low: int, high: int, default: int) -> int:
    return value if isinstance(value, int) and low <= value <= high else default


class SSHChannelHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """One SSH channel of this server's user (see the module's docstring)."""

    # what an SSH session does is its own activity (`_touch`), not this request's
    _track_activity = False

    async def get(self, *args, **kwargs):
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "not signed in")
        hub_user = getattr(user, "hub_user", None) or {}
        if not token_may_ssh(hub_user, self.request.headers.get("Authorization", "")):
            raise web.HTTPError(403, f"the token needs the {SSH_SCOPE} scope")
        self.process: asyncio.subprocess.Process | None = None
        self.pty = None  # a terminal's ptyprocess.PtyProcess
        self.pty_fd: int | None = None
        self.pid: int | None = None
        self.started = False
        self.writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task] = []
        self.touched = 0.0
        await super().get(*args, **kwargs)

    def check_xsrf_cookie(self):
        pass  # a token in the header, never a cookie: nothing a page can forge

    # ------------------------------------------------------------------ messages

    async def on_message(self, message):
        if not self.started:
            self.started = True
            try:
                await self._start(json.loads(message))
            except (ValueError, OSError) as e:
                await self._send_error(str(e))
            return
        if isinstance(message, bytes):
            self._touch()
            await self._stdin(message)
            return
        try:
            control = json.loads(message)
        except ValueError:
            return
        if not isinstance(control, dict):
            return  # not a control message: ignored, as is any unknown field
        resize = control.get("resize")
        if isinstance(resize, list) and len(resize) == 2 and self.pty_fd is not None:
            cols, rows = resize
            # the kernel tells the terminal's foreground group (SIGWINCH)
            _set_size(self.pty_fd, _bounded(cols, 1, 1000, 80), _bounded(rows, 1, 1000, 24))
        elif control.get("eof") is True:
            await self._eof()
        elif isinstance(control.get("signal"), str) and self.pid and self._running():
            sig = getattr(signal, f"SIG{control['signal'].upper()}", None)
            if sig in CLIENT_SIGNALS:
                # a terminal's signal goes where ^C goes: its foreground job
                group = self.pid
                if self.pty_fd is not None:
                    with contextlib.suppress(OSError):
                        group = os.tcgetpgrp(self.pty_fd)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)

    def on_close(self):
        for task in self.tasks:
            task.cancel()
        if self.writer is not None:
            self.writer.close()
        if self.pid and self._running():
            _keep(asyncio.ensure_future(_hang_up(self.pid, self.pty)))
        if self.pty_fd is not None:
            with contextlib.suppress(OSError, ValueError):
                asyncio.get_running_loop().remove_reader(self.pty_fd)
            with contextlib.suppress(OSError):
                os.close(self.pty_fd)
            self.pty_fd = None

    def _running(self) -> bool:
        """Whether what this channel started still runs (its group is not signalled after it
        exited: its id may belong to another process by then)."""
        if self.process is not None:
            return self.process.returncode is None
        return self.pty is not None and self.pty.isalive()

    # ------------------------------------------------------------------ starting

    async def _start(self, request: dict) -> None:
        if not isinstance(request, dict):
            raise ValueError("the first message must be an object")
        kind = request.get("kind")
        env = {**os.environ, **client_env(request.get("env"))}
        home = os.environ.get("HOME") or os.getcwd()
        if kind == "forward":
            await self._forward(request.get("host", "localhost"), request.get("port"))
            return
        if kind == "sftp":
            server = sftp_server()
            if server is None:
                raise ValueError(
                    "SFTP needs OpenSSH's sftp-server in this server's system (Debian and"
                    " Ubuntu: the openssh-sftp-server package); ask the operator"
                )
            argv = [server]
        elif kind == "exec":
            command = request.get("command")
            if not isinstance(command, str) or "\0" in command:
                raise ValueError("exec needs a command")
            argv = [shell(), "-c", command]
        elif kind == "shell":
            argv = [shell(), "-l"]
        else:
            raise ValueError(f"unknown kind of channel {kind!r}")
        pty = request.get("pty") if kind != "sftp" else None
        if isinstance(pty, dict):
            env["TERM"] = terminal_type(pty.get("term"))
            await self._start_pty(argv, env, home, pty)
        else:
            # a command that runs is activity, output or not; a shell or SFTP is by its bytes
            await self._start_pipes(argv, env, home, running_is_activity=kind == "exec")
        self._touch()

    async def _start_pipes(
        self, argv: list[str], env: dict, home: str, running_is_activity: bool
    ) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=home,
            env=env,
            start_new_session=True,
        )
        self.pid = self.process.pid
        self.tasks = [
            asyncio.ensure_future(self._pump(self.process.stdout, STDOUT)),
            asyncio.ensure_future(self._pump(self.process.stderr, STDERR)),
        ]
        if running_is_activity:
            self.tasks.append(asyncio.ensure_future(self._running_is_activity()))
        self.tasks.append(asyncio.ensure_future(self._exit_after_output()))

    async def _start_pty(self, argv: list[str], env: dict, home: str, pty: dict) -> None:
        import ptyprocess

        cols = _bounded(pty.get("cols"), 1, 1000, 80)
        rows = _bounded(pty.get("rows"), 1, 1000, 24)
        try:
            proc = ptyprocess.PtyProcess.spawn(argv, cwd=home, env=env, dimensions=(rows, cols))
        except (OSError, ValueError, ptyprocess.PtyProcessError) as e:
            raise ValueError(f"the terminal could not start: {e}") from None
        self.pty = proc
        self.pid = proc.pid
        self.pty_fd = proc.fd
        os.set_blocking(proc.fd, False)
        loop = asyncio.get_running_loop()
        output: asyncio.Queue[bytes | None] = asyncio.Queue()
        reading, ended = True, False

        def readable():
            nonlocal reading, ended
            try:
                data = os.read(proc.fd, CHUNK_BYTES)
            except BlockingIOError:
                return
            except OSError:  # EIO: the last process holding the terminal has exited
                data = b""
            if not data:
                loop.remove_reader(proc.fd)
                reading, ended = False, True
                output.put_nowait(None)
                return
            output.put_nowait(data)
            if output.qsize() >= PTY_READ_AHEAD:  # the gateway is behind: wait for it
                loop.remove_reader(proc.fd)
                reading = False

        loop.add_reader(proc.fd, readable)

        async def relay():
            nonlocal reading
            while (data := await output.get()) is not None:
                await self._send(STDOUT, data)
                if not reading and not ended and output.empty() and self.pty_fd is not None:
                    reading = True
                    loop.add_reader(proc.fd, readable)
            status = await asyncio.to_thread(_wait_pty, proc)
            await self._send_exit(status)

        self.tasks = [asyncio.ensure_future(relay())]

    # ------------------------------------------------------------------ relaying

    async def _pump(self, stream: asyncio.StreamReader, tag: int) -> None:
        while data := await stream.read(CHUNK_BYTES):
            await self._send(tag, data)

    async def _exit_after_output(self) -> None:
        process = self.process
        assert process is not None
        status = await process.wait()
        # everything it wrote goes before its exit status
        await asyncio.gather(*self.tasks[:2], return_exceptions=True)
        await self._send_exit(status)

    async def _running_is_activity(self) -> None:
        while True:
            self._touch()
            await asyncio.sleep(RUNNING_ACTIVITY_SECONDS)

    async def _send(self, tag: int, data: bytes) -> None:
        self._touch()
        # awaited: the message is on its way before the next read, so the gateway (and the
        # person at the far end) sets the pace
        with contextlib.suppress(WebSocketClosedError):
            await self.write_message(bytes([tag]) + data, binary=True)

    async def _send_exit(self, status: int) -> None:
        message = (
            {"exit_signal": signal.Signals(-status).name[3:]}
            if status < 0 and -status in signal.valid_signals()
            else {"exit": status}
        )
        with contextlib.suppress(WebSocketClosedError):
            await self.write_message(json.dumps(message))
        self.close()

    async def _send_error(self, text: str) -> None:
        with contextlib.suppress(WebSocketClosedError):
            await self.write_message(bytes([STDERR]) + f"meterhub: {text}\n".encode(), binary=True)
            await self.write_message(json.dumps({"exit": 1}))
        self.close()

    async def _stdin(self, data: bytes) -> None:
        if self.pty_fd is not None:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.pty_fd, view) :]
                except BlockingIOError:
                    await asyncio.sleep(0.01)
        elif self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(ConnectionError):
                self.process.stdin.write(data)
                await self.process.stdin.drain()
        elif self.writer is not None:
            self.writer.write(data)
            await self.writer.drain()

    async def _eof(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(ConnectionError, OSError):
                self.process.stdin.close()
        elif self.pty_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.pty_fd, b"\x04")  # ^D: what a terminal sends at end of input
        elif self.writer is not None and self.writer.can_write_eof():
            self.writer.write_eof()

    async def _forward(self, host: object, port: object) -> None:
        if host not in LOOPBACK:
            raise ValueError("only this server's own ports (localhost) can be forwarded")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError("forward needs a port from 1 to 65535")
        try:
            reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1" if host != "::1" else "::1", port), 20
            )
        except (OSError, TimeoutError) as e:
            raise ValueError(f"nothing answers on port {port} in this server ({e})") from None

        async def relay():
            while data := await reader.read(CHUNK_BYTES):
                await self._send(STDOUT, data)
            await self._send_exit(0)

        self.tasks = [asyncio.ensure_future(relay())]

    def _touch(self) -> None:
        now = time.monotonic()
        if now - self.touched >= 1:
            self.touched = now
            self.application.settings[ACTIVITY_KEY] = utcnow()


def _wait_pty(proc) -> int:
    """A pty command's exit status as asyncio reports one (negative: the signal)."""
    proc.wait()
    if proc.signalstatus is not None:
        return -int(proc.signalstatus)
    return int(proc.exitstatus or 0)


async def _hang_up(sid: int, pty=None) -> None:
    """End what a closed channel left running, as sshd does when a client goes away: SIGHUP
    (and SIGCONT) to every process group of its session, the terminal's foreground job and
    background jobs included; then SIGKILL to the command or shell itself if it is still
    there. What ignores SIGHUP (`nohup`) lives on, as with sshd; `setsid` left the session."""
    for group in session_groups(sid) | {sid}:
        for sig in (signal.SIGHUP, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
    await asyncio.sleep(HANGUP_SECONDS)
    if sid in session_groups(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
    if pty is not None:  # a terminal's shell is this server's child: collect it
        await asyncio.to_thread(pty.wait)


#: hang-ups started by closed channels, kept until done (the loop holds tasks weakly)
_HANGING_UP: set[asyncio.Future] = set()


def _keep(task: asyncio.Future) -> None:
    _HANGING_UP.add(task)
    task.add_done_callback(_HANGING_UP.discard)


def handlers(base_url: str) -> list[tuple]:
    return [(url_path_join(base_url, "meterhub/ssh"), SSHChannelHandler)]
