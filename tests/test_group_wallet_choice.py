"""Which wallet pays for a spawn: the user options, the member's groups now, the defaults.

`paying_wallet` is a step of the pre-spawn hook; here with a user's hub groups (by name) and
a real ledger. The real-hub path is in test_groups_hub.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import pytest
import yaml
from sqlalchemy.exc import OperationalError
from tornado import web
from traitlets.config import Config

from meterhub.billing_hooks.hooks import authorize_spawn, paying_wallet
from meterhub.billing_hooks.ledger import Ledger
from meterhub.billing_hooks.settings import BillingSettings
from meterhub.billing_hooks.wallets import WalletRef, WalletRefError, parse_wallet
from meterhub.hub.config import apply_config, load_site_config
from meterhub.i18n import using
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


# ---------------------------------------------------------------- the hook, in its thread


def on_the_loop(value):
    """What only the event loop's thread may read: the hub's ORM (a user's name, groups)."""
    assert threading.current_thread() is threading.main_thread(), "the hub's ORM, in a thread"
    return value


class HubUser:
    def __init__(self, name: str, groups: list[str]):
        self._name, self._groups = name, groups

    name = property(lambda self: on_the_loop(self._name))
    groups = property(lambda self: on_the_loop([SimpleNamespace(name=g) for g in self._groups]))


class StandIn:
    """A spawner as the pre-spawn hook sees it (a spawn that never gets ready)."""

    name = ""
    _spawn_future = None
    ready = pending = False
    start_timeout = http_timeout = 1
    credit_seconds = None

    def __init__(self, config, user: HubUser, options: dict):
        self.config, self.user, self.user_options = config, user, options
        self.log = logging.getLogger("test.hook")

    @property
    def _log_name(self) -> str:
        return self.user.name


@pytest.fixture
def site(tmp_path) -> Config:
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    c = apply_config(load_site_config(path), Config())
    BillingSettings(config=c).ledger().create_group("kab", "test")
    return c


def authorize(site, groups, options, language="en"):
    spawner = StandIn(site, HubUser("ann", groups), options)
    with using(language):
        asyncio.run(authorize_spawn(spawner))
    return spawner


@pytest.mark.parametrize(
    "groups, options, trial, status, words",
    [
        ([], {"profile": "debug", "wallet": "group:kab"}, "10", 403, "not a member"),
        (["kab"], {"profile": "nope"}, "10", 400, "Unknown profile 'nope'"),
        (["kab"], {"profile": "debug", "wallet": "group:k b"}, "10", 400, "invalid group"),
        ([], {"profile": "debug"}, "0", 402, "Your balance is"),
    ],
)
def test_the_hook_refuses_from_its_thread_with_the_status_it_says(
    site, groups, options, trial, status, words
):
    site.BillingSettings.trial_credit = trial
    with pytest.raises(web.HTTPError) as e:
        authorize(site, groups, options)
    assert e.value.status_code == status and words in e.value.log_message
    assert BillingSettings(config=site).ledger().open_sessions() == []


def test_the_hook_speaks_the_spawns_language_in_its_thread(site):
    with pytest.raises(web.HTTPError) as e:
        authorize(site, [], {"profile": "debug", "wallet": "group:kab"}, language="zh_CN")
    assert e.value.status_code == 403 and "您不是课题组" in e.value.log_message


def test_the_hook_opens_the_session_and_says_its_runway(site):
    spawner = authorize(site, ["kab"], {"profile": "debug"})
    (session,) = BillingSettings(config=site).ledger().open_sessions()
    assert (session.user_name, session.server_name, session.profile) == ("ann", "", "debug")
    assert spawner.credit_seconds and spawner.credit_seconds > 0


def test_a_ledger_down_is_a_503_naming_the_server_in_the_log(site, monkeypatch, caplog):
    def down(*args, **kwargs):
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    monkeypatch.setattr(Ledger, "open_session", down)
    with caplog.at_level(logging.ERROR, "test.hook"), pytest.raises(web.HTTPError) as e:
        authorize(site, [], {"profile": "debug"})
    assert e.value.status_code == 503
    assert "Ledger database error while authorizing ann" in caplog.text
