"""The store's schema history, as alembic migrations (`versions/`); `tx/store/migrate.py` runs them."""
