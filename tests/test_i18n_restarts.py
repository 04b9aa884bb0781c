"""What the meter and the hub's debug-mode restarts tell a user, in Simplified Chinese too:
a restart that could not happen is a notification kept in every language (its reason
inside the sentence), English in the log and the ledger; a session whose profile the catalog
no longer lists is still called debug mode in the reader's language.
"""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

from meterhub import i18n
from meterhub.billing_hooks.meter import Meter
from meterhub.hub import restarts

from .billing_support import make_ledger


def test_a_restart_that_cannot_happen_is_told_in_every_language():
    ledger, clock = make_ledger()
    clock.now = 1_800_000_000
    assert ledger.request_restart("gone", "", 7, "user:gone", "idle")
    app = SimpleNamespace(users={})  # the user was deleted meanwhile
    assert asyncio.run(restarts.run_restarts(app, ledger)) == 0
    (note,) = ledger.notifications("gone")
    assert note.kind == "stopped"
    assert note.message == (
        "Your server could not be started again in debug mode (the user no longer exists)."
        " It is stopped; your files are kept. Start it from the Hub Control Panel."
    )
    assert json.loads(note.translations) == {
        "zh_CN": "您的服务器未能以调试模式重新启动（该用户已不存在）。服务器已停止；文件已保留。"
        "可在“Hub 控制面板”中启动它。"
    }
    (done,) = ledger.restarts("gone")
    assert done.applied_at == clock.now and done.outcome == "the user no longer exists"
    assert ledger.pending_restarts() == []


def test_a_late_restart_says_how_late_in_chinese():
    ledger, clock = make_ledger()
    clock.now = 1_800_000_000
    assert ledger.request_restart("amy", "", 3, "user:amy", "cap")
    clock.now += restarts.GIVE_UP_SECONDS + 1
    assert asyncio.run(restarts.run_restarts(SimpleNamespace(users={}), ledger)) == 0
    (note,) = ledger.notifications("amy")
    assert "(it was asked for more than 10 minutes ago)" in note.message
    assert "（重启请求发出已超过 10 分钟）" in json.loads(note.translations)["zh_CN"]
    assert ledger.restarts("amy")[0].outcome == "it was asked for more than 10 minutes ago"


def test_every_reason_reads_in_chinese():
    for reason in (
        (restarts.N_("its user started it again meanwhile"), {}),
        (restarts.N_("the server no longer exists"), {}),
        (restarts.N_("the hub answered %(code)s"), {"code": 403}),
        (restarts.N_("the hub answered %(code)s: %(message)s"), {"code": 403, "message": "x"}),
        (restarts.N_("the hub did not answer: %(error)s"), {"error": "timeout"}),
    ):
        with i18n.using("zh_CN"):
            text = restarts.said(reason)
        assert text != restarts.said(reason) and re.search("[\u4e00-\u9fff]", text), text


def test_a_session_of_a_profile_the_catalog_lost_is_debug_mode_in_the_readers_language():
    ledger, clock = make_ledger()
    meter = Meter(ledger, hub=None, clock=clock)  # no catalog: the label's fallback
    debug = SimpleNamespace(profile="debug", gpus=0)
    assert meter._label(debug) == "debug mode (no GPU)"
    with i18n.using("zh_CN"):
        assert meter._label(debug) == "调试模式（无 GPU）"
        assert meter._label(SimpleNamespace(profile="l40s", gpus=2)) == "2 × l40s"


def test_a_restarted_server_comes_back_in_the_language_it_last_started_in():
    """The restart's request has no reader behind it: it asks for the server's last
    language, so that the hub's pre-spawn hook starts it in that language again."""
    chinese = restarts.restart_headers("t0k", {"METERHUB_LANGUAGE": "zh_CN", "OTHER": "1"})
    assert chinese == {
        "Authorization": "token t0k",
        "Content-Type": "application/json",
        "Accept-Language": "zh-CN",
    }
    assert i18n.negotiate(accept_language=chinese["Accept-Language"]) == "zh_CN"
    for environment in ({}, {"METERHUB_LANGUAGE": "en"}, {"METERHUB_LANGUAGE": "x\r\nSet: 1"}):
        assert restarts.restart_headers("t0k", environment)["Accept-Language"] == "en"
