"""halfmoon: outbox/integrations."""
