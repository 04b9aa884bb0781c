"""Issue 15 ("no money wasted") attacked as a stranger would: session caps with odd values,
other users' tokens against a server's activity and saving endpoints, the debug-mode restart
queue and its short-lived token, and hostile disks archived and restored as root.

Tests named `test_hole_…` pin a hole found: they fail until the product is fixed (see the
report of the security review). The others pin attacks that are refused correctly."""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import stat
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
import yaml

from meterhub.billing_hooks.db import connect
from meterhub.billing_hooks.ledger import Ledger
from meterhub.hub import restarts as hub_restarts
from meterhub.spawner import disk_archive
from meterhub.spawner.catalog import InvalidChoice, session_caps

from .clirun import run_cli
from .hubprocess import until
from .test_authz_matrix import process_env
from .test_disk_idle_archive import hostile_archive, member

NOW = datetime.datetime(2026, 11, 2, 14, 0, tzinfo=datetime.UTC)
ROOT = os.geteuid() == 0

# ---------------------------------------------------------------------- caps, no hub


@pytest.mark.parametrize(
    "options",
    [
        {"max_cost": value}
        for value in ("1e3", "0.001", "0", "0.00", "-1", "１２", " 5", "5\n", "NaN", "00.5")
        + ("1000000", 12, 12.5, True, ["1"], {"x": 1})
    ]
    + [
        {"max_hours": value}
        for value in ("0", "721", "+3", "3 ", "٣", "³", "0x10", "1_0", True, 1.0, [3], {"a": 1})
        + (10**30, -1)
    ],
)
def test_odd_caps_are_refused_as_invalid_choices(options):
    with pytest.raises(InvalidChoice):
        session_caps(options)


def test_hole_a_max_hours_of_thousands_of_digits_is_an_invalid_choice_not_a_crash():
    """int() refuses strings over 4300 digits with a ValueError, which the spawn does not
    turn into a 400."""
    for value in ("1" * 5000, "0" * 5000 + "1"):
        with pytest.raises(InvalidChoice):
            session_caps({"max_hours": value})


# ---------------------------------------------------------------------- hostile disks


def _archive(disk: Path, folder: Path) -> disk_archive.Archived:
    return disk_archive.archive_idle(str(disk), str(folder), NOW)


def test_hole_a_hard_link_to_a_symlink_in_an_idle_archive_is_refused_and_touches_nothing(
    tmp_path,
):
    """The hard link's target is a member, but a symlink: tarfile links to the symlink and
    then chowns and chmods the hard link, which follows it to the file outside the disk."""
    disk, folder, outside = tmp_path / "disk", tmp_path / "archives", tmp_path / "outside"
    disk.mkdir()
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("not yours")
    os.chmod(victim, 0o600)
    before = os.stat(victim)
    link = member("s", tarfile.SYMTYPE, str(victim))
    hard = member("h", tarfile.LNKTYPE, "s")
    hard.mode, hard.uid, hard.gid = 0o666, 4242, 4242
    hostile_archive(folder, [link, hard])
    try:
        disk_archive.restore_idle(str(disk), str(folder), None)
    except disk_archive.ArchiveError as e:
        assert "hard link" in str(e)
    after = os.stat(victim)
    assert stat.S_IMODE(after.st_mode) == 0o600, "a file outside the disk was chmodded"
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid), "and chowned"
    assert victim.read_text() == "not yours"
    assert os.listdir(disk) == [], "an archive with such a member is refused whole"


def _nest(disk: Path, name: str, depth: int = 1100) -> Path:
    """`depth` folders named `name`, one in the other, below `disk`; the file at the bottom."""
    here = os.getcwd()
    try:
        os.chdir(disk)
        for _ in range(depth):
            os.mkdir(name)
            os.chdir(name)
        Path("bottom.txt").write_text(f"deep {name}\n")
    finally:
        os.chdir(here)
    return disk.joinpath(*[name] * depth, "bottom.txt")


def test_a_disk_nested_deeper_than_python_recurses_archives_and_restores(tmp_path):
    """A user can nest 1100 folders (2200 characters, under PATH_MAX): tarfile.add's,
    os.walk's and shutil.rmtree's recursion end in a RecursionError (which the hub's idle
    loop used to take for its own failure, archiving nobody after that user). Every archive
    walks the disk itself: the deep disk goes and comes back whole, by an idle archive, a
    staff archive (a course reset) and the copy a restore makes of what lies on the disk."""
    disk, folder = tmp_path / "disk", tmp_path / "archives"
    disk.mkdir()
    deepest = _nest(disk, "a")
    try:
        reset = disk_archive.archive_disk(str(disk), str(folder), "reset", NOW)
        assert not list(folder.glob("*.partial"))
        _archive(disk, folder)
        assert os.listdir(disk) == [] and disk_archive.archived(str(folder)) is not None
        stray = _nest(disk, "b")  # a non-empty, deep disk under the archived one
        disk_archive.restore_idle(str(disk), str(folder), None)
        assert deepest.read_text() == "deep a\n" and os.listdir(disk) == ["a"]
        saved = [n for n in disk_archive.archives(str(folder)) if "before-idle-restore" in n]
        assert len(saved) == 1 and not list(folder.glob("*.partial"))
        for name, bottom in ((saved[0], stray), (reset, deepest)):
            disk_archive.restore_disk(str(disk), str(folder / name), (os.getuid(), os.getgid()))
            assert bottom.read_text() == bottom.parent.name.join(("deep ", "\n"))
    finally:
        disk_archive.empty_disk(str(disk))  # pytest's own clean-up recurses too


@pytest.mark.skipif(not ROOT, reason="setuid files, devices and other owners need root")
def test_planted_setuid_pipes_devices_and_outward_links_neither_survive_nor_escape(tmp_path):
    disk, folder, outside = tmp_path / "disk", tmp_path / "archives", tmp_path / "outside"
    disk.mkdir()
    outside.mkdir()
    user = (54321, 54321)
    secret = outside / "shadow"
    secret.write_text("hash")
    os.chmod(secret, 0o600)
    (disk / "suid").write_text("x")
    os.chown(disk / "suid", *user)
    os.chmod(disk / "suid", 0o6755)
    (disk / "sub").mkdir()
    os.mkfifo(disk / "sub" / "fifo")
    os.mkfifo(disk / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(disk / "sub" / "sock"))
    os.mknod(disk / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.symlink(str(secret), disk / "shadow")
    os.symlink("..", disk / "up")
    (disk / ("L" * 255)).write_text("long")
    (disk / "...").write_text("dots")
    (disk / "new\nline").write_text("nl")
    try:
        _archive(disk, folder)
    finally:
        server.close()
    assert os.listdir(disk) == []
    disk_archive.restore_idle(str(disk), str(folder), user)
    assert sorted(os.listdir(disk)) == sorted(
        ["suid", "sub", "shadow", "up", "L" * 255, "...", "new\nline"]
    ), "pipes, sockets and devices are left out"
    assert os.listdir(disk / "sub") == []
    assert stat.S_IMODE(os.lstat(disk / "suid").st_mode) == 0o755, "setuid/setgid dropped"
    assert os.readlink(disk / "shadow") == str(secret), "links stay links"
    assert os.readlink(disk / "up") == ".."
    assert os.listdir(outside) == ["shadow"] and secret.read_text() == "hash"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600 and os.stat(secret).st_uid == 0


def test_the_disk_cli_takes_a_path_like_user_for_a_name_and_touches_nothing(tmp_path):
    data = tmp_path / "data"
    (data / "disks" / "ada").mkdir(parents=True)
    (data / "disks" / "ada" / "f.txt").write_text("ada's")
    (tmp_path / "x").mkdir()
    site = tmp_path / "meterhub.yaml"
    site.write_text(yaml.safe_dump({"data_dir": str(data)}))
    for user in ("../disks/ada", "..", ".", "ada/../ada", "/etc", "../../x", "-", "ada\x00"):
        for argv in (("archive", user), ("delete", user, "--yes", "--archives")):
            result = run_cli(["disk", *argv, "--config", str(site)])
            refused = "has no disk" in result.stderr or "USER: a user name" in result.stderr
            assert result.returncode != 0 and refused, (argv, result)
    assert (data / "disks" / "ada" / "f.txt").read_text() == "ada's"
    assert (tmp_path / "x").is_dir() and not (data / "archives").exists()


# ---------------------------------------------------------------------- the restart token


class _Fetch:
    """AsyncHTTPClient standing in for the hub's own REST API."""

    requests: list = []

    async def fetch(self, request):
        type(self).requests.append(request)
        return SimpleNamespace(code=201, body=b"{}")


def _restart_app(monkeypatch, inactive: bool = True):
    minted = []
    spawner = SimpleNamespace(active=not inactive, pending=None, ready=False, environment={})

    def new_api_token(**kwargs):
        minted.append(kwargs)
        return "t0ken"

    user = SimpleNamespace(
        name="amy", orm_spawners={"": object()}, spawners={"": spawner}, new_api_token=new_api_token
    )
    app = SimpleNamespace(
        users={"amy": user}, hub=SimpleNamespace(url="http://127.0.0.1:1/hub/"), db=None
    )
    _Fetch.requests = []
    monkeypatch.setattr(hub_restarts, "AsyncHTTPClient", _Fetch)
    monkeypatch.setattr(
        hub_restarts, "orm", SimpleNamespace(APIToken=SimpleNamespace(find=lambda db, t: None))
    )
    return app, minted


def _queued(created_at: int):
    return SimpleNamespace(
        id=1,
        user_name="amy",
        server_name="",
        created_at=created_at,
        options='{"profile": "debug", "wallet": "user:amy"}',
        reason="idle",
    )


def test_hole_the_restart_token_can_only_start_that_one_server(monkeypatch):
    """`servers!server=U/S` also holds delete:servers (stop it, and remove a named server)
    and read:servers; starting needs start:servers only."""
    app, minted = _restart_app(monkeypatch)
    assert asyncio.run(hub_restarts._restart(app, _queued(1000), 1010)) == ()  # started
    (token,) = minted
    assert token["scopes"] == ["start:servers!server=amy/"]
    assert token["expires_in"] <= 120


def test_hole_a_restart_queued_long_ago_is_given_up_even_if_its_server_has_stopped(
    monkeypatch,
):
    """GIVE_UP_SECONDS is checked only while the server still runs: a restart the hub could
    not run for a day (the hub was down) starts a debug server, charging, a day later."""
    app, minted = _restart_app(monkeypatch)
    day = 86400
    outcome = asyncio.run(hub_restarts._restart(app, _queued(1000), 1000 + day))
    assert outcome, "given up, with a reason"
    assert minted == [] and _Fetch.requests == [], "no token, no start"


# ---------------------------------------------------------------------- a real hub


@pytest.fixture(scope="module")
def attack_hub(hub_factory):
    hub = hub_factory(
        {
            "gpus": [{"type": "rtx4090", "count": 1}],
            "profiles": {
                "debug": {"idle_minutes": 0},
                "rtx4090": {"idle_minutes": 0, "price_per_hour": "36.00"},
            },
            "idle": {"check_interval_seconds": 1},
            "billing": {
                "trial_credit": "100.00",
                "min_minutes_to_start": 0,
                "meter_interval_seconds": 1,
            },
            "groups": {"sync_interval_seconds": 1},
        },
        name="attack",
    )
    hub.ledger = Ledger(connect(f"sqlite:///{hub.data_dir}/billing.sqlite"))
    return hub


def _user_token(hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"note": "attack test"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _server_token(hub, name: str) -> str:
    """The token inside `name`'s default server (what its kernels read as
    $JUPYTERHUB_API_TOKEN)."""
    port = hub.site["hub"]["api_port"]
    env = process_env(
        lambda e: (
            e.get("JUPYTERHUB_USER") == name
            and e.get("JUPYTERHUB_SERVER_NAME", "") == ""
            and e.get("JUPYTERHUB_API_URL", "").endswith(f":{port}/hub/api")
            and bool(e.get("JUPYTERHUB_API_TOKEN"))
        )
    )
    return env["JUPYTERHUB_API_TOKEN"]


def test_another_users_or_kernels_token_cannot_touch_a_servers_activity(attack_hub):
    hub = attack_hub
    hub.spawn("amy", {"profile": "debug"})
    hub.spawn("bob", {"profile": "debug"})
    try:
        amy, bob = _user_token(hub, "amy"), _user_token(hub, "bob")
        bob_kernel = _server_token(hub, "bob")
        base = f"{hub.url}/user/amy/api/meterhub"
        for token in (bob, bob_kernel):
            for method, what in (("POST", "activity"), ("POST", "saving"), ("GET", "status")):
                r = requests.request(
                    method,
                    f"{base}/{what}",
                    headers={"Authorization": f"token {token}"},
                    timeout=30,
                    allow_redirects=False,
                )
                assert r.status_code in (302, 403), (what, r.status_code, r.text[:200])
            stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            r = hub.api(
                "POST",
                "/users/amy/activity",
                token=token,
                json={"servers": {"": {"last_activity": stamp}}, "last_activity": stamp},
            )
            assert r.status_code in (403, 404), r.text
        # the owner may (so the refusals above are about the token, not the route)
        r = requests.post(f"{base}/activity", headers={"Authorization": f"token {amy}"}, timeout=30)
        assert r.status_code == 204, r.text
    finally:
        hub.stop_server("amy")
        hub.stop_server("bob")


@pytest.mark.parametrize(
    "wallet, words",
    [("group:nosuch", "not a member"), ("user:bob", "own wallet"), ("course:nope", "student")],
)
def test_a_queued_restart_cannot_pay_from_a_wallet_its_user_may_not_use(attack_hub, wallet, words):
    """The restart is the user's own start: the hub's REST API checks the wallet now."""
    hub = attack_hub
    hub.ensure_user("cy")
    hub.ensure_user("bob")
    ledger = hub.ledger
    assert ledger.request_restart("cy", "", None, wallet, "idle")
    queued = ledger.restarts("cy")[0].id
    restart = until(
        lambda: next((r for r in ledger.restarts("cy") if r.id == queued and r.applied_at), None),
        "the hub to try the restart",
    )
    assert restart.outcome.startswith("the hub answered 403: "), restart.outcome
    assert words in restart.outcome, restart.outcome
    assert hub.server("cy") is None and ledger.open_sessions("cy") == []


def test_hole_a_cost_cap_that_buys_less_than_a_meter_pass_and_the_stop_is_refused(
    attack_hub,
):
    """Charging stops at the cap, the stop comes up to a meter interval plus the stop grace
    later, and that time is free: with `max_cost: "0.01"` a GPU runs for free most of each
    session, and a user can start again and again."""
    hub = attack_hub
    hub.ensure_user("dee")
    r = hub.api(
        "POST", "/users/dee/server", json={"profile": "rtx4090", "gpus": "1", "max_cost": "0.10"}
    )
    try:
        assert r.status_code == 400 and "max_cost" in r.json()["message"], r.text
        assert hub.ledger.open_sessions("dee") == []
    finally:
        if hub.server("dee") is not None:
            hub.stop_server("dee")
