"""How many GPUs passes may reserve: the local inventory, or on Kubernetes the site's
`kubernetes.pass_capacity` — and without it no pass is offered or sold there."""

from __future__ import annotations

import pytest
import yaml
from traitlets.config import Config

from meterhub.billing_hooks import actions
from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.settings import BillingSettings, pass_capacity, priced_catalog
from meterhub.hub.config import ConfigError, apply_config, load_site_config
from meterhub.hub.k8s import configure

L40S = {
    "display_name": "L40S",
    "vram_gb": 48,
    "price_per_hour": "3.20",
    "cpu_per_gpu": 16,
    "memory_gib_per_gpu": 96,
    "product_patterns": ["L40S"],
    "node_product": "NVIDIA-L40S",
}


def config_for(tmp_path, site: dict) -> Config:
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **site}))
    return apply_config(load_site_config(path), Config())


def kube(tmp_path, **kubernetes) -> Config:
    return config_for(tmp_path, {"backend": "kubernetes", "kubernetes": kubernetes})


def test_local_declared_inventory_counts_each_type(tmp_path):
    c = config_for(
        tmp_path,
        {
            "gpu_types": {"l40s": L40S},
            "gpus": [
                {"type": "a800", "count": 2},
                {"type": "rtx4090", "count": 1},
                {"type": "a800", "count": 1},
                {"type": "l40s", "count": 4},
            ],
            # ignored here: the local backend counts what it has
            "kubernetes": {"pass_capacity": {"h800": 8}},
        },
    )
    assert pass_capacity(c) == {"a800": 3, "rtx4090": 1, "l40s": 4}


def test_kubernetes_without_the_key_sells_no_pass(tmp_path):
    c = kube(tmp_path)
    assert pass_capacity(c) == {}
    ledger = BillingSettings(config=c).ledger()
    catalog = priced_catalog(c, ledger)
    assert actions.pass_offers(catalog) != []  # without a capacity every pass is offered
    assert actions.pass_offers(catalog, pass_capacity(c)) == []
    ledger.grant("alice", to_micros(100000), "grant-1")
    before = ledger.balance("alice")
    with pytest.raises(actions.ActionError) as e:
        actions.buy_pass(
            ledger, catalog, "alice", "a800", 1, "daily", "buy-1", "test",
            capacity=pass_capacity(c),
        )  # fmt: skip
    assert e.value.status == 409
    assert ledger.passes("alice") == []
    assert ledger.balance("alice") == before  # nothing was written


def test_kubernetes_with_the_key_sells_what_fits(tmp_path):
    c = kube(tmp_path, pass_capacity={"a800": 4, "h800": 0})
    assert c.BillingSettings.pass_capacity == {"a800": 4, "h800": 0}
    assert pass_capacity(c) == {"a800": 4, "h800": 0}
    ledger = BillingSettings(config=c).ledger()
    catalog = priced_catalog(c, ledger)
    offers = actions.pass_offers(catalog, pass_capacity(c))
    assert {(o["profile"], o["gpus"]) for o in offers} == {("a800", 1), ("a800", 2), ("a800", 4)}
    ledger.grant("alice", to_micros(100000), "grant-1")

    def buy(gpus: int, key: str):
        return actions.buy_pass(
            ledger, catalog, "alice", "a800", gpus, "daily", key, "test",
            capacity=pass_capacity(c),
        )  # fmt: skip

    buy(4, "buy-4")
    with pytest.raises(actions.ActionError) as e:
        buy(1, "buy-1")  # the 4 are reserved that day
    assert e.value.status == 409
    assert [(p.profile, p.gpus) for p in ledger.passes("alice")] == [("a800", 4)]


def test_the_hub_on_kubernetes_reads_the_same_capacity(tmp_path):
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"kubernetes": {"pass_capacity": {"a800": 16}}}))
    c = Config()
    configure(c, str(path))  # what the chart's hub.extraConfig runs
    assert pass_capacity(c) == {"a800": 16}
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    c = Config()
    configure(c, str(empty))
    assert pass_capacity(c) == {}


@pytest.mark.parametrize(
    "capacity, message",
    [
        ({"a100": 8}, "kubernetes.pass_capacity.a100: unknown key"),
        ({"a800": -1}, "pass_capacity"),
        ({"a800": "many"}, "pass_capacity"),
    ],
)
def test_a_bad_capacity_names_the_key(tmp_path, capacity, message):
    with pytest.raises(ConfigError) as e:
        kube(tmp_path, pass_capacity=capacity)
    assert message in str(e.value)
