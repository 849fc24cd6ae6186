"""halfmoon: outbox/reconcile."""
