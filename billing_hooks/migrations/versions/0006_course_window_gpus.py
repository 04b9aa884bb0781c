"""Courses: the GPUs a course's lab windows reserve for its students.

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
    with op.batch_alter_table("course_settings") as batch:
        batch.add_column(sa.Column("window_gpus", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("course_settings") as batch:
        batch.drop_column("window_gpus")
