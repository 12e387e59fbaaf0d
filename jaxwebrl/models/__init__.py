"""jaxwebrl.models."""
