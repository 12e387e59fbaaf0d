"""jaxwebrl.rl: the PPO-family objective and advantage library (pure jnp, imports only jax/numpy).

  advantages     reward shaping, step advantages r̂/(k or T_e), last-token placement, masked GAE, adv_norm;
                 `compute_token_advantages` runs the whole path
  estimators     episode-level estimators (GRPO/RLOO/Dr.GRPO/...), `get_estimator(name)`, `register_estimator`
  losses         decoupled PPO and its family (GSPO, SAPO, CISPO, SAO, fbc, IcePop/KPop, M2PO), `get_loss(name)`,
                 `register_loss`
  aggregation    token-mean / seq-mean-token-mean / Dr.GRPO constant-normaliser reductions
  rejection      behaviour weight, dropping cap, IcePop/KPop rejection sampling
  normalization  NormConfig and `normalize` for variable-size groups
  gae            masked / turn-unit / skip-observation GAE and λ functions
  kl             k1/k2/k3 and binary-KL estimators
  regularizers   KL penalty to the reference policy, and the whole actor objective
  segments       dense group ids under jit (static segment counts)

Import from the modules (`from jaxwebrl.rl import advantages, losses`).
"""
