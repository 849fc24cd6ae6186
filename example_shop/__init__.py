"""halfmoon: example_shop."""
