"""public:// — the pool through fsspec: lists and reads, refuses every write."""

from __future__ import annotations

import fsspec
import pytest

from meterhub.extensions.pool import Catalog, PublicFileSystem, catalog
from meterhub.hub.demo_pool import generate_demo_pool


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return generate_demo_pool(str(tmp_path_factory.mktemp("pool") / "pool"))


@pytest.fixture
def public(pool, monkeypatch):
    monkeypatch.setenv("METERHUB_PUBLIC_DIR", pool)
    return fsspec.filesystem("public", skip_instance_cache=True)


def test_public_is_registered_and_lists_and_reads(public):
    assert isinstance(public, PublicFileSystem)  # found through the fsspec.specs entry point
    assert set(public.ls("", detail=False)) >= {"catalog.yaml", "models", "datasets"}
    assert public.ls("models", detail=False) == ["models/tiny-llama"]
    assert public.isfile("models/tiny-llama/config.json")
    with fsspec.open("public://datasets/tiny-arithmetic/train.jsonl", "r") as f:
        assert '"text"' in f.readline()
    assert public.cat("public://models/tiny-llama/config.json").startswith(b"{")


@pytest.mark.parametrize(
    "write",
    [
        lambda fs: fs.open("models/new.txt", "w"),
        lambda fs: fs.open("catalog.yaml", "ab"),
        lambda fs: fsspec.open("public://x.txt", "w").open(),
        lambda fs: fs.pipe("x.bin", b"1"),
        lambda fs: fs.touch("x"),
        lambda fs: fs.mkdir("mine"),
        lambda fs: fs.rm("catalog.yaml"),
        lambda fs: fs.mv("catalog.yaml", "c.yaml"),
        lambda fs: fs.cp("catalog.yaml", "c.yaml"),
        lambda fs: fs.write_text("x.txt", "hi"),
        lambda fs: fs.put("/etc/hostname", "hostname"),
    ],
)
def test_every_write_is_refused_with_a_clear_message(public, pool, write):
    import os

    before = sorted(os.listdir(pool))
    with pytest.raises(PermissionError, match="public:// is read-only"):
        write(public)
    assert sorted(os.listdir(pool)) == before


def test_the_catalog_lists_models_and_datasets(pool):
    data = catalog(pool)
    (model,) = data["models"]
    (dataset,) = data["datasets"]
    assert model["name"] == "tiny-llama" and model["size_bytes"] > 0 and model["licence"]
    assert dataset["path"] == "datasets/tiny-arithmetic"
    table = Catalog(pool)._repr_html_()
    assert "public://models/tiny-llama" in table and "<table" in table
    assert "tiny-arithmetic" in repr(Catalog(pool))
