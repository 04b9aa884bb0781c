"""The generated demo pool: a loadable-shaped tiny model, a dataset and a catalog."""

import json
import os
import struct

import yaml

from meterhub.hub.demo_pool import (
    TINY_LLAMA,
    byte_level_alphabet,
    ensure_demo_pool,
    llama_tensor_shapes,
    read_safetensors_header,
)


def test_demo_pool_has_model_dataset_and_catalog(tmp_path):
    pool = tmp_path / "pool"
    assert ensure_demo_pool(str(pool)) is True
    assert ensure_demo_pool(str(pool)) is False  # generated once
    catalog = yaml.safe_load((pool / "catalog.yaml").read_text())
    assert [m["name"] for m in catalog["models"]] == ["tiny-llama"]
    assert [d["name"] for d in catalog["datasets"]] == ["tiny-arithmetic"]
    for entry in catalog["models"] + catalog["datasets"]:
        assert (pool / entry["path"]).is_dir()
        assert entry["size_bytes"] > 0 and entry["licence"] and entry["description"]
    lines = (pool / "datasets/tiny-arithmetic/train.jsonl").read_text().splitlines()
    assert len(lines) == 512 and json.loads(lines[0])["text"].startswith("Q: ")
    assert oct(os.stat(pool).st_mode & 0o777) == "0o755"


def test_safetensors_weights_match_the_config(tmp_path):
    pool = tmp_path / "pool"
    ensure_demo_pool(str(pool))
    model = pool / "models/tiny-llama"
    config = json.loads((model / "config.json").read_text())
    assert config == TINY_LLAMA
    path = model / "model.safetensors"
    header = read_safetensors_header(str(path))
    assert header.pop("__metadata__") == {"format": "pt"}
    shapes = llama_tensor_shapes(config)
    assert {k: tuple(v["shape"]) for k, v in header.items()} == shapes
    end = max(v["data_offsets"][1] for v in header.values())
    (size,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert size % 8 == 0
    assert path.stat().st_size == 8 + size + end
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        n = 1
        for d in info["shape"]:
            n *= d
        assert stop - begin == 4 * n and info["dtype"] == "F32", name


def test_tokenizer_covers_every_byte(tmp_path):
    pool = tmp_path / "pool"
    ensure_demo_pool(str(pool))
    tok = json.loads((pool / "models/tiny-llama/tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert len(vocab) == 256 and len(set(byte_level_alphabet())) == 256
    assert tok["added_tokens"][0]["id"] == 256 == TINY_LLAMA["vocab_size"] - 1
