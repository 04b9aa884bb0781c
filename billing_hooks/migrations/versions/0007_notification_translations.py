"""Notifications in every language: what the meter says, kept in each language it speaks
(the reader's is picked when it is read: the Wallet page, JupyterLab).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # JSON {"zh_CN": "..."}; `message` stays the English text (webhooks, older readers)
    op.add_column("notifications", sa.Column("translations", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("notifications", "translations")
