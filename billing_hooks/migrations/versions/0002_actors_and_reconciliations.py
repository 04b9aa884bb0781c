"""Every entry names its actor and, for client-keyed requests, what was asked; the meter's
reconciliations with the hub are kept for the audit.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("entries") as batch:
        batch.add_column(sa.Column("actor", sa.String(255), nullable=False, server_default=""))
        batch.add_column(sa.Column("request_digest", sa.String(64), nullable=True))
    op.create_table(
        "reconciliations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("session_id", sa.Integer(), sa.ForeignKey("sessions.id"), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reconciliations")
    with op.batch_alter_table("entries") as batch:
        batch.drop_column("request_digest")
        batch.drop_column("actor")
