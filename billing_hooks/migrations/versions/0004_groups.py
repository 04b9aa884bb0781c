"""Groups with wallets: their settings, admins, members' caps and the membership changes
the hub applies for the CLI.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_settings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("default_for_members", sa.Boolean(), nullable=False),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "group_admins",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("group_name", sa.String(64), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.UniqueConstraint("group_name", "user_name"),
    )
    op.create_table(
        "member_caps",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("wallet_id", sa.Integer(), sa.ForeignKey("wallets.id"), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("set_by", sa.String(255), nullable=False),
        sa.Column("set_at", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("wallet_id", "user_name"),
    )
    op.create_table(
        "hub_changes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("group_name", sa.String(64), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=True),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("applied_at", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
    )
    op.create_index("ix_hub_changes_pending", "hub_changes", ["applied_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_hub_changes_pending", "hub_changes")
    op.drop_table("hub_changes")
    op.drop_table("member_caps")
    op.drop_table("group_admins")
    op.drop_table("group_settings")
