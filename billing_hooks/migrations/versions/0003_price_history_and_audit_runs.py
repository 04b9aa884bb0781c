"""Prices are dated and append-only (a change adds a row naming who set it); the scheduled
audit's runs are kept for the admin page.

The one-row-per-profile prices become history: each keeps its price, effective from when
it was last set, set by "unknown".

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_old_prices = sa.table(
    "prices",
    sa.column("profile", sa.String),
    sa.column("micros_per_hour", sa.BigInteger),
    sa.column("updated_at", sa.BigInteger),
)


def _create_dated_prices() -> sa.Table:
    table = op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("profile", sa.String(32), nullable=False),
        sa.Column("micros_per_hour", sa.BigInteger(), nullable=False),
        sa.Column("effective_from", sa.BigInteger(), nullable=False),
        sa.Column("set_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_prices_profile", "prices", ["profile", "effective_from", "id"])
    return table


def upgrade() -> None:
    # the primary key changes (profile -> id): copy the rows into a new table
    rows = (
        op.get_bind()
        .execute(sa.select(_old_prices).order_by(_old_prices.c.updated_at, _old_prices.c.profile))
        .all()
    )
    op.drop_table("prices")
    prices = _create_dated_prices()
    if rows:
        op.bulk_insert(
            prices,
            [
                {
                    "profile": row.profile,
                    "micros_per_hour": row.micros_per_hour,
                    "effective_from": row.updated_at,
                    "set_by": "unknown",
                    "created_at": row.updated_at,
                }
                for row in rows
            ],
        )
    op.create_table(
        "audit_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("finished_at", sa.BigInteger(), nullable=False),
        sa.Column("problems_count", sa.Integer(), nullable=False),
        sa.Column("problems", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    """Back to one row per profile: each profile's latest price (later ones are lost)."""
    op.drop_table("audit_runs")
    dated = sa.table(
        "prices",
        sa.column("id", sa.Integer),
        sa.column("profile", sa.String),
        sa.column("micros_per_hour", sa.BigInteger),
        sa.column("effective_from", sa.BigInteger),
    )
    latest: dict[str, tuple[int, int]] = {}
    for row in op.get_bind().execute(sa.select(dated).order_by(dated.c.effective_from, dated.c.id)):
        latest[row.profile] = (row.micros_per_hour, row.effective_from)
    op.drop_index("ix_prices_profile", "prices")
    op.drop_table("prices")
    prices = op.create_table(
        "prices",
        sa.Column("profile", sa.String(32), primary_key=True),
        sa.Column("micros_per_hour", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )
    if latest:
        op.bulk_insert(
            prices,
            [
                {"profile": profile, "micros_per_hour": micros, "updated_at": at}
                for profile, (micros, at) in latest.items()
            ],
        )
