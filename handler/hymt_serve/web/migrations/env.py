"""Alembic's environment: migrate on the connection :func:`..database.upgrade` passes, inside
its transaction (no URL, no ini file, no logging set-up of its own)."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
# render_as_batch: SQLite alters a table by copying it; Alembic's batch mode does that for us.
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
