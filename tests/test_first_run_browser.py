"""A student's whole first run, in a real browser (Debian's Chromium driven by Playwright).

A fresh hub as `meterhub serve` makes it (an admin account and its printed password); sign
in with that password, choose debug mode, start, open the LoRA starter in JupyterLab (it
opens clean: not marked modified), Run All once the kernel is idle, read the printed losses
and see them fall, stop the server and see the cost in the Wallet. A screenshot of each step
goes to test-output/first-run/, and each step's wall-clock time is printed (`pytest -s`),
not asserted: this machine is shared and noisy.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import pytest

from .hubprocess import until
from .test_serve_console import SIGN_IN

METERHUB = str(Path(sys.executable).parent / "meterhub")
CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "first-run"
#: what the starter's training prints for each step
STEP = re.compile(r"^step (\d+) loss (\d+\.\d+)$", re.MULTILINE)
#: an exception shown in an output ("Traceback …", "SomeError: …")
ERROR = re.compile(r"Traceback|\b\w*Error: ")
#: what Python's warnings print in an output ("file:line: SomeWarning: …")
WARNING = re.compile(r"\b\w*Warning: .*")

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)


@pytest.fixture(scope="module")
def fresh_hub(hub_factory):
    # the embedded default (no GPUs here: debug mode only), with debug at ¥3.60/h instead of
    # ¥0.10/h so that a run of a few minutes shows a cost of more than a rounding (¥0.001 a
    # second)
    return hub_factory({"profiles": {"debug": {"price_per_hour": "3.60"}}}, name="first-run")


class Steps:
    """Each step's wall-clock time, printed as it ends, and its screenshot."""

    def __init__(self, page):
        self.page = page
        self.times: list[tuple[str, float]] = []
        SHOTS.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def __call__(self, name: str):
        started = time.monotonic()
        try:
            yield
        except BaseException:
            self.page.screenshot(path=str(SHOTS / f"{len(self.times) + 1}-{name}-failed.png"))
            raise
        seconds = time.monotonic() - started
        self.times.append((name, seconds))
        print(f"first run: {name}: {seconds:.1f} s", flush=True)
        self.page.screenshot(path=str(SHOTS / f"{len(self.times)}-{name}.png"), full_page=True)

    def report(self) -> None:
        print("first run, all steps:", f"{sum(s for _, s in self.times):.1f} s")
        for name, seconds in self.times:
            print(f"  {name:<20} {seconds:6.1f} s")


def printed_password(hub) -> tuple[str, str]:
    """The sign-in line `meterhub serve` printed: (the login URL, the admin's password)."""
    for line in hub.log_path.read_text(errors="replace").splitlines():
        found = SIGN_IN.match(line)
        if found:
            return found.group(1), found.group(2)
    raise AssertionError(f"no sign-in line in the hub's output:\n{hub.log_tail()}")


def outputs_of(cell) -> str:
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


def test_a_first_run_from_sign_in_to_the_wallet(fresh_hub, browser):
    login_url, password = printed_password(fresh_hub)
    context = browser.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
    page = context.new_page()
    step = Steps(page)
    try:
        with step("sign-in"):
            page.goto(login_url)
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", password)
            page.click("input[type=submit]")
            page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))

        with step("spawn-page"):
            # in English whatever the browser says; the switch must not try a spawn
            page.goto(f"{fresh_hub.url}/hub/spawn?lang=en")
            assert page.locator(".spawn-error-msg").count() == 0, page.locator(
                ".spawn-error-msg"
            ).inner_text()
            assert page.locator("#meterhub-form-balance").inner_text() == "Your balance: ¥10.00"
            debug = page.locator("#profile-debug")
            assert "write and debug your code on the same disk for ¥3.60/h" in debug.inner_text()
            debug.locator("input[name=profile]").check()

        with step("start"):
            page.click("form#spawn_form [type=submit]")
            page.wait_for_url(re.compile(r".*/user/admin/lab.*"), timeout=180_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=180_000)

        with step("open-starter"):
            page.goto(f"{fresh_hub.url}/user/admin/lab/tree/lora-starter.ipynb")
            notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
            notebook.locator(".jp-Cell").first.wait_for(timeout=120_000)
            # the kernel has started and answered: JupyterLab has written what it says of
            # itself (language_info, kernelspec) into the notebook's metadata by now
            page.locator(".jp-StatusBar-Widget").get_by_text(
                re.compile(r"Python 3 \(ipykernel\) \| Idle")
            ).wait_for(timeout=180_000)
            tab = page.locator(".lm-TabBar-tab.jp-mod-current", has_text="lora-starter.ipynb")
            tab.wait_for()
            # a document JupyterLab normalised on opening turns dirty at once; give it a
            # moment to show, then the tab must still be clean
            page.wait_for_timeout(2000)
            assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), (
                "the starter notebook is marked modified as soon as it opens"
            )

        with step("run-all"):
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
            page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()
            cells = notebook.locator(".jp-CodeCell")
            last = cells.last
            # the last cell prints "loss A -> B; adapter saved in …" once training is done
            last.locator(".jp-OutputArea-output", has_text="adapter saved in").wait_for(
                timeout=600_000
            )
            outputs = [outputs_of(cells.nth(i)) for i in range(cells.count())]
            everything = "\n".join(outputs)
            assert not ERROR.search(everything), everything
            printed = [(int(n), float(loss)) for n, loss in STEP.findall(everything)]
            assert [n for n, _ in printed] == list(range(1, 31)), everything
            losses = [loss for _, loss in printed]
            # falling: clearly over the run, and the last ten below the first ten
            assert losses[-1] < losses[0] - 0.3, losses
            assert max(losses[-10:]) < min(losses[:10]), losses
            assert not WARNING.findall(everything), everything
            last.scroll_into_view_if_needed()

        with step("stop"):
            page.goto(f"{fresh_hub.url}/hub/home")
            page.click("#stop")
            # the home page hides its stop button once the hub took the request (a slow
            # stop answers 202 and goes on); the Wallet is read once it has stopped
            page.locator("#stop").wait_for(state="hidden", timeout=120_000)
            until(lambda: fresh_hub.server("admin") is None, "the server to stop")

        with step("wallet"):
            page.click("#meterhub-wallet-link")
            page.wait_for_url(re.compile(r".*/hub/wallet$"))
            out = subprocess.run(
                [METERHUB, "usage", "admin", "--csv", "--config", str(fresh_hub.config_path)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            (session,) = list(csv.DictReader(io.StringIO(out.stdout)))
            cost = Decimal(session["cost_CNY"])
            assert session["profile"] == "debug" and cost > 0, session
            row = page.locator("#meterhub-usage tbody tr").first.inner_text()
            assert "debug" in row.lower() and f"¥{cost}" in row and "stopped" in row, row
            shown = page.locator("#meterhub-balance").inner_text()
            credit = subprocess.run(
                [METERHUB, "credit", "show", "admin", "--config", str(fresh_hub.config_path)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            balance = credit.stdout.strip().splitlines()[-1].split()[0]
            assert shown == f"¥{balance}" and Decimal(balance) < Decimal("10.00"), shown
    finally:
        step.report()
        context.close()
