"""`meterhub …` run through its own entry point in this process.

A subprocess per command costs a second and a half of imports; the entry point is the
same code (`meterhub.hub.cli.main`). Tests that must see the installed script run it
once in a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

from meterhub.hub.cli import main


def run_cli(
    argv: list[str], cwd=None, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """Like subprocess.run(["meterhub", *argv], capture_output=True, text=True)."""
    out, err = io.StringIO(), io.StringIO()
    saved_env = {key: os.environ.get(key) for key in env or {}}
    saved_stdin, saved_cwd = sys.stdin, os.getcwd()
    os.environ.update(env or {})
    sys.stdin = io.StringIO(stdin or "")
    if cwd is not None:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse refusing the command line
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
    return subprocess.CompletedProcess(["meterhub", *argv], code, out.getvalue(), err.getvalue())
