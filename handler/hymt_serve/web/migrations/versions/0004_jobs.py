"""Durable jobs: DeepL document jobs and batches with their segments' progress, and the batch
API's files (web/job_store.py holds the same tables as SQLAlchemy Core).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("secret", sa.String(64)),
        sa.Column("filename", sa.String(400)),
        sa.Column("fields", sa.Text, nullable=False),
        sa.Column("input", sa.LargeBinary),
        sa.Column("billed", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("refunded", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("total", sa.Integer),
        sa.Column("fingerprint", sa.String(64)),
        sa.Column("result", sa.LargeBinary),
        sa.Column("error", sa.Text),
        sa.Column("runner", sa.String(64)),
        sa.Column("heartbeat", sa.Float),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float),
        sa.Column("downloaded_at", sa.Float),
    )
    op.create_table(
        "job_items",
        sa.Column(
            "job_id",
            sa.String(64),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("characters", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "job_files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False, index=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(400), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_files")
    op.drop_table("job_items")
    op.drop_table("jobs")
