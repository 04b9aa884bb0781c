"""The catalog: profiles, prices, and validation of user options."""

from decimal import Decimal

import pytest
from traitlets.config import Config

from meterhub.spawner.catalog import (
    GPU_TYPES,
    Catalog,
    InvalidChoice,
    gpu_type_for_product,
    parse_price,
)


def test_reference_profiles_and_prices():
    profiles = Catalog().profiles()
    assert list(profiles) == ["debug", "rtx4090", "a800", "h800"]
    assert profiles["debug"].price_per_hour == Decimal("0.10")
    assert profiles["debug"].is_debug and profiles["debug"].counts == ()
    assert {s: p.price_per_hour for s, p in profiles.items() if not p.is_debug} == {
        "rtx4090": Decimal("1.25"),
        "a800": Decimal("4.50"),
        "h800": Decimal("6.67"),
    }
    assert [(t.display_name, t.vram_gb) for t in GPU_TYPES.values()] == [
        ("RTX 4090", 24),
        ("A800", 80),
        ("H800", 80),
    ]
    assert all(p.counts == (1, 2, 4, 8) for p in profiles.values() if not p.is_debug)


def test_price_overrides_from_config_are_exact():
    c = Config()
    c.Catalog.prices = {"a800": "5.10", "debug": 0.2}
    catalog = Catalog(config=c)
    choice = catalog.parse({"profile": "a800", "gpus": "4"})
    assert choice.rate_per_hour == Decimal("20.40")
    assert catalog.parse({"profile": "debug"}).rate_per_hour == Decimal("0.20")


@pytest.mark.parametrize("bad", ["1.234", "-1", "0", "abc", True, "NaN", "Infinity"])
def test_bad_prices_are_refused(bad):
    with pytest.raises(ValueError, match="profiles.a800"):
        parse_price(bad, "profiles.a800")


def test_choice_resources_and_options_round_trip():
    catalog = Catalog()
    choice = catalog.parse({"profile": "h800", "gpus": 8})
    assert (choice.gpus, choice.cpu, choice.memory_gib) == (8, 160, 1600)
    assert choice.rate_per_hour == Decimal("53.36")
    assert choice.user_options == {"profile": "h800", "gpus": "8"}
    assert catalog.parse(choice.user_options) == choice
    debug = catalog.parse({"profile": "debug"})
    assert debug.gpus == 0 and debug.user_options == {"profile": "debug"}
    assert catalog.choice("a800", 2).label == "2 × A800"


@pytest.mark.parametrize(
    "options, message",
    [
        (None, "Choose a profile"),
        ({}, "Choose a profile"),
        ([], "Choose a profile"),
        ({"profile": "A800", "gpus": "1"}, "Unknown profile 'A800'"),
        ({"profile": "a800", "gpus": "16"}, "'gpus' must be one of 1, 2, 4, 8"),
        ({"profile": "a800", "gpus": "02"}, "'gpus' must be one of"),
        ({"profile": "a800", "gpus": 1.0}, "'gpus' must be one of"),
        ({"profile": "a800", "gpus": True}, "'gpus' must be one of"),
        ({"profile": "a800"}, "needs 'gpus'"),
        ({"profile": "debug", "gpus": "2"}, "Debug mode has no GPUs"),
        ({"profile": "debug", "mounts": ["/"]}, "Unknown option 'mounts'"),
        ({"profile": ["debug"]}, "Unknown profile"),
    ],
)
def test_invalid_options_say_why(options, message):
    with pytest.raises(InvalidChoice, match=message):
        Catalog().parse(options)


def test_nvml_product_names_map_to_types():
    assert gpu_type_for_product("NVIDIA GeForce RTX 4090").slug == "rtx4090"
    assert gpu_type_for_product("NVIDIA A800-SXM4-80GB").slug == "a800"
    assert gpu_type_for_product("NVIDIA A800 80GB PCIe").slug == "a800"
    assert gpu_type_for_product("NVIDIA H800").slug == "h800"
    assert gpu_type_for_product("NVIDIA H200") is None
