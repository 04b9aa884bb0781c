"""The instructor console's reset refusals, made in a worker thread as the console makes them
(`asyncio.to_thread` runs in a copy of the request's context), read in the request's language:
a busy disk and a failed archive, from spawner/disk_archive.py, inside the console's sentence.
"""

from __future__ import annotations

import asyncio
import datetime

import pytest

from meterhub import i18n
from meterhub.hub.course_pages import _busy
from meterhub.spawner import disk_archive


def refusal_from_a_thread(work):
    async def console():
        try:
            await asyncio.to_thread(work)
        except disk_archive.ArchiveBusy as e:
            return _busy("amy", e)
        except disk_archive.ArchiveError as e:
            return i18n._("The reset failed: %(error)s", error=e)
        raise AssertionError("no refusal")

    return asyncio.run(console())


def test_a_busy_disk_is_refused_in_the_readers_language(tmp_path):
    held = disk_archive.DiskLock(str(tmp_path), "amy")
    assert held.acquire()

    def reset():
        with disk_archive.DiskLock(str(tmp_path), "amy"):
            pass

    try:
        with i18n.using("zh_CN"):
            said = refusal_from_a_thread(reset)
        assert said == "amy 的数据盘正忙：数据盘正在归档、恢复或启动中。未做任何更改，请稍后再试。"
        english = refusal_from_a_thread(reset)
        assert english == (
            "amy's disk is busy: the disk is being archived, restored or started right now."
            " Nothing was changed; try again in a moment."
        )
    finally:
        held.release()


def test_an_archive_that_cannot_be_made_is_told_in_chinese(tmp_path):
    disk, folder = tmp_path / "amy", tmp_path / "archives"
    disk.mkdir()
    (disk / "notes.txt").write_text("x")
    stamp = datetime.datetime(2027, 2, 2, 5, tzinfo=datetime.UTC)
    first = disk_archive.archive_disk(str(disk), str(folder), "reset-ml101", stamp)
    assert first

    def again():  # the same name in the same second
        disk_archive.archive_disk(str(disk), str(folder), "reset-ml101", stamp)

    with i18n.using("zh_CN"):
        said = refusal_from_a_thread(again)
    assert said == "重置失败：名为 20270202T050000Z-reset-ml101.tar.gz 的归档已存在；请一秒后重试"
    with pytest.raises(disk_archive.ArchiveError, match="exists already"):
        again()
