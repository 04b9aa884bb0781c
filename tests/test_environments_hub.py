"""Environments on a real hub: `meterhub env build minimal`, a sandboxed server that runs from
that build (its own Python, NumPy and no PyTorch), back to `pytorch` on the same disk, and
the usage rows that say which environment each session ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests

from .hubprocess import ADMIN_TOKEN
from .jupyter import execute

PROBE = """
import importlib.util, json, os, sys
print(json.dumps({
    "prefix": sys.prefix,
    "executable": sys.executable,
    "environment": os.environ.get("METERHUB_ENVIRONMENT"),
    "torch": importlib.util.find_spec("torch") is not None,
    "numpy": importlib.util.find_spec("numpy") is not None,
    "scipy": importlib.util.find_spec("scipy") is not None,
    "notes": open("notes.txt").read() if os.path.exists("notes.txt") else None,
}))
"""


async def probe(hub, user: str) -> dict:
    return json.loads(await execute(hub.url, user, ADMIN_TOKEN, PROBE))


def env_build(hub, *slugs: str) -> subprocess.CompletedProcess:
    meterhub = str(Path(sys.executable).parent / "meterhub")
    return subprocess.run(
        [meterhub, "env", "build", *slugs, "--config", str(hub.config_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )


async def test_a_server_runs_the_environment_it_was_started_in_on_the_same_disk(hub_factory):
    hub = hub_factory({"gpus": [{"type": "a800", "count": 1}]}, name="envs")
    hub.ensure_user("eve")

    # not built yet: refused before anything is charged, with the command that builds it
    r = hub.api("POST", "/users/eve/server", json={"profile": "debug", "environment": "minimal"})
    assert r.status_code == 409, r.text
    assert "meterhub env build minimal" in r.json()["message"]
    assert hub.server("eve") is None

    built = env_build(hub, "minimal")
    assert built.returncode == 0, built.stderr + built.stdout
    build = os.path.realpath(Path(hub.data_dir) / "envs" / "minimal")

    hub.spawn("eve", {"profile": "debug", "environment": "minimal"})
    facts = await probe(hub, "eve")
    assert facts["prefix"] == build and facts["executable"].startswith(build + "/")
    assert facts["environment"] == "minimal"
    assert facts["numpy"] and facts["scipy"] and not facts["torch"]
    # the server reports it too (its status API, with its own token's view)
    status = requests.get(
        f"{hub.url}/user/eve/api/meterhub/status",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=60,
    ).json()
    assert (status["environment"], status["prefix"]) == ("minimal", build)
    # the build is read-only inside the sandbox, like the servers' own environment
    written = await execute(
        hub.url,
        "eve",
        ADMIN_TOKEN,
        "import sys\ntry:\n    open(sys.prefix + '/x', 'w')\n    print('wrote')\n"
        "except OSError as e:\n    print(e.errno)\nopen('notes.txt', 'w').write('kept')",
    )
    assert written.strip() in ("13", "30"), written  # EACCES or EROFS
    hub.stop_server("eve")

    # back to the default environment (pytorch): the same disk, the servers' own Python
    hub.spawn("eve", {"profile": "debug"})
    facts = await probe(hub, "eve")
    assert facts["prefix"] == os.path.realpath(sys.prefix) or facts["prefix"] == sys.prefix
    assert facts["environment"] == "pytorch" and facts["torch"]
    assert facts["notes"] == "kept"
    hub.stop_server("eve")

    usage = requests.get(
        f"{hub.url}/services/billing/api/v1/users/eve/usage",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=60,
    ).json()
    sessions = usage["sessions"] if isinstance(usage, dict) else usage
    assert [s["environment"] for s in sessions][:2] == ["pytorch", "minimal"]  # newest first


def test_a_gpu_only_environment_is_refused_in_debug_mode_and_named_where_not_built(hub_factory):
    hub = hub_factory({"gpus": [{"type": "a800", "count": 1}]}, name="envs-refused")
    hub.ensure_user("ray")
    r = hub.api("POST", "/users/ray/server", json={"profile": "debug", "environment": "vllm"})
    assert r.status_code == 400 and "needs a GPU" in r.json()["message"]
    r = hub.api(
        "POST", "/users/ray/server", json={"profile": "a800", "gpus": "1", "environment": "vllm"}
    )
    assert r.status_code == 409 and "meterhub env build vllm" in r.json()["message"]
    r = hub.api("POST", "/users/ray/server", json={"profile": "debug", "environment": "nope"})
    assert r.status_code == 400 and "Unknown environment 'nope'" in r.json()["message"]
    assert hub.server("ray") is None
