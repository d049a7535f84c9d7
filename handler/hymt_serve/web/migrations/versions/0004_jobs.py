"""Durable jobs: DeepL document jobs and batches with their segments' progress.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
