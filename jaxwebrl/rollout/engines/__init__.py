"""Serving engines behind the policy-server contract: `vllm_process` (run by the engine venv's python, no JAX)
and `vllm_client` (the JAX side: starts it, talks to it over the project's wire format)."""
