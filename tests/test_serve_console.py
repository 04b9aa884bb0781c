"""What `meterhub serve` shows a person and how it stops: a real hub with its proxy and billing
service, started as `make serve` starts it, and as `make serve &` in a script does (SIGINT
ignored, which its children inherit). The sign-in line comes last, on its own, once the hub
is healthy, and in the data directory's README; no Python warning or traceback appears; one
SIGTERM ends the hub, the proxy and the billing service."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from .hubprocess import HubProcess, until

SIGN_IN = re.compile(r"^meterhub: sign in at (http://\S+/hub/login) as 'admin' with password (\S+)")
#: what Python's warnings print ("file:line: SomeWarning: …"), and tracebacks
PYTHON_TROUBLE = re.compile(r"\b\w*Warning: |Traceback \(most recent call last\)|InformationOnly")


def alive(pid: int) -> bool:
    """A live process (a zombie nobody reaped yet is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def lines(hub: HubProcess) -> list[str]:
    return hub.log_path.read_text(errors="replace").splitlines()


@pytest.mark.parametrize("sigint", ["inherited", "ignored"])
def test_sign_in_line_comes_last_and_one_sigterm_stops_everything(tmp_path, sigint):
    # the embedded default, on free ports, in tmp_path; once without the sandbox, whose
    # warning comes just before the sign-in line
    warned = sigint == "ignored"
    hub = HubProcess(tmp_path, {"local": {"sandbox": "off"}} if warned else {})

    def start_as_make_would():
        if sigint == "ignored":  # what a shell does to `make serve &` in a script
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    with open(hub.log_path, "wb") as log:
        hub.proc = subprocess.Popen(
            hub.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=hub.workdir,
            start_new_session=True,
            preexec_fn=start_as_make_would,
        )
    try:

        def healthy():
            assert hub.proc.poll() is None, hub.log_tail()
            try:
                return requests.get(f"{hub.url}/hub/health", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        until(healthy, "the hub to be healthy")
        signed = until(
            lambda: [i for i, line in enumerate(lines(hub)) if SIGN_IN.match(line)],
            "the sign-in line",
        )
        console = lines(hub)
        (at,) = signed
        running = [i for i, line in enumerate(console) if "JupyterHub is now running" in line]
        assert running and running[0] < at, "the sign-in line comes once the hub runs"
        if warned:
            assert console[at - 1].startswith("meterhub: WARNING: Servers run WITHOUT a sandbox")
            at -= 1
        assert console[at - 1] == "", "the sign-in lines stand on their own"
        sign_in = console[signed[0]]
        url, password = SIGN_IN.match(sign_in).groups()
        assert url == f"{hub.url}/hub/login"
        assert sign_in.endswith("(kept in data/admin-password)")
        assert (Path(hub.data_dir) / "admin-password").read_text().strip() == password
        readme = (Path(hub.data_dir) / "README").read_text()
        assert f"meterhub: sign in at {url} as 'admin' with the password in data/" in readme
        assert password not in readme

        proxy = int((Path(hub.data_dir) / "jupyterhub-proxy.pid").read_text())
        (billing,) = hub.service_pids(b"billing", b"service")
        assert alive(proxy) and alive(billing)
        # nothing came after the sign-in line while the test looked (its health polls ended)
        assert lines(hub)[-1] == sign_in, "\n".join(lines(hub)[at:])

        asked = time.monotonic()
        hub.proc.send_signal(signal.SIGTERM)
        assert hub.proc.wait(timeout=60) == 0, hub.log_tail()
        until(lambda: not alive(proxy) and not alive(billing), "the proxy and billing to exit")
        print(f"stopped in {time.monotonic() - asked:.1f} s (SIGINT {sigint})")
    finally:
        if hub.proc.poll() is None:  # an assertion failed before the stop
            hub.proc.kill()
            hub.proc.wait(timeout=30)
        for pid in hub.service_pids(b"billing", b"service"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it went with the hub
        hub.kill_leftovers()  # the proxy, by its pid file
    output = hub.log_path.read_text(errors="replace")
    # the hub's SIGINT stops the billing service, inherited ignored or not: nobody waits
    # for JupyterHub's interrupt timeout and its SIGTERM
    assert "Billing service stopped on SIGINT" in output, output[-3000:]
    assert not PYTHON_TROUBLE.search(output), PYTHON_TROUBLE.search(output).group(0) + output
