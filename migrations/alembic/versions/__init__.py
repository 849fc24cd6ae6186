"""halfmoon's Alembic revisions (branch ``halfmoon``); Alembic skips this file."""
