"""Disk archives (spawner/disk_archive.py) on their own: what a restore refuses to write
outside the disk, and what the materials copy refuses to follow."""

from __future__ import annotations

import datetime
import io
import os
import tarfile

import pytest

from meterhub.spawner import disk_archive

NOW = datetime.datetime(2027, 2, 2, 14, 0, tzinfo=datetime.UTC)


def test_an_archive_round_trips_and_keeps_links_as_links(tmp_path):
    disk = tmp_path / "disk"
    (disk / "notes").mkdir(parents=True)
    (disk / "notes" / "a.txt").write_text("a")
    os.symlink("/public", disk / "public")  # the pool link: absolute, skipped on restore
    os.symlink("notes/a.txt", disk / "link")  # inside the disk: kept
    name = disk_archive.archive_disk(str(disk), str(tmp_path / "arch"), "Reset ML101!", NOW)
    assert name == "20270202T140000Z-reset-ml101.tar.gz"
    assert disk_archive.archives(str(tmp_path / "arch")) == [name]
    with pytest.raises(disk_archive.ArchiveError, match="exists already"):
        disk_archive.archive_disk(str(disk), str(tmp_path / "arch"), "reset-ml101", NOW)
    disk_archive.empty_disk(str(disk))
    assert os.listdir(disk) == []
    disk_archive.restore_disk(str(disk), str(tmp_path / "arch" / name), None)
    assert (disk / "notes" / "a.txt").read_text() == "a"
    assert os.readlink(disk / "link") == "notes/a.txt"
    assert not os.path.lexists(disk / "public")


def test_a_restore_writes_nothing_outside_the_disk(tmp_path):
    hostile = tmp_path / "hostile.tar.gz"
    with tarfile.open(hostile, "w:gz") as tar:
        for name in ("../escaped.txt", "/tmp/absolute-escape.txt", "ok.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc"
        tar.addfile(link)
    disk = tmp_path / "disk"
    disk.mkdir()
    disk_archive.restore_disk(str(disk), str(hostile), None)
    # `..` and the link out are skipped; an absolute name lands inside the disk
    assert sorted(os.listdir(disk)) == ["ok.txt", "tmp"]
    assert (disk / "tmp" / "absolute-escape.txt").read_bytes() == b"hi"
    assert not (tmp_path / "escaped.txt").exists()
    assert not os.path.exists("/tmp/absolute-escape.txt")


def test_materials_are_copied_without_following_links(tmp_path):
    source = tmp_path / "materials"
    (source / "week1").mkdir(parents=True)
    (source / "week1" / "lab.ipynb").write_text("{}")
    os.symlink("/etc/passwd", source / "passwd")
    os.symlink("/etc", source / "etc")
    target = tmp_path / "disk" / "ml101"
    assert disk_archive.copy_materials(str(source), str(target), None) == 1
    assert sorted(os.listdir(target)) == ["week1"]
