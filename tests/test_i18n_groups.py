"""Research groups and course labs in Simplified Chinese: the phrases, the refusals of the
ledger, the console's actions and the CLI, and the group page and the instructor console of
a real hub asked for zh-CN; in English they stay as they were.
"""

from __future__ import annotations

import datetime
import re

import pytest
import requests

from meterhub import i18n
from meterhub.billing_hooks import labwindows
from meterhub.billing_hooks.actions import ActionError
from meterhub.billing_hooks.course_actions import change_course, roster_lines
from meterhub.billing_hooks.courses import course_refusal, lab_phrase
from meterhub.billing_hooks.groups import runway_phrase
from meterhub.billing_hooks.ledger import LedgerError, UnknownWallet
from meterhub.billing_hooks.money import to_micros
from meterhub.hub.billing_cli import CliError
from meterhub.hub.course_cli import allowance_set, read_roster

from .billing_support import make_ledger
from .clirun import run_cli
from .hubprocess import until

#: Tuesday 2 February 2027 05:00 UTC (13:00 in Shanghai): an hour before the lab
TUE = int(datetime.datetime(2027, 2, 2, 5, tzinfo=datetime.UTC).timestamp())
ZONE = "Asia/Shanghai"
LAB = labwindows.weekly("Tue 14:00-16:00")
PASSWORD = "correct horse battery"
#: any of these English words in a zh-CN text: a string left untranslated
ENGLISH_WORD = re.compile(r"\b(the|is|are|of|an|on|from|your|may|spend|per)\b", re.I)


def course_ledger():
    ledger, clock = make_ledger()
    clock.now = TUE
    ledger.create_course("ml101", "root", instructors=["prof"], timezone=ZONE)
    ledger.set_course_profiles("ml101", ["debug", "rtx4090:1"])
    ledger.set_course_windows("ml101", [LAB])
    return ledger


def test_lab_times_read_with_chinese_day_names():
    ledger = course_ledger()
    course = ledger.course("ml101")
    assert lab_phrase(course, TUE) == "next lab: Tue 14:00 CST"
    with i18n.using("zh_CN"):
        assert lab_phrase(course, TUE) == "下次上课：周二 14:00 CST"
        assert lab_phrase(course, TUE + 3600 + 60) == "正在上课，至 周二 16:00 CST"
        far = labwindows.phrase(TUE + 10 * 86_400, ZONE, TUE)
        assert far == "2027-02-12 周五 13:00 CST"
    assert labwindows.phrase(TUE + 10 * 86_400, ZONE, TUE) == "Fri 2027-02-12 13:00 CST"


def test_runway_and_refusals_are_whole_chinese_sentences():
    course = course_ledger().course("ml101")
    with i18n.using("zh_CN"):
        assert runway_phrase(12 * 86_400) == "约可用 12 天"
        assert runway_phrase(5 * 3600) == "约可用 5 小时"
        assert runway_phrase(400 * 86_400) == "可用一年以上"
        refusal = course_refusal(course, "rtx4090", 1, TUE)
        assert refusal == (
            "课程 ml101 只在上课时段内支付 GPU 费用（下次上课：周二 14:00 CST）。调试模式随时可用。"
            "也可以用自己的钱包付费。"
        )
        other = course_refusal(course, "a800", 1, TUE)
        assert other.startswith("课程 ml101 只支付 debug, rtx4090:1；") and "1x a800" in other
    assert course_refusal(course, "rtx4090", 1, TUE).startswith(
        "ml101 pays for GPUs during its lab hours only (next lab: Tue 14:00 CST)."
    )


def test_the_ledger_and_the_console_refuse_in_chinese_and_write_nothing():
    ledger = course_ledger()
    ledger.create_group("lab", "root")
    with i18n.using("zh_CN"):
        with pytest.raises(LedgerError, match="^课题组 'lab' 已存在$"):
            ledger.create_group("lab", "root")
        with pytest.raises(UnknownWallet, match="^没有课程 'nope'$"):
            ledger.set_allowance("nope", to_micros("5"), "week", None)
        with pytest.raises(LedgerError, match="^上限不能为负数$"):
            ledger.set_cap("lab", "amy", -1, "month", "root")
        with pytest.raises(labwindows.WindowError, match="时段须在同一天内结束"):
            labwindows.weekly("Tue 16:00-14:00")
        with pytest.raises(ActionError) as refused:
            change_course(ledger, None, "ml101", {"windows": {"weekly": ["Tuesday at two"]}})
        assert refused.value.message == (
            "windows：'Tuesday at two'：每周时段的写法如 'Tue 14:00-16:00'"
        )
        with pytest.raises(ActionError) as refused:
            roster_lines([{"username": "amy", "role": "dean"}])
        assert refused.value.message == ("roster[1]：角色 'dean' 不在 student, ta, instructor 之中")
    assert ledger.course("ml101").windows == LAB


def test_the_cli_says_what_it_did_and_refuses_in_chinese():
    with i18n.using("zh_CN"):
        said = allowance_set("ml101", "20.00 CNY", "month", "2027-06-30", ZONE)
        assert said == (
            "ml101：每位学生每月可花费 20.00 CNY，直到 2027-06-30（Asia/Shanghai）结束，"
            "从课程钱包划拨"
        )
        with pytest.raises(CliError, match="^第 2 行：角色 'dean' 不在"):
            read_roster("username,role\namy,dean\n")
    assert allowance_set("ml101", "20.00 CNY", "total", None, ZONE) == (
        "ml101: each student may spend 20.00 CNY, carved from the course wallet"
    )


# ---------------------------------------------------------------------- a real hub


def meterhub(hub, *argv: str, stdin: str | None = None, lang: str = "C.UTF-8"):
    # the CLI sets the language of this process from LANG: `using` puts English back
    with i18n.using("en"):
        return run_cli(
            [*argv, "--config", str(hub.config_path)],
            env={"LANG": lang, "LANGUAGE": "", "LC_ALL": "", "LC_MESSAGES": ""},
            stdin=stdin,
        )


@pytest.fixture(scope="module")
def zh_hub(hub_factory):
    hub = hub_factory(
        {
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "36.00"}},
            "groups": {"sync_interval_seconds": 1},
        },
        name="i18n-groups",
    )
    for name in ("amy", "pia", "prof", "ben"):
        assert (
            meterhub(hub, "user", "add", name, "--password-stdin", stdin=PASSWORD).returncode == 0
        )
    for argv in (
        ("group", "create", "lab", "--admin", "pia"),
        ("group", "add", "lab", "amy"),
        ("course", "create", "ml101", "--instructor", "prof", "--tz", ZONE),
        ("course", "allowance", "ml101", "20.00", "--per", "month"),
        ("course", "window", "ml101", "--weekly", "Tue 14:00-16:00"),
    ):
        out = meterhub(hub, *argv)
        assert out.returncode == 0, (argv, out.stdout, out.stderr)

    def synced() -> bool:
        roles = {n: hub.api("GET", f"/users/{n}").json()["roles"] for n in ("pia", "prof")}
        return (
            hub.api("GET", "/groups/lab").json().get("users") == ["amy"]
            and "meterhub-group-admin-lab" in roles["pia"]
            and "meterhub-course-instructor-ml101" in roles["prof"]
        )

    until(synced, "the hub to add amy to lab and give pia and prof their roles")
    return hub


ZH = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"}


def text_of(html: str) -> str:
    """What a person reads of a page: its text, without tags, scripts and styles."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_group_page_speaks_chinese_to_a_chinese_browser(zh_hub):
    pia = zh_hub.sign_in("pia", PASSWORD)
    r = pia.get(f"{zh_hub.url}/hub/groups/lab", headers=ZH, timeout=30)
    assert r.status_code == 200 and r.headers["Content-Language"] == "zh-CN"
    text = text_of(r.text)
    for chinese in (
        "课题组 lab",
        "成员",
        "已花费",
        "上限",
        "设置上限",
        "最近 7 天没有花费。",
        "账单",
    ):
        assert chinese in text, chinese
    for english in ("Members", "Set cap", "Nothing spent", "Running on the group", "Statements"):
        assert english not in text, english
    english = pia.get(f"{zh_hub.url}/hub/groups/lab?lang=en", timeout=30)
    assert "Members" in text_of(english.text) and "Set cap" in english.text
    # a refusal, on the hub's page and from the billing API
    ben = zh_hub.sign_in("ben", PASSWORD)
    refused = ben.get(f"{zh_hub.url}/hub/groups/lab", headers=ZH, timeout=30)
    assert refused.status_code == 403
    # the error page says its charset in a <meta> only (a browser reads it; requests not)
    assert "只有该课题组的成员和管理员可以查看此页面" in refused.content.decode()
    token = zh_hub.api("POST", "/users/ben/tokens", json={"note": "zh"}).json()["token"]
    api = requests.get(
        f"{zh_hub.url}/services/billing/api/v1/groups/lab",
        headers={"Authorization": f"token {token}", **ZH},
        timeout=30,
    )
    assert api.status_code == 403
    assert api.json()["message"] == "只有该课题组的成员和管理员可以查看其钱包"


def test_the_instructor_console_speaks_chinese_to_a_chinese_browser(zh_hub):
    prof = zh_hub.sign_in("prof", PASSWORD)
    r = prof.get(f"{zh_hub.url}/hub/courses/ml101", headers=ZH, timeout=30)
    assert r.status_code == 200
    text = text_of(r.text)
    for chinese in (
        "课程 ml101",
        "额度每月 ¥20.00",
        "支付任意配置",
        "名单",
        "启动链接",
        "生成链接",
    ):
        assert chinese in text, chinese
    assert re.search(r"(下次上课|正在上课)：?.*周二", text)
    for english in ("Roster", "Launch link", "Build the link", "allowance ¥", "next lab"):
        assert english not in text, english
    built = prof.get(
        f"{zh_hub.url}/hub/courses/ml101",
        params={"repo": "ftp://example.org/lab"},
        headers=ZH,
        timeout=30,
    )
    assert "仓库须为 http(s) 地址" in built.text


def test_the_cli_speaks_the_language_of_lang(zh_hub):
    refused = meterhub(
        zh_hub, "course", "window", "ml101", "--weekly", "Tue 16:00-14:00", lang="zh_CN.UTF-8"
    )
    assert refused.returncode != 0
    assert "时段须在同一天内结束" in refused.stderr + refused.stdout
    shown = meterhub(zh_hub, "group", "show", "lab", lang="zh_CN.UTF-8")
    assert shown.returncode == 0 and "余额" in shown.stdout and "管理员：pia" in shown.stdout
    said = meterhub(zh_hub, "group", "cap", "lab", "amy", "5.00", lang="zh_CN.UTF-8")
    assert said.stdout.strip() == "amy 每月可从 lab 花费 5.00 CNY"
    assert not ENGLISH_WORD.search(said.stdout)
    assert meterhub(zh_hub, "group", "cap", "lab", "amy", "none").stdout.strip() == (
        "amy has no cap on lab"
    )
