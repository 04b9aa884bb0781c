"""Alembic environment for the billing ledger (run via billing_hooks.db.upgrade)."""

from alembic import context
from sqlalchemy import pool

from meterhub.billing_hooks.db import make_engine
from meterhub.billing_hooks.orm import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    engine.pool = pool.NullPool(engine.pool._creator)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
