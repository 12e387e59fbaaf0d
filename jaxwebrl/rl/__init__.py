"""jaxwebrl.rl."""
