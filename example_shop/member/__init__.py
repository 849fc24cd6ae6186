"""The member service: a SQLAlchemy app that consumes ``order.paid`` and awards points."""
