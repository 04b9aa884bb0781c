"""The pages in Simplified Chinese, in Chromium set to zh-CN (its Accept-Language): sign-in,
the spawn page and the Wallet read in Chinese with nothing English left in meterhub's own
parts, and the language switch takes a reader to English and back, remembered by its cookie
across pages. Screenshots go to test-output/pages/zh-*.png (the README shows the spawn page's).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from .hubprocess import ADMIN_TOKEN

METERHUB = str(Path(sys.executable).parent / "meterhub")
CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "pages"
PASSWORD = "correct-horse-battery-staple"
USER = "lin"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)

#: words that stay as they are in a Chinese page: product and unit names, the currency,
#: the language switch's own "English", commands, and the test's user
KEPT_IN_ENGLISH = (
    "JupyterLab",
    "JupyterHub",
    "meterhub",
    "English",
    "RTX",
    "GPU",
    "VRAM",
    "CNY",
    "CSV",
    "debug",
    # a command to copy, not a sentence (`meterhub env build minimal`)
    "env build",
    USER,
)
#: two Latin words in a row, once the kept ones are taken out: a phrase left in English
ENGLISH_RUN = re.compile(r"[A-Za-z][A-Za-z'’]+(?:[ \t,.;:/-]+[A-Za-z][A-Za-z'’]+)+")
_KEPT = re.compile(r"\b(?:" + "|".join(map(re.escape, KEPT_IN_ENGLISH)) + r")\b")


def english_runs(text: str) -> list[str]:
    """The phrases of `text` still in English (the kept words aside)."""
    return ENGLISH_RUN.findall(_KEPT.sub("·", text))


def test_the_english_detector_finds_a_phrase_and_lets_names_be():
    assert english_runs("您的余额：¥10.00 · Stop this server 自动") == ["Stop this server"]
    assert english_runs("RTX 4090 · 24 GB 显存 · JupyterLab · debug · 1,234.50 CNY") == []
    assert english_runs("lin 已登录 English 简体中文") == []


@pytest.fixture(scope="module")
def zh_hub(hub_factory):
    hub = hub_factory(
        {"gpus": [{"type": "a800", "count": 2}, {"type": "rtx4090", "count": 1}]},
        name="pages-zh",
    )
    out = subprocess.run(
        [METERHUB, "user", "add", USER, "--password-stdin", "--config", str(hub.config_path)],
        input=PASSWORD,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    hub.sign_in(USER, PASSWORD)  # the first sign-in gives the trial credit (¥10.00)
    # ¥1,224.50 more: a balance with thousands to group, ¥1,234.50
    granted = requests.post(
        f"{hub.url}/services/billing/api/v1/users/{USER}/grants",
        headers={"Authorization": f"token {ADMIN_TOKEN}"},
        json={"amount": "1224.50", "key": "zh-pages", "note": "课题组经费"},
        timeout=30,
    )
    assert granted.status_code == 201, granted.text
    return hub


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def chinese_context(browser):
    """A browser whose language is zh-CN: it sends Accept-Language: zh-CN."""
    return browser.new_context(locale="zh-CN", viewport={"width": 1200, "height": 900})


def sign_in(context, hub):
    page = context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))
    return page


def html_lang(page) -> str:
    return page.evaluate("document.documentElement.lang")


def assert_nothing_english(page, *selectors: str) -> None:
    for selector in selectors:
        for text in page.locator(selector).all_inner_texts():
            found = english_runs(text)
            assert not found, f"English in {selector} of {page.url}: {found}\n{text}"


def test_the_sign_in_page_is_in_chinese(zh_hub, browser):
    context = chinese_context(browser)
    page = context.new_page()
    response = page.goto(f"{zh_hub.url}/hub/login")
    assert response.headers["content-language"] == "zh-CN"
    assert html_lang(page) == "zh-CN"
    intro = page.locator("#meterhub-intro").inner_text()
    assert "按小时计费的 GPU 笔记本：在 GPU 上运行 JupyterLab" in intro
    assert "新账号赠送 ¥10.00 试用额度。" in intro
    form = page.locator("form").first
    assert "用户名" in form.inner_text() and "密码" in form.inner_text()
    assert page.locator("#login_submit").get_attribute("value") == "登录"
    assert "注册" in page.locator("#meterhub-signup").inner_text()
    assert_nothing_english(page, "#meterhub-intro", "form", "nav")
    shot(page, "zh-login")
    # a wrong password is refused in Chinese too
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", "not-the-password")
    page.click("input[type=submit]")
    page.wait_for_load_state()
    assert page.locator(".login_error").inner_text() == "用户名或密码错误"
    context.close()


def test_the_spawn_page_is_in_chinese_with_yuan(zh_hub, browser):
    context = chinese_context(browser)
    page = sign_in(context, zh_hub)
    page.goto(f"{zh_hub.url}/hub/spawn")
    assert html_lang(page) == "zh-CN"
    main = page.locator("#meterhub-spawn")
    assert main.locator("h1").inner_text() == "启动服务器"
    assert page.locator("#meterhub-form-balance").inner_text() == "您的余额：¥1,234.50"
    debug = page.locator("#profile-debug").inner_text()
    assert "调试模式" in debug and "¥0.10/小时" in debug and "约可用 12345 小时" in debug
    a800 = page.locator("#profile-a800")
    assert a800.locator(".meterhub-price").inner_text().startswith("¥4.50/")
    assert "80 GB" in a800.inner_text()
    assert "当前 1 块中 1 块空闲" in page.locator("#profile-rtx4090").inner_text()
    h800 = page.locator("#profile-h800")
    assert h800.locator("input[name=profile]").is_disabled()
    assert h800.locator(".meterhub-reason").inner_text() == "本机没有 H800"
    assert "自动停止此服务器（可选）" in page.locator("#meterhub-limits").inner_text()
    assert page.locator("#spawn_form button[type=submit]").inner_text() == "启动"
    nav = page.locator("nav").inner_text()
    assert "钱包" in nav and "退出登录" in nav
    count = a800.locator("label.meterhub-count").nth(0).inner_text().strip()
    assert count.startswith("1 × A800 — ¥4.50/小时 · "), count
    assert_nothing_english(page, "#meterhub-spawn", "nav")
    shot(page, "zh-spawn")
    context.close()


def test_the_wallet_is_in_chinese_with_yuan(zh_hub, browser):
    context = chinese_context(browser)
    page = sign_in(context, zh_hub)
    page.goto(f"{zh_hub.url}/hub/wallet")
    assert html_lang(page) == "zh-CN"
    assert page.locator("#meterhub-balance").inner_text() == "¥1,234.50"
    wallet = page.locator("#meterhub-wallet").inner_text()
    for chinese in ("钱包", "余额", "使用记录", "包时套餐", "还没有使用记录。"):
        assert chinese in wallet, chinese
    assert "没有运行中的服务器：当前不产生任何费用。" in wallet
    assert "包月 · 1 × A800" in page.locator("#offer").inner_text()
    assert_nothing_english(page, "#meterhub-wallet", "nav")
    shot(page, "zh-wallet")
    context.close()


#: an amount as people read it: ¥, thousands grouped, two decimals
YUAN = re.compile(r"¥\d{1,3}(?:,\d{3})*\.\d\d\b")


def test_every_amount_on_the_wallet_groups_thousands(zh_hub, browser):
    context = chinese_context(browser)
    page = sign_in(context, zh_hub)
    page.goto(f"{zh_hub.url}/hub/wallet")
    text = page.locator("#meterhub-wallet").inner_text()
    amounts = re.findall(r"¥[\d,.]+\d", text)
    assert "¥1,234.50" in amounts
    assert [a for a in amounts if not YUAN.fullmatch(a)] == []
    context.close()


def test_the_switch_goes_to_english_and_back_and_the_cookie_remembers(zh_hub, browser):
    context = chinese_context(browser)
    page = sign_in(context, zh_hub)
    page.goto(f"{zh_hub.url}/hub/wallet")
    switch = page.locator("#meterhub-language")
    assert switch.locator("a[aria-current]").inner_text() == "简体中文"
    switch.locator("a[hreflang=en]").click()
    page.wait_for_url(re.compile(r".*/hub/wallet\?lang=en$"))
    assert html_lang(page) == "en"
    assert page.locator("#meterhub-wallet-link").inner_text() == "Wallet"
    assert switch.locator("a[aria-current]").inner_text() == "English"
    cookies = {c["name"]: c["value"] for c in context.cookies()}
    assert cookies["meterhub-lang"] == "en"
    # the browser still asks for zh-CN; the choice wins on every page after
    page.goto(f"{zh_hub.url}/hub/spawn")
    assert html_lang(page) == "en"
    assert page.locator("#meterhub-spawn h1").inner_text() == "Start a server"
    assert page.locator("#meterhub-form-balance").inner_text() == "Your balance: ¥1,234.50"
    switch.locator("a[hreflang=zh-CN]").click()
    page.wait_for_url(re.compile(r".*/hub/spawn\?lang=zh-CN$"))
    assert page.locator("#meterhub-spawn h1").inner_text() == "启动服务器"
    page.goto(f"{zh_hub.url}/hub/wallet")
    assert (
        html_lang(page) == "zh-CN" and page.locator("#meterhub-wallet-link").inner_text() == "钱包"
    )
    context.close()


def test_a_lang_link_speaks_chinese_to_an_english_browser_and_is_remembered(zh_hub, browser):
    context = browser.new_context(locale="en-US")
    page = context.new_page()
    page.goto(f"{zh_hub.url}/hub/login")
    assert html_lang(page) == "en"
    assert page.locator("#login_submit").get_attribute("value") == "Sign in"
    page.goto(f"{zh_hub.url}/hub/login?lang=zh-CN")
    assert html_lang(page) == "zh-CN"
    assert page.locator("#login_submit").get_attribute("value") == "登录"
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))
    page.goto(f"{zh_hub.url}/hub/wallet")  # no ?lang=: the cookie's
    assert html_lang(page) == "zh-CN"
    assert page.locator("#meterhub-wallet-link").inner_text() == "钱包"
    context.close()
