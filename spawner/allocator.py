"""Exclusive, persistent GPU allocation for the local backend.

Allocations live in a small SQLite file so a hub restart (which keeps servers running)
never hands a GPU out twice. The GPU index is the primary key: two owners can never hold
the same GPU, whatever the callers do. All methods are blocking; call them off the hub's
event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime

from meterhub.i18n import _

from .catalog import GPU_COUNTS, GPU_TYPES, GpuType
from .inventory import Gpu

SCHEMA = """
CREATE TABLE IF NOT EXISTS gpu_allocation (
    gpu_index INTEGER PRIMARY KEY,
    gpu_type TEXT NOT NULL,
    owner TEXT NOT NULL,
    allocated_at TEXT NOT NULL,
    holder TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS gpu_allocation_owner ON gpu_allocation (owner);
"""


#: a reservation: a user's count, or a pool's (count, its members)
Reserved = int | tuple[int, Sequence[str]]


class NotEnoughGpus(RuntimeError):
    """A request the free GPUs cannot meet; the message says what is free."""


class GpuAllocator:
    def __init__(
        self,
        db_path: str,
        inventory: list[Gpu],
        gpu_types: Mapping[str, GpuType] | None = None,
    ):
        """`gpu_types`: the configured catalog's (`Catalog.types()`); default the built-in ones."""
        self.db_path = db_path
        self.inventory = list(inventory)
        self.gpu_types = dict(GPU_TYPES if gpu_types is None else gpu_types)
        self.by_index = {gpu.index: gpu for gpu in self.inventory}
        with closing(sqlite3.connect(self.db_path, timeout=30)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(gpu_allocation)")}
            if "holder" not in columns:  # a table from before reservations
                db.execute("ALTER TABLE gpu_allocation ADD COLUMN holder TEXT NOT NULL DEFAULT ''")

    @contextmanager
    def _transaction(self):
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the read of what is
        # free and the insert that takes it hold one write lock across processes.
        with closing(sqlite3.connect(self.db_path, timeout=30, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _held(self, db, owner: str) -> list[Gpu]:
        rows = db.execute(
            "SELECT gpu_index FROM gpu_allocation WHERE owner = ? ORDER BY gpu_index", (owner,)
        )
        return [self.by_index[i] for (i,) in rows if i in self.by_index]

    def _taken(self, db) -> set[int]:
        return {i for (i,) in db.execute("SELECT gpu_index FROM gpu_allocation")}

    def allocate(
        self,
        owner: str,
        gpu_type: str,
        count: int,
        holder: str = "",
        reserved: Mapping[str, Reserved] | None = None,
    ) -> list[Gpu]:
        """Give `owner` (a server of user `holder`) `count` GPUs of `gpu_type`, exclusively.

        `reserved` maps users to how many GPUs of this type are reserved for them (pass
        holders), or a pool's name to (count, its members) (a course's class during its lab
        window): what they reserved and do not use is not free for anyone else.
        Idempotent: an owner that already holds exactly such an allocation gets it back;
        an owner holding something else (a stale allocation) has it replaced.
        """
        with self._transaction() as db:
            held = self._held(db, owner)
            if len(held) == count and all(gpu.type == gpu_type for gpu in held):
                return held
            db.execute("DELETE FROM gpu_allocation WHERE owner = ?", (owner,))
            taken = self._taken(db)
            of_type = [gpu for gpu in self.inventory if gpu.type == gpu_type]
            free = [gpu for gpu in of_type if gpu.index not in taken]
            held_back = self._held_back(db, gpu_type, holder, reserved or {})
            if len(free) - held_back < count:
                known = self.gpu_types.get(gpu_type)
                name = known.display_name if known else gpu_type
                raise NotEnoughGpus(
                    _shortage_message(
                        name, count, max(0, len(free) - held_back), len(of_type), held_back
                    )
                )
            chosen = free[:count]
            now = datetime.now(UTC).isoformat()
            db.executemany(
                "INSERT INTO gpu_allocation (gpu_index, gpu_type, owner, allocated_at, holder)"
                " VALUES (?, ?, ?, ?, ?)",
                [(gpu.index, gpu.type, owner, now, holder) for gpu in chosen],
            )
            return chosen

    def _held_back(self, db, gpu_type: str, holder: str, reserved: Mapping[str, Reserved]) -> int:
        """GPUs of a type reserved for other users (or pools `holder` is not in) and not in
        use by them."""
        in_use: dict[str, int] = {}
        for (user,) in db.execute(
            "SELECT holder FROM gpu_allocation WHERE gpu_type = ?", (gpu_type,)
        ):
            in_use[user] = in_use.get(user, 0) + 1
        held = 0
        for key, value in reserved.items():
            count, members = (value, (key,)) if isinstance(value, int) else value
            if holder in members:
                continue
            held += max(0, count - sum(in_use.get(user, 0) for user in set(members)))
        return held

    def release(self, owner: str) -> list[int]:
        with self._transaction() as db:
            released = [gpu.index for gpu in self._held(db, owner)]
            db.execute("DELETE FROM gpu_allocation WHERE owner = ?", (owner,))
            return released

    def held(self, owner: str) -> list[Gpu]:
        with self._transaction() as db:
            return self._held(db, owner)

    def owners(self) -> dict[int, str]:
        with self._transaction() as db:
            return dict(db.execute("SELECT gpu_index, owner FROM gpu_allocation"))

    def availability(
        self, holder: str = "", reserved: Mapping[str, Mapping[str, Reserved]] | None = None
    ) -> dict[str, tuple[int, int]]:
        """(total, free for `holder`) by GPU type, for every type in the catalog."""
        with self._transaction() as db:
            taken = self._taken(db)
            held_back = {
                gpu_type: self._held_back(db, gpu_type, holder, users)
                for gpu_type, users in (reserved or {}).items()
            }
        result = {slug: (0, 0) for slug in self.gpu_types}
        for gpu in self.inventory:
            total, free = result.get(gpu.type, (0, 0))
            result[gpu.type] = (total + 1, free + (gpu.index not in taken))
        return {
            slug: (total, max(0, free - held_back.get(slug, 0)))
            for slug, (total, free) in result.items()
        }

    def reconcile(self, active_owners: Iterable[str]) -> dict[str, list[int]]:
        """Release allocations of owners that no longer run; return what was released."""
        active = set(active_owners)
        released: dict[str, list[int]] = {}
        with self._transaction() as db:
            for index, owner in db.execute("SELECT gpu_index, owner FROM gpu_allocation"):
                if owner not in active:
                    released.setdefault(owner, []).append(index)
            for owner in released:
                db.execute("DELETE FROM gpu_allocation WHERE owner = ?", (owner,))
        return released


def _shortage_message(name: str, wanted: int, free: int, total: int, held_back: int = 0) -> str:
    """Why `wanted` GPUs of `name` cannot be had, one whole sentence per case; `held_back`:
    how many of the free ones are reserved for others."""
    values = {"gpu": name, "wanted": wanted, "free": free, "total": total, "held": held_back}
    if total == 0:
        if held_back:
            return _(
                "This machine has no %(gpu)s GPUs. Choose another profile or debug mode."
                " (%(held)s reserved for pass holders or a lab class)",
                **values,
            )
        return _(
            "This machine has no %(gpu)s GPUs. Choose another profile or debug mode.", **values
        )
    if free == 0:
        if held_back:
            return _(
                "All %(total)s %(gpu)s GPUs are in use; %(wanted)s requested. Try again later or"
                " choose debug mode. (%(held)s reserved for pass holders or a lab class)",
                **values,
            )
        return _(
            "All %(total)s %(gpu)s GPUs are in use; %(wanted)s requested. Try again later or"
            " choose debug mode.",
            **values,
        )
    values["fits"] = max(count for count in GPU_COUNTS if count <= free)
    if held_back:
        return _(
            "Only %(free)s of %(total)s %(gpu)s GPUs are free now; %(wanted)s requested. Ask for"
            " %(fits)s or fewer, or try again later. (%(held)s reserved for pass holders or a lab"
            " class)",
            **values,
        )
    return _(
        "Only %(free)s of %(total)s %(gpu)s GPUs are free now; %(wanted)s requested. Ask for"
        " %(fits)s or fewer, or try again later.",
        **values,
    )
