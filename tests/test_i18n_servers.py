"""Servers, the spawn form and disks in Simplified Chinese: what the spawn page, a refused
spawn and the disk and stop commands say to a zh-CN reader."""

from __future__ import annotations

import html
import re

import pytest

from meterhub import i18n
from meterhub.hub.spawn_form import credit_annotation
from meterhub.hub.stop_cli import find_hub
from meterhub.spawner import disk_archive
from meterhub.spawner.allocator import GpuAllocator, NotEnoughGpus
from meterhub.spawner.catalog import Catalog, InvalidChoice
from meterhub.spawner.form import PayerOption, render_options_form
from meterhub.spawner.inventory import declared_inventory

AVAILABLE = {"rtx4090": (4, 3), "a800": (2, 0), "h800": (0, 0)}
#: three English words in a row: a sentence left untranslated (names such as "RTX 4090",
#: "GPU" or "JupyterLab" are one or two)
ENGLISH_RUN = re.compile(r"\b[A-Za-z]{2,}(?:[ ,;:]+[A-Za-z]{2,}){2,}\b")


def text_of(page: str) -> str:
    """What a person reads of `page`: its text, without tags or attribute values."""
    return html.unescape(re.sub(r"<[^>]*>", " ", page))


def test_the_spawn_form_reads_in_chinese_with_its_fields_inside_the_sentences():
    payers = [
        PayerOption("user:ann", "我的钱包", "¥1.00"),
        PayerOption("group:lab-a", "课题组 lab-a", "", ""),
    ]
    with i18n.using("zh_CN"):
        page = render_options_form(
            Catalog(),
            AVAILABLE,
            annotate=credit_annotation(available_micros=1_000_000, min_seconds=600),
            summary="余额",
            payers=payers,
            payer_checked="user:ann",
        )
    text = text_of(page)
    for chinese in (
        "付款方式",
        "调试模式",
        "无 GPU —— 在同一块数据盘上编写和调试代码，只需",
        "每块 GPU 24 GB 显存",
        "¥1.25/GPU·小时",
        "¥0.10/小时",
        "当前 4 块中 3 块空闲",
        "仅剩 3 块空闲",
        "全部 2 块 A800 GPU 都在使用中",
        "本机没有 H800",
        "按此配置约可用 10 小时",
        "自动停止此服务器（可选）",
        "文件会保留",
    ):
        assert chinese in text, chinese
    assert not ENGLISH_RUN.findall(text), ENGLISH_RUN.findall(text)
    # the spend and time caps stay fields inside their sentences, not escaped text
    assert re.search(r'花费 ¥<input type="text"[^>]* name="max_cost"[^>]*> 后', page)
    assert re.search(r'或运行 <input type="number" name="max_hours"[^>]*> 小时后', page)
    with i18n.using("en"):
        english = render_options_form(Catalog(), AVAILABLE)
    assert "after ¥<input" in english and "> spent</label>" in english


def test_a_refused_choice_says_why_in_chinese():
    catalog = Catalog(allowed_groups={"h800": ["lab-a"]})
    with i18n.using("zh_CN"):
        with pytest.raises(InvalidChoice, match="未知配置 'a100'；请从以下选择：debug"):
            catalog.parse({"profile": "a100"})
        with pytest.raises(InvalidChoice, match="'gpus' 必须是 1, 2, 4, 8 之一，实际为 '3'"):
            catalog.parse({"profile": "a800", "gpus": "3"})
        with pytest.raises(InvalidChoice, match="max_cost：必须大于零"):
            catalog.parse({"profile": "debug", "max_cost": "0"})
        refusal = catalog.refusal(catalog.choice("h800", 1), frozenset())
        assert catalog.choice("debug").label == "调试模式（无 GPU）"
    assert refusal == "H800 仅限课题组 lab-a 使用，而您不属于其中任何一个"
    assert catalog.choice("debug").label == "debug mode (no GPU)"


def test_a_gpu_shortage_and_a_damaged_archive_are_told_in_chinese(tmp_path):
    inventory = declared_inventory([{"type": "a800", "count": 4}])
    allocator = GpuAllocator(str(tmp_path / "gpus.sqlite"), inventory)
    allocator.allocate("1/", "a800", 3)
    with i18n.using("zh_CN"):
        with pytest.raises(NotEnoughGpus) as shortage:
            allocator.allocate("2/", "a800", 2)
        folder = tmp_path / "archives"
        folder.mkdir()
        (folder / disk_archive.MARKER).write_text("{")
        with pytest.raises(disk_archive.ArchiveError) as damaged:
            disk_archive.archived(str(folder))
    assert str(shortage.value) == (
        "4 块 A800 GPU 中目前只有 1 块空闲；您申请了 2 块。请申请 1 块或更少，或稍后重试。"
    )
    assert "已损坏" in str(damaged.value) and "docs/idle.md" in str(damaged.value)


def test_meterhub_stop_says_nothing_runs_in_chinese(tmp_path):
    with i18n.using("zh_CN"):
        hub, why = find_hub(str(tmp_path))
    assert hub is None
    assert why.startswith(f"{tmp_path} 没有正在运行的 meterhub serve（没有 ")
