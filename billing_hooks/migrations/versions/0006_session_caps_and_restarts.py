"""Session caps (a user's "stop after ¥X / N hours") and the queue of servers the hub
restarts in debug mode (idle, cap or lab window fallbacks).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable columns: added in place on SQLite and PostgreSQL alike (no table copy)
    op.add_column("sessions", sa.Column("max_cost_micros", sa.BigInteger(), nullable=True))
    op.add_column("sessions", sa.Column("max_seconds", sa.BigInteger(), nullable=True))
    op.create_table(
        "restarts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("session_id", sa.Integer(), sa.ForeignKey("sessions.id"), nullable=True),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("applied_at", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False, server_default=""),
        sa.UniqueConstraint("session_id"),
    )
    op.create_index("ix_restarts_pending", "restarts", ["applied_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_restarts_pending", "restarts")
    op.drop_table("restarts")
    # SQLite drops a column in place since 3.35 (Debian 12 has 3.40)
    op.drop_column("sessions", "max_seconds")
    op.drop_column("sessions", "max_cost_micros")
