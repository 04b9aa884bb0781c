"""Which wallet pays for a spawn: the user options, the member's groups now, the defaults.

`paying_wallet` is a step of the pre-spawn hook; here with a user's hub groups (by name) and
a real ledger. The real-hub path is in test_groups_hub.py.
"""

from __future__ import annotations

import pytest
from tornado import web

from meterhub.billing_hooks.hooks import paying_wallet
from meterhub.billing_hooks.wallets import WalletRef, WalletRefError, parse_wallet
from meterhub.spawner.catalog import Catalog

from .billing_support import make_ledger


@pytest.fixture
def ledger():
    ledger, _clock = make_ledger()
    ledger.create_group("kab", "test")
    ledger.create_group("vision", "test", default_for_members=True)
    return ledger


@pytest.mark.parametrize(
    "groups, options, expected",
    [
        (["vision"], {"wallet": "group:VISION"}, WalletRef("group", "vision")),
        (["vision"], {"wallet": "user:ann"}, None),
        (["vision"], {"wallet": "ann"}, None),
        (["vision"], {}, WalletRef("group", "vision")),  # the group's default_for_members
        ([], {}, None),
        (["kab"], {"wallet": "group:kab"}, WalletRef("group", "kab")),
    ],
)
def test_the_wallet_that_pays(ledger, groups, options, expected):
    assert paying_wallet(ledger, "ann", set(groups), options) == expected


@pytest.mark.parametrize(
    "groups, options, status, words",
    [
        ([], {"wallet": "group:vision"}, 403, "not a member of the group 'vision'"),
        # another hub group: the PI's delete:servers!group=vision does not reach its members
        (["Vision"], {"wallet": "group:vision"}, 403, "not a member"),
        (["vision"], {"wallet": "user:bob"}, 403, "your own wallet"),
        (["vision"], {"wallet": 7}, 400, "a wallet is"),
        (["vision"], {"wallet": "team:vision"}, 400, "unknown wallet kind"),
        (["vision"], {"wallet": "group:a b"}, 400, "invalid group name"),
        # the Kelvin sign folds to "k" with str.casefold: its group is not the wallet kab
        (["\u212aab"], {"wallet": "group:kab"}, 403, "not a member"),
        (["kab"], {"wallet": "group:\u212aab"}, 400, "invalid group name"),
    ],
)
def test_wallets_one_may_not_pay_from(ledger, groups, options, status, words):
    with pytest.raises(web.HTTPError) as e:
        paying_wallet(ledger, "ann", set(groups), options)
    assert e.value.status_code == status and words in e.value.log_message


def test_references_and_group_limited_profiles_fold_ascii_only():
    assert parse_wallet("group:Lab-A") == WalletRef("group", "lab-a")
    for bad in ("group:\u212aab", "group:lab-", "group:" + "a" * 65, "user:Ann", ""):
        with pytest.raises(WalletRefError):
            parse_wallet(bad)
    catalog = Catalog(allowed_groups={"h800": ["kab"]})
    h800 = catalog.profiles()["h800"]
    assert catalog.profile_refusal(h800, {"KAB"}) == ""
    assert catalog.profile_refusal(h800, {"\u212aab"}) != ""
