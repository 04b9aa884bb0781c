"""`meterhub systemd-unit`: a systemd service that keeps `meterhub serve` running.

`unit_text` is a pure builder (tested against a literal unit); `unit_for` fills it in with
this environment's `meterhub` and absolute paths.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: characters that make systemd split or reinterpret an ExecStart argument
_SPECIAL = set(" \t\n\"'\\;$")


def quote_arg(arg: str) -> str:
    """One ExecStart argument, quoted for systemd when it needs it; `%` escaped always."""
    arg = arg.replace("%", "%%")
    if arg and not _SPECIAL & set(arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")
    return f'"{escaped}"'


def unit_text(command: list[str], working_directory: str) -> str:
    """The unit file that runs `command` (absolute, ending in `serve …`)."""
    exec_start = " ".join(quote_arg(arg) for arg in command)
    return f"""\
[Unit]
Description=meterhub: GPU notebooks by the hour (JupyterHub)
Documentation=https://jupyterhub.readthedocs.io/
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={exec_start}
WorkingDirectory={working_directory.replace("%", "%%")}
Environment=PYTHONUNBUFFERED=1
Restart=on-failure
RestartSec=5s
# Stop (or restart) the hub only: the users' servers keep running (after a crash, the
# proxy too), and the restarted hub takes them over. The billing service exits with the hub and is restarted by it.
KillMode=process
TimeoutStopSec=60s

[Install]
WantedBy=multi-user.target
"""


def meterhub_command() -> list[str]:
    """This environment's `meterhub`, absolute (not resolved: a venv's bin/ must stay)."""
    script = Path(os.path.abspath(sys.executable)).parent / "meterhub"
    if script.is_file():
        return [str(script)]
    return [os.path.abspath(sys.executable), "-m", "meterhub.hub.cli"]


def unit_for(
    config_path: str | None,
    ip: str,
    port: int,
    working_directory: str | None = None,
) -> str:
    """The unit for this environment: the config's absolute path, the working directory
    (where relative `data_dir`/`public_dir` resolve; default the current one)."""
    command = [*meterhub_command(), "serve"]
    if config_path is not None:
        command += ["--config", os.path.abspath(config_path)]
    command += ["--ip", ip, "--port", str(port)]
    return unit_text(command, os.path.abspath(working_directory or os.getcwd()))
