"""Courses: their settings (allowance, profiles, lab windows and the GPUs they reserve)
and rosters.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "course_settings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("allowance_micros", sa.BigInteger(), nullable=True),
        sa.Column("allowance_period", sa.String(8), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=True),
        sa.Column("profiles", sa.Text(), nullable=False),
        sa.Column("windows", sa.Text(), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("debug_outside_windows", sa.Boolean(), nullable=False),
        sa.Column("at_window_end", sa.String(8), nullable=False),
        sa.Column("window_gpus", sa.Text(), nullable=False, server_default=""),
        sa.Column("lti_key", sa.String(700), nullable=True, unique=True),
    )
    op.create_table(
        "course_members",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("course_name", sa.String(64), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("full_name", sa.Text(), nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("added_at", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("course_name", "user_name"),
    )


def downgrade() -> None:
    op.drop_table("course_members")
    op.drop_table("course_settings")
