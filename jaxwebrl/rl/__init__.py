"""jaxwebrl.rl: the PPO-family objective and advantage library (pure jnp, imports only jax/numpy).

  advantages     reward shaping, episode estimators (GRPO/RLOO/Dr.GRPO/...), step advantages r̂/(k or T_e),
                 last-token placement, masked GAE, adv_norm; `compute_token_advantages` runs the whole path
  losses         decoupled PPO and its family (GSPO, SAPO, CISPO, SAO, fbc, ...), registry `get_loss(name)`
  normalization  NormConfig and `normalize` for variable-size groups
  gae            masked / turn-unit / skip-observation GAE and λ functions
  kl             k1/k2/k3 and binary-KL estimators
  segments       dense group ids under jit (static segment counts)
"""

from jaxwebrl.rl import advantages, gae, kl, normalization, segments  # noqa: F401
