"""jaxwebrl.buffer."""
