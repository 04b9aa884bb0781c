"""`meterhub stop`: end the `meterhub serve` of a site config cleanly, with its proxy and
billing service (and, with `--servers`, its users' servers), found by the pid file it keeps.

The pid file names the hub only while it runs; a stale one (a killed hub, a pid reused by
another program) is recognised by the process's command line and start time, never killed.
"""

from __future__ import annotations

import os
import shlex
import signal
import time

from meterhub.i18n import _
from meterhub.spawner import procs
from meterhub.spawner.files import write_private
from meterhub.spawner.procs import Process, read_process

from .billing_cli import CliError

#: in data_dir: the running hub's process id, mode 0600, removed when it exits cleanly
PID_FILE = "meterhub.pid"
#: in data_dir, written by `meterhub stop --servers`: the hub whose pid it names stops its
#: users' servers (and settles their billing) before it exits, this once
STOP_SERVERS_FILE = "meterhub-stop-servers"
#: JupyterHub's pid file for the proxy it starts (`ConfigurableHTTPProxy.pid_file`)
PROXY_PID_FILE = "jupyterhub-proxy.pid"
DEFAULT_TIMEOUT_SECONDS = 60.0
#: how long a SIGKILLed process may take to disappear
KILL_WAIT_SECONDS = 10.0
POLL_SECONDS = 0.1
#: a pid file is written after its process started; the kernel's boot time is whole seconds
START_SLACK_SECONDS = 2.0


class NothingRuns(CliError):
    """No `meterhub serve` runs for this data_dir. Exit status 1."""

    exit_code = 1


class StillRunning(CliError):
    """Something did not stop (in time, or at all). Exit status 4."""

    exit_code = 4


def command(process: Process, limit: int = 80) -> str:
    """A process's command line for people, cut at `limit` characters."""
    text = shlex.join(a.decode(errors="replace") for a in process.argv) or "?"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def alive(process: Process) -> bool:
    """Whether this very process (not a later one with its pid) still runs; a zombie
    does not (after a hub exits nobody may reap its children for a while)."""
    now = read_process(process.pid)
    return (
        now is not None
        and now.started_ticks == process.started_ticks
        and now.state not in ("Z", "X")
    )


def children(pid: int) -> list[Process]:
    return [p for p in procs.scan() if p.ppid == pid]


def is_meterhub_serve(argv: tuple[bytes, ...]) -> bool:
    """`…/meterhub serve …` or `python -m meterhub.hub.cli serve …`."""
    named = any(os.path.basename(a) == b"meterhub" or a == b"meterhub.hub.cli" for a in argv)
    return named and b"serve" in argv


def is_proxy(argv: tuple[bytes, ...]) -> bool:
    return any(os.path.basename(a) == b"configurable-http-proxy" for a in argv)


def is_billing_service(argv: tuple[bytes, ...]) -> bool:
    """The managed billing service: `python -m meterhub.hub.cli billing service …`."""
    return b"meterhub.hub.cli" in argv and b"billing" in argv and b"service" in argv


# ---------------------------------------------------------------------- files in data_dir


def pid_file_path(data_dir: str) -> str:
    return os.path.join(data_dir, PID_FILE)


def stop_servers_path(data_dir: str) -> str:
    return os.path.join(data_dir, STOP_SERVERS_FILE)


def _write_private(path: str, text: str) -> None:
    """Write a small file atomically, readable by this user only."""
    write_private(path, text, f"{path}.{os.getpid()}.tmp", durable=False)


def _read_pid(path: str) -> int | None:
    """The pid a file names; None when it is missing or holds no pid."""
    try:
        with open(path) as f:
            text = f.read(64).strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() and int(text) > 1 else None


def write_pid_file(path: str, pid: int) -> None:
    _write_private(path, f"{pid}\n")


def remove_if_names(path: str, pid: int) -> None:
    """Remove a pid or flag file, only while it names `pid` (not a successor's)."""
    try:
        if _read_pid(path) == pid:
            os.unlink(path)
    except OSError:
        pass


def request_server_stop(data_dir: str, hub_pid: int) -> None:
    _write_private(stop_servers_path(data_dir), f"{hub_pid}\n")


def clear_server_stop(data_dir: str) -> None:
    try:
        os.unlink(stop_servers_path(data_dir))
    except FileNotFoundError:
        pass


def server_stop_requested(data_dir: str, hub_pid: int) -> bool:
    try:
        return _read_pid(stop_servers_path(data_dir)) == hub_pid
    except OSError:
        return False


def find_hub(data_dir: str) -> tuple[Process | None, str]:
    """The `meterhub serve` running for `data_dir`, or (None, why none does)."""
    path = pid_file_path(data_dir)
    try:
        pid = _read_pid(path)
        written_at = os.stat(path).st_mtime
    except FileNotFoundError:
        return None, _(
            "no meterhub serve runs for %(data_dir)s (no %(path)s)", data_dir=data_dir, path=path
        )
    except OSError as e:
        raise CliError(
            _(
                "cannot read %(path)s: %(error)s (run this as the user the hub runs as)",
                path=path,
                error=e.strerror,
            )
        ) from None
    values = {"data_dir": data_dir, "path": path, "pid": pid}
    if pid is None:
        return None, _(
            "no meterhub serve runs for %(data_dir)s: %(path)s holds no process id (a stale"
            " file, left alone: `meterhub serve` replaces it)",
            **values,
        )
    process = read_process(pid)
    if process is None or process.state in ("Z", "X"):
        return None, _(
            "no meterhub serve runs for %(data_dir)s: %(path)s names pid %(pid)s, which is gone"
            " (a stale file, left alone: `meterhub serve` replaces it)",
            **values,
        )
    if not is_meterhub_serve(process.argv):
        return None, _(
            "no meterhub serve runs for %(data_dir)s: %(path)s names pid %(pid)s, which is now"
            " `%(command)s`, not meterhub serve (a stale file, left alone: `meterhub serve`"
            " replaces it)",
            command=command(process),
            **values,
        )
    if process.started_at > written_at + START_SLACK_SECONDS:
        return None, _(
            "no meterhub serve runs for %(data_dir)s: %(path)s names pid %(pid)s, a meterhub"
            " serve started after the file was written: another hub's (a stale file, left"
            " alone: `meterhub serve` replaces it)",
            **values,
        )
    return process, ""


def find_proxy(data_dir: str) -> Process | None:
    """The proxy JupyterHub started for this data_dir, if its pid file names a live one."""
    try:
        pid = _read_pid(os.path.join(data_dir, PROXY_PID_FILE))
    except OSError:
        return None
    process = read_process(pid) if pid else None
    if process is None or not alive(process) or not is_proxy(process.argv):
        return None
    return process


# ---------------------------------------------------------------------- stopping


def _send(process: Process, sig: int, what: str) -> None:
    try:
        os.kill(process.pid, sig)
        if sig == signal.SIGTERM:
            os.kill(process.pid, signal.SIGCONT)  # a stopped process handles it once continued
    except ProcessLookupError:
        pass
    except PermissionError:
        raise StillRunning(
            _(
                "%(what)s (pid %(pid)s) runs as another user: run meterhub stop as that user",
                what=what,
                pid=process.pid,
            )
        ) from None


def _wait_gone(process: Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(process):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def _running_servers(site: dict) -> list[str] | None:
    """Owners of the local backend's servers that have a live process; None for a
    backend whose servers this machine cannot see."""
    if site["backend"] != "local":
        return None
    from meterhub.spawner.local import group_has_live_members, read_records

    records, _bad = read_records(site["data_dir"])
    return [r.owner for r in records if r.pid and group_has_live_members(r.pid)]


def _open_sessions(site: dict) -> str:
    """Whether billing sessions are still open, as a line to print."""
    from sqlalchemy.exc import DBAPIError
    from traitlets.config import Config

    from meterhub.billing_hooks.settings import BillingSettings

    from .config import apply_config

    try:
        ledger = BillingSettings(config=apply_config(site, Config())).ledger()
        left = len(ledger.open_sessions())
    except DBAPIError as e:
        return _(
            "billing: the ledger database did not answer (%(error)s); sessions not checked",
            error=e.orig,
        )
    if not left:
        return _("billing: no session left open")
    return _(
        "billing: %(left)s session(s) still open: the hub could not settle them (see its"
        " log); the meter closes them at their last sight when the hub runs again",
        left=left,
    )


def stop(site: dict, servers: bool, timeout: float, force: bool, say=print) -> int:
    """Stop the hub of `site`, report each step with `say`; 0 once everything stopped."""
    data_dir = site["data_dir"]
    hub, why = find_hub(data_dir)
    if hub is None:
        proxy = find_proxy(data_dir)
        if proxy is not None:
            why = _(
                "%(why)s; a proxy from an earlier run still runs as pid %(pid)s, and the next"
                " meterhub serve stops it",
                why=why,
                pid=proxy.pid,
            )
        raise NothingRuns(why)
    helpers = [(_("proxy"), p) for p in [find_proxy(data_dir)] if p is not None]
    helpers += [(_("billing service"), p) for p in children(hub.pid) if is_billing_service(p.argv)]
    before = _running_servers(site)
    if servers:
        try:
            request_server_stop(data_dir, hub.pid)
        except OSError as e:
            raise CliError(
                _(
                    "cannot write %(path)s: %(error)s",
                    path=stop_servers_path(data_dir),
                    error=e.strerror,
                )
            ) from None
    started = time.monotonic()
    _send(hub, signal.SIGTERM, _("the hub"))
    if servers:
        say(
            _(
                "hub (pid %(pid)s): SIGTERM sent; it stops users' servers and settles their"
                " billing, then exits",
                pid=hub.pid,
            )
        )
    else:
        say(_("hub (pid %(pid)s): SIGTERM sent; it exits", pid=hub.pid))
    if _wait_gone(hub, timeout):
        say(
            _(
                "hub (pid %(pid)s): stopped after %(seconds)s s",
                pid=hub.pid,
                seconds=format(time.monotonic() - started, ".1f"),
            )
        )
    elif not force:
        raise StillRunning(
            _(
                "hub (pid %(pid)s) still runs after %(timeout)s s; not killed: wait and run"
                " meterhub stop again, or add --force to SIGKILL it",
                pid=hub.pid,
                timeout=format(timeout, "g"),
            )
        )
    else:
        _send(hub, signal.SIGKILL, _("the hub"))
        if not _wait_gone(hub, KILL_WAIT_SECONDS):
            raise StillRunning(_("hub (pid %(pid)s) survived SIGKILL", pid=hub.pid))
        say(
            _(
                "hub (pid %(pid)s): still running after %(timeout)s s; killed (SIGKILL)",
                pid=hub.pid,
                timeout=format(timeout, "g"),
            )
        )
    # a clean exit removed both; a killed hub left them, naming a process that is gone
    remove_if_names(pid_file_path(data_dir), hub.pid)
    remove_if_names(stop_servers_path(data_dir), hub.pid)

    failures = []
    for what, process in helpers:
        named = {"what": what, "pid": process.pid}
        if not alive(process):
            say(_("%(what)s (pid %(pid)s): stopped with the hub", **named))
            continue
        _send(process, signal.SIGTERM, what)
        if _wait_gone(process, timeout):
            say(_("%(what)s (pid %(pid)s): outlived the hub; stopped it (SIGTERM)", **named))
        elif force:
            _send(process, signal.SIGKILL, what)
            if _wait_gone(process, KILL_WAIT_SECONDS):
                say(_("%(what)s (pid %(pid)s): outlived the hub; killed it (SIGKILL)", **named))
            else:
                failures.append(_("%(what)s (pid %(pid)s) survived SIGKILL", **named))
        else:
            failures.append(
                _(
                    "%(what)s (pid %(pid)s) outlived the hub and still runs after SIGTERM and"
                    " %(timeout)s s; not killed (add --force)",
                    timeout=format(timeout, "g"),
                    **named,
                )
            )

    after = _running_servers(site)
    if after is None:
        pass  # not on this machine: the hub stopped them (--servers) or left them running
    elif servers and after:
        failures.append(
            _(
                "%(count)s user server(s) still run (%(owners)s); the next meterhub serve adopts"
                " or stops them",
                count=len(after),
                owners=", ".join(after),
            )
        )
    elif servers:
        say(_("users' servers: %(count)s stopped with the hub", count=len(before or [])))
    elif after:
        say(
            _(
                "users' servers: %(count)s left running; the next meterhub serve adopts them",
                count=len(after),
            )
        )
    else:
        say(_("users' servers: none were running"))
    if servers:
        say(_open_sessions(site))
    if failures:
        raise StillRunning(_("; ").join(failures))
    return 0


def _positive_seconds(text: str) -> float:
    import argparse

    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= 86400:
        raise argparse.ArgumentTypeError(
            _("%(text)s is not a number of seconds (0 < s ≤ 86400)", text=repr(text))
        )
    return seconds


def _stop(args) -> int:
    from .config import load_site_config

    site = load_site_config(args.config)
    return stop(site, args.servers, args.timeout, args.force)


def add_command(commands) -> None:
    command = commands.add_parser(
        "stop",
        help="stop the running `meterhub serve` of a site config (hub, proxy, billing service)",
        description="Sends the hub SIGTERM and waits for it, its proxy and its billing service"
        " to exit; users' servers keep running (the next `meterhub serve` adopts them) unless"
        " --servers. Exit 0 once stopped, 1 when nothing runs, 4 when something still runs.",
    )
    command.add_argument("--config", help="site config (YAML); default: the embedded default")
    command.add_argument(
        "--servers",
        action="store_true",
        help="stop users' servers too; their billing sessions close at their stop",
    )
    command.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"how long to wait for each process to exit (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    command.add_argument(
        "--force",
        action="store_true",
        help="SIGKILL what still runs after the timeout (servers a killed hub did not stop"
        " are left to the next `meterhub serve`)",
    )
    command.set_defaults(func=_stop)
