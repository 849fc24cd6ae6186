"""halfmoon: outbox/integrations/celery."""
