"""GPU types are data: a site adds a type (or overrides a built-in one) in its config, and
the catalog, GPU detection, the spawn page, `meterhub render-k8s` and billing follow with
no code change."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import requests
import yaml
from traitlets import TraitError
from traitlets.config import Config

from meterhub.hub.config import ConfigError, apply_config, load_site_config
from meterhub.spawner.allocator import GpuAllocator, NotEnoughGpus
from meterhub.spawner.catalog import (
    GPU_TYPES,
    Catalog,
    InvalidChoice,
    gpu_type_for_product,
    merge_gpu_types,
)
from meterhub.spawner.inventory import Gpu, declared_inventory, detect_inventory

from .hubprocess import ADMIN_TOKEN
from .test_inventory import FakeNVML

L40S = {
    "display_name": "L40S",
    "vram_gb": 48,
    "price_per_hour": "3.20",
    "cpu_per_gpu": 16,
    "memory_gib_per_gpu": 96,
    "product_patterns": ["L40S"],
    "node_product": "NVIDIA-L40S",
}
#: a site that adds an L40S and renames and reprices the built-in H800
SITE = {"gpu_types": {"l40s": L40S, "h800": {"display_name": "H800 NVLink", "price_per_hour": 6}}}


def site_config(tmp_path, site: dict) -> Path:
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def catalog_for(site: dict, tmp_path) -> Catalog:
    config = apply_config(load_site_config(site_config(tmp_path, site)), Config())
    return Catalog(config=config)


def test_a_site_adds_a_type_and_overrides_a_built_in(tmp_path):
    catalog = catalog_for(SITE, tmp_path)
    profiles = catalog.profiles()
    assert list(profiles) == ["debug", "rtx4090", "a800", "h800", "l40s"]
    l40s = profiles["l40s"]
    assert (l40s.display_name, l40s.price_per_hour, l40s.counts) == (
        "L40S",
        Decimal("3.20"),
        (1, 2, 4, 8),
    )
    assert l40s.gpu_type.product_patterns == ("l40s",)  # matched in any case
    # the guarantees and /dev/shm left out are derived: 3/4 of the CPUs, 4/5 and 1/4 of memory
    choice = catalog.parse({"profile": "l40s", "gpus": "2"})
    assert (choice.cpu, choice.memory_gib, choice.rate_per_hour) == (32, 192, Decimal("6.40"))
    assert (choice.cpu_guarantee, choice.memory_guarantee_gib, choice.shm_gib) == (24.0, 152, 48)
    h800 = profiles["h800"]
    assert (h800.display_name, h800.price_per_hour) == ("H800 NVLink", Decimal("6.00"))
    assert h800.gpu_type.vram_gb == 80 and h800.gpu_type.node_product == "NVIDIA-H800"
    # the built-in defaults stay as they are
    assert GPU_TYPES["h800"].display_name == "H800" and list(GPU_TYPES) == [
        "rtx4090",
        "a800",
        "h800",
    ]
    # profiles.<slug> overrides the type's price, for added types too
    repriced = catalog_for({**SITE, "profiles": {"l40s": {"price_per_hour": "2.90"}}}, tmp_path)
    assert repriced.profiles()["l40s"].price_per_hour == Decimal("2.90")


def test_unknown_profiles_name_the_configured_types():
    catalog = Catalog(config=Config({"Catalog": {"gpu_types": {"l40s": L40S}}}))
    with pytest.raises(InvalidChoice, match="choose one of: debug, rtx4090, a800, h800, l40s"):
        catalog.parse({"profile": "v100", "gpus": "1"})
    assert catalog.pass_price("l40s", 1, "daily") == Decimal("69.12")  # 90% of 24 h × 3.20


def test_detection_and_declared_inventory_use_the_configured_types():
    types = merge_gpu_types({"l40s": L40S})
    assert gpu_type_for_product("NVIDIA L40S", types).slug == "l40s"
    assert gpu_type_for_product("NVIDIA L40S") is None  # not a built-in type
    nvml = FakeNVML(["NVIDIA L40S", "NVIDIA A800-SXM4-80GB", "Tesla V100"])
    assert [g.type for g in detect_inventory(nvml, gpu_types=types)] == ["l40s", "a800"]
    assert declared_inventory([{"type": "l40s", "count": 1}], types) == [Gpu(0, "l40s", 0)]
    with pytest.raises(ValueError, match="unknown GPU type 'l40s'"):
        declared_inventory([{"type": "l40s", "count": 1}])


def test_the_allocator_knows_every_configured_type(tmp_path):
    types = merge_gpu_types({"l40s": L40S})
    allocator = GpuAllocator(str(tmp_path / "alloc.sqlite"), [Gpu(0, "a800", 0)], types)
    assert allocator.availability()["l40s"] == (0, 0)  # the form says "No L40S on this machine"
    with pytest.raises(NotEnoughGpus, match="This machine has no L40S GPUs"):
        allocator.allocate("1/", "l40s", 1)


@pytest.mark.parametrize(
    "gpu_types, named",
    [
        (
            {"l40s": {k: v for k, v in L40S.items() if k != "node_product"}},
            "gpu_types.l40s.node_product: required",
        ),
        ({"l40s": {**L40S, "price_per_hour": "3.255"}}, "gpu_types.l40s.price_per_hour"),
        ({"l40s": {**L40S, "price_per_hour": 0}}, "gpu_types.l40s.price_per_hour"),
        ({"a800": {"price_per_hour": "-1"}}, "gpu_types.a800.price_per_hour"),
        ({"debug": L40S}, "gpu_types.debug: 'debug' is debug mode"),
        ({"L40S": L40S}, "gpu_types.L40S: a GPU type slug is lower-case letters"),
        ({"l40s!": L40S}, "gpu_types.l40s!: a GPU type slug"),
        ({"l40s": {**L40S, "vram": 48}}, "gpu_types.l40s.vram: unknown key"),
        ({"l40s": {**L40S, "vram_gb": "48"}}, "gpu_types.l40s.vram_gb"),
        ({"l40s": {**L40S, "product_patterns": "l40s"}}, "gpu_types.l40s.product_patterns"),
        (
            {"a800": {"cpu_guarantee_per_gpu": 64}},
            "gpu_types.a800.cpu_guarantee_per_gpu: 64 is more than",
        ),
    ],
)
def test_bad_gpu_types_name_the_key(tmp_path, gpu_types, named):
    with pytest.raises(ConfigError) as e:
        load_site_config(site_config(tmp_path, {"gpu_types": gpu_types}))
    assert named in str(e.value)
    with pytest.raises(TraitError, match="Catalog.gpu_types"):
        Catalog(config=Config({"Catalog": {"gpu_types": gpu_types}}))


@pytest.mark.parametrize(
    "site, named",
    [
        ({"profiles": {"l40s": {"price_per_hour": 3}}}, "profiles.l40s: unknown key"),
        ({"gpus": [{"type": "l40s", "count": 1}]}, "gpus.0.type: unknown GPU type 'l40s'"),
        ({"kubernetes": {"node_products": {"l40s": ["x"]}}}, "kubernetes.node_products.l40s"),
    ],
)
def test_keys_naming_a_type_need_it_in_the_catalog(tmp_path, site, named):
    with pytest.raises(ConfigError, match=named):
        load_site_config(site_config(tmp_path, site))
    load_site_config(site_config(tmp_path, {**site, "gpu_types": {"l40s": L40S}}))  # fine


def meterhub(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "meterhub"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_render_k8s_renders_an_added_type(tmp_path):
    path = site_config(tmp_path, SITE)
    out = meterhub(
        "render-k8s", "--config", str(path), "--user", "amy", "--profile", "l40s", "--gpus", "2"
    )
    assert out.returncode == 0, out.stderr
    pod = next(yaml.safe_load_all(out.stdout))
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["limits"]["cpu"] in ("32", 32, "32.0", 32.0)
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    expressions = [e for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]]
    assert {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-L40S"],
    } in expressions
    assert pod["metadata"]["labels"]["meterhub.io/profile"] == "l40s"
    # without the site's gpu_types the same choice is refused with the catalog's profiles
    bare = meterhub("render-k8s", "--user", "amy", "--profile", "l40s", "--gpus", "2")
    assert bare.returncode == 2
    assert "Unknown profile 'l40s'; choose one of: debug, rtx4090, a800, h800" in bare.stderr


def login(hub) -> requests.Session:
    password = (Path(hub.data_dir) / "admin-password").read_text().strip()
    s = requests.Session()
    s.get(f"{hub.url}/hub/login")
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": "admin", "password": password, "_xsrf": s.cookies.get("_xsrf")},
    )
    assert r.ok and "/hub/login" not in r.url, r.status_code
    return s


def test_a_real_hub_offers_and_prices_an_added_type(hub_factory):
    hub = hub_factory({**SITE, "gpus": [{"type": "l40s", "count": 2}]}, name="l40s")
    s = login(hub)
    form = s.get(f"{hub.url}/hub/spawn").content.decode()
    for text in ("L40S", "48 GB VRAM per GPU", "¥3.20/GPU-hour", "H800 NVLink", "¥6.00/GPU-hour"):
        assert text in form, text
    assert 'data-free="2"' in form  # the two declared L40S, the only GPUs here
    r = requests.get(
        f"{hub.url}/services/billing/api/v1/prices",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        timeout=30,
    )
    prices = r.json()["prices"]
    assert prices["l40s"] == {"price_per_hour": "3.20", "per": "GPU-hour", "set_by_admin": False}
    assert prices["h800"]["price_per_hour"] == "6.00"
