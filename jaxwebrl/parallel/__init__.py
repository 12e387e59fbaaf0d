"""jaxwebrl.parallel."""
