"""halfmoon: outbox/integrations/sqlalchemy."""
