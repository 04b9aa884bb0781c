"""Ledger database connections: SQLite (WAL) by default, PostgreSQL through psycopg 3.

The schema is owned by alembic. `connect()` refuses a database whose schema is not at the
current revision and says the exact command that upgrades it. `python -m
meterhub.billing_hooks.db` waits for that revision instead (the billing pod's init container
on Kubernetes, while the Helm chart's upgrade Job runs the migration).
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

MIGRATIONS = str(Path(__file__).parent / "migrations")


class Direct:
    """A Core statement run straight on the DBAPI cursor of a SQLAlchemy connection (in its
    transaction), compiled once for each database.

    SQLAlchemy's work around each execution (its execution context, result and events) cost
    a spawn's short statements about six times what the database did (bench/ledger_spawn.py,
    bench/spawn_burst.py): the statements of a spawn's path run this way. Only for
    statements whose parameters and columns need no conversion (integers, strings, NULL),
    with no expanding IN, and whose insert names every column it sets: others are refused
    when first compiled. A select's rows are named tuples of its columns' keys. `returning`:
    the column an insert's `inserted` returns (RETURNING where the database has it, else the
    cursor's last row id).
    """

    def __init__(self, statement, returning=None) -> None:
        self.statement = statement
        self.returning = returning
        names = [column.key for column in getattr(statement, "selected_columns", ())]
        self.row: Any = namedtuple("Row", names) if names else None
        #: {dialect: (SQL, the parameters' names in their order or None (by name), the
        #: values of the statement's own literals, whether it returns the insert's id)}
        self._compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _sql(self, dialect) -> tuple[str, tuple[str, ...] | None, dict[str, Any], bool]:
        made = self._compiled.get(dialect)
        if made is None:
            returns = self.returning is not None and dialect.insert_returning
            statement = self.statement.returning(self.returning) if returns else self.statement
            compiled = statement.compile(dialect=dialect)
            converted = [
                bind.key
                for bind in compiled.binds.values()
                if bind.type.dialect_impl(dialect).bind_processor(dialect) is not None
            ]
            converted += [
                column.key
                for column in getattr(statement, "selected_columns", ())
                if column.type.dialect_impl(dialect).result_processor(dialect, None) is not None
            ]
            if converted or compiled.post_compile_params or compiled.escaped_bind_names:
                raise ValueError(
                    f"Direct cannot run this statement on {dialect.name}: {converted} need"
                    " converting, or it expands parameters; run it through SQLAlchemy"
                )
            order = tuple(compiled.positiontup or ()) if compiled.positional else None
            literals = {k: v for k, v in compiled.params.items() if v is not None}
            made = self._compiled[dialect] = (compiled.string, order, literals, returns)
        return made

    def _on_cursor(self, connection, params: dict, read: Callable[[Any, bool], Any]) -> Any:
        """Execute, and `read(cursor, returns)` before the cursor closes. The database's
        errors are raised as SQLAlchemy's (`DBAPIError` and its kinds), as `execute` does;
        a lost connection is invalidated."""
        dialect = connection.dialect
        sql, order, literals, returns = self._sql(dialect)
        given = {**literals, **params} if literals else params
        values = given if order is None else tuple(given[name] for name in order)
        pooled = connection.connection  # the pool's proxy of the DBAPI connection
        cursor = None
        try:
            cursor = pooled.cursor()
            cursor.execute(sql, values)
            return read(cursor, returns)
        except dialect.loaded_dbapi.Error as e:
            lost = dialect.is_disconnect(e, pooled, cursor)
            if lost:
                connection.invalidate(e)
            raise as_sqlalchemy_error(e, dialect, sql, values, lost) from e
        finally:
            if cursor is not None and pooled.is_valid:
                cursor.close()

    def rows(self, connection, params: dict) -> list[Any]:
        return self._on_cursor(
            connection, params, lambda cursor, _: [self.row._make(v) for v in cursor.fetchall()]
        )

    def first(self, connection, params: dict) -> Any:
        def read(cursor, _returns):
            values = cursor.fetchone()
            return None if values is None else self.row._make(values)

        return self._on_cursor(connection, params, read)

    def count(self, connection, params: dict) -> int:
        """Execute an update or delete; the rows it matched."""
        return self._on_cursor(connection, params, lambda cursor, _: cursor.rowcount)

    def inserted(self, connection, params: dict) -> int:
        """Execute an insert; the `returning` column of the row it inserted."""

        def read(cursor, returns):
            return cursor.fetchone()[0] if returns else cursor.lastrowid

        return self._on_cursor(connection, params, read)


def as_sqlalchemy_error(error, dialect, statement=None, params=None, lost: bool = False):
    """A driver's error as SQLAlchemy raises it (`DBAPIError` and its kinds)."""
    return DBAPIError.instance(
        statement,
        params,
        error,
        dialect.loaded_dbapi.Error,
        connection_invalidated=lost,
        dialect=dialect,
    )


class PooledConnection:
    """A pooled DBAPI connection, with what `Direct` reads of a SQLAlchemy Connection."""

    def __init__(self, engine: Engine) -> None:
        self.dialect = engine.dialect
        try:
            self.connection = engine.raw_connection()
        except self.dialect.loaded_dbapi.Error as e:  # unlike Engine.connect's, the driver's
            raise as_sqlalchemy_error(e, self.dialect) from e

    def invalidate(self, error: BaseException) -> None:
        self.connection.invalidate(error)

    def commit(self) -> None:
        try:
            self.connection.commit()
        except self.dialect.loaded_dbapi.Error as e:
            raise as_sqlalchemy_error(e, self.dialect, "COMMIT") from e


#: SQLite's BEGIN of a `direct_transaction` that writes (True) or only reads (False)
_SQLITE_BEGIN = {True: Direct(text("BEGIN IMMEDIATE")), False: Direct(text("BEGIN"))}


@contextmanager
def direct_transaction(engine: Engine, write: bool = False) -> Iterator[PooledConnection]:
    """A transaction for `Direct` statements alone, on a pooled DBAPI connection without a
    SQLAlchemy Connection around it (whose begin, events and return to the pool cost a
    one-statement transaction of a spawn more than the statement: bench/ledger_spawn.py).
    Committed at the end, rolled back on an error. SQLite: BEGIN IMMEDIATE for a `write`
    (as `make_engine`'s transactions: the write lock at once, never a deadlock), BEGIN for
    reads (no lock held against writers); other databases begin by themselves (PostgreSQL:
    READ COMMITTED, as the engine's)."""
    pooled = PooledConnection(engine)
    try:
        if engine.dialect.name == "sqlite":
            _SQLITE_BEGIN[write].count(pooled, {})
        yield pooled
        pooled.commit()
    except BaseException:
        if pooled.connection.is_valid:  # not lost (Direct invalidates a lost one)
            try:
                pooled.connection.rollback()
            except Exception:  # lost now: never back into the pool
                pooled.connection.invalidate()
        raise
    finally:
        pooled.connection.close()


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


def head_revision() -> str | None:
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


def schema_problem(engine: Engine) -> str | None:
    """Why this meterhub cannot use the ledger yet (None: it can: at head, or empty, which
    `connect()` creates at head)."""
    current = current_revision(engine)
    head = head_revision()
    if current == head or (current is None and _is_empty(engine)):
        return None
    scripts = ScriptDirectory.from_config(alembic_config("sqlite://"))
    try:
        unknown = current is not None and scripts.get_revision(current) is None
    except CommandError:  # "No such revision"
        unknown = True
    if unknown:
        return (
            f"the ledger is at schema revision {current}, which this meterhub ({head}) does"
            " not know: a newer meterhub migrated it. Upgrade meterhub again, or restore the"
            " ledger backup taken before that upgrade (docs/kubernetes.md, Rollback)"
        )
    return (
        f"the ledger is at schema revision {current or 'none'}, this meterhub needs {head}:"
        " waiting for `meterhub billing upgrade-db` (the Helm chart's upgrade Job runs it)"
    )


def wait_for_schema(
    db_url: str,
    interval_seconds: float = 5.0,
    log_every: int = 12,
    max_checks: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
) -> bool:
    """Check every `interval_seconds` until the ledger is usable; True then. Says why it
    waits when that changes and every `log_every` checks; a database that does not answer is
    one more reason to wait. False after `max_checks` checks (None: never gives up)."""
    engine = make_engine(db_url)
    last, checks = None, 0
    try:
        while True:
            try:
                problem = schema_problem(engine)
            except SQLAlchemyError as e:
                # the driver's message names the host, never the password
                problem = f"the ledger database does not answer: {getattr(e, 'orig', e)}"
            if problem is None:
                log(f"the ledger is at schema revision {head_revision()}")
                return True
            checks += 1
            if problem != last or checks % log_every == 0:
                log(problem)
                last = problem
            if max_checks is not None and checks >= max_checks:
                return False
            sleep(interval_seconds)
    finally:
        engine.dispose()


def main() -> int:
    """Wait for $METERHUB_DB_URL's ledger to be at this meterhub's schema."""
    db_url = os.environ.get("METERHUB_DB_URL")
    if not db_url:
        print("METERHUB_DB_URL is not set", file=sys.stderr)
        return 2
    wait_for_schema(db_url, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
