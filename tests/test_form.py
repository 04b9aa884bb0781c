"""The spawn form: every profile, prices, free counts and reasons for what cannot start."""

from meterhub.spawner.catalog import Catalog
from meterhub.spawner.form import profile_options, render_options_form

AVAILABLE = {"rtx4090": (4, 3), "a800": (2, 0), "h800": (0, 0)}


def test_options_disable_what_cannot_start_with_reasons():
    options = {o.profile.slug: o for o in profile_options(Catalog(), AVAILABLE)}
    assert options["debug"].disabled_reason == ""
    assert options["a800"].disabled_reason == "All 2 A800 GPUs are in use"
    assert options["h800"].disabled_reason == "No H800 on this machine"
    counts = {c.count: c.disabled_reason for c in options["rtx4090"].counts}
    assert counts == {1: "", 2: "", 4: "only 3 free", 8: "only 3 free"}
    assert [str(c.price_per_hour) for c in options["rtx4090"].counts] == [
        "1.25",
        "2.50",
        "5.00",
        "10.00",
    ]


def test_rendered_form_shows_names_vram_prices_and_free():
    html = render_options_form(Catalog(), AVAILABLE)
    for text in (
        "RTX 4090",
        "24 GB VRAM",
        "80 GB VRAM",
        "¥1.25/GPU-hour",
        "¥10.00/h",
        "3 of 4 free",
        "No GPU — write and debug your code on the same disk for",
        'data-price="0.10">¥0.10/h</span>',
        "No H800 on this machine",
        'name="gpus_rtx4090"',
    ):
        assert text in html, text
    # debug is the first enabled choice and is preselected
    assert 'value="debug" checked' in html
    assert 'value="a800" disabled' in html


def test_unknown_availability_offers_everything():
    html = render_options_form(Catalog(), None)
    assert " disabled" not in html
    assert "free" not in html.replace("data-free", "")


def test_hub_annotations_add_run_time_and_credit_reasons():
    from meterhub.hub.spawn_form import credit_annotation

    annotate = credit_annotation(available_micros=1_000_000, min_seconds=600)  # ¥1.00, 10 min
    options = {o.profile.slug: o for o in profile_options(Catalog(), AVAILABLE, annotate)}
    assert options["debug"].note == "≈ 10 h at this profile"
    rtx = options["rtx4090"].counts
    assert rtx[0].note == "≈ 48 min at this profile" and rtx[0].disabled_reason == ""
    # 2 × RTX 4090 costs ¥2.50/h: 10 minutes need ¥0.41 — fine; 8 × needs ¥1.66: refused
    assert rtx[1].disabled_reason == ""
    assert rtx[3].disabled_reason == "only 3 free"  # availability wins over credit
    broke = credit_annotation(available_micros=0, min_seconds=600)
    options = {o.profile.slug: o for o in profile_options(Catalog(), AVAILABLE, broke)}
    assert options["debug"].disabled_reason == "not enough credit"
    assert options["rtx4090"].disabled_reason == "Not enough credit"
    html = render_options_form(Catalog(), AVAILABLE, annotate=broke, summary="Your balance: ¥0.00")
    assert "Your balance: ¥0.00" in html and "≈ 0 s at this profile" in html


def test_choices_limited_to_other_groups_are_disabled_with_the_reason():
    catalog = Catalog(
        allowed_groups={"h800": ["lab-a"]}, allowed_groups_by_count={"a800": {"8": ["staff"]}}
    )
    options = {o.profile.slug: o for o in profile_options(catalog, None, groups=frozenset())}
    assert options["h800"].disabled_reason == "Not allowed for your group (only for lab-a)"
    assert {c.count: c.disabled_reason for c in options["a800"].counts} == {
        1: "",
        2: "",
        4: "",
        8: "not allowed for your group",
    }
    members = profile_options(catalog, None, groups=frozenset({"lab-a", "staff"}))
    assert not any(o.disabled_reason for o in members)
    assert not any(c.disabled_reason for o in members for c in o.counts)
    html = render_options_form(catalog, None, groups=frozenset())
    assert "not allowed for your group" in html.lower()
    assert "meterhub-nothing-allowed" not in html  # debug and more are still open


def test_group_limits_on_the_form_ignore_letter_case():
    catalog = Catalog(allowed_groups={"h800": ["Lab-A"]})
    options = {o.profile.slug: o for o in profile_options(catalog, None, groups={"lab-a"})}
    assert options["h800"].disabled_reason == ""


def test_a_user_who_may_start_nothing_is_told_so_at_the_top():
    catalog = Catalog(
        allowed_groups={
            "debug": ["staff"],
            "rtx4090": ["staff"],
            "a800": ["lab-a"],
            "h800": ["lab-a"],
        }
    )
    html = render_options_form(catalog, None, groups=frozenset({"other"}))
    message = (
        "Your groups may start no profile on this hub; ask an admin to add you to one of:"
        " lab-a, staff"
    )
    assert 'id="meterhub-nothing-allowed"' in html and message in html
    assert html.index(message) < html.index('id="profile-debug"')
    assert 'type="radio" name="profile" value="debug" disabled' in html
    assert " checked" not in html  # nothing preselected
    member = render_options_form(catalog, None, groups=frozenset({"Staff"}))
    assert "meterhub-nothing-allowed" not in member and 'value="debug" checked' in member


def test_the_hub_writes_prices_as_billing_does():
    from meterhub.billing_hooks.money import format_money, to_micros

    catalog = Catalog(prices={"a800": "1250.00"})
    hub_price = lambda amount: format_money(to_micros(amount))  # noqa: E731 (hub/spawn_form.py)
    html = render_options_form(catalog, None, price=hub_price)
    assert "¥1,250.00/GPU-hour" in html and "8 × A800 — ¥10,000.00/h" in html
    assert "¥1250.00" not in html
