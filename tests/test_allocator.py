"""Exclusive, persistent GPU allocation."""

import threading

import pytest

from meterhub.spawner.allocator import GpuAllocator, NotEnoughGpus
from meterhub.spawner.inventory import declared_inventory

INVENTORY = declared_inventory([{"type": "a800", "count": 4}, {"type": "rtx4090", "count": 1}])


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "alloc.sqlite")


def test_allocate_release_and_availability(db):
    alloc = GpuAllocator(db, INVENTORY)
    assert [g.index for g in alloc.allocate("1/", "a800", 2)] == [0, 1]
    assert [g.index for g in alloc.allocate("2/", "a800", 1)] == [2]
    assert alloc.availability() == {"rtx4090": (1, 1), "a800": (4, 1), "h800": (0, 0)}
    with pytest.raises(NotEnoughGpus, match="Only 1 of 4 A800 GPUs are free now; 2 requested"):
        alloc.allocate("3/", "a800", 2)
    assert alloc.held("3/") == []
    assert alloc.release("1/") == [0, 1]
    assert [g.index for g in alloc.allocate("3/", "a800", 2)] == [0, 1]


def test_messages_for_missing_and_exhausted_types(db):
    alloc = GpuAllocator(db, INVENTORY)
    with pytest.raises(NotEnoughGpus, match="no H800 GPUs"):
        alloc.allocate("1/", "h800", 1)
    alloc.allocate("1/", "rtx4090", 1)
    with pytest.raises(NotEnoughGpus, match="All 1 RTX 4090 GPUs are in use"):
        alloc.allocate("2/", "rtx4090", 1)


def test_allocation_is_idempotent_per_owner_and_replaces_stale(db):
    alloc = GpuAllocator(db, INVENTORY)
    first = alloc.allocate("1/", "a800", 2)
    assert alloc.allocate("1/", "a800", 2) == first
    assert [g.type for g in alloc.allocate("1/", "rtx4090", 1)] == ["rtx4090"]
    assert alloc.availability()["a800"] == (4, 4)


def test_allocations_survive_a_new_allocator(db):
    GpuAllocator(db, INVENTORY).allocate("1/", "a800", 4)
    again = GpuAllocator(db, INVENTORY)
    assert [g.index for g in again.held("1/")] == [0, 1, 2, 3]
    with pytest.raises(NotEnoughGpus):
        again.allocate("2/", "a800", 1)


def test_reconcile_releases_owners_not_running(db):
    alloc = GpuAllocator(db, INVENTORY)
    alloc.allocate("1/", "a800", 1)
    alloc.allocate("2/", "a800", 2)
    assert alloc.reconcile({"2/"}) == {"1/": [0]}
    assert alloc.owners() == {1: "2/", 2: "2/"}


def test_concurrent_allocations_never_share_a_gpu(db):
    allocators = [GpuAllocator(db, INVENTORY) for _ in range(8)]
    results: dict[str, list[int]] = {}
    errors = []

    def take(i):
        try:
            results[f"{i}/"] = [g.index for g in allocators[i].allocate(f"{i}/", "a800", 1)]
        except NotEnoughGpus as e:
            errors.append(e)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = [i for indices in results.values() for i in indices]
    assert sorted(taken) == [0, 1, 2, 3] and len(errors) == 4


def test_reserved_gpus_are_kept_for_their_holder(db):
    alloc = GpuAllocator(db, INVENTORY)  # 4 × A800
    reserved = {"holder": 2}
    with pytest.raises(NotEnoughGpus, match=r"2 reserved for pass holders"):
        alloc.allocate("1/", "a800", 4, holder="other", reserved=reserved)
    assert len(alloc.allocate("1/", "a800", 2, holder="other", reserved=reserved)) == 2
    with pytest.raises(NotEnoughGpus, match="All 4 A800 GPUs are in use"):
        alloc.allocate("2/", "a800", 1, holder="third", reserved=reserved)
    assert alloc.availability("holder", {"a800": reserved})["a800"] == (4, 2)
    assert alloc.availability("third", {"a800": reserved})["a800"] == (4, 0)
    # the holder takes what was kept; once in use, nothing more is held back
    assert len(alloc.allocate("3/", "a800", 2, holder="holder", reserved=reserved)) == 2
    alloc.release("1/")
    assert alloc.availability("third", {"a800": reserved})["a800"] == (4, 2)


def test_a_pool_reservation_is_kept_for_any_of_its_members(db):
    alloc = GpuAllocator(db, INVENTORY)  # 4 × A800
    reserved = {"course:ml101": (2, ("amy", "bob")), "pia": 1}
    # a stranger finds 1 free: 2 kept for the class, 1 for pia's pass
    assert alloc.availability("eve", {"a800": reserved})["a800"] == (4, 1)
    with pytest.raises(NotEnoughGpus, match=r"3 reserved for pass holders or a lab class"):
        alloc.allocate("eve/", "a800", 2, holder="eve", reserved=reserved)
    # a student of the class finds the class's 2 and what is free for all
    assert alloc.availability("amy", {"a800": reserved})["a800"] == (4, 3)
    assert len(alloc.allocate("amy/", "a800", 1, holder="amy", reserved=reserved)) == 1
    # one of the class's two is in use by amy: one is still kept for bob
    assert alloc.availability("eve", {"a800": reserved})["a800"] == (4, 1)
    assert len(alloc.allocate("bob/", "a800", 1, holder="bob", reserved=reserved)) == 1
    assert alloc.availability("eve", {"a800": reserved})["a800"] == (4, 1)  # pia's is kept
    assert len(alloc.allocate("eve/", "a800", 1, holder="eve", reserved=reserved)) == 1
    with pytest.raises(NotEnoughGpus):
        alloc.allocate("cy/", "a800", 1, holder="cy", reserved=reserved)
