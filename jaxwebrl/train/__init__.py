"""jaxwebrl.train."""
