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
        ({"profile": "a800", "gpus": " 4"}, "'gpus' must be one of 1, 2, 4, 8, got ' 4'"),
        ({"profile": "a800", "gpus": -1}, "'gpus' must be one of"),
        ({"profile": "a800", "gpus": "1" * 5000}, "'gpus' must be one of"),
        ({"profile": "a800", "gpus": "1", "max_hours": "03"}, "max_hours: expected a whole"),
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


def test_group_limits_ignore_letter_case():
    catalog = Catalog(
        allowed_groups={"h800": ["Lab-A"]}, allowed_groups_by_count={"a800": {"8": ["STAFF"]}}
    )
    h800 = catalog.profiles()["h800"]
    assert catalog.profile_refusal(h800, frozenset({"lab-a"})) == ""
    assert catalog.refusal(catalog.choice("h800", 1), frozenset({"LAB-A"})) == ""
    assert catalog.refusal(catalog.choice("a800", 8), frozenset({"staff"})) == ""
    assert "limited to the groups STAFF" in catalog.refusal(
        catalog.choice("a800", 8), frozenset({"lab-a"})
    )
    assert "limited to the groups Lab-A" in catalog.profile_refusal(h800, frozenset({"lab-b"}))


def _spawner_of(catalog, *groups):
    from types import SimpleNamespace

    from meterhub.spawner.options import CatalogOptions

    user = SimpleNamespace(name="ann", groups=[SimpleNamespace(name=g) for g in groups])
    spawner = CatalogOptions(catalog=catalog)
    spawner.user = user
    return spawner


ONLY_FOR_GROUPS = {"debug": ["course-101"], "rtx4090": ["Vision"], "a800": ["vision"]}


def test_a_user_who_may_start_nothing_is_refused_with_whom_to_ask():
    from tornado import web

    catalog = Catalog(allowed_groups={**ONLY_FOR_GROUPS, "h800": ["staff"]})
    outsider = _spawner_of(catalog, "other")
    for options in ({"profile": "debug"}, {"profile": "a800", "gpus": "1"}, {}):
        outsider.user_options = options
        with pytest.raises(web.HTTPError) as e:
            outsider.parse_options()
        assert e.value.status_code == 403
        assert e.value.log_message == (
            "Your groups may start no profile on this hub; ask an admin to add you to one of:"
            " course-101, staff, Vision"
        )
    member = _spawner_of(catalog, "VISION")
    member.user_options = {"profile": "a800", "gpus": "2"}
    assert member.parse_options().label == "2 × A800"
    member.user_options = {"profile": "h800", "gpus": "1"}
    with pytest.raises(web.HTTPError, match="H800 is limited to the groups staff"):
        member.parse_options()  # one refused choice is not "nothing"


def test_counts_count_when_deciding_that_nothing_may_start():
    from meterhub.spawner.options import nothing_allowed

    catalog = Catalog(
        allowed_groups={**ONLY_FOR_GROUPS, "h800": ["staff"], "a800": ["x"]},
        allowed_groups_by_count={"rtx4090": {"1": ["y"], "2": ["y"], "4": ["y"], "8": ["y"]}},
    )
    assert nothing_allowed(catalog, frozenset({"vision"}))  # every rtx4090 count is y's
    assert nothing_allowed(catalog, frozenset({"vision", "y"})) == ""
    assert "y" in nothing_allowed(catalog, frozenset()).split(": ")[1].split(", ")
    assert nothing_allowed(Catalog(), frozenset()) == ""


def test_profiles_are_made_once_a_language_and_follow_the_traits():
    from meterhub.i18n import using

    catalog = Catalog()
    first = catalog.profiles()
    assert catalog.profiles() is not first  # a dict of the caller's own ...
    assert catalog.profiles()["a800"] is first["a800"]  # ... of the same profiles
    assert first["debug"].display_name == "Debug mode"
    with using("zh_CN"):
        assert catalog.profiles()["debug"].display_name == "调试模式"
    assert catalog.profiles()["debug"].display_name == "Debug mode"
    catalog.prices = {"debug": "0.30"}
    catalog.debug_cpu = 1
    catalog.gpu_types = {"a800": {"price_per_hour": "4.00"}}
    debug, a800 = catalog.profiles()["debug"], catalog.profiles()["a800"]
    assert (debug.price_per_hour, debug.cpu, a800.price_per_hour) == (
        Decimal("0.30"),
        1,
        Decimal("4.00"),
    )
    catalog.prices = {"nope": "1.00"}
    with pytest.raises(ValueError, match="unknown profile 'nope'"):
        catalog.profiles()
