"""The instructor console in a real browser: the roster with who runs what, Stop and Stop
all, the wallet, the usage CSV and the launch-link builder; a student and a stranger are
refused. The course is made with `meterhub course`; amy runs a debug server on the course's
money. Screenshots go to test-output/pages/course-console*.png (docs/courses.md uses them).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import re
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from meterhub.hub.course_pages import launch_link
from meterhub.spawner.local import ServerRecord, remove_record, write_record

from .hubprocess import ADMIN_TOKEN, until
from .test_group_page import meterhub, sign_in
from .test_pages import CHROMIUM, PASSWORD, fits_a_phone, shot

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is installed by `make test`"
)

COURSE = "ml101"
ROSTER = "username,name,role\namy,Amy A,student\nbob,Bob B,student\ntara,Tara T,ta\n"


@pytest.fixture(scope="module")
def lab_repository(tmp_path_factory):
    """A git repository of course materials served over HTTP on loopback (git's dumb
    protocol, static files), as a launch link names one on GitHub: the machine reaches no
    git host. Yields its URL."""
    root = tmp_path_factory.mktemp("git")
    work = root / "work"
    (work / "week1").mkdir(parents=True)
    (work / "week1" / "lora.ipynb").write_text(
        '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    git = ["git", "-c", "user.name=prof", "-c", "user.email=prof@uni.edu"]
    for args in (
        ["-C", str(work), "init", "-q", "-b", "main"],
        ["-C", str(work), "add", "."],
        ["-C", str(work), "commit", "-q", "-m", "week 1"],
        ["clone", "-q", "--bare", str(work), str(root / "ml101-labs.git")],
        ["-C", str(root / "ml101-labs.git"), "update-server-info"],
    ):
        subprocess.run([*git, *args], check=True, capture_output=True)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ml101-labs.git"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def course_hub(hub_factory, tmp_path_factory):
    pool = tmp_path_factory.mktemp("pool")
    (pool / "courses" / COURSE).mkdir(parents=True)
    (pool / "courses" / COURSE / "week1.ipynb").write_text('{"cells": [], "nbformat": 4}')
    hub = hub_factory(
        {
            "public_dir": str(pool),
            "gpus": [],
            "profiles": {"debug": {"price_per_hour": "36.00"}},
            "billing": {"meter_interval_seconds": 1},
            "groups": {"sync_interval_seconds": 1},
        },
        name="course-page",
    )
    for name in ("amy", "prof", "tara", "eve"):
        meterhub(hub, "user", "add", name, "--password-stdin", stdin=PASSWORD)
    meterhub(hub, "course", "create", COURSE, "--instructor", "prof", "--tz", "Asia/Shanghai")
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text(ROSTER)
    meterhub(hub, "course", "roster", COURSE, str(roster))
    meterhub(hub, "credit", "grant", f"course:{COURSE}", "300", "--key", "po-1")
    meterhub(hub, "course", "allowance", COURSE, "20.00", "--per", "month")
    meterhub(hub, "course", "profiles", COURSE, "debug", "rtx4090:1")
    meterhub(hub, "course", "window", COURSE, "--weekly", "Tue 14:00-16:00")

    def synced() -> bool:
        group = hub.api("GET", f"/groups/{COURSE}").json()
        roles = hub.api("GET", "/users/prof").json()["roles"]
        return group.get("users") == ["amy"] and f"meterhub-course-instructor-{COURSE}" in roles

    until(synced, "the hub to mirror the roster and give prof his role")
    hub.spawn("amy", {"profile": "debug", "wallet": f"course:{COURSE}"})
    return hub


def test_the_instructor_sees_who_runs_what_and_stops_them(course_hub, browser):
    page = sign_in(browser, course_hub, "prof")
    page.locator("#meterhub-courses a", has_text=COURSE).click()
    page.wait_for_url(re.compile(rf".*/hub/courses/{COURSE}$"))
    assert page.locator("#meterhub-course-balance").inner_text() == "¥280.00"  # 20 carved
    settings = page.locator("#meterhub-course-settings").inner_text()
    assert "allowance ¥20.00 per month" in settings and "pays for debug, rtx4090:1" in settings
    assert re.search(r"next lab: Tue .*14:00 CST", page.locator("#meterhub-lab").inner_text())
    amy = page.locator('#meterhub-roster tr[data-member="amy"]').inner_text()
    assert "Amy A" in amy and "debug · ¥" in amy
    bob = page.locator('#meterhub-roster tr[data-member="bob"]').inner_text()
    assert "(not signed in yet)" in bob and "never" in bob
    assert "TA" in page.locator('#meterhub-roster tr[data-member="tara"]').inner_text()
    shot(page, "course-console")
    # the launch link: the course's money, the choice, then nbgitpuller
    page.fill("#meterhub-repo", "https://github.com/uni/ml101-labs.git")
    page.fill("#meterhub-path", "week1/lora.ipynb")
    page.select_option("#meterhub-choice", "rtx4090:1")
    page.locator("#meterhub-launch button").click()
    page.wait_for_load_state()
    link = page.locator("#meterhub-launch-link").input_value()
    query = parse_qs(urlsplit(link).query)
    assert urlsplit(link).path == "/hub/spawn"
    assert query["opt-profile"] == ["rtx4090"] and query["opt-gpus_rtx4090"] == ["1"]
    assert query["opt-wallet"] == [f"course:{COURSE}"]
    pull = parse_qs(urlsplit(query["next"][0]).query)
    assert urlsplit(query["next"][0]).path == "/hub/user-redirect/git-pull"
    assert pull["urlpath"] == ["lab/tree/ml101-labs/week1/lora.ipynb"]
    page.fill("#meterhub-repo", "file:///etc")
    page.locator("#meterhub-launch button").click()
    page.wait_for_load_state()
    assert "http(s) URL" in page.locator("#meterhub-link-error").inner_text()
    # the usage CSV
    href = page.locator("#meterhub-usage-csv").get_attribute("href")
    download = page.request.get(f"{course_hub.url}{href}")
    assert download.ok and download.headers["content-type"].startswith("text/csv")
    (row,) = list(csv.DictReader(io.StringIO(download.text())))
    assert row["member"] == "amy" and row["profile"] == "debug"
    # Stop: the hub stops amy's server; the roster shows her stopped
    page.goto(f"{course_hub.url}/hub/courses/{COURSE}")
    page.locator('#meterhub-roster tr[data-member="amy"] button', has_text="Stop").click()
    page.wait_for_load_state()
    assert (
        "Stopped amy's server; its files are kept."
        in page.locator("#meterhub-message").inner_text()
    )
    assert course_hub.server("amy") is None
    assert "debug" not in page.locator('#meterhub-roster tr[data-member="amy"]').inner_text()
    fits_a_phone(page, "course-console")
    page.context.close()


def test_stop_all_stops_what_the_course_pays_for_and_nothing_else(course_hub, browser):
    course_hub.spawn("amy", {"profile": "debug", "wallet": f"course:{COURSE}"})
    course_hub.spawn("eve", {"profile": "debug"})  # her own money, not the course's
    page = sign_in(browser, course_hub, "tara")  # a TA: the console and Stop
    page.goto(f"{course_hub.url}/hub/courses/{COURSE}")
    page.locator("#meterhub-stop-all button").click()
    page.wait_for_load_state()
    assert "Stopped 1 server(s)" in page.locator("#meterhub-message").inner_text()
    assert course_hub.server("amy") is None and course_hub.server("eve") is not None
    course_hub.stop_server("eve")
    page.context.close()


def test_a_student_and_a_stranger_get_403_and_forms_need_their_xsrf_token(course_hub, browser):
    for name in ("amy", "eve"):
        page = sign_in(browser, course_hub, name)
        assert page.locator("#meterhub-courses").count() == 0
        assert page.goto(f"{course_hub.url}/hub/courses/{COURSE}").status == 403
        assert page.request.get(f"{course_hub.url}/hub/courses/{COURSE}/usage.csv").status == 403
        page.context.close()
    page = sign_in(browser, course_hub, "prof")
    assert page.goto(f"{course_hub.url}/hub/courses/nope").status == 403  # not its staff
    for path in ("stop", "stop-all"):
        r = page.request.post(
            f"{course_hub.url}/hub/courses/{COURSE}/{path}", form={"user": "amy", "server": ""}
        )
        assert r.status == 403, path
    page.context.close()


def test_the_launch_link_refuses_what_is_not_a_repository_a_branch_or_a_path():
    ok = launch_link(
        "https://hub.uni.edu/", "ml101", "https://github.com/u/r", "main", "", "debug", ""
    )
    assert ok.startswith(
        "https://hub.uni.edu/hub/spawn?opt-profile=debug&opt-wallet=course%3Aml101"
    )
    for repo, branch, path, why in (
        ("ftp://x/y", "main", "a.ipynb", "http(s) URL"),
        ("https://github.com/u/r", "main;rm", "a.ipynb", "branch"),
        ("https://github.com/u/r", "main", "../../etc/passwd", "path"),
        ("https://github.com/u/r", "main", "/abs.ipynb", "path"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            launch_link("https://hub", "ml101", repo, branch, path, "debug", "")


def test_a_launch_link_pulls_the_repository_into_the_students_server(course_hub, lab_repository):
    """What the link's `next` does once the server runs: nbgitpuller (in the single-user
    environment) clones the repository onto the student's disk."""
    if course_hub.server("amy") is None:
        course_hub.spawn("amy", {"profile": "debug", "wallet": f"course:{COURSE}"})
    try:
        link = launch_link(course_hub.url, COURSE, lab_repository, "main", "week1", "debug", "")
        then = urlsplit(parse_qs(urlsplit(link).query)["next"][0])
        pull = {k: v[0] for k, v in parse_qs(then.query).items()}
        assert pull["urlpath"] == "lab/tree/ml101-labs/week1"
        # what nbgitpuller's page asks of its API; a full clone: git's dumb HTTP protocol
        # (this test's static server) cannot make a shallow one, GitHub's can
        headers = {"Authorization": f"token {ADMIN_TOKEN}"}
        pulled = requests.get(
            f"{course_hub.url}/user/amy/git-pull/api",
            params={**pull, "depth": "0"},
            headers=headers,
            timeout=120,
        )
        assert pulled.status_code == 200 and '"phase": "finished"' in pulled.text, pulled.text
        notebook = requests.get(
            f"{course_hub.url}/user/amy/api/contents/ml101-labs/week1/lora.ipynb",
            headers=headers,
            timeout=60,
        )
        assert notebook.status_code == 200, notebook.text
    finally:
        course_hub.stop_server("amy")


def test_a_reset_archives_the_disk_copies_the_materials_and_a_restore_brings_it_back(
    course_hub, browser
):
    if course_hub.server("amy") is not None:
        course_hub.stop_server("amy")
    disk = Path(course_hub.data_dir) / "disks" / "amy"
    owner = disk.stat()
    (disk / "mywork.txt").write_text("amy's notes")
    os.chown(disk / "mywork.txt", owner.st_uid, owner.st_gid)
    page = sign_in(browser, course_hub, "prof")
    page.goto(f"{course_hub.url}/hub/courses/{COURSE}")
    row = page.locator('#meterhub-roster tr[data-member="amy"]')
    row.locator("summary").click()
    row.locator("form.meterhub-reset-form input[name=confirm]").check()
    with page.expect_navigation():
        row.locator("form.meterhub-reset-form button").click()
    message = page.locator("#meterhub-message").inner_text()
    assert re.fullmatch(
        r"Reset amy's environment: archived as \d{8}T\d{6}Z-reset-ml101\.tar\.gz; the course"
        r" materials \(1 files\) are in ml101/\.",
        message,
    ), message
    assert not (disk / "mywork.txt").exists()
    copied = disk / COURSE / "week1.ipynb"
    assert copied.read_text() == '{"cells": [], "nbformat": 4}'
    assert (copied.stat().st_uid, copied.stat().st_gid) == (owner.st_uid, owner.st_gid)
    archives = Path(course_hub.data_dir) / "archives" / "amy"
    (archive,) = [p.name for p in archives.iterdir()]
    assert oct(archives.stat().st_mode & 0o777) == "0o700"
    assert oct((archives / archive).stat().st_mode & 0o777) == "0o600"
    # restore: her notes come back, as hers; what the disk held is archived first
    row = page.locator('#meterhub-roster tr[data-member="amy"]')
    row.locator("summary").click()
    row.locator("form.meterhub-restore-form select").select_option(archive)
    with page.expect_navigation():
        row.locator("form.meterhub-restore-form button").click()
    assert "Restored amy's disk from" in page.locator("#meterhub-message").inner_text()
    assert (disk / "mywork.txt").read_text() == "amy's notes"
    assert (disk / "mywork.txt").stat().st_uid == owner.st_uid
    assert not (disk / COURSE).exists()
    assert len(list(archives.iterdir())) == 2
    # refused: a running server, an archive that is not hers, and a student's own request
    course_hub.spawn("amy", {"profile": "debug"})
    try:
        r = page.request.post(
            f"{course_hub.url}/hub/courses/{COURSE}/reset",
            form={"user": "amy", "confirm": "yes", "_xsrf": xsrf_of(page)},
        )
        assert r.status == 409 and "s server first." in r.text()
    finally:
        course_hub.stop_server("amy")
    # a start that got past the page's check: its runtime record names the disk, and the
    # reset, under the disk's lock, refuses it and changes nothing
    before = sorted(p.name for p in disk.iterdir())
    write_record(course_hub.data_dir, ServerRecord(owner="race/", marker=str(disk), started_at=0))
    try:
        r = page.request.post(
            f"{course_hub.url}/hub/courses/{COURSE}/reset",
            form={"user": "amy", "confirm": "yes", "_xsrf": xsrf_of(page)},
        )
        assert r.status == 409 and "a server is running on it" in r.text(), r.text()
    finally:
        remove_record(course_hub.data_dir, "race/")
    assert sorted(p.name for p in disk.iterdir()) == before
    r = page.request.post(
        f"{course_hub.url}/hub/courses/{COURSE}/restore",
        form={"user": "amy", "archive": "../../../etc/passwd", "_xsrf": xsrf_of(page)},
    )
    assert r.status == 404
    page.context.close()
    student = sign_in(browser, course_hub, "amy")
    r = student.request.post(
        f"{course_hub.url}/hub/courses/{COURSE}/reset",
        form={"user": "amy", "confirm": "yes", "_xsrf": xsrf_of(student)},
    )
    assert r.status == 403
    student.context.close()


def xsrf_of(page) -> str:
    return next(c["value"] for c in page.context.cookies() if c["name"] == "_xsrf")


def test_the_instructor_changes_the_settings_on_the_console_and_a_ta_cannot(course_hub, browser):
    page = sign_in(browser, course_hub, "prof")
    page.goto(f"{course_hub.url}/hub/courses/{COURSE}")
    form = page.locator("#meterhub-course-form")
    assert form.locator("#meterhub-amount").input_value() == "20.00"
    assert form.locator("#meterhub-weekly").input_value() == "Tue 14:00-16:00"
    form.locator("#meterhub-amount").fill("25.00")
    form.locator("#meterhub-per").select_option("week")
    form.locator("#meterhub-expires").fill("2099-06-30")
    form.locator("#meterhub-weekly").fill("Tue 14:00-16:00\nThu 14:00-16:00")
    with page.expect_navigation():
        form.locator("button[type=submit]").click()
    assert page.locator("#meterhub-message").inner_text() == f"Saved {COURSE}'s settings."
    course = ledger_of(course_hub).course(COURSE)
    assert (course.allowance_micros, course.allowance_period) == (25_000_000, "week")
    assert course.windows.splitlines() == ["weekly Tue 14:00-16:00", "weekly Thu 14:00-16:00"]
    assert page.locator("#meterhub-expires").input_value() == "2099-06-30"
    # a refused change says why and changes nothing
    page.locator("#meterhub-weekly").fill("Tue 16:00-14:00")
    with page.expect_navigation():
        page.locator("#meterhub-course-form button[type=submit]").click()
    assert "ends after it starts" in page.locator("#meterhub-error").inner_text()
    assert ledger_of(course_hub).course(COURSE).windows.count("weekly") == 2
    page.context.close()
    ta = sign_in(browser, course_hub, "tara")
    ta.goto(f"{course_hub.url}/hub/courses/{COURSE}")
    assert ta.locator("#meterhub-course-form").count() == 0
    r = ta.request.post(
        f"{course_hub.url}/hub/courses/{COURSE}/settings",
        form={"amount": "1000", "per": "week", "_xsrf": xsrf_of(ta)},
    )
    assert r.status == 403 and ledger_of(course_hub).course(COURSE).allowance_micros == 25_000_000
    ta.context.close()


def ledger_of(hub):
    from meterhub.billing_hooks.db import connect
    from meterhub.billing_hooks.ledger import Ledger

    return Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
