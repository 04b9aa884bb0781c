"""Copy the ledger to another database, exactly: every table, ids kept, then checked.

`meterhub billing migrate --to URL` runs it with the hub stopped (e.g. SQLite to PostgreSQL);
the operator then points `billing.db_url` at the target. The source is never written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import Table, func, inspect, select, text
from sqlalchemy.engine import Connection, Engine

from .db import SchemaMismatch, current_revision, head_revision, make_engine, upgrade
from .ledger import Ledger
from .orm import Base, Wallet

#: rows read and written at a time
BATCH = 5000
#: parents before children (wallets, passes, sessions, entries, ...)
TABLES: list[Table] = list(Base.metadata.sorted_tables)


class MigrationError(RuntimeError):
    """A migration refused before anything was written, or a copy that does not match."""


@dataclass
class Migrated:
    rows: dict[str, int] = field(default_factory=dict)
    #: the audit's violations, the same on both sides ([] for a sound ledger)
    audit: list[str] = field(default_factory=list)
    wallets: int = 0


def _rows(conn: Connection, table: Table) -> Iterator[list[dict]]:
    """The table's rows in primary-key order, BATCH at a time (keyset pagination)."""
    key = list(table.primary_key.columns)[0]
    last = None
    while True:
        query = select(table).order_by(key).limit(BATCH)
        if last is not None:
            query = query.where(key > last)
        batch = [dict(row._mapping) for row in conn.execute(query)]
        if not batch:
            return
        yield batch
        last = batch[-1][key.name]


def table_digest(conn: Connection, table: Table) -> tuple[int, str]:
    """(row count, sha256 of every row in key order): equal digests, equal tables."""
    digest = hashlib.sha256()
    count = 0
    for batch in _rows(conn, table):
        for row in batch:
            digest.update(repr([row[c.name] for c in table.columns]).encode())
        count += len(batch)
    return count, digest.hexdigest()


def _balances(ledger: Ledger) -> dict[tuple[str, str], int]:
    with ledger.begin() as db:
        return {(w.owner_kind, w.owner_name): w.balance_micros for w in db.scalars(select(Wallet))}


def _check_target(target: Engine) -> bool:
    """True when the target needs its schema made; refuses one that holds anything."""
    names = set(inspect(target).get_table_names())
    if not names:
        return True
    ledger_tables = [t for t in TABLES if t.name in names]
    with target.connect() as conn:
        for table in ledger_tables:
            if conn.execute(select(func.count()).select_from(table)).scalar_one():
                raise MigrationError(
                    f"the target already holds a ledger ({table.name} is not empty):"
                    " migrate only into an empty database"
                )
    if names - {"alembic_version"} and current_revision(target) != head_revision():
        raise MigrationError(
            f"the target has tables ({', '.join(sorted(names))}) but not the ledger schema"
            f" {head_revision()}: migrate only into an empty database"
        )
    return current_revision(target) != head_revision()


def _advance_sequences(conn: Connection) -> None:
    """PostgreSQL: the next id of each table after the copied ones (rows were inserted with
    their ids, which leaves the serial sequences at 1)."""
    for table in TABLES:
        key = list(table.primary_key.columns)[0]
        if key.type.python_type is not int:
            continue
        conn.execute(
            text(
                f"SELECT setval(pg_get_serial_sequence('{table.name}', '{key.name}'),"
                f" COALESCE(MAX({key.name}), 1), MAX({key.name}) IS NOT NULL) FROM {table.name}"
            )
        )


def migrate(source: Engine, target_url: str, now: int) -> Migrated:
    """Copy the ledger at `source` (at the current schema) into the empty `target_url`.

    Refuses (MigrationError, nothing written) a target that holds a ledger or other tables.
    The copy is one transaction on the target, checked row by row before it commits; then
    the audit (at `now`) and every balance are compared through the ledger on both sides.
    """
    if current_revision(source) != head_revision():
        raise SchemaMismatch(
            f"the billing database is at schema revision {current_revision(source) or 'none'},"
            f" not {head_revision()}: run `meterhub billing upgrade-db` first"
        )
    target = make_engine(target_url)
    try:
        if _check_target(target):
            upgrade(target_url)
        before = Ledger(source)
        audit_before, balances_before = before.audit(now), _balances(before)
        result = Migrated(audit=audit_before, wallets=len(balances_before))
        # SQLite's BEGIN IMMEDIATE (db.make_engine) holds writers off while we read
        with source.begin() as src, target.begin() as dst:
            for table in TABLES:
                for batch in _rows(src, table):
                    dst.execute(table.insert(), batch)
            for table in TABLES:
                copied, expected = table_digest(dst, table), table_digest(src, table)
                if copied != expected:
                    raise MigrationError(
                        f"{table.name}: the copy does not match ({copied[0]} rows,"
                        f" {expected[0]} expected); the target was rolled back"
                    )
                result.rows[table.name] = copied[0]
            if target.dialect.name == "postgresql":
                _advance_sequences(dst)
        after = Ledger(target)
        if after.audit(now) != audit_before or _balances(after) != balances_before:
            raise MigrationError(
                "the copied ledger's audit or balances differ from the original's: keep"
                " billing.db_url on the original and report this"
            )
        return result
    finally:
        target.dispose()
