"""jaxwebrl: fully asynchronous multi-step RL for visual web agents, in JAX.

Layers (dependencies point down): launch -> train/rollout -> buffer/env/models -> rl/parallel.
"""

__version__ = "0.1.0"
