"""The LoRA starter in a real debug server: the shipped notebook's code cells train with
the loss falling, and after the server restarts training resumes from its checkpoint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from .hubprocess import ADMIN_TOKEN
from .jupyter import execute

NOTEBOOK = Path(__file__).resolve().parent.parent / "images" / "notebooks" / "lora-starter.ipynb"


@pytest.fixture(scope="module")
def lab_hub(hub_factory):
    return hub_factory({"gpus": []}, name="starter")


def run(hub, user: str, code: str) -> str:
    return asyncio.run(execute(hub.url, user, ADMIN_TOKEN, code, timeout=600))


def test_the_shipped_notebook_trains_and_resumes_after_a_restart(lab_hub):
    lab_hub.spawn("lea", {"profile": "debug"})
    # a new disk starts with the notebook
    assert (
        run(lab_hub, "lea", "import os; print(os.path.isfile('lora-starter.ipynb'))").strip()
        == "True"
    )
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
