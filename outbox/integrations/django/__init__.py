"""halfmoon: outbox/integrations/django."""
