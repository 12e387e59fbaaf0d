"""The multi-step RL lab: a vectorised multi-turn environment family, a tiny token-level policy, and training
through the production rl/ path (advantages and losses, via train.rl_config), many seeds as one program.

Modules: env (the environment and its knobs), oracle (warm-start demonstrations), policy (the transformer,
constrained sampling, log-probs), rollout (episodes -> step rows), recipes (arms from configs/), update (one RL
update and the warm start's step), run (seeds x updates). The study: bench/lab_study.py.
"""
