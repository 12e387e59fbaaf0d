"""jaxwebrl.models: Flax Qwen3-VL / Qwen2.5-VL policies, KV cache, rope index, HF import/export.

Nothing is imported here: a rollout worker process imports the tokenizer, the processor and the token constraints
from this package without JAX and the model stack (bench/process_cost.py). Import from the modules.
"""
