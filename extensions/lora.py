"""The LoRA starter: fine-tune a causal LM from the pool with PEFT LoRA, resumably.

    from meterhub.extensions.lora import train
    train()                      # picks a model and a dataset from /public, trains, saves

In debug mode (no GPU) it takes the pool's tiny model and shows `step N loss X` falling in
a minute or two on 2 CPU cores. On a GPU it takes the largest 7B-class model in the pool
and uses bf16, SDPA attention and gradient checkpointing — and 4-bit QLoRA on a 24 GB card
(RTX 4090) when bitsandbytes is installed. Checkpoints (adapter, optimizer, step, RNG) go to
your disk every `save_every` steps; run it again after a restart and it resumes from the
latest one. The adapter ends up in `<output_dir>/adapter`.
"""

from __future__ import annotations

import json
import os
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .pool import catalog, pool_root

SEVEN_B = 6_000_000_000


@dataclass
class Plan:
    """What `train` will do, decided from the pool and the hardware; print it to check."""

    model_path: str
    dataset_path: str
    output_dir: str
    device: str
    dtype: str
    quantize_4bit: bool
    gradient_checkpointing: bool
    max_steps: int = 60
    batch_size: int = 8
    block_size: int = 64
    learning_rate: float = 3e-3
    save_every: int = 20
    lora_r: int = 16
    notes: list[str] = field(default_factory=list)


def _params(item: dict) -> int:
    return int(item.get("parameters") or item.get("size_bytes", 0) // 2)


def plan(
    model: str | None = None,
    dataset: str | None = None,
    output_dir: str | None = None,
    max_steps: int | None = None,
) -> Plan:
    """Choose the model, data, precision and output for this server."""
    import torch

    root = pool_root()
    pool = catalog(root)
    gpu = torch.cuda.is_available()
    notes = []
    if model is None:
        models = [m for m in pool["models"] if m.get("format", "huggingface") == "huggingface"]
        if not models:
            raise FileNotFoundError(f"no model in the pool's catalog ({root}/catalog.yaml)")
        if gpu:
            big = [m for m in models if _params(m) >= SEVEN_B]
            chosen = max(big or models, key=_params)
        else:
            chosen = min(models, key=_params)  # debug mode: the smallest, on CPU
        model = os.path.join(root, chosen["path"])
        notes.append(f"model {chosen['name']} from the pool")
    if dataset is None:
        if not pool["datasets"]:
            raise FileNotFoundError(f"no dataset in the pool's catalog ({root}/catalog.yaml)")
        dataset = os.path.join(root, pool["datasets"][0]["path"])
    name = Path(model).name
    output_dir = output_dir or os.path.join(os.path.expanduser("~"), "lora-runs", name)
    memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else 0
    quantize = False
    if gpu and memory_gib <= 25:
        try:
            import bitsandbytes  # noqa: F401

            quantize = True
            notes.append(f"{memory_gib:.0f} GiB GPU: 4-bit QLoRA")
        except ImportError:
            notes.append(f"{memory_gib:.0f} GiB GPU without bitsandbytes: bf16 LoRA")
    result = Plan(
        model_path=model,
        dataset_path=dataset,
        output_dir=output_dir,
        device="cuda" if gpu else "cpu",
        dtype="bfloat16" if gpu else "float32",
        quantize_4bit=quantize,
        gradient_checkpointing=gpu,
        notes=notes,
    )
    if gpu:
        result.batch_size, result.block_size, result.learning_rate = 4, 512, 2e-4
        result.lora_r, result.save_every = 16, 50
    if max_steps is not None:
        result.max_steps = max_steps
        # a short run still leaves checkpoints on the way (the notebook's 30 steps on a GPU
        # saved only at the end: a server stopped in the middle lost them all)
        result.save_every = min(result.save_every, max(1, max_steps // 3))
    return result


def _texts(dataset_path: str) -> list[str]:
    files = sorted(Path(dataset_path).glob("*.jsonl")) or [Path(dataset_path)]
    texts = []
    for file in files:
        with open(file) as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def _blocks(tokenizer, texts: list[str], block_size: int) -> list[list[int]]:
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    return [stream[i : i + block_size] for i in range(0, len(stream) - block_size, block_size)]


def latest_checkpoint(output_dir: str) -> Path | None:
    found = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    complete = [p for p in found if (p / "trainer_state.json").exists()]
    return complete[-1] if complete else None


def train(
    model: str | None = None,
    dataset: str | None = None,
    output_dir: str | None = None,
    max_steps: int | None = None,
    log=print,
) -> dict:
    """Fine-tune with LoRA; prints `step N loss X`; resumes from the latest checkpoint."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = plan(model, dataset, output_dir, max_steps)
    for note in p.notes:
        log(note)
    torch.manual_seed(0)
    random.seed(0)
    tokenizer = AutoTokenizer.from_pretrained(p.model_path)
    kwargs = {"dtype": getattr(torch, p.dtype), "attn_implementation": "sdpa"}
    if p.quantize_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        kwargs["device_map"] = {"": 0}
    base = AutoModelForCausalLM.from_pretrained(p.model_path, **kwargs)
    if p.gradient_checkpointing:
        base.gradient_checkpointing_enable()
        base.enable_input_require_grads()
    if not p.quantize_4bit:
        base.to(p.device)
    config = LoraConfig(
        r=p.lora_r,
        lora_alpha=2 * p.lora_r,
        lora_dropout=0.0,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21.2's PeftModel reads transformers 5's deprecated
        # `is_gradient_checkpointing` whatever its caller does: the library's own warning
        warnings.filterwarnings(
            "ignore",
            message="`is_gradient_checkpointing` is deprecated",
            category=FutureWarning,
            module="transformers.modeling_utils",
        )
        net = get_peft_model(base, config)
    trainable = sum(t.numel() for t in net.parameters() if t.requires_grad)
    log(f"training {trainable:,} LoRA parameters of {p.model_path} on {p.device}")
    optimizer = torch.optim.AdamW(
        [t for t in net.parameters() if t.requires_grad], lr=p.learning_rate
    )
    blocks = _blocks(tokenizer, _texts(p.dataset_path), p.block_size)
    order = list(range(len(blocks)))
    step = 0
    resumed = latest_checkpoint(p.output_dir)
    if resumed is not None:
        set_peft_model_state_dict(net, load_file(str(resumed / "adapter_model.safetensors")))
        optimizer.load_state_dict(torch.load(resumed / "optimizer.pt", weights_only=True))
        state = json.loads((resumed / "trainer_state.json").read_text())
        step = state["step"]
        random.setstate(_tuple(state["python_rng"]))
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        log(f"resumed from {resumed} at step {step}")
    losses = []
    started = time.perf_counter()
    tokens = 0
    net.train()
    while step < p.max_steps:
        picks = random.sample(order, min(p.batch_size, len(order)))
        batch = torch.tensor([blocks[i] for i in picks], device=p.device)
        out = net(input_ids=batch, labels=batch)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += batch.numel()
        losses.append(out.loss.item())
        log(f"step {step} loss {losses[-1]:.4f}")
        if step % p.save_every == 0 or step == p.max_steps:
            _save(net, optimizer, step, Path(p.output_dir) / f"checkpoint-{step}")
    adapter = Path(p.output_dir) / "adapter"
    net.save_pretrained(adapter)
    seconds = time.perf_counter() - started
    return {
        "steps": step,
        "losses": losses,
        "adapter": str(adapter),
        "tokens_per_second": tokens / seconds if seconds and tokens else 0.0,
        "resumed_from": str(resumed) if resumed else None,
    }


def _tuple(value):
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _save(net, optimizer, step: int, where: Path) -> None:
    """A checkpoint appears complete or not at all (trainer_state.json is written last)."""
    import torch

    where.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(where)
    torch.save(optimizer.state_dict(), where / "optimizer.pt")
    state = {
        "step": step,
        "python_rng": random.getstate(),
        "torch_rng": torch.get_rng_state().tolist(),
    }
    tmp = where / "trainer_state.json.tmp"
    tmp.write_text(json.dumps(state))
    tmp.rename(where / "trainer_state.json")
