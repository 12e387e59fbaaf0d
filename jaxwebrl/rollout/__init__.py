"""jaxwebrl.rollout."""
