"""Objects made once for the hub's config (`per_config`): the spawn's BillingSettings, its
priced catalog and the spawners' catalog are shared, and made again only when what they
read changes (a section of the config, the admins' prices)."""

from __future__ import annotations

import copy
from decimal import Decimal

from traitlets.config import Config, Configurable

from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.settings import BillingSettings, billing_settings_of, priced_catalog
from meterhub.spawner.catalog import Catalog
from meterhub.spawner.configured import per_config
from meterhub.spawner.local import LocalGPUSpawner

from .billing_support import make_ledger


def test_one_object_a_config_until_its_sections_change():
    c = Config()
    c.BillingSettings.min_minutes_to_start = 5
    first = billing_settings_of(c)
    assert billing_settings_of(c) is first and first.min_minutes_to_start == 5
    assert billing_settings_of(Config(c)) is not first  # another config object: its own

    c.BillingSettings.min_minutes_to_start = 7  # a changed section is read again
    again = billing_settings_of(c)
    assert again is not first and again.min_minutes_to_start == 7
    c.LoggingConfigurable.log_level = "DEBUG"  # a parent class's section counts too
    assert billing_settings_of(c) is not again

    twin = copy.deepcopy(c)  # a copy starts with nothing made
    assert billing_settings_of(twin) is not billing_settings_of(c)
    assert "_meterhub_made" not in twin and "_meterhub_made" not in dict(c)


def test_kinds_apart_and_the_maker_used():
    c = Config()
    made = []

    def make():
        made.append(1)
        return Catalog(config=c, prices={"debug": "0.30"})

    one = per_config(Catalog, c, "cheap", make)
    assert per_config(Catalog, c, "cheap", make) is one and len(made) == 1
    assert one.profiles()["debug"].price_per_hour == Decimal("0.30")
    plain = per_config(Catalog, c)
    assert plain is not one and plain.profiles()["debug"].price_per_hour == Decimal("0.10")
    # kept side by side: asking for one does not make the other again
    assert per_config(Catalog, c, "cheap", make) is one and per_config(Catalog, c) is plain
    assert len(made) == 1
    assert isinstance(per_config(BillingSettings, c), BillingSettings)


def test_the_priced_catalog_follows_the_admins_prices_and_is_never_changed():
    c = Config()
    c.Catalog.prices = {"a800": "4.80"}
    ledger, _clock = make_ledger()
    before = priced_catalog(c, ledger)
    assert priced_catalog(c, ledger) is before
    # without the admins' price changes it is the spawners' catalog, one object
    assert LocalGPUSpawner(config=c).catalog is before
    assert before.profiles()["a800"].price_per_hour == Decimal("4.80")

    ledger.set_price("a800", to_micros("5.00"), "user:amy")
    after = priced_catalog(c, ledger)
    assert after is not before and after.profiles()["a800"].price_per_hour == Decimal("5.00")
    assert LocalGPUSpawner(config=c).catalog is before  # the spawners' is kept beside it
    # the catalog shared before the change still says what it said
    assert before.prices == {"a800": "4.80"}
    assert priced_catalog(c, ledger) is after


def test_spawners_share_the_hubs_catalog_unless_a_section_is_their_own():
    c = Config()
    c.Catalog.debug_cpu = 1
    a, b = LocalGPUSpawner(config=c), LocalGPUSpawner(config=c)
    assert a.catalog is b.catalog and a.catalog.debug_cpu == 1

    own = Config()
    own.Catalog.debug_cpu = 1
    own.LocalGPUSpawner.Catalog.debug_cpu = 3  # for this spawner's catalog only
    spawner = LocalGPUSpawner(config=own)
    assert spawner.catalog.debug_cpu == 3
    assert spawner.catalog is not LocalGPUSpawner(config=own).catalog

    class Wrapper(Configurable):  # a spawner with a parent: its parent's sections count
        pass

    below = Config()
    below.Wrapper.LocalGPUSpawner.Catalog.debug_cpu = 3
    wrapped = LocalGPUSpawner(parent=Wrapper(config=below), config=below)
    assert wrapped.catalog.debug_cpu == 3
