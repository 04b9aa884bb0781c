"""A real meterhub process for tests: `meterhub serve` on free ports with a given site config."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from meterhub.spawner import procs

ADMIN_TOKEN = "test-admin-token-" + "x" * 16
MAX_WAIT_SECONDS = 90


# Ports the tests' hubs, proxies and databases listen on come from below the kernel's
# ephemeral range (32768+), where single-user servers and outgoing connections take theirs,
# and each pytest process has its own slice: a port picked here cannot be taken meanwhile
# by another worker's server (CI saw "Address already in use" from exactly that race).
# xdist workers gw0..gw7 take slices 0..7; a pytest without xdist one of 8..9 by its pid.
_SLICE = 2000
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_SLICE_INDEX = int(_worker[2:]) % 8 if _worker[2:].isdigit() else 8 + os.getpid() % 2
_BASE = 12000 + _SLICE_INDEX * _SLICE
_next_port = _BASE + (os.getpid() % 97) * 16


def free_port() -> int:
    global _next_port
    for _ in range(_SLICE):
        port = _next_port
        _next_port = _BASE + (port + 1 - _BASE) % _SLICE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this process's slice")


def until(condition, what: str, timeout: float = MAX_WAIT_SECONDS, interval: float = 0.2):
    """Poll `condition` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class HubProcess:
    def __init__(self, workdir: Path, site: dict):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.site = dict(site)
        self.site.setdefault("data_dir", str(self.workdir / "data"))
        # the SSH front door listens on a port of its own: only where a test asks for one
        self.site.setdefault("ssh", {"enabled": False})
        self.data_dir = self.site["data_dir"]
        self.port = free_port()
        ports = ("api_port", "proxy_api_port", "billing_port")
        self.site.setdefault("hub", {port: free_port() for port in ports})
        self.config_path = self.workdir / "meterhub.yaml"
        self.config_path.write_text(yaml.safe_dump(self.site))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.workdir / "hub.log"
        self.proc: subprocess.Popen | None = None

    # -- process
    def command(self) -> list[str]:
        meterhub = str(Path(sys.executable).parent / "meterhub")
        return [meterhub, "serve", "--config", str(self.config_path), "--port", str(self.port)]

    def start(self) -> None:
        env = dict(os.environ, METERHUB_ADMIN_TOKEN=ADMIN_TOKEN)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"hub exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                return requests.get(f"{self.url}/hub/api/", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        until(up, "the hub to answer")

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def teardown(self) -> None:
        try:
            if self.proc and self.proc.poll() is None:
                for user in self.api("GET", "/users").json():
                    if user["servers"]:
                        self.api("DELETE", f"/users/{user['name']}/server")
                self.stop()
        finally:
            self.kill_leftovers()

    def kill_leftovers(self) -> None:
        """Kill what this hub left running: servers and sandboxes (they name its data
        directory), the hub and its billing service (they name its config file: a teardown
        whose REST call failed left them running) and its proxy (by the pid file JupyterHub
        keeps in the data directory: a port alone could be another hub's by now)."""
        markers = (self.data_dir.encode(), str(self.config_path).encode())
        proxy = None
        try:
            proxy = int((Path(self.data_dir) / "jupyterhub-proxy.pid").read_text().strip())
        except (OSError, ValueError):
            pass
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            is_proxy = int(pid) == proxy and b"configurable-http-proxy" in cmdline
            if any(marker in cmdline for marker in markers) or is_proxy:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def service_pids(self, *words: bytes) -> list[int]:
        """This hub's managed services whose command line has `words` (b"billing",
        b"service"; b"ssh", b"serve"): they name its config file."""
        config = str(self.config_path).encode()
        return [p.pid for p in procs.scan() if config in p.argv and all(w in p.argv for w in words)]

    # -- REST API
    def api(self, method: str, path: str, token: str = ADMIN_TOKEN, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {token}", **kwargs.pop("headers", {})}
        return requests.request(
            method, f"{self.url}/hub/api{path}", headers=headers, timeout=120, **kwargs
        )

    def ensure_user(self, name: str) -> None:
        if self.api("GET", f"/users/{name}").status_code == 404:
            assert self.api("POST", f"/users/{name}").status_code == 201

    def add_user(self, name: str, password: str, *options: str) -> None:
        """`meterhub user add NAME --password-stdin` (with `options`, e.g. `--admin`)."""
        add = [*self.command()[:1], "user", "add", name, "--password-stdin", *options]
        out = subprocess.run(
            [*add, "--config", str(self.config_path)],
            input=password,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr

    def sign_in(self, name: str, password: str) -> requests.Session:
        """A session signed in through the login form, as a browser would (a first sign-in
        also gives the account its default role, which its servers' tokens draw from)."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30)
        r = s.post(
            f"{self.url}/hub/login",
            data={"username": name, "password": password, "_xsrf": s.cookies["_xsrf"]},
            timeout=30,
        )
        assert r.ok and "/hub/login" not in r.url, r.status_code
        return s

    def server(self, name: str) -> dict | None:
        return self.api("GET", f"/users/{name}").json()["servers"].get("")

    def spawn(self, name: str, options: dict) -> dict:
        """Start `name`'s server with user options and wait until it is ready."""
        self.ensure_user(name)
        r = self.api("POST", f"/users/{name}/server", json=options)
        assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{self.log_tail()}"
        return until(
            lambda: (s := self.server(name)) and s["ready"] and s,
            f"{name}'s server to be ready",
        )

    def stop_server(self, name: str) -> None:
        r = self.api("DELETE", f"/users/{name}/server")
        assert r.status_code in (202, 204), r.text
        until(lambda: self.server(name) is None, f"{name}'s server to stop")
