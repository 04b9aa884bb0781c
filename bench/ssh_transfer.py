"""The SSH front door vs SSH without it, side by side, alternating: what the relay costs
(gateway → proxy → websocket → the server's endpoint → OpenSSH's sftp-server or a shell).

- through meterhub: a real hub (`meterhub serve`, its gateway on a free port) and a real
  sandboxed debug-mode server; asyncssh's client logs in with a token.
- without it: a plain asyncssh server on this machine, in this process's event loop, whose
  SFTP is asyncssh's own (files of a temporary folder) and whose commands run as local
  subprocesses; the same asyncssh client with a password. No hub, no proxy, no sandbox.

Measured each round, one after the other:
1. login + `true`: connect, authenticate, run `true`, close (median of 10 a round);
2. SFTP upload of one file (`--mib`, random bytes) with `put`, MiB/s;
3. command output: `head -c SIZE /dev/zero` read whole, MiB/s.

    .venv/bin/python bench/ssh_transfer.py --rounds 3 --mib 256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncssh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.hubprocess import HubProcess, free_port, until  # noqa: E402

PASSWORD = "bench-password"


class PlainServer(asyncssh.SSHServer):
    def begin_auth(self, username):
        return True

    def password_auth_supported(self):
        return True

    def validate_password(self, username, password):
        return password == PASSWORD


async def plain_process(process: asyncssh.SSHServerProcess) -> None:
    proc = await asyncio.create_subprocess_shell(
        process.command or "true",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
    )
    while data := await proc.stdout.read(64 * 1024):
        process.stdout.write(data)
        await process.stdout.drain()
    process.exit(await proc.wait())


async def connect(port: int, user: str, password: str) -> asyncssh.SSHClientConnection:
    return await asyncssh.connect(
        "127.0.0.1",
        port,
        username=user,
        password=password,
        known_hosts=None,
        client_keys=None,
        agent_path=None,
        preferred_auth="password",
    )


async def login_seconds(port: int, user: str, password: str, times: int = 10) -> float:
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        async with await connect(port, user, password) as conn:
            assert (await conn.run("true")).exit_status == 0
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


async def upload_mib_s(port: int, user: str, password: str, local: Path, mib: int) -> float:
    async with await connect(port, user, password) as conn:
        async with conn.start_sftp_client() as sftp:
            start = time.perf_counter()
            await sftp.put(str(local), "bench-upload.bin")
            took = time.perf_counter() - start
            await sftp.remove("bench-upload.bin")
    return mib / took


async def output_mib_s(port: int, user: str, password: str, mib: int) -> float:
    async with await connect(port, user, password) as conn:
        start = time.perf_counter()
        result = await conn.run(f"head -c {mib * 1024 * 1024} /dev/zero", encoding=None)
        took = time.perf_counter() - start
    assert len(result.stdout) == mib * 1024 * 1024
    return mib / took


async def measure(port: int, user: str, password: str, local: Path, mib: int) -> dict:
    return {
        "login": await login_seconds(port, user, password),
        "upload": await upload_mib_s(port, user, password, local, mib),
        "output": await output_mib_s(port, user, password, mib),
    }


async def run(rounds: int, mib: int, work: Path) -> None:
    local = work / "upload.bin"
    with open(local, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1024 * 1024))
    plain_root = work / "plain"
    plain_root.mkdir()
    key = asyncssh.generate_private_key("ssh-ed25519")
    plain_port = free_port()
    plain = await asyncssh.listen(
        "127.0.0.1",
        plain_port,
        server_host_keys=[key],
        server_factory=PlainServer,
        process_factory=plain_process,
        sftp_factory=lambda chan: asyncssh.SFTPServer(chan, chroot=str(plain_root).encode()),
        encoding=None,
        line_editor=False,
    )
    port = free_port()
    hub = HubProcess(work / "hub", {"ssh": {"enabled": True, "port": port}})
    hub.start()
    try:
        until(lambda: hub.api("GET", "/").ok, "the hub")
        hub.spawn("bench", {"profile": "debug"})
        token = hub.api("POST", "/users/bench/tokens", json={"note": "bench"}).json()["token"]
        results = {"meterhub": [], "plain": []}
        for i in range(rounds):
            order = ("meterhub", "plain") if i % 2 == 0 else ("plain", "meterhub")
            for which in order:
                if which == "meterhub":
                    results[which].append(await measure(port, "bench", token, local, mib))
                else:
                    results[which].append(await measure(plain_port, "bench", PASSWORD, local, mib))
                print(f"round {i + 1} {which}: {results[which][-1]}", flush=True)
        print()
        print("| | login + `true` (median) | SFTP upload | command output |")
        print("| --- | --- | --- | --- |")
        summary = {}
        for which, rows in results.items():
            login = statistics.median(r["login"] for r in rows)
            upload = statistics.median(r["upload"] for r in rows)
            output = statistics.median(r["output"] for r in rows)
            summary[which] = (login, upload, output)
            print(f"| {which} | {login * 1000:.0f} ms | {upload:.0f} MiB/s | {output:.0f} MiB/s |")
        m, p = summary["meterhub"], summary["plain"]
        print(
            f"| ratio meterhub/plain | {m[0] / p[0]:.2f}× the time | {m[1] / p[1]:.2f}×"
            f" the throughput | {m[2] / p[2]:.2f}× the throughput |"
        )
    finally:
        hub.teardown()
        plain.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256, help="MiB uploaded and read per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="meterhub-ssh-bench-") as work:
        asyncio.run(run(args.rounds, args.mib, Path(work)))


if __name__ == "__main__":
    main()
