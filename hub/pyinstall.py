"""Installing Python packages the way this machine's pip would: with uv where it can be had
(many times faster), pip's index, find-links, constraints and certificate passed on to it.

Standard library only: `scripts/install-python` loads this file by its path before anything
is installed (`make`), and `meterhub env build` installs the environments with it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: pip's settings that uv must be told, as (pip's name, uv's option); lists are split on
#: whitespace, as pip splits them
PASSED_ON = (
    ("index-url", "--index-url"),
    ("extra-index-url", "--extra-index-url"),
    ("find-links", "--find-links"),
    ("constraint", "--constraint"),
)
#: pip applies its configuration's sections in this order, a later one winning
SECTIONS = ("global", "install", ":env:")


def pip_settings(python: str) -> dict[str, str]:
    """pip's effective configuration for `pip install`: name → value."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    found: dict[tuple[str, str], str] = {}
    for line in listed.stdout.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not (sep and dot) or section not in SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        found[(section, name)] = str(value)
    settings: dict[str, str] = {}
    for section in SECTIONS:
        for (where, name), value in found.items():
            if where == section:
                settings[name] = value
    return settings


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's settings."""
    args = [
        # pip searches every index for the best match; uv's default would take each package
        # from the first index that has it, at whatever versions that index holds
        "--index-strategy",
        "unsafe-best-match",
    ]
    for name, option in PASSED_ON:
        for value in settings.get(name, "").split():
            args += [option, value]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    env = {}
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    timeout = settings.get("default-timeout") or settings.get("timeout")
    if timeout:
        env["UV_HTTP_TIMEOUT"] = timeout
    return args, env


def has_pip(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0


def ensure_pip(python: str) -> bool:
    """pip in the environment (made --without-pip: seconds faster), from Python's own
    ensurepip; whether it is there now."""
    if has_pip(python):
        return True
    subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=False)
    return has_pip(python)


def find_uv(venv: Path, python: str, version: str) -> str | None:
    """uv on PATH, in the environment, or installed there by pip (the base Python's, which
    installs into an environment without pip, else the environment's own); None when none
    can be had."""
    uv = venv / "bin" / "uv"
    for candidate in (shutil.which("uv"), uv):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    wanted = f"uv=={version}"
    if has_pip(sys.executable):
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", python, "install", "-q", wanted],
            check=False,
        )
    if not os.access(uv, os.X_OK) and ensure_pip(python):
        subprocess.run([python, "-m", "pip", "install", "-q", wanted], check=False)
    if os.access(uv, os.X_OK):
        return str(uv)
    print(f"install-python: uv {version} could not be installed; pip installs instead")
    return None


def ensurepip_version(python: str) -> str:
    """The pip that `python -m venv` would have put in the environment."""
    return subprocess.run(
        [python, "-c", "import ensurepip; print(ensurepip.version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def install_command(
    venv: Path, uv_version: str, requirements: list[str], uv: str | None = None
) -> tuple[list[str], dict]:
    """The command that installs `requirements` into the environment `venv`, and the
    variables to add to its environment; ([], {}) when neither uv nor pip can be had.
    `uv`: the uv to use, else one is looked for (and installed) as `find_uv` does."""
    python = str(venv / "bin" / "python")
    uv = uv or find_uv(venv, python, uv_version)
    if uv:
        pip = python if has_pip(python) else sys.executable
        options, env = uv_arguments(pip_settings(pip))
        if not has_pip(python):  # the environment has pip as if `venv` had put it there
            requirements = [*requirements, f"pip=={ensurepip_version(python)}"]
        return [uv, "pip", "install", "--python", python, *options, *requirements], env
    if not ensure_pip(python):
        return [], {}
    return [python, "-m", "pip", "install", *requirements], {}
