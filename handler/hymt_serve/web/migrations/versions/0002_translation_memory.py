"""The translation memory: segment translations keyed by everything that decides them.

The table is ``hymt_serve.request.memory.translation_memory`` (the TorchServe worker's, which
cannot import the front end); tests/unit/test_memory_store.py keeps the two equal. A worker
that started before the front end ever migrated has created the table already (under the same
lock): then there is nothing to do.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLE = "translation_memory"


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table(TABLE):
        return
    op.create_table(
        TABLE,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("plain_key", sa.String(64), nullable=True),
        sa.Column("namespace", sa.String(200), nullable=False, server_default=""),
        sa.Column("model", sa.String(32), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("token_ids", sa.Text, nullable=False),
        sa.Column("finish_reason", sa.String(8), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("template", sa.String(32), nullable=False),
        sa.Column("target_language", sa.String(8), nullable=True),
        sa.Column("last_used", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.create_index(f"ix_{TABLE}_plain_key", TABLE, ["plain_key"])
    op.create_index(f"ix_{TABLE}_last_used", TABLE, ["last_used"])


def downgrade() -> None:
    op.drop_index(f"ix_{TABLE}_last_used", table_name=TABLE)
    op.drop_index(f"ix_{TABLE}_plain_key", table_name=TABLE)
    op.drop_table(TABLE)
