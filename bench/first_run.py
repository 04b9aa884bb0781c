"""A newcomer's first run, timed: fresh clone → `make serve` → healthy hub → stopped.

Each run clones a commit into a new folder, gives pip, uv and npm empty caches of their own
(cold, as on a new machine), runs `make serve` on free ports, and reports the seconds until
`/hub/health` answers, where the sign-in line stands in the console, and the seconds from the
stop signal until make, the hub, its proxy and its billing service have all exited.

    python3 bench/first_run.py --runs 2                # HEAD of this repository
    python3 bench/first_run.py --commit 8578b2f        # an older commit (before `ARGS=`)
    python3 bench/first_run.py --signal TERM --ignore-sigint  # as `make serve &` in a script

The stop is Ctrl-C by default (SIGINT to make's process group, as a terminal sends it).
Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP_LIMIT_SECONDS = 1800
STOP_LIMIT_SECONDS = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def processes_naming(marker: bytes) -> list[int]:
    """Live processes whose command line names `marker` (the clone's path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in argv and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def own_lines(console: list[str]) -> list[str]:
    """The console without the lines this probe's own health polls caused: the proxy's 404
    (and its failed error page, a stack of lines) while the hub's route is not added yet,
    and the hub's error page for it."""
    kept, in_stack = [], False
    for line in console:
        if "Failed to get custom error page" in line:
            in_stack = True
            continue
        if in_stack:
            in_stack = line != "}"
            continue
        if "/hub/health" not in line and "/hub/error/404" not in line and "xsrf" not in line:
            kept.append(line)
    return kept


def one_run(repo: str, commit: str, stop_signal: str, ignore_sigint: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="meterhub-first-run-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", repo, str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    makefile = clone / "Makefile"
    if "$(ARGS)" not in makefile.read_text():
        # commits before `make serve ARGS=...`: the same recipe, on this run's ports
        text = makefile.read_text().replace(
            "\t$(VENV)/bin/meterhub serve\n", "\t$(VENV)/bin/meterhub serve $(ARGS)\n"
        )
        makefile.write_text(text)
    port = free_port()
    ports = (free_port(), free_port(), free_port())
    config = work / "meterhub.yaml"
    api, proxy_api, billing = ports
    config.write_text(
        f"hub:\n  api_port: {api}\n  proxy_api_port: {proxy_api}\n  billing_port: {billing}\n"
    )
    env = dict(
        os.environ,
        UV_CACHE_DIR=str(work / "uv-cache"),
        PIP_CACHE_DIR=str(work / "pip-cache"),
        npm_config_cache=str(work / "npm-cache"),
    )
    log_path = work / "console.log"

    def ignore():
        # SIG_IGN is what a shell gives `make serve &` in a script (and children inherit it)
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

    started = time.monotonic()
    with open(log_path, "wb") as log:
        make = subprocess.Popen(
            ["make", "serve", f"ARGS=--config {config} --port {port}"],
            cwd=clone,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=ignore,
        )
    health = f"http://127.0.0.1:{port}/hub/health"
    while not healthy(health):
        if make.poll() is not None:
            raise SystemExit(f"make serve exited with {make.returncode}; see {log_path}")
        if time.monotonic() - started > SETUP_LIMIT_SECONDS:
            raise SystemExit(f"no healthy hub after {SETUP_LIMIT_SECONDS}s; see {log_path}")
        time.sleep(0.5)
    to_healthy = time.monotonic() - started
    time.sleep(5)  # what the console shows once things settle
    console = own_lines(log_path.read_text(errors="replace").splitlines())
    sign_in = [i for i, line in enumerate(console) if "sign in at" in line]

    stopping = time.monotonic()
    if stop_signal == "INT":
        os.killpg(make.pid, signal.SIGINT)
    else:
        make.send_signal(signal.SIGTERM)
    marker = str(clone).encode()
    while make.poll() is None or processes_naming(marker):
        if time.monotonic() - stopping > STOP_LIMIT_SECONDS:
            for pid in processes_naming(marker):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    to_stopped = time.monotonic() - stopping
    text = log_path.read_text(errors="replace")
    return {
        "work": str(work),
        "healthy_s": round(to_healthy, 1),
        "stopped_s": round(to_stopped, 1),
        "console_lines": len(console),
        "sign_in_line": sign_in[0] + 1 if sign_in else None,
        "last_line": console[-1] if console else "",
        "tracebacks": text.count("Traceback"),
        "make_rc": make.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(ROOT), help="repository to clone (default: this)")
    parser.add_argument("--commit", default="HEAD", help="commit to check out (default HEAD)")
    parser.add_argument("--runs", type=int, default=1, help="runs, each with cold caches")
    parser.add_argument("--signal", choices=("INT", "TERM"), default="INT", help="how to stop")
    parser.add_argument(
        "--ignore-sigint", action="store_true", help="start make with SIGINT ignored"
    )
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", args.repo, "rev-parse", "--short", args.commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    results = []
    for n in range(args.runs):
        result = one_run(args.repo, commit, args.signal, args.ignore_sigint)
        results.append(result)
        print(f"run {n + 1} at {commit}: {result}", flush=True)
    if len(results) > 1:
        for key in ("healthy_s", "stopped_s"):
            values = [r[key] for r in results]
            print(
                f"{key}: median {statistics.median(values)}, min {min(values)}, max {max(values)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
