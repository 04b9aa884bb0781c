"""Ledger database connections: SQLite (WAL) by default, PostgreSQL through psycopg 3.

The schema is owned by alembic. `connect()` refuses a database whose schema is not at the
current revision and says the exact command that upgrades it.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

MIGRATIONS = str(Path(__file__).parent / "migrations")


class SchemaMismatch(RuntimeError):
    """The ledger database is not at the schema this code needs."""


def make_engine(db_url: str) -> Engine:
    if db_url.startswith("sqlite"):
        engine = create_engine(db_url, connect_args={"timeout": 30, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin_immediate(conn):
            # take the write lock at BEGIN: a read-then-write transaction never deadlocks
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if db_url.startswith("postgresql://"):
        db_url = "postgresql+psycopg://" + db_url[len("postgresql://") :]
    return create_engine(db_url, pool_pre_ping=True, isolation_level="READ COMMITTED")


def alembic_config(db_url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", MIGRATIONS)
    cfg.set_main_option("sqlalchemy.url", db_url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(db_url: str) -> None:
    if db_url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(db_url[len("sqlite:///") :])), exist_ok=True)
    command.upgrade(alembic_config(db_url), "head")


def connect(db_url: str, create: bool = True, config_hint: str = "") -> Engine:
    """An engine for an up-to-date ledger; a new empty database is created at head."""
    if db_url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(db_url[len("sqlite:///") :])), exist_ok=True)
    engine = make_engine(db_url)
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return engine
    if current is None and create and _is_empty(engine):
        upgrade(db_url)
        return engine
    raise SchemaMismatch(
        f"The billing database is at schema revision {current or 'none'}, this meterhub needs"
        f" {head}. Back it up, then run: meterhub billing upgrade-db{config_hint}"
    )


def _is_empty(engine: Engine) -> bool:
    from sqlalchemy import inspect

    return not inspect(engine).get_table_names()
