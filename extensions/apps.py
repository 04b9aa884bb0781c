"""Web apps inside a server, behind its own URL, through jupyter-server-proxy: TensorBoard,
and VS Code in the browser where the environment has code-server.

Each is a `jupyter_serverproxy_servers` entry point (pyproject.toml): jupyter-server-proxy
starts the app on first use at `/user/NAME/<app>/`, behind the server's own authentication,
and JupyterLab's launcher shows it. An app the environment lacks raises, which
jupyter-server-proxy logs as a warning and skips.
"""

from __future__ import annotations

import os
import shutil

#: where TensorBoard looks for event files: the disk, so that logs written anywhere on it
#: (PyTorch's SummaryWriter writes ./runs, the Trainer OUTPUT_DIR/runs) show up
TENSORBOARD_LOGDIR_ENV = "METERHUB_TENSORBOARD_LOGDIR"
#: how often TensorBoard looks for new event files, seconds: a whole disk is many folders
TENSORBOARD_RELOAD_SECONDS = 30


def tensorboard() -> dict:
    if shutil.which("tensorboard") is None:
        raise RuntimeError("TensorBoard is not installed in this server's environment")
    logdir = os.environ.get(TENSORBOARD_LOGDIR_ENV) or os.path.expanduser("~")
    return {
        "command": [
            "tensorboard",
            "--logdir",
            logdir,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--reload_interval",
            str(TENSORBOARD_RELOAD_SECONDS),
        ],
        # TensorBoard's first start reads its plugins; a busy debug-mode server is slow
        "timeout": 60,
        "new_browser_tab": True,
        "launcher_entry": {"enabled": True, "title": "TensorBoard"},
    }


def code_server() -> dict:
    if shutil.which("code-server") is None:
        raise RuntimeError("code-server is not installed in this server's environment")
    return {
        # the server's own authentication guards the URL: code-server's would ask again
        "command": [
            "code-server",
            "--auth",
            "none",
            "--bind-addr",
            "127.0.0.1:{port}",
            "--disable-telemetry",
            "--disable-update-check",
            os.path.expanduser("~"),
        ],
        "timeout": 60,
        "new_browser_tab": True,
        "launcher_entry": {"enabled": True, "title": "VS Code"},
    }
