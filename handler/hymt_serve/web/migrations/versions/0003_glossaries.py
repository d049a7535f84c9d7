"""Stored glossaries (DeepL's glossary objects and ours) with their entries.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "glossaries",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("name", sa.String(1024), nullable=False),
        sa.Column("source_lang", sa.String(16), nullable=False),
        sa.Column("target_lang", sa.String(16), nullable=False),
        sa.Column("entry_count", sa.Integer, nullable=False),
        sa.Column("ready", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("creation_time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_glossaries_owner", "glossaries", ["owner"])
    op.create_table(
        "glossary_entries",
        sa.Column(
            "glossary_id",
            sa.String(36),
            sa.ForeignKey("glossaries.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("glossary_entries")
    op.drop_index("ix_glossaries_owner", table_name="glossaries")
    op.drop_table("glossaries")
