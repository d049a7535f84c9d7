"""Alembic's migrations of the front end's database (env.py, versions/); run by
:func:`hymt_serve.web.database.upgrade`."""
