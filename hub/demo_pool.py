"""The demo `/public` pool, generated locally on first start: nothing is downloaded.

It holds a tiny randomly initialised Llama-architecture causal LM in Hugging Face format
(safetensors weights, a byte-level BPE tokenizer) and a small text dataset, with a
`catalog.yaml` at the root describing both.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import sys
import tempfile
from array import array

import yaml

MODEL_NAME = "tiny-llama"
DATASET_NAME = "tiny-arithmetic"
EOS = "<|endoftext|>"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 257,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": 256,
    "pad_token_id": 256,
    "torch_dtype": "float32",
    "initializer_range": 0.02,
}


def byte_level_alphabet() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2's mapping)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_json() -> dict:
    vocab = {ch: i for i, ch in enumerate(byte_level_alphabet())}
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 256,
                "content": EOS,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def llama_tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        shapes |= {
            f"{p}.self_attn.q_proj.weight": (h, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, h),
            f"{p}.mlp.gate_proj.weight": (i, h),
            f"{p}.mlp.up_proj.weight": (i, h),
            f"{p}.mlp.down_proj.weight": (h, i),
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    return shapes


def write_safetensors(path: str, tensors: dict[str, tuple[tuple[int, ...], array]]) -> None:
    """Write float32 tensors in the safetensors format (little-endian, 8-byte aligned header)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, (shape, values) in tensors.items():
        if sys.byteorder != "little":
            values = array("f", values)
            values.byteswap()
        blob = values.tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


def read_safetensors_header(path: str) -> dict:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def _tiny_llama_weights(config: dict, seed: int) -> dict[str, tuple[tuple[int, ...], array]]:
    rng = random.Random(seed)
    std = config["initializer_range"]
    tensors = {}
    for name, shape in llama_tensor_shapes(config).items():
        n = 1
        for dim in shape:
            n *= dim
        if name.endswith("norm.weight"):
            values = array("f", [1.0]) * n
        else:
            values = array("f", (rng.gauss(0.0, std) for _ in range(n)))
        tensors[name] = (shape, values)
    return tensors


def arithmetic_lines(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        op = rng.choice(["+", "-"])
        result = a + b if op == "+" else a - b
        lines.append(f"Q: {a} {op} {b} = ? A: {result}")
    return lines


def _dir_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, files in os.walk(path)
        for name in files
    )


def generate_demo_pool(target: str, seed: int = 0) -> str:
    """Create the demo pool at `target` (atomically: it appears complete or not at all)."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".pool-", dir=parent)
    try:
        model_dir = os.path.join(work, "models", MODEL_NAME)
        os.makedirs(model_dir)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(TINY_LLAMA, f, indent=2)
        with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 256, "eos_token_id": 256, "pad_token_id": 256}, f, indent=2)
        with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
            json.dump(tokenizer_json(), f, ensure_ascii=False)
        with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
            json.dump(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": EOS,
                    "eos_token": EOS,
                    "pad_token": EOS,
                    "model_max_length": TINY_LLAMA["max_position_embeddings"],
                },
                f,
                indent=2,
            )
        write_safetensors(
            os.path.join(model_dir, "model.safetensors"), _tiny_llama_weights(TINY_LLAMA, seed)
        )
        with open(os.path.join(model_dir, "README.md"), "w") as f:
            f.write(
                "# tiny-llama\n\nA randomly initialised 2-layer Llama-architecture causal LM "
                "(hidden size 64, byte-level tokenizer), generated locally by meterhub for demos "
                "and tests. It knows nothing until you train it.\n"
            )

        data_dir = os.path.join(work, "datasets", DATASET_NAME)
        os.makedirs(data_dir)
        with open(os.path.join(data_dir, "train.jsonl"), "w") as f:
            for line in arithmetic_lines(512, seed):
                f.write(json.dumps({"text": line}) + "\n")
        with open(os.path.join(data_dir, "README.md"), "w") as f:
            f.write(
                "# tiny-arithmetic\n\n512 lines like `Q: 3 + 4 = ? A: 7`, one JSON object with a "
                "`text` field per line. Small enough to fine-tune on in seconds.\n"
            )

        catalog = {
            "models": [
                {
                    "name": MODEL_NAME,
                    "path": f"models/{MODEL_NAME}",
                    "format": "huggingface",
                    "size_bytes": _dir_size(model_dir),
                    "licence": "CC0-1.0",
                    "description": "Tiny random Llama-architecture causal LM for demos and tests.",
                }
            ],
            "datasets": [
                {
                    "name": DATASET_NAME,
                    "path": f"datasets/{DATASET_NAME}",
                    "format": "jsonl",
                    "size_bytes": _dir_size(data_dir),
                    "licence": "CC0-1.0",
                    "description": "Generated arithmetic questions and answers, one per line.",
                }
            ],
        }
        with open(os.path.join(work, "catalog.yaml"), "w") as f:
            yaml.safe_dump(catalog, f, sort_keys=False)
        for root, _dirs, files in os.walk(work):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def ensure_demo_pool(target: str) -> bool:
    """Generate the demo pool unless it exists; True if it was generated now."""
    if os.path.isdir(target):
        return False
    generate_demo_pool(target)
    return True
