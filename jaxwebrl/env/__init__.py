"""jaxwebrl.env."""
