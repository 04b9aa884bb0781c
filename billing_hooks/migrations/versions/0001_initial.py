"""The first ledger schema: wallets, entries, sessions, passes, notifications, prices.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "wallets",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("owner_kind", sa.String(16), nullable=False),
        sa.Column("owner_name", sa.String(255), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("balance_micros", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("owner_kind", "owner_name"),
    )
    op.create_table(
        "passes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("wallet_id", sa.Integer(), sa.ForeignKey("wallets.id"), nullable=False),
        sa.Column("profile", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("price_micros", sa.BigInteger(), nullable=False),
        sa.Column("starts_at", sa.BigInteger(), nullable=False),
        sa.Column("ends_at", sa.BigInteger(), nullable=False),
        sa.Column("entry_key", sa.String(200), nullable=False, unique=True),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("wallet_id", sa.Integer(), sa.ForeignKey("wallets.id"), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("rate_micros_per_hour", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("ready_at", sa.BigInteger(), nullable=True),
        sa.Column("stopped_at", sa.BigInteger(), nullable=True),
        sa.Column("metered_through", sa.BigInteger(), nullable=True),
        sa.Column("last_seen_running", sa.BigInteger(), nullable=True),
        sa.Column("pass_id", sa.Integer(), sa.ForeignKey("passes.id"), nullable=True),
    )
    op.create_index("ix_sessions_open", "sessions", ["stopped_at", "user_name"])
    op.create_table(
        "entries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("wallet_id", sa.Integer(), sa.ForeignKey("wallets.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("balance_after_micros", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(200), nullable=False, unique=True),
        sa.Column("session_id", sa.Integer(), sa.ForeignKey("sessions.id"), nullable=True),
        sa.Column("window_start", sa.BigInteger(), nullable=True),
        sa.Column("window_end", sa.BigInteger(), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_entries_wallet_id", "entries", ["wallet_id", "id"])
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("read_at", sa.BigInteger(), nullable=True),
        sa.UniqueConstraint("key"),
    )
    op.create_table(
        "prices",
        sa.Column("profile", sa.String(32), primary_key=True),
        sa.Column("micros_per_hour", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    for table in ("prices", "notifications", "entries", "sessions", "passes", "wallets"):
        op.drop_table(table)
