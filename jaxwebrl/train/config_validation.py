"""Check a run's ConfigDict before any browser, process or device work starts.

Every problem becomes one `ConfigError` whose message is a single line naming the key (or file) and the fix,
e.g. `actor.c_clip=0.5: the dual clip must be > 1 (e.g. 3.0) or None to disable it`. The config's extension
modules (`extensions`) are imported first, so the losses, estimators and envs they register are known.

A field's own range is declared with the field (configs/base.py SCHEMA, run here once by `_check_fields`), or,
where another layer owns it, is that layer's rule called here (the field's `checked_by` names it: the losses'
knobs `losses.knob_problem`, the latency regime `LatencyConfig`, the schedule `update.schedule_problem`, ...).
What stays below relates several fields, or needs the filesystem, a registry or an optional dependency.
"""

from __future__ import annotations

import os
import shutil

from ml_collections import config_dict

from configs.base import FIELDS
from jaxwebrl.checkpoint.layout import holds_params
from jaxwebrl.env.agent.action_space import config_memory_grammar, response_text
from jaxwebrl.env.latency import LatencyConfig
from jaxwebrl.env.registry import check_env_spec, config_action_texts, env_specs, needs_browser
from jaxwebrl.env.tasks.webtask.task_spec import TaskSpecError, max_steps_problem
from jaxwebrl.extensions import import_extensions
from jaxwebrl.models import presets
from jaxwebrl.models.attention_kernels import kernel_problem
from jaxwebrl.models.layers import remat_problem
from jaxwebrl.parallel import distributed, multihost
from jaxwebrl.rl import aggregation, estimators, gae, kl, losses
from jaxwebrl.rollout.spec import cpu_ids
from jaxwebrl.rollout.transport import DEFAULT_MAX_MESSAGE_BYTES
from jaxwebrl.train import reference, rl_config, update

# Losses whose objective is built on the plain (coupled) ratio and must not be reweighted by w.
COUPLED_ONLY_LOSSES = ("sapo",)
# Losses that keep the tokens of successes only (their sign filter, not a value baseline, decides): no critic.
VALUE_BLIND_LOSSES = ("fbc", "raft")
MESSAGE_HEADROOM = 1 << 20   # of a transport message, left to an engine judge's prompt beside its screenshots


class ConfigError(ValueError):
    """A bad config value; the message is one line that names the key and the fix."""


def validate(config: config_dict.ConfigDict, workdir: str | None = None) -> None:
    """Raise ConfigError on the first problem found; return None when the config can run."""
    try:
        import_extensions(config.extensions)
    except ImportError as err:
        raise ConfigError(_one_line(err)) from None
    _check_fields(config)
    _check_rollout(config)
    _check_train(config)
    _check_actor(config)
    _check_critic(config)
    _check_model(config)
    _check_env(config)
    _check_paths(config, workdir)
    _check_distributed(config)


def _fail(key: str, value, fix: str) -> None:
    raise ConfigError(f"{key}={value!r}: {fix}")


def _check_fields(c) -> None:
    """Every declared field's own check (configs/base.py SCHEMA), in declaration order; a field the config lacks
    is a config not built from configs/base.py."""
    for key, field in FIELDS.items():
        node = c
        for part in key.split("."):
            if part not in node:
                _fail(key, "<absent>", "the config lacks this field: build it from configs.base.config()")
            node = node[part]
        fix = field.problem(node)
        if fix is not None:
            _fail(key, node, fix)


def _check_rollout(c) -> None:
    r = c.rollout
    if r.launcher == "ray":
        try:
            import ray  # noqa: F401  (deferred: optional dependency; only checks it is installed)
        except ImportError:
            _fail("rollout.launcher", "ray", "Ray is not installed: pip install 'jaxwebrl[ray]', or use 'local'")
    try:
        cpus = cpu_ids(r.worker_cpus)
    except ValueError:
        cpus = [-1]
    if any(c not in os.sched_getaffinity(0) for c in cpus):
        _fail("rollout.worker_cpus", r.worker_cpus, f"must be comma-separated CPU ids of this host "
              f"({sorted(os.sched_getaffinity(0))}), or empty for any")


def _check_train(c) -> None:
    t, g = c.train, c.env.group_size
    if t.consumer_batch_size % g:
        _fail("train.consumer_batch_size", t.consumer_batch_size,
              f"must be a multiple of env.group_size={g} (whole groups are trained together)")
    schedule_fix = update.schedule_problem(t.lr_schedule)
    if schedule_fix is not None:
        _fail("train.lr_schedule", t.lr_schedule, schedule_fix)


def _check_actor(c) -> None:
    a = c.actor
    try:
        losses.get_loss(a.loss)
    except (KeyError, ValueError) as err:
        _fail("actor.loss", a.loss, f"not a registered loss ({_one_line(err)})")
    if a.loss in COUPLED_ONLY_LOSSES and a.use_decoupled_loss:
        _fail("actor.use_decoupled_loss", True,
              f"{a.loss} uses the coupled ratio: set --config.actor.use_decoupled_loss=False")
    if a.eps_clip is None and losses.loss_default(a.loss, "eps_clip") is not None:
        _fail("actor.eps_clip", None, "only CISPO and M2PO run without a lower clip: set it in (0, 1), e.g. 0.2")
    for field, kwarg in rl_config.LOSS_KNOBS.items():   # the losses' own rule for each knob
        fix = losses.knob_problem(kwarg, a[field])
        if fix is not None:
            _fail(f"actor.{field}", a[field], fix)
    if a.eps_clip_higher is not None and a.eps_clip is not None and a.eps_clip_higher < a.eps_clip:
        _fail("actor.eps_clip_higher", a.eps_clip_higher, f"must be >= actor.eps_clip={a.eps_clip} (DAPO: 0.28)")
    if a.behav_imp_weight_cap is not None and not a.use_decoupled_loss:
        _fail("actor.behav_imp_weight_cap", a.behav_imp_weight_cap,
              "the cap applies to the decoupled loss only: set it to None or use_decoupled_loss=True")
    ignored = rl_config.ignored_knobs(a)
    if ignored:
        _fail(f"actor.{ignored[0]}", a[ignored[0]], f"loss {a.loss!r} does not use it: set it to None")
    if a.agg_mode is not None and a.agg_mode not in aggregation.AGG_MODES:
        _fail("actor.agg_mode", a.agg_mode, f"use one of {aggregation.AGG_MODES} or None")
    for name in ("kl_estimator", "kl_loss_estimator"):
        kl_fix = kl.estimator_problem(a[name])
        if kl_fix is not None:
            _fail(f"actor.{name}", a[name], kl_fix)
    for name in ("reward_norm", "adv_norm"):
        if a[name].mean_leave1out and a[name].mean_level is None:
            _fail(f"actor.{name}.mean_leave1out", True, f"leave-one-out needs actor.{name}.mean_level set")
    try:
        rl_config.estimator_name(a)
    except ValueError as err:
        raise ConfigError(_one_line(err)) from None
    try:   # the advantage path's own checks (step_adv_const_length k > 0, the overlong penalty's fields)
        rl_config.advantage_config(a, max_new_tokens=c.model.max_new_tokens)
    except ValueError as err:
        raise ConfigError(f"actor.{_one_line(err)}") from None
    refused = reference.problem(c)   # a KL term without a reference source, reference knobs without a KL term
    if refused is not None:
        _fail(*refused)
    if c.env.group_size < 2 and "group" in (a.reward_norm.mean_level, a.reward_norm.std_level):
        _fail("env.group_size", c.env.group_size, "group reward normalisation needs G >= 2 episodes per group")


def _check_critic(c) -> None:
    """The value model against the estimator and loss that would read its values, and the λ function's arguments
    (after `_check_actor`: the estimator is a registered one)."""
    a, enabled = c.actor, c.critic.enabled
    use = estimators.critic_use(a.estimator)
    if use == "needed" and not enabled:
        _fail("actor.estimator", a.estimator, "GAE from critic values needs a value model: set "
              "--config.critic.enabled=True (or use configs/ppo.py)")
    if enabled and use == "ignored":
        _fail("critic.enabled", True, f"actor.estimator={a.estimator!r} has its own baseline and ignores values: "
              f"use actor.estimator='gae' (configs/ppo.py) or set critic.enabled=False")
    if enabled and a.loss in VALUE_BLIND_LOSSES:
        _fail("critic.enabled", True, f"actor.loss={a.loss!r} keeps successes by sign and ignores values: use "
              f"actor.loss='ppo' or set critic.enabled=False")
    if a.gae_lambda_fn is None:
        if a.gae_lambda_kwargs:
            _fail("actor.gae_lambda_kwargs", a.gae_lambda_kwargs, "arguments of a λ function: set "
                  "actor.gae_lambda_fn too, or '' for none")
        return
    if a.gae_lambda_fn not in gae.LAMBDA_FNS:
        _fail("actor.gae_lambda_fn", a.gae_lambda_fn, f"use one of {sorted(gae.LAMBDA_FNS)} or None (gae_lambda)")
    try:
        gae.resolve_lambda(a.gae_lambda_fn, [1.0], rl_config.lambda_kwargs(a))
    except (TypeError, ValueError) as err:
        _fail("actor.gae_lambda_kwargs", a.gae_lambda_kwargs, f"{a.gae_lambda_fn}: {_one_line(err)}")


def _check_model(c) -> None:
    m = c.model
    remat_fix = remat_problem(m.remat)
    if remat_fix is not None:
        _fail("model.remat", m.remat, remat_fix)
    kernel = kernel_problem(m.attention_impl, dtype=m.dtype, chunk=m.attention_chunk)
    if kernel is not None:   # one line that starts "attention_impl=..."
        raise ConfigError(f"model.{kernel}")
    if m.preset is not None and m.preset not in presets.PUBLISHED:
        _fail("model.preset", m.preset, f"use one of {', '.join(presets.PUBLISHED)}")
    if m.name == "random" and m.preset is None:
        _fail("model.preset", None, f"model.name='random' needs a preset: one of {', '.join(presets.PUBLISHED)}")
    if m.name == "pretrained":
        if m.checkpoint is None:
            _fail("model.checkpoint", None, "name a local HF directory: --config.model.checkpoint=/path/to/Qwen3-VL-8B")
        if not os.path.isdir(m.checkpoint):
            _fail("model.checkpoint", m.checkpoint, "directory not found: give an existing local HF checkpoint directory")
        if not os.path.isfile(os.path.join(m.checkpoint, "config.json")):
            _fail("model.checkpoint", m.checkpoint, "no config.json inside: point at the HF model directory itself")
    if m.lora.rank is not None or m.freeze_vision or m.num_layers is not None or m.vision_depth is not None:
        try:   # the LoRA targets, a text-only model's freeze_vision and a preset's depths are the model layer's rules
            presets.shapes_config(m)
        except ValueError as err:
            raise ConfigError(_one_line(err)) from None


def _check_env(c) -> None:
    e = c.env
    try:
        specs = env_specs(e.tasks)   # a .jsonl task set or a directory is read here
    except TaskSpecError as err:
        raise ConfigError(f"env.tasks: {_one_line(err)}") from None
    if not specs:
        _fail("env.tasks", e.tasks, "name at least one env spec, e.g. 'toy' or 'miniwob/click-test'")
    judged_only = []     # specs whose reward only a judge can give (a WebGym rubric without an answer)
    for spec in specs:   # every key, type, range, regex and start URL of a JSON spec; its evaluator is not imported
        try:
            checked = check_env_spec(spec)
            if getattr(checked, "evaluator", {}).get("type") == "judge":
                judged_only.append(spec)
        except TaskSpecError as err:   # names the spec file itself
            raise ConfigError(f"env.tasks: {_one_line(err)}") from None
        except (ValueError, TypeError) as err:
            raise ConfigError(f"env.tasks={spec!r}: {_one_line(err)}") from None
    steps_fix = max_steps_problem(e.max_episode_steps)
    if steps_fix is not None:
        _fail("env.max_episode_steps", e.max_episode_steps, steps_fix)
    _check_memory(c)
    _check_latency(e)
    judge = e.get("judge")
    if judge is not None and judge.backend == "chat" and not (judge.url and judge.model):
        _fail("env.judge.backend", judge.backend, "the chat judge needs env.judge.url and env.judge.model (an "
                                                  "OpenAI-compatible endpoint and its model)")
    if judge is not None and judge.backend == "engine":
        _check_engine_judge(c)
    if judged_only and (judge is None or judge.backend == "ground_truth"):
        _fail("env.judge.backend", "ground_truth" if judge is None else judge.backend,
              f"{len(judged_only)} of the tasks (first {judged_only[0]}) have a rubric but no reference_answer or "
              f"ground_truth: only a judge that reads the rubric can score them; set env.judge.backend=chat with "
              f"its url and model, or drop those lines")
    if needs_browser(specs):
        if _which(e.chromium) is None:
            _fail("env.chromium", e.chromium, "Chromium not found: apt-get install -y chromium (or set the path)")
        if _which(e.chromedriver) is None:
            _fail("env.chromedriver", e.chromedriver, "chromedriver not found: apt-get install -y chromium-driver")


def _check_engine_judge(c) -> None:
    """The engine judge decodes on the run's own JAX policy server, and a verdict's screenshots travel with its
    request (rollout/engine_judge.py): they must fit one transport message."""
    e = c.env
    if c.rollout.get("engine", "jax") != "jax":
        _fail("env.judge.backend", "engine", f"the judge on the run's engine needs rollout.engine='jax' (the "
                                             f"{c.rollout.engine!r} engine serves no verdicts): set it, or judge "
                                             f"with env.judge.backend=chat")
    shot = 3 * e.screenshot_width * e.screenshot_height
    fits = (DEFAULT_MAX_MESSAGE_BYTES - MESSAGE_HEADROOM) // shot
    if e.judge.max_screenshots > fits:
        _fail("env.judge.max_screenshots", e.judge.max_screenshots,
              f"the engine judge sends a verdict's screenshots in one transport message of at most "
              f"{DEFAULT_MAX_MESSAGE_BYTES >> 20} MiB: at {e.screenshot_width}x{e.screenshot_height} set it to at "
              f"most {fits}")


def _check_memory(c) -> None:
    """A free memory shapes the constrained grammar, and its longest response must fit model.max_new_tokens
    (counted in characters: no token of a tokenizer is shorter than one)."""
    texts, memory = config_action_texts(c), config_memory_grammar(c)
    if memory is None:
        return
    if texts is None:
        _fail("env.memory", c.env.memory, "a free memory grammar needs model.constrained_actions=True (an "
                                          "unconstrained policy writes any memory): set env.memory='empty'")
    longest = len(response_text(max(texts, key=len), {})) - 2 + memory.max_chars + 1   # + the end token
    if c.model.max_new_tokens < longest:
        _fail("model.max_new_tokens", c.model.max_new_tokens,
              f"the free memory's longest response takes up to {longest} tokens: set "
              f"--config.model.max_new_tokens={longest} (or shrink env.memory_max_keys / env.memory_value_chars)")


def _check_latency(e) -> None:
    """env.latency (the benchmark's latency regime): its ranges, and in "web" a page delay cap that leaves room in
    env.step_timeout_s."""
    try:
        LatencyConfig.for_run(e.latency.to_dict(), e.step_timeout_s)
    except ValueError as err:   # "field=value: fix"
        raise ConfigError(f"env.latency.{_one_line(err)}") from None


def _check_paths(c, workdir) -> None:
    if workdir is not None and os.path.exists(workdir) and not os.path.isdir(workdir):
        _fail("--workdir", workdir, "exists and is not a directory: choose a directory path")
    cache = c.compilation_cache_dir
    if cache is not None and not isinstance(cache, str):
        _fail("compilation_cache_dir", cache, "give a directory path, or '' to turn the compilation cache off")
    if cache and os.path.exists(os.path.expanduser(cache)) and not os.path.isdir(os.path.expanduser(cache)):
        _fail("compilation_cache_dir", cache, "exists and is not a directory: give a directory path, or '' (off)")
    init = c.model.init_params
    if init is not None and not holds_params(init):
        _fail("model.init_params", init, "no params checkpoint (jaxwebrl_params.json) or training checkpoint "
              "(<step>/state) there: give launch/sft.py's --workdir or a run's checkpoints/ dir")
    ckpt = c.checkpoint.restore_from
    if ckpt is not None and not os.path.isdir(ckpt):
        _fail("checkpoint.restore_from", ckpt, "checkpoint directory not found: give an existing checkpoints/ dir")
    if c.metrics.wandb_project is not None:
        try:
            import wandb  # noqa: F401  (deferred: optional dependency; only checks it is installed)
        except ImportError:
            _fail("metrics.wandb_project", c.metrics.wandb_project, "wandb is not installed: pip install wandb, or unset it")


def _check_distributed(c) -> None:
    """Join settings as `distributed.initialize` will resolve them (config, then JAXWEBRL_* environment), and
    the trainer mesh; nothing is joined here."""
    section = c.distributed.to_dict()
    try:
        settings = distributed.resolve_settings(multihost.initialize_settings(section))
    except ValueError as err:
        raise ConfigError(_one_line(err)) from None
    if sum(size == -1 for size in section["mesh"].values()) > 1:
        _fail("distributed.mesh", section["mesh"], "at most one axis may be -1")
    if section["server_devices"] and not settings.multi_process and multihost.mesh_sizes(section, 1) is None:
        _fail("distributed.server_devices", section["server_devices"],
              "reserves devices from a trainer mesh: set distributed.mesh (e.g. mesh.fsdp=-1) or run several processes")


def _which(name: str) -> str | None:
    if os.path.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
