"""jaxwebrl.eval: evaluate a policy on a fixed task set, export trained checkpoints, scripted demonstrations."""
