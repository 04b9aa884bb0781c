"""Vouchers: codes redeemed once for credit, kept only as hashes, and the failed
redemptions their rate limit counts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vouchers",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("code_hash", sa.String(64), nullable=False),
        sa.Column("hint", sa.String(8), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("batch", sa.String(32), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.Column("revoked_by", sa.String(255), nullable=True),
        sa.Column("redeemed_at", sa.BigInteger(), nullable=True),
        sa.Column("redeemed_by", sa.String(255), nullable=True),
        sa.Column("entry_id", sa.Integer(), sa.ForeignKey("entries.id"), nullable=True),
        # one code, one voucher; one voucher, one entry at most
        sa.UniqueConstraint("code_hash"),
        sa.UniqueConstraint("entry_id"),
    )
    op.create_index("ix_vouchers_batch", "vouchers", ["batch", "id"])
    op.create_table(
        "redeem_failures",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_redeem_failures_user", "redeem_failures", ["user_name", "created_at"])
    op.create_index("ix_redeem_failures_at", "redeem_failures", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_redeem_failures_at", "redeem_failures")
    op.drop_index("ix_redeem_failures_user", "redeem_failures")
    op.drop_table("redeem_failures")
    op.drop_index("ix_vouchers_batch", "vouchers")
    op.drop_table("vouchers")
