"""The LoRA starter in a real debug server: the shipped notebook's code cells train with
the loss falling, and after the server restarts training resumes from its checkpoint. The
notebook is written as Jupyter writes it and stamped with the server's kernel (JupyterLab
opens it unmodified: tests/test_first_run_browser.py), and its run shows no FutureWarning
of meterhub's making."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.ipkernel import IPythonKernel

from meterhub.hub.demo_pool import generate_demo_pool
from meterhub.spawner.starters import copy_starters, kernel_language_info, stamp

from .hubprocess import ADMIN_TOKEN
from .jupyter import execute

NOTEBOOK = Path(__file__).resolve().parent.parent / "images" / "notebooks" / "lora-starter.ipynb"


def test_the_shipped_notebook_is_written_as_jupyter_writes_it():
    text = NOTEBOOK.read_text(encoding="utf-8")
    notebook = nbformat.reads(text, as_version=4)
    nbformat.validate(notebook)
    # what a save from JupyterLab writes: nothing to normalise, so nothing to mark modified
    assert nbformat.writes(notebook) + "\n" == text
    assert stamp(text, None) == text
    assert notebook.metadata.kernelspec == {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    assert set(notebook.metadata.language_info) == set(IPythonKernel.language_info)
    for cell in notebook.cells:
        assert cell.id and cell.metadata == {}
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_a_copy_carries_the_language_info_of_the_servers_python(tmp_path):
    info = kernel_language_info(sys.prefix)
    assert info == IPythonKernel.language_info  # what this Python's kernel will report
    (tmp_path / "disk").mkdir()
    (tmp_path / "starters").mkdir()
    other = json.loads(NOTEBOOK.read_text())
    other["metadata"]["language_info"] = {"name": "python", "version": "2.7.18"}
    (tmp_path / "starters" / "a.ipynb").write_text(json.dumps(other))
    (tmp_path / "starters" / "notes.txt").write_text("not a notebook")
    written = copy_starters(str(tmp_path / "starters"), str(tmp_path / "disk"), info)
    assert written == [str(tmp_path / "disk" / "a.ipynb")]
    copied = json.loads((tmp_path / "disk" / "a.ipynb").read_text())
    assert copied["metadata"]["language_info"] == info
    assert copied["cells"] == other["cells"]
    # an environment that cannot say (no Python there): copied as it is
    assert kernel_language_info(str(tmp_path / "no-such-env")) is None
    copy_starters(str(tmp_path / "starters"), str(tmp_path / "disk"), None)
    assert json.loads((tmp_path / "disk" / "a.ipynb").read_text()) == other


@pytest.fixture(scope="module")
def starter_run(tmp_path_factory) -> dict:
    """What running the notebook's code cells prints, FutureWarnings shown every time; then
    what running them again prints, once it has finished; and its HOME."""
    where = tmp_path_factory.mktemp("starter-run")
    pool = generate_demo_pool(str(where / "pool"))
    (where / "home").mkdir()
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    env = dict(os.environ, HOME=str(where / "home"), METERHUB_PUBLIC_DIR=pool)
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-W", "always::FutureWarning", "-c", f"display = print\n{code}"],
            capture_output=True,
            text=True,
            env=env,
            cwd=where,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(out.stdout + out.stderr)
    assert "loss " in runs[0] and "adapter saved in" in runs[0], runs[0][-3000:]
    return {"first": runs[0], "again": runs[1], "home": where / "home"}


def test_the_starter_shows_no_future_warning(starter_run):
    """Not even peft 0.21.2's own (it reads transformers 5's deprecated
    `is_gradient_checkpointing` whatever its caller does): extensions/lora.py filters that
    one narrowly around get_peft_model."""
    assert "FutureWarning" not in starter_run["first"] + starter_run["again"]


def test_a_short_run_checkpoints_on_the_way_and_a_finished_one_runs_again(starter_run):
    """The notebook's 30 steps save every 10 (a stop in the middle keeps most of the work,
    on a GPU too, where a long run saves every 50), and running the notebook again after it
    finished says so instead of failing."""
    runs = starter_run["home"] / "lora-runs" / "tiny-llama"
    assert sorted(p.name for p in runs.glob("checkpoint-*")) == [
        "checkpoint-10",
        "checkpoint-20",
        "checkpoint-30",
    ]
    assert "already trained to step 30" in starter_run["again"]
    assert "step 1 loss" not in starter_run["again"]


@pytest.fixture(scope="module")
def lab_hub(hub_factory):
    return hub_factory({"gpus": []}, name="starter")


def run(hub, user: str, code: str) -> str:
    return asyncio.run(execute(hub.url, user, ADMIN_TOKEN, code, timeout=600))


def test_the_shipped_notebook_trains_and_resumes_after_a_restart(lab_hub):
    lab_hub.spawn("lea", {"profile": "debug"})
    # a new disk starts with the notebook, stamped with the Python its kernel runs
    stamped = (
        "import json, sys\n"
        "info = json.load(open('lora-starter.ipynb'))['metadata']['language_info']\n"
        "print(info['version'] == sys.version.split()[0])"
    )
    assert run(lab_hub, "lea", stamped).strip() == "True"
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    out = run(lab_hub, "lea", code)
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert steps[0].startswith("step 1 loss") and steps[-1].startswith("step 30 loss")
    losses = [float(line.split()[-1]) for line in steps]
    assert losses[-1] < losses[0] - 0.3, losses  # falls, clearly
    assert "adapter saved in /home/jovyan/lora-runs/tiny-llama/adapter" in out
    lab_hub.stop_server("lea")

    lab_hub.spawn("lea", {"profile": "debug"})
    out = run(
        lab_hub,
        "lea",
        "from meterhub.extensions.lora import train\n"
        "r = train(max_steps=36)\n"
        "print('RESULT', r['resumed_from'], r['steps'])",
    )
    assert "resumed from /home/jovyan/lora-runs/tiny-llama/checkpoint-30 at step 30" in out
    resumed = [line for line in out.splitlines() if line.startswith("step ")]
    assert resumed[0].startswith("step 31 loss") and resumed[-1].startswith("step 36 loss")
    assert float(resumed[0].split()[-1]) < losses[0] - 0.3  # it kept what it had learnt
    assert "RESULT /home/jovyan/lora-runs/tiny-llama/checkpoint-30 36" in out
    lab_hub.stop_server("lea")
