"""Idle disks archived, never silently deleted: the library (spawner/disk_archive.py), the
rule and the CLI (hub/disk_cli.py), and a real hub that archives a stopped user's disk and
puts it back at their next start."""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

from meterhub.hub import disk_cli
from meterhub.spawner import disk_archive
from meterhub.spawner.local import ServerRecord, write_record

from .clirun import run_cli
from .hubprocess import ADMIN_TOKEN, HubProcess, until
from .jupyter import execute

NOW = datetime.datetime(2026, 11, 2, 14, 0, tzinfo=datetime.UTC)
ROOT = os.geteuid() == 0


def make_disk(disk: Path) -> None:
    """A disk with what users' disks hold: files and folders with their own modes, links in
    and out, a hard link, an empty folder, a read-only folder."""
    disk.mkdir(mode=0o700, parents=True)
    (disk / "notes").mkdir()
    (disk / "notes" / "a.txt").write_text("alpha")
    (disk / "secret.txt").write_text("s")
    os.chmod(disk / "secret.txt", 0o600)
    (disk / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(disk / "run.sh", 0o755)
    os.mkdir(disk / "empty")
    os.chmod(disk / "empty", 0o750)
    os.mkdir(disk / "frozen")
    (disk / "frozen" / "f.txt").write_text("f")
    os.chmod(disk / "frozen", 0o500)
    os.symlink("notes/a.txt", disk / "inside")
    os.symlink("/public", disk / "public")  # the pool, as the sandbox shows it
    os.symlink("/public/models/llama", disk / "model")  # a user's link into the pool
    os.link(disk / "notes" / "a.txt", disk / "hard.txt")
    if ROOT:
        os.lchown(disk / "secret.txt", 123456, 654321)
        os.lchown(disk / "inside", 123456, 654321)


def snapshot(disk: Path) -> dict:
    """Every entry below `disk`: kind, mode, owner, content or link target."""
    found = {}
    for root, dirs, files in os.walk(disk):
        for name in dirs + files:
            path = Path(root) / name
            info = os.lstat(path)
            rel = str(path.relative_to(disk))
            if stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path), info.st_uid, info.st_gid)
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", oct(stat.S_IMODE(info.st_mode)), info.st_uid, info.st_gid)
            else:
                content = path.read_text()
                found[rel] = ("file", oct(stat.S_IMODE(info.st_mode)), info.st_uid, content)
    return found


def test_an_idle_archive_round_trips_files_modes_owners_links_and_empty_folders(tmp_path):
    disk, folder = tmp_path / "disks" / "ada", tmp_path / "archives" / "ada"
    make_disk(disk)
    os.chmod(disk, 0o711)
    before, disk_mode = snapshot(disk), os.stat(disk).st_mode
    folder.mkdir(parents=True)
    (folder / "20261001T000000Z-idle.tar.gz.partial").write_bytes(b"a hub stopped mid-way")

    marker = disk_archive.archive_idle(str(disk), str(folder), NOW)

    assert os.listdir(disk) == [] and os.stat(disk).st_mode == disk_mode  # emptied, kept
    assert marker.archive == "20261102T140000Z-idle.tar.gz"
    assert marker.day == "2026-11-02" and marker.disk_bytes == len("alpha") + 1 + 10 + 1
    archive = folder / marker.archive
    assert marker.bytes == archive.stat().st_size
    assert marker.sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert (folder / (marker.archive + ".sha256")).read_text() == (
        f"{marker.sha256}  {marker.archive}\n"  # what `sha256sum -c` reads
    )
    assert oct(stat.S_IMODE(folder.stat().st_mode)) == "0o700"
    assert oct(stat.S_IMODE(archive.stat().st_mode)) == "0o600"
    assert not list(folder.glob("*.partial"))
    assert json.loads((folder / "archived.json").read_text())["sha256"] == marker.sha256
    assert disk_archive.archived(str(folder)) == marker
    with pytest.raises(disk_archive.ArchiveError, match="archived already"):
        disk_archive.archive_idle(str(disk), str(folder), NOW)

    assert disk_archive.restore_idle(str(disk), str(folder), None) == marker
    assert snapshot(disk) == before
    assert os.stat(disk / "hard.txt").st_ino == os.stat(disk / "notes" / "a.txt").st_ino
    assert disk_archive.archived(str(folder)) is None
    assert archive.exists(), "kept until the disk's next idle archive replaces it"
    assert disk_archive.restore_idle(str(disk), str(folder), None) is None  # nothing to do

    later = NOW + datetime.timedelta(days=40)
    newer = disk_archive.archive_idle(str(disk), str(folder), later)
    assert disk_archive.idle_archives(str(folder)) == [newer.archive]
    assert not (folder / (marker.archive + ".sha256")).exists()


def test_a_damaged_archive_is_refused_and_nothing_is_extracted(tmp_path):
    disk, folder = tmp_path / "disk", tmp_path / "archives"
    make_disk(disk)
    marker = disk_archive.archive_idle(str(disk), str(folder), NOW)
    archive = folder / marker.archive
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    with pytest.raises(disk_archive.ArchiveError, match="does not match its checksum"):
        disk_archive.restore_idle(str(disk), str(folder), None)
    assert os.listdir(disk) == []
    assert archive.exists() and disk_archive.archived(str(folder)) == marker
    # a staff restore of that archive (the course page) checks the same checksum
    with pytest.raises(disk_archive.ArchiveError, match="does not match its checksum"):
        disk_archive.restore_disk(str(disk), str(archive), None)
    assert os.listdir(disk) == []


def hostile_archive(folder: Path, members: list[tarfile.TarInfo]) -> None:
    """A well-checksummed idle archive holding `members`, as an attacker who could write
    the archive folder would make it."""
    folder.mkdir(parents=True)
    name = "20261102T140000Z-idle.tar.gz"
    with tarfile.open(folder / name, "w:gz") as tar:
        ok = tarfile.TarInfo("ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        for member in members:
            tar.addfile(member, io.BytesIO(b"hi") if member.isreg() else None)
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "archived.json").write_text(
        json.dumps(
            {
                "archive": name,
                "sha256": digest,
                "bytes": (folder / name).stat().st_size,
                "disk_bytes": 4,
                "archived_at": NOW.isoformat(),
            }
        )
    )


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.size = 2 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "members, why",
    [
        ([member("../escaped.txt")], "absolute path or `..`"),
        ([member("/tmp/meterhub-absolute.txt")], "absolute path or `..`"),
        ([member("a/../../escaped.txt")], "absolute path or `..`"),
        (
            [member("evil", tarfile.SYMTYPE, "../outside"), member("evil/x.txt")],
            "through a link",
        ),
        (
            [member("./evil", tarfile.SYMTYPE, "../outside"), member("evil//./x.txt")],
            "through a link",
        ),
        ([member("h", tarfile.LNKTYPE, "/etc/passwd")], "hard link"),
        ([member("dev", tarfile.CHRTYPE)], "device file"),
        ([member("ok.txt")], "second entry"),
    ],
)
def test_an_archive_that_could_write_outside_the_disk_is_refused_whole(tmp_path, members, why):
    disk, folder = tmp_path / "disk", tmp_path / "archives"
    disk.mkdir()
    (tmp_path / "outside").mkdir()
    hostile_archive(folder, members)
    with pytest.raises(disk_archive.ArchiveError, match=why):
        disk_archive.restore_idle(str(disk), str(folder), None)
    assert os.listdir(disk) == [], "nothing is extracted, not even the harmless member"
    assert not (tmp_path / "escaped.txt").exists()
    assert os.listdir(tmp_path / "outside") == []
    assert not os.path.exists("/tmp/meterhub-absolute.txt")
    assert disk_archive.archived(str(folder)) is not None


def test_what_lies_on_an_archived_disk_is_archived_before_a_restore(tmp_path):
    disk, folder = tmp_path / "disk", tmp_path / "archives"
    make_disk(disk)
    disk_archive.archive_idle(str(disk), str(folder), NOW)
    (disk / "stray.txt").write_text("stray")
    disk_archive.restore_idle(str(disk), str(folder), None)
    assert not (disk / "stray.txt").exists() and (disk / "notes" / "a.txt").read_text() == "alpha"
    saved = [n for n in disk_archive.archives(str(folder)) if "before-idle-restore" in n]
    with tarfile.open(folder / saved[0]) as tar:
        assert tar.getnames() == ["stray.txt"]


def test_a_restore_recreates_a_missing_disk_folder(tmp_path):
    disk, folder = tmp_path / "disk", tmp_path / "archives"
    make_disk(disk)
    disk_archive.archive_idle(str(disk), str(folder), NOW)
    os.rmdir(disk)
    disk_archive.restore_idle(str(disk), str(folder), None)
    assert (disk / "notes" / "a.txt").read_text() == "alpha"
    assert oct(stat.S_IMODE(disk.stat().st_mode)) == "0o700"


def test_a_damaged_marker_is_an_error_never_not_archived(tmp_path):
    (tmp_path / "archived.json").write_text("{not json")
    with pytest.raises(disk_archive.ArchiveError, match="damaged"):
        disk_archive.archived(str(tmp_path))


def test_a_disk_lock_is_held_by_one_at_a_time(tmp_path):
    first = disk_archive.DiskLock(str(tmp_path), "ada")
    second = disk_archive.DiskLock(str(tmp_path), "ada")
    assert first.acquire()
    assert not second.acquire()
    with pytest.raises(disk_archive.ArchiveBusy):
        with second:
            pass
    assert disk_archive.DiskLock(str(tmp_path), "bob").acquire()
    first.release()
    with second:
        assert not first.acquire()
    assert first.acquire()
    first.release()


def test_disk_sizes_count_files_once_follow_no_links_and_are_cached(tmp_path):
    disk = tmp_path / "disk"
    make_disk(disk)
    (tmp_path / "outside.bin").write_bytes(b"x" * 1000)
    os.symlink(tmp_path / "outside.bin", disk / "outside")
    os.symlink(tmp_path, disk / "loop")
    size = len("alpha") + 1 + 10 + 1
    assert disk_archive.tree_bytes(str(disk)) == size
    assert disk_archive.disk_bytes(str(disk)) == size
    (disk / "more.bin").write_bytes(b"y" * 100)
    assert disk_archive.disk_bytes(str(disk)) == size  # cached for a minute
    assert disk_archive.disk_bytes(str(disk), max_age_seconds=0) == size + 100
    disk_archive.archive_idle(str(disk), str(tmp_path / "archives"), NOW)
    assert disk_archive.disk_bytes(str(disk)) == 0, "an archived disk's size is measured anew"
    disk_archive.forget_size(str(disk))
    assert disk_archive.gib(3 * 1024**3 // 2) == "1.5 GiB"
    assert disk_archive.gib(5 * 1024**2) == "5.0 MiB"


def test_one_walk_a_disk_serves_every_caller_and_nobody_waits_to_start_it(tmp_path, monkeypatch):
    """A spawn and the Wallet page asking at once share one walk; a walk forgotten meanwhile
    (the disk was archived) answers its callers but is not cached."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "f.bin").write_bytes(b"x" * 7)
    release, walks = threading.Event(), []
    real = disk_archive.tree_bytes

    def slow(top: str) -> int:  # a disk that takes a while to walk
        walks.append(top)
        release.wait(10)
        return real(top)

    monkeypatch.setattr(disk_archive, "tree_bytes", slow)
    first = disk_archive.measure(str(disk))
    second = disk_archive.measure(str(disk))
    assert first is second and not first.done()
    assert not first.cancel(), "a caller that stops waiting cannot cancel it"
    release.set()
    assert first.result(10) == 7 and walks == [str(disk)]
    assert disk_archive.measure(str(disk)).result(0) == 7 and len(walks) == 1  # cached
    release.clear()
    stale = disk_archive.measure(str(disk), max_age_seconds=0)
    disk_archive.forget_size(str(disk))
    release.set()
    assert stale.result(10) == 7
    assert disk_archive.measure(str(disk)) is not stale and len(walks) == 3, "not cached"
    disk_archive.forget_size(str(disk))


# ---------------------------------------------------------------------- the rule


def test_the_rule_archives_only_stopped_disks_unused_long_enough(tmp_path):
    data, disks = tmp_path / "data", tmp_path / "data" / "disks"
    make_disk(disks / "ada")
    old = NOW - datetime.timedelta(days=31)
    idle_before = NOW - datetime.timedelta(days=30)
    recent = [(NOW - datetime.timedelta(days=2)).replace(tzinfo=None)]  # JupyterHub's naive UTC

    def archive(times=()):
        return disk_cli.archive_user_disk(str(data), str(disks), "ada", NOW, idle_before, times)

    assert archive(recent) is None  # used two days ago
    os.utime(disks / "ada", (old.timestamp(), old.timestamp()))
    record = ServerRecord(owner="1/", marker=str(disks / "ada"), started_at=0)
    write_record(str(data), record)
    with pytest.raises(disk_cli.Refused, match="server is running"):
        archive()  # no server time known: the disk's mtime says idle, but a server runs
    os.unlink(data / "run" / "servers.d" / os.listdir(data / "run" / "servers.d")[0])
    with disk_archive.DiskLock(str(data), "ada"):  # a start holds the disk
        with pytest.raises(disk_archive.ArchiveBusy):
            archive()
    assert os.listdir(disks / "ada")
    marker = archive()
    assert marker is not None and os.listdir(disks / "ada") == []
    with pytest.raises(disk_cli.Refused, match="archived already"):
        archive()
    with pytest.raises(disk_cli.Refused, match="no disk"):
        disk_cli.archive_user_disk(str(data), str(disks), "bob", NOW)


# ---------------------------------------------------------------------- the CLI


@pytest.fixture
def site(tmp_path) -> Path:
    path = tmp_path / "meterhub.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    return path


def cli(site: Path, *argv: str):
    return run_cli(["disk", *argv, "--config", str(site)])


def listing(site: Path) -> dict:
    """Every entry below the site's data directory, with its kind, size and mtime."""
    data = Path(yaml.safe_load(site.read_text())["data_dir"])
    found = {}
    for root, dirs, files in os.walk(data):
        for name in dirs + files:
            info = os.lstat(Path(root) / name)
            found[os.path.join(root, name)] = (
                stat.S_IFMT(info.st_mode),
                info.st_size,
                info.st_mtime_ns,
            )
    return found


def one_line_refusal(site: Path, argv: tuple[str, ...], text: str):
    """`meterhub disk ARGV` refuses with one line holding `text`, and writes nothing."""
    before = listing(site)
    result = cli(site, *argv)
    assert result.returncode != 0, result
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert text in result.stderr, result.stderr
    assert listing(site) == before, f"{argv} refused, but wrote"
    return result


def test_the_cli_lists_archives_restores_and_deletes_only_when_told(site, tmp_path):
    data = tmp_path / "data"
    disk = data / "disks" / "ada"
    make_disk(disk)
    (data / "disks" / "bob").mkdir()
    listed = cli(site, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["USER", "SIZE", "LAST", "USED", "STATE", "ARCHIVES"]
    assert "ada (no account)" in lines[1] and "on disk" in lines[1]

    archived = cli(site, "archive", "ada")
    assert archived.returncode == 0, archived.stderr
    assert "archived ada's disk" in archived.stdout and "restored at their next start" in (
        archived.stdout
    )
    assert os.listdir(disk) == []
    listed = cli(site, "list").stdout
    assert "archived 20" in listed.splitlines()[1], listed
    one_line_refusal(site, ("archive", "ada"), "archived already")

    restored = cli(site, "restore", "ada")
    assert restored.returncode == 0, restored.stderr
    assert (disk / "notes" / "a.txt").read_text() == "alpha"
    one_line_refusal(site, ("restore", "ada"), "not archived")

    # without --yes: says what it would delete, deletes nothing
    before = snapshot(disk)
    refused = one_line_refusal(site, ("delete", "ada"), f"would delete {disk}")
    assert "add --yes" in refused.stderr and snapshot(disk) == before
    disk_archive.archive_idle(str(disk), str(data / "archives" / "ada"), NOW)  # named apart
    marker = data / "archives" / "ada" / "archived.json"
    assert marker.exists()
    deleted = cli(site, "delete", "ada", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert not disk.exists()
    assert not marker.exists(), "the next start begins on a new disk, restoring nothing"
    assert "the mark that restored the archive at the next start" in deleted.stdout
    assert "kept 1 archive(s)" in deleted.stdout, deleted.stdout
    assert disk_archive.archives(str(data / "archives" / "ada"))
    one_line_refusal(site, ("delete", "ada", "--yes"), "ada has no disk (see --archives)")
    gone = cli(site, "delete", "ada", "--yes", "--archives")
    assert gone.returncode == 0 and "1 archive(s)" in gone.stdout, gone
    assert not (data / "archives" / "ada").exists()


def test_the_cli_refuses_a_running_server_a_missing_disk_and_bad_input(site, tmp_path):
    data = tmp_path / "data"
    disk = data / "disks" / "ada"
    make_disk(disk)
    before = snapshot(disk)
    write_record(str(data), ServerRecord(owner="7/", marker=str(disk), started_at=0))
    one_line_refusal(site, ("archive", "ada"), "ada's server is running or starting")
    one_line_refusal(site, ("delete", "ada", "--yes"), "ada's server is running or starting")
    assert snapshot(disk) == before and not (data / "archives").exists()
    one_line_refusal(site, ("archive", "cyd"), "cyd has no disk")
    make_disk(data / "disks" / "bob")
    disk_archive.archive_idle(str(data / "disks" / "bob"), str(data / "archives" / "bob"), NOW)
    # refused before the disk's lock is taken: not even a lock file is written
    one_line_refusal(site, ("archive", "bob"), "archived already")
    one_line_refusal(site, ("restore", "cyd"), "cyd's disk is not archived")
    one_line_refusal(site, ("archive", ""), "USER: a user name")
    kube = tmp_path / "kube.yaml"
    kube.write_text(yaml.safe_dump({"data_dir": str(data), "backend": "kubernetes"}))
    one_line_refusal(kube, ("list",), "PersistentVolumeClaims")


# ---------------------------------------------------------------------- a real hub

# The hub's idle clock runs 40 days ahead (a jupyterhub_config.d file moves
# disk_archive.utcnow, as tests move every clock here), so a disk idle for "a day" is
# one whose server stopped a moment ago; the hub looks every second.
TIME_TRAVEL = """
import datetime
from meterhub.spawner import disk_archive

_real_utcnow = disk_archive.utcnow
disk_archive.utcnow = lambda: _real_utcnow() + datetime.timedelta(days=40)
c.MeterHub.disk_archive_interval_seconds = 1
"""


def progress_of_a_spawn(hub: HubProcess, user: str, options: dict) -> str:
    post = threading.Thread(
        target=hub.api, args=("POST", f"/users/{user}/server"), kwargs={"json": options}
    )
    post.start()
    until(lambda: hub.server(user), f"{user}'s spawn to be pending", interval=0.02)
    with hub.api("GET", f"/users/{user}/server/progress", stream=True) as events:
        messages = [
            json.loads(line[len(b"data: ") :]).get("message", "")
            for line in events.iter_lines()
            if line.startswith(b"data: ")
        ]
    post.join()
    return "\n".join(messages)


def wallet_of_admin(hub: HubProcess) -> str:
    password = (Path(hub.data_dir) / "admin-password").read_text().strip()
    r = hub.sign_in("admin", password).get(f"{hub.url}/hub/wallet")
    assert r.status_code == 200, r.status_code
    return r.text


async def test_a_real_hub_archives_a_stopped_disk_and_restores_it_at_the_next_start(tmp_path):
    hub = HubProcess(tmp_path / "hub", {"disks": {"archive_after_days": 1, "quota_gib": 0.001}})
    (hub.workdir / "jupyterhub_config.d").mkdir()
    (hub.workdir / "jupyterhub_config.d" / "time.py").write_text(TIME_TRAVEL)
    folder = Path(hub.data_dir) / "archives" / "admin"
    disk = Path(hub.data_dir) / "disks" / "admin"
    try:
        hub.start()
        text = progress_of_a_spawn(hub, "admin", {"profile": "debug"})
        until(lambda: (s := hub.server("admin")) and s["ready"], "admin's server")
        assert "Restoring" not in text and "quota" not in text, text  # a new, small disk
        code = "open('notes.txt', 'w').write('kept'); open('big.bin', 'wb').write(bytes(2 << 20))"
        await execute(hub.url, "admin", ADMIN_TOKEN, code)
        assert not (folder / "archived.json").exists(), "a running server's disk stays"
        hub.stop_server("admin")

        # the marker is written first and the disk emptied after it: wait for both
        until(
            lambda: (folder / "archived.json").exists() and not os.listdir(disk),
            "the hub to archive and empty the disk",
            60,
        )
        marker = disk_archive.archived(str(folder))
        archive = folder / marker.archive
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == marker.sha256
        assert (folder / (marker.archive + ".sha256")).exists()
        assert f"archived on {marker.day}; restored at your next start" in wallet_of_admin(hub)
        listed = run_cli(["disk", "list", "--config", str(hub.config_path)])
        assert "admin" in listed.stdout and f"archived {marker.day}" in listed.stdout, listed

        # a damaged archive: the spawn is refused, nothing starts, nothing is lost
        whole = archive.read_bytes()
        damaged = bytearray(whole)
        damaged[len(damaged) // 2] ^= 0xFF
        archive.write_bytes(bytes(damaged))
        refused = hub.api("POST", "/users/admin/server", json={"profile": "debug"})
        assert refused.status_code == 500, (refused.status_code, refused.text)
        assert "could not be restored" in refused.text, refused.text
        assert "does not match its checksum" in refused.text, refused.text
        until(lambda: hub.server("admin") is None, "the refused spawn to be cleared")
        assert os.listdir(disk) == [] and disk_archive.archived(str(folder)) == marker
        assert archive.read_bytes() == bytes(damaged), "kept as it is, for the operator"
        archive.write_bytes(whole)  # the operator puts the good copy back

        text = progress_of_a_spawn(hub, "admin", {"profile": "debug"})
        until(lambda: (s := hub.server("admin")) and s["ready"], "admin's server, again")
        size = disk_archive.gib(marker.disk_bytes)
        assert f"Restoring your disk ({size} archived on {marker.day})" in text, text
        assert "over the site's 0.001 GiB quota" in text, text
        out = await execute(hub.url, "admin", ADMIN_TOKEN, "print(open('notes.txt').read())")
        assert out == "kept\n"
        assert disk_archive.archived(str(folder)) is None
        page = wallet_of_admin(hub)
        assert re.search(r"Disk: 2\.\d MiB, over the 0\.001 GiB quota", page), page
        hub.stop_server("admin")
    finally:
        hub.teardown()
