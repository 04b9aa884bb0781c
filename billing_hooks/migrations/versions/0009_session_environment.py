"""The environment each session ran (user option `environment`: pytorch, minimal, ...), as
its usage rows show it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable: sessions from before environments ran the servers' one environment
    op.add_column("sessions", sa.Column("environment", sa.String(32), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "environment")
