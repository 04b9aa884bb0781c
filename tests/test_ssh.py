"""The SSH front door on a real hub: asyncssh and OpenSSH's own ssh and rsync against the
gateway (hub/ssh.py), into a real sandboxed server (extensions/ssh.py) — commands, a
terminal, SFTP and rsync onto the user's disk, port forwarding — and every token that must
be refused: a wrong one, another user's, the kernel's own, one without the SSH scope."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import stat
import subprocess
from pathlib import Path

import asyncssh
import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from meterhub.hub.ssh import LoginLimits, ensure_host_key, may_ssh

from .hubprocess import ADMIN_TOKEN, free_port, until
from .jupyter import execute


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def ssh_hub(hub_factory):
    port = free_port()
    hub = hub_factory({"ssh": {"enabled": True, "port": port}}, name="ssh")
    hub.ssh_port = port
    until(lambda: _listening(port), "the SSH front door to listen")
    return hub


AMY_PASSWORD = "amy-password-1234"


@pytest.fixture(scope="module")
def amy(ssh_hub) -> str:
    """amy, with a password (her browser's cookies), a running debug-mode server that the
    tests share, and a token from /hub/token: what they log in with."""
    ssh_hub.add_user("amy", AMY_PASSWORD)
    ssh_hub.spawn("amy", {"profile": "debug"})
    return token_for(ssh_hub, "amy")


def token_for(hub, user: str, scopes: list[str] | None = None) -> str:
    hub.ensure_user(user)
    body = {"note": "ssh test", **({"scopes": scopes} if scopes is not None else {})}
    r = hub.api("POST", f"/users/{user}/tokens", json=body)
    assert r.status_code == 201, r.text
    return r.json()["token"]


async def connect(hub, user: str, token: str) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        "127.0.0.1",
        hub.ssh_port,
        username=user,
        password=token,
        known_hosts=None,
        client_keys=None,
        agent_path=None,
        preferred_auth="password",
    )


def disk(hub, user: str) -> Path:
    return Path(hub.data_dir) / "disks" / user


# ------------------------------------------------------------------ who may


def test_the_scopes_that_open_a_server_over_ssh():
    mine = {"access:servers!user=amy", "custom:meterhub:ssh!user=amy"}
    assert may_ssh(frozenset(mine), "amy", set())
    assert not may_ssh(frozenset(mine), "ben", set())  # amy's token, ben's server
    # the kernel's own token reaches the server but has no SSH scope
    assert not may_ssh(
        frozenset({"access:servers!server=amy/", "users:activity!user=amy"}), "amy", set()
    )
    assert not may_ssh(frozenset({"custom:meterhub:ssh!user=amy"}), "amy", set())  # no access
    assert may_ssh(frozenset({"access:servers", "custom:meterhub:ssh"}), "ben", set())
    group = frozenset({"access:servers!group=lab", "custom:meterhub:ssh"})
    assert may_ssh(group, "ben", {"lab"}) and not may_ssh(group, "ben", {"Lab"})
    # the server knows its user, not their groups: an SSH scope for a group is not enough
    by_group = frozenset({"access:servers", "custom:meterhub:ssh!group=lab"})
    assert not may_ssh(by_group, "ben", {"lab"})


def test_failed_logins_are_limited_per_address_and_user_attempts_in_flight_included():
    limits = LoginLimits(limit=3, window=60)
    for second in range(3):  # three wrong passwords for amy from one address
        assert limits.begin("10.0.0.1", "amy", now=second)
        limits.end("10.0.0.1", "amy", ok=False, now=second)
    assert not limits.begin("10.0.0.1", "amy", now=10)  # the hub is not asked again
    # others behind the same address, and amy from elsewhere, are not locked out
    assert limits.begin("10.0.0.1", "ben", now=10) and limits.begin("10.0.0.2", "amy", now=10)
    assert limits.begin("10.0.0.1", "amy", now=70)  # the window has passed
    # attempts still waiting for the hub count: a burst is not all asked
    burst = LoginLimits(limit=3, window=60)
    assert [burst.begin("10.0.0.9", "amy", now=0) for _ in range(5)] == [True] * 3 + [False] * 2


def test_connections_waiting_to_log_in_are_limited_in_all_and_per_address():
    limits = LoginLimits(pending_limit=4, pending_per_address=2)
    assert limits.connect("10.0.0.1") and limits.connect("10.0.0.1")
    assert not limits.connect("10.0.0.1")  # a third from one address
    assert limits.connect("10.0.0.2") and limits.connect("10.0.0.3")
    assert not limits.connect("10.0.0.4")  # four in all
    limits.settled("10.0.0.1")  # one logged in (or went away)
    assert limits.connect("10.0.0.4")


# ------------------------------------------------------------------ a real hub


async def test_no_running_server_is_told_how_to_start_one_and_what_it_costs(ssh_hub):
    token = token_for(ssh_hub, "nora")
    async with await connect(ssh_hub, "nora", token) as conn:
        result = await conn.run("true")
    assert result.exit_status == 1
    assert "nora has no running server" in result.stderr
    assert f"{ssh_hub.url}/hub/spawn" in result.stderr
    assert "Debug mode costs ¥0.10 per hour" in result.stderr
    assert "your balance is ¥10.00" in result.stderr
    assert ssh_hub.server("nora") is None, "SSH never starts a server"


async def test_commands_run_inside_the_users_sandbox_on_their_disk(ssh_hub, amy):
    token = amy
    (disk(ssh_hub, "amy") / "notes.txt").write_text("on the disk\n")
    async with await connect(ssh_hub, "amy", token) as conn:
        probe = await conn.run(
            "id -u; pwd; echo $METERHUB_PROFILE; ls /home; cat notes.txt;"
            f" test -e {ssh_hub.data_dir} && echo visible || echo hidden"
        )
        assert probe.exit_status == 0, probe.stderr
        uid, cwd, profile, homes, notes, data_dir = probe.stdout.splitlines()
        assert (cwd, profile, homes, notes) == ("/home/jovyan", "debug", "jovyan", "on the disk")
        assert data_dir == "hidden", "the hub's data directory must not be visible"
        if os.geteuid() == 0:
            assert int(uid) > 200000  # the user's own uid, never root
        assert int(uid) != 0
        assert (await conn.run("exit 3")).exit_status == 3
        echoed = await conn.run("cat; echo err >&2", input="hello\n")
        assert (echoed.stdout, echoed.stderr) == ("hello\n", "err\n")
        # a terminal has the client's size, and a shell reads what is typed
        sized = await conn.run("stty size", term_type="xterm", term_size=(100, 30))
        assert sized.stdout.strip() == "30 100"
        shell = await conn.create_process(term_type="xterm")
        shell.stdin.write("echo $((6 * 7))\n")
        await asyncio.wait_for(shell.stdout.readuntil("42"), 30)
        shell.stdin.write("exit 5\n")
        assert (await asyncio.wait_for(shell.wait(), 30)).exit_status == 5


async def test_sftp_copies_into_the_users_disk(ssh_hub, amy, tmp_path):
    token = amy
    payload = os.urandom(3 * 1024 * 1024)
    local = tmp_path / "weights.bin"
    local.write_bytes(payload)
    async with await connect(ssh_hub, "amy", token) as conn:
        async with conn.start_sftp_client() as sftp:
            await sftp.mkdir("data")
            await sftp.put(str(local), "data/weights.bin")
            assert "weights.bin" in await sftp.listdir("data")
            back = tmp_path / "back.bin"
            await sftp.get("data/weights.bin", str(back))
    copied = disk(ssh_hub, "amy") / "data" / "weights.bin"
    assert hashlib.sha256(copied.read_bytes()).digest() == hashlib.sha256(payload).digest()
    assert back.read_bytes() == payload
    if os.geteuid() == 0:
        assert copied.stat().st_uid > 200000, "written as the user, not as root"
    assert not stat.S_IMODE(copied.stat().st_mode) & stat.S_IWOTH


def test_openssh_and_rsync_work_with_a_token_as_the_password(ssh_hub, amy, tmp_path):
    """What people type: `ssh -p PORT amy@host` and `rsync -e 'ssh -p PORT'`, the token given
    at the password prompt (here by SSH_ASKPASS)."""
    token = amy
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho {token}\n")
    askpass.chmod(0o700)
    env = {
        **os.environ,
        "SSH_ASKPASS": str(askpass),
        "SSH_ASKPASS_REQUIRE": "force",
        "DISPLAY": ":0",
    }
    ssh = (
        f"ssh -p {ssh_hub.ssh_port} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        " -o PreferredAuthentications=password -o PubkeyAuthentication=no -o LogLevel=ERROR"
    )
    ran = subprocess.run(
        [*ssh.split(), "amy@127.0.0.1", "echo $HOME; hostname"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["/home/jovyan", "meterhub"]
    source = tmp_path / "dataset"
    (source / "part").mkdir(parents=True)
    for i in range(20):
        (source / "part" / f"{i}.txt").write_text(f"row {i}\n" * 100)
    synced = subprocess.run(
        ["rsync", "-a", "-e", ssh, f"{source}/", "amy@127.0.0.1:dataset/"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert synced.returncode == 0, synced.stderr
    landed = disk(ssh_hub, "amy") / "dataset" / "part"
    assert sorted(p.name for p in landed.iterdir()) == sorted(f"{i}.txt" for i in range(20))
    assert (landed / "7.txt").read_text() == "row 7\n" * 100


async def test_port_forwarding_reaches_the_servers_own_ports_only(ssh_hub, amy):
    token = amy
    port = free_port()
    async with await connect(ssh_hub, "amy", token) as conn:
        web = await conn.create_process(f"exec python3 -m http.server {port} --bind 127.0.0.1")
        try:

            async def get():
                reader, writer = await conn.open_connection("localhost", port)
                writer.write(b"GET / HTTP/1.0\r\n\r\n")
                writer.write_eof()
                return await reader.read()

            answer = b""
            for _ in range(100):  # the server inside takes a moment to listen
                answer = await get()
                if answer:
                    break
                await asyncio.sleep(0.2)
            assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.open_connection("10.1.2.3", 80)
        finally:
            web.terminate()


async def test_tokens_that_must_not_open_a_server_are_refused(ssh_hub, amy):
    ben = token_for(ssh_hub, "lou")
    kernel = (
        await execute(
            ssh_hub.url, "amy", ADMIN_TOKEN, "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])"
        )
    ).strip()
    narrow = token_for(ssh_hub, "amy", scopes=["access:servers!user=amy"])
    for who, token in (
        ("a wrong token", "0" * 32),
        ("another user's token", ben),
        ("the kernel's own token", kernel),
        ("a token without the SSH scope", narrow),
        ("the operator's admin token (no SSH scope)", ADMIN_TOKEN),
        ("an empty password", ""),
    ):
        with pytest.raises(asyncssh.PermissionDenied):
            await connect(ssh_hub, "amy", token)
            pytest.fail(f"{who} opened kim's server")
    # kim's own token still works
    async with await connect(ssh_hub, "amy", amy) as conn:
        assert (await conn.run("true")).exit_status == 0


async def test_the_servers_endpoint_refuses_cookies_and_tokens_without_the_scope(ssh_hub, amy):
    """The gateway is not the only check: a page in a signed-in browser (cookies, no
    Authorization header) and the kernel's token get 403 from the server itself."""
    session = ssh_hub.sign_in("amy", AMY_PASSWORD)
    kernel = (
        await execute(
            ssh_hub.url, "amy", ADMIN_TOKEN, "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])"
        )
    ).strip()
    # the browser's cookies for the server (set by visiting it)
    session.get(f"{ssh_hub.url}/user/amy/lab", timeout=60)
    cookie = "; ".join(f"{c.name}={c.value}" for c in session.cookies)
    url = ssh_hub.url.replace("http", "ws", 1) + "/user/amy/meterhub/ssh"
    for headers in (
        {"Cookie": cookie},
        {"Authorization": f"token {kernel}"},
        {"Authorization": f"token {token_for(ssh_hub, 'amy', scopes=['access:servers!user=amy'])}"},
    ):
        with pytest.raises(HTTPClientError) as refused:
            await websocket_connect(HTTPRequest(url, headers=headers, request_timeout=30))
        assert refused.value.code == 403, headers
    assert requests.get(f"{ssh_hub.url}/user/amy/api/status", timeout=30).status_code in (302, 403)


def test_the_host_key_is_made_once_kept_and_served(ssh_hub):
    """`meterhub serve` runs the gateway (site config `ssh`) with a host key of its own."""
    key = Path(ssh_hub.data_dir) / "ssh_host_ed25519_key"
    assert key.exists() and stat.S_IMODE(key.stat().st_mode) == 0o600
    scan = subprocess.run(
        ["ssh-keyscan", "-p", str(ssh_hub.ssh_port), "-t", "ed25519", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    public = Path(f"{key}.pub").read_text().split()[1]
    assert public in scan.stdout
    before = key.read_bytes()
    assert ensure_host_key(str(key)) == str(key) and key.read_bytes() == before  # kept


def test_the_gateway_stops_with_the_hub(hub_factory):
    port = free_port()
    hub = hub_factory({"ssh": {"enabled": True, "port": port}}, name="ssh-stop")
    until(lambda: _listening(port), "the SSH front door to listen")
    hub.stop()  # SIGTERM, as systemd or Ctrl-C stops `meterhub serve`

    until(
        lambda: not hub.service_pids(b"ssh", b"serve") and not _listening(port),
        "the gateway to stop with the hub",
    )


async def test_output_arrives_whole_and_a_vanished_client_ends_its_command(ssh_hub, amy):
    token = amy
    async with await connect(ssh_hub, "amy", token) as conn:
        # 16 MiB through the websocket and the gateway, paced by the client
        big = await conn.run("head -c 16777216 /dev/zero", encoding=None)
        assert big.exit_status == 0 and len(big.stdout) == 16 * 1024 * 1024
        pty = await conn.run("seq 1 200000", term_type="xterm")
        assert pty.stdout.split()[-1] == "200000"
    # a client that drops its connection mid-command: the command is hung up, as sshd does
    dropped = await connect(ssh_hub, "amy", token)
    await dropped.create_process("sleep 307")
    await asyncio.sleep(1)
    dropped.abort()

    async def still_running() -> bool:
        async with await connect(ssh_hub, "amy", token) as conn:
            found = await conn.run("pgrep -fx 'sleep 307' || true")
            return bool(found.stdout.strip())

    for _ in range(60):
        if not await still_running():
            break
        await asyncio.sleep(0.5)
    else:
        pytest.fail("the command of a client that went away still runs")


SCRAPE = """
import os, re
found = set()
for pid in os.listdir("/proc"):
    try:
        if b"jupyterhub-singleuser" not in open(f"/proc/{pid}/cmdline", "rb").read():
            continue
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except (OSError, ValueError):
        continue
    for line in maps:
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if "r" not in perms or end - start > 512 * 1024 * 1024:
            continue
        try:
            mem.seek(start)
            found.update(m.decode() for m in re.findall(rb"[0-9a-f]{32}", mem.read(end - start)))
        except (OSError, ValueError, OverflowError):
            continue
print(" ".join(sorted(found)))
"""


async def test_the_server_never_holds_the_users_own_token(ssh_hub):
    """What a server is sent, code in it can read (its memory is its user's): SSH gives it a
    token for that server alone, made for the connection and deleted after it."""
    token = token_for(ssh_hub, "pam")
    ssh_hub.spawn("pam", {"profile": "debug"})
    narrow = {"access:servers!server=pam/", "custom:meterhub:ssh!user=pam"}

    def made_for_ssh() -> list[dict]:
        tokens = ssh_hub.api("GET", "/users/pam/tokens").json()["api_tokens"]
        return [t for t in tokens if t["note"].startswith("meterhub SSH from")]

    async with await connect(ssh_hub, "pam", token) as conn:
        assert (await conn.run("true")).exit_status == 0
        (made,) = made_for_ssh()
        identify = {"read:users:name!user=pam", "read:users:groups!user=pam"}  # every token's
        assert set(made["scopes"]) - identify == narrow and made["expires_at"]
        found = set((await execute(ssh_hub.url, "pam", ADMIN_TOKEN, SCRAPE)).split())
        assert token not in found, "the user's own token reached the server"
        for candidate in found - {ADMIN_TOKEN}:  # the test's own calls to the kernel
            who = requests.get(
                f"{ssh_hub.url}/hub/api/user",
                headers={"Authorization": f"token {candidate}"},
                timeout=30,
            )
            if who.status_code == 200:
                scopes = set(who.json()["scopes"])
                assert not scopes & {"servers!user=pam", "tokens!user=pam", "custom:meterhub:spend"}
    until(lambda: not made_for_ssh(), "the connection's token to be deleted")


async def test_closing_a_terminal_hangs_up_its_jobs_and_odd_requests_are_ignored(ssh_hub, amy):
    token = amy
    # a variable name that is no variable, and a terminal type that is no terminal: refused
    # quietly, the session runs
    async with await connect(ssh_hub, "amy", token) as conn:
        odd = await conn.run(
            "echo ${LC_A:-unset} $TERM",
            env={"LC_A=B": "x", "LANGEVIL": "1"},
            term_type="xterm\x00evil",
        )
        assert odd.exit_status == 0 and odd.stdout.split() == ["unset", "xterm"]
    dropped = await connect(ssh_hub, "amy", token)
    shell = await dropped.create_process(term_type="xterm")
    shell.stdin.write("sleep 613\n")  # the terminal's foreground job, a group of its own
    await asyncio.sleep(2)
    dropped.abort()

    async def running(pattern: str) -> bool:
        async with await connect(ssh_hub, "amy", token) as conn:
            return bool((await conn.run(f"pgrep -fx '{pattern}' || true")).stdout.strip())

    for _ in range(180):  # 30 s was once not enough in CI (four test workers on two cores)
        if not await running("sleep 613"):
            break
        await asyncio.sleep(0.5)
    else:
        pytest.fail("the closed terminal's job still runs")


async def test_the_servers_endpoint_ignores_control_messages_it_cannot_read(ssh_hub, amy):
    token = amy
    url = ssh_hub.url.replace("http", "ws", 1) + "/user/amy/meterhub/ssh"
    ws = await websocket_connect(
        HTTPRequest(url, headers={"Authorization": f"token {token}"}, request_timeout=30)
    )
    await ws.write_message('{"kind": "exec", "command": "cat"}')
    for junk in ("5", "[1]", '{"resize": "ab"}', '{"resize": {"a": 1}}', '{"signal": 9}', "{"):
        await ws.write_message(junk)
    await ws.write_message(b"still here", binary=True)
    await ws.write_message('{"eof": true}')
    got, exit_status = b"", None
    while (message := await asyncio.wait_for(ws.read_message(), 30)) is not None:
        if isinstance(message, bytes):
            got += message[1:]
        elif "exit" in message:
            exit_status = message
    assert got == b"still here" and exit_status == '{"exit": 0}'


async def test_a_connection_whose_token_no_longer_may_is_closed(monkeypatch):
    """Checked again every RECHECK_SECONDS: a revoked token ends the connection."""
    from meterhub.hub import ssh

    monkeypatch.setattr(ssh, "RECHECK_SECONDS", 0.01)
    answers = iter([True, True, False])

    class Hub:
        limits = ssh.LoginLimits()

        async def authenticate(self, user, token):
            return next(answers)

    class Conn:
        closed = False

        def close(self):
            self.closed = True

    owner = ssh.SessionOwner(Hub())
    owner.user, owner.token, owner.conn = "amy", "t", Conn()
    await asyncio.wait_for(owner._recheck(), 5)
    assert owner.conn.closed
