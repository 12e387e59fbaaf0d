"""Check a run's ConfigDict before any browser, process or device work starts.

Every problem becomes one `ConfigError` whose message is a single line naming the key (or file) and the fix,
e.g. `actor.c_clip=0.5: the dual clip must be > 1 (e.g. 3.0) or None to disable it`. The config's extension
modules (`extensions`) are imported first, so the losses, estimators and envs they register are known.
"""

from __future__ import annotations

import os
import shutil

from ml_collections import config_dict

from jaxwebrl.checkpoint.layout import holds_params
from jaxwebrl.env.latency import LatencyConfig
from jaxwebrl.env.registry import check_env_spec, env_specs, needs_browser
from jaxwebrl.env.tasks.task_spec import MAX_STEPS, TaskSpecError
from jaxwebrl.extensions import import_extensions
from jaxwebrl.models import presets
from jaxwebrl.models.layers import REMAT_POLICIES
from jaxwebrl.parallel import distributed, multihost
from jaxwebrl.rl import aggregation, losses
from jaxwebrl.rollout.spec import cpu_ids
from jaxwebrl.train import rl_config

MODES = ("async", "sync")
LAUNCHERS = ("local", "ray")
MODEL_NAMES = ("tiny", "pretrained", "random")
NORM_LEVELS = ("group", "batch", None)
LR_SCHEDULES = ("constant", "cosine")
# Losses whose objective is built on the plain (coupled) ratio and must not be reweighted by w.
COUPLED_ONLY_LOSSES = ("sapo",)


class ConfigError(ValueError):
    """A bad config value; the message is one line that names the key and the fix."""


def validate(config: config_dict.ConfigDict, workdir: str | None = None) -> None:
    """Raise ConfigError on the first problem found; return None when the config can run."""
    try:
        import_extensions(config.get("extensions"))
    except ImportError as err:
        raise ConfigError(_one_line(err)) from None
    _check_rollout(config)
    _check_train(config)
    _check_actor(config)
    _check_model(config)
    _check_env(config)
    _check_paths(config, workdir)
    _check_distributed(config)


def _fail(key: str, value, fix: str) -> None:
    raise ConfigError(f"{key}={value!r}: {fix}")


def _check_rollout(c) -> None:
    r = c.rollout
    if r.mode not in MODES:
        _fail("rollout.mode", r.mode, f"use one of {MODES}")
    if r.launcher not in LAUNCHERS:
        _fail("rollout.launcher", r.launcher, f"use one of {LAUNCHERS}")
    if r.launcher == "ray":
        try:
            import ray  # noqa: F401  (deferred: optional dependency; only checks it is installed)
        except ImportError:
            _fail("rollout.launcher", "ray", "Ray is not installed: pip install 'jaxwebrl[ray]', or use 'local'")
    if r.num_workers < 1:
        _fail("rollout.num_workers", r.num_workers, "need at least 1 rollout worker")
    if r.max_head_offpolicyness < 0:
        _fail("rollout.max_head_offpolicyness", r.max_head_offpolicyness,
              "the staleness bound η must be >= 0 (0 = on-policy only; the paper uses 2)")
    if r.server_max_batch < 1:
        _fail("rollout.server_max_batch", r.server_max_batch, "must be >= 1")
    if r.server_deadline_ms < 0:
        _fail("rollout.server_deadline_ms", r.server_deadline_ms, "must be >= 0 milliseconds")
    if not 0 <= r.worker_nice <= 19:
        _fail("rollout.worker_nice", r.worker_nice, "must be a niceness in 0..19 (higher: workers yield the CPU)")
    try:
        cpus = cpu_ids(r.worker_cpus)
    except ValueError:
        cpus = [-1]
    if any(c not in os.sched_getaffinity(0) for c in cpus):
        _fail("rollout.worker_cpus", r.worker_cpus, f"must be comma-separated CPU ids of this host "
              f"({sorted(os.sched_getaffinity(0))}), or empty for any")
    if r.decode_chunk < 1:
        _fail("rollout.decode_chunk", r.decode_chunk, "must be >= 1 decode step")


def _check_train(c) -> None:
    t, g = c.train, c.env.group_size
    for key in ("max_steps", "consumer_batch_size", "ppo_n_minibatches", "ppo_n_epochs"):
        if getattr(t, key) < 1:
            _fail(f"train.{key}", getattr(t, key), "must be >= 1")
    if g < 1:
        _fail("env.group_size", g, "must be >= 1 episode per task instance")
    if t.consumer_batch_size % g:
        _fail("train.consumer_batch_size", t.consumer_batch_size,
              f"must be a multiple of env.group_size={g} (whole groups are trained together)")
    if not t.lr > 0:
        _fail("train.lr", t.lr, "the learning rate must be > 0 (the paper uses 5e-6)")
    if t.lr_schedule not in LR_SCHEDULES:
        _fail("train.lr_schedule", t.lr_schedule, f"use one of {LR_SCHEDULES}")
    if t.warmup_steps < 0:
        _fail("train.warmup_steps", t.warmup_steps, "must be >= 0")
    if t.max_grad_norm is not None and not t.max_grad_norm > 0:
        _fail("train.max_grad_norm", t.max_grad_norm, "must be > 0 (e.g. 1.0)")
    target = t.get("stop_at_success")
    if target is not None and not 0 < target <= 1:
        _fail("train.stop_at_success", target, "must be a success rate in (0, 1], or unset to run to max_steps")
    greedy = t.get("stop_at_greedy_success")
    if greedy is not None and not 0 < greedy <= 1:
        _fail("train.stop_at_greedy_success", greedy, "must be a success rate in (0, 1], or unset to run to max_steps")
    if greedy is not None and not t.get("greedy_check_seeds", 0) >= 1:
        _fail("train.greedy_check_seeds", t.get("greedy_check_seeds"), "the greedy check needs >= 1 instance a task")
    if c.checkpoint.keep < 1:
        _fail("checkpoint.keep", c.checkpoint.keep, "keep at least the last checkpoint (>= 1)")
    if c.checkpoint.save_every_steps < 1:
        _fail("checkpoint.save_every_steps", c.checkpoint.save_every_steps, "must be >= 1")


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
    if a.eps_clip is not None and not 0 < a.eps_clip < 1:
        _fail("actor.eps_clip", a.eps_clip, "the PPO clip must be in (0, 1), e.g. 0.2")
    if a.eps_clip_higher is not None and a.eps_clip is not None and a.eps_clip_higher < a.eps_clip:
        _fail("actor.eps_clip_higher", a.eps_clip_higher, f"must be >= actor.eps_clip={a.eps_clip} (DAPO: 0.28)")
    if a.c_clip is not None and not a.c_clip > 1:
        _fail("actor.c_clip", a.c_clip, "the dual clip must be > 1 (e.g. 3.0) or None to disable it")
    if a.behav_imp_weight_cap is not None and not a.behav_imp_weight_cap > 1:
        _fail("actor.behav_imp_weight_cap", a.behav_imp_weight_cap, "the behaviour-weight cap must be > 1 (e.g. 5.0) or None")
    if a.behav_imp_weight_cap is not None and not a.use_decoupled_loss:
        _fail("actor.behav_imp_weight_cap", a.behav_imp_weight_cap,
              "the cap applies to the decoupled loss only: set it to None or use_decoupled_loss=True")
    ignored = rl_config.ignored_knobs(a)
    if ignored:
        _fail(f"actor.{ignored[0]}", a[ignored[0]], f"loss {a.loss!r} does not use it: set it to None")
    if a.agg_mode is not None and a.agg_mode not in aggregation.AGG_MODES:
        _fail("actor.agg_mode", a.agg_mode, f"use one of {aggregation.AGG_MODES} or None")
    for key in ("agg_normalizer", "m2_threshold"):
        if a[key] is not None and not a[key] > 0:
            _fail(f"actor.{key}", a[key], "must be > 0 or None (agg_normalizer: the response-token budget; "
                  "m2_threshold: e.g. 0.04)")
    if a.kl_ctl < 0:
        _fail("actor.kl_ctl", a.kl_ctl, "must be >= 0")
    if not (0 < a.discount <= 1 and 0 <= a.gae_lambda <= 1):
        _fail("actor.discount", (a.discount, a.gae_lambda), "need 0 < discount <= 1 and 0 <= gae_lambda <= 1")
    for name in ("reward_norm", "adv_norm"):
        n = a[name]
        for level in ("mean_level", "std_level"):
            if n[level] not in NORM_LEVELS:
                _fail(f"actor.{name}.{level}", n[level], "use 'group', 'batch' or None")
        if n.mean_leave1out and n.mean_level is None:
            _fail(f"actor.{name}.mean_leave1out", True, f"leave-one-out needs actor.{name}.mean_level set")
        if not n.eps > 0:
            _fail(f"actor.{name}.eps", n.eps, "must be > 0 (e.g. 1e-5)")
    try:
        rl_config.estimator_name(a)
    except ValueError as err:
        raise ConfigError(_one_line(err)) from None
    try:   # the advantage path's own checks (step_adv_const_length k > 0, the overlong penalty's fields)
        rl_config.advantage_config(a, max_new_tokens=c.model.max_new_tokens)
    except ValueError as err:
        raise ConfigError(f"actor.{_one_line(err)}") from None
    if c.env.group_size < 2 and "group" in (a.reward_norm.mean_level, a.reward_norm.std_level):
        _fail("env.group_size", c.env.group_size, "group reward normalisation needs G >= 2 episodes per group")


def _check_model(c) -> None:
    m = c.model
    if m.name not in MODEL_NAMES:
        _fail("model.name", m.name, f"use one of {MODEL_NAMES}")
    if m.dtype not in ("float32", "bfloat16"):
        _fail("model.dtype", m.dtype, "use 'float32' or 'bfloat16'")
    for key in ("param_dtype",):
        if m.get(key) not in (None, "float32", "bfloat16"):
            _fail(f"model.{key}", m.get(key), "use 'float32', 'bfloat16' or None (= model.dtype)")
    if c.train.get("moments_dtype") not in (None, "float32", "bfloat16"):
        _fail("train.moments_dtype", c.train.get("moments_dtype"), "use 'float32', 'bfloat16' or None (= the params')")
    if m.get("remat", "none") not in REMAT_POLICIES:
        _fail("model.remat", m.get("remat"), f"use one of {', '.join(REMAT_POLICIES)}")
    for key in ("attention_chunk", "logits_chunk"):
        if int(m.get(key) or 0) < 0:
            _fail(f"model.{key}", m.get(key), "must be >= 0 (0: no chunking)")
    if m.get("preset") is not None and m.preset not in presets.PUBLISHED:
        _fail("model.preset", m.preset, f"use one of {', '.join(presets.PUBLISHED)}")
    if m.name == "random" and m.get("preset") is None:
        _fail("model.preset", None, f"model.name='random' needs a preset: one of {', '.join(presets.PUBLISHED)}")
    if m.max_new_tokens < 1:
        _fail("model.max_new_tokens", m.max_new_tokens, "must be >= 1")
    if not m.temperature > 0:
        _fail("model.temperature", m.temperature, "must be > 0 (training samples; greedy decoding is for eval only)")
    if not 0 < m.top_p <= 1:
        _fail("model.top_p", m.top_p, "must be in (0, 1]")
    if m.top_k < 0:
        _fail("model.top_k", m.top_k, "must be >= 0 (0 = no top-k truncation)")
    if m.name == "pretrained":
        if m.checkpoint is None:
            _fail("model.checkpoint", None, "name a local HF directory: --config.model.checkpoint=/path/to/Qwen3-VL-8B")
        if not os.path.isdir(m.checkpoint):
            _fail("model.checkpoint", m.checkpoint, "directory not found: give an existing local HF checkpoint directory")
        if not os.path.isfile(os.path.join(m.checkpoint, "config.json")):
            _fail("model.checkpoint", m.checkpoint, "no config.json inside: point at the HF model directory itself")


def _check_env(c) -> None:
    e = c.env
    try:
        specs = env_specs(e.tasks)   # a .jsonl task set or a directory is read here
    except TaskSpecError as err:
        raise ConfigError(f"env.tasks: {_one_line(err)}") from None
    if not specs:
        _fail("env.tasks", e.tasks, "name at least one env spec, e.g. 'toy' or 'miniwob/click-test'")
    for spec in specs:   # every key, type, range, regex and start URL of a JSON spec; its evaluator is not imported
        try:
            check_env_spec(spec)
        except TaskSpecError as err:   # names the spec file itself
            raise ConfigError(f"env.tasks: {_one_line(err)}") from None
        except (ValueError, TypeError) as err:
            raise ConfigError(f"env.tasks={spec!r}: {_one_line(err)}") from None
    if not 1 <= e.max_episode_steps <= MAX_STEPS:
        _fail("env.max_episode_steps", e.max_episode_steps, f"must be in 1..{MAX_STEPS}")
    if e.prompt_window < 0:
        _fail("env.prompt_window", e.prompt_window, "must be >= 0 past rounds")
    if e.action_style not in ("call", "tool_call"):
        _fail("env.action_style", e.action_style, "use 'call' or 'tool_call'")
    if e.screenshot_height < 8 or e.screenshot_width < 8:
        _fail("env.screenshot_height", (e.screenshot_height, e.screenshot_width), "screenshots must be at least 8×8")
    _check_latency(e)
    if needs_browser(specs):
        if _which(e.chromium) is None:
            _fail("env.chromium", e.chromium, "Chromium not found: apt-get install -y chromium (or set the path)")
        if _which(e.chromedriver) is None:
            _fail("env.chromedriver", e.chromedriver, "chromedriver not found: apt-get install -y chromium-driver")


def _check_latency(e) -> None:
    """env.latency (the benchmark's latency regime; absent in configs older than it): its ranges, and in "web"
    a page delay cap that leaves room in env.step_timeout_s."""
    if e.get("latency") is None:
        return
    try:
        LatencyConfig.from_dict(e.latency.to_dict()).check_step_timeout(e.step_timeout_s)
    except ValueError as err:   # "field=value: fix"
        raise ConfigError(f"env.latency.{_one_line(err)}") from None


def _check_paths(c, workdir) -> None:
    if workdir is not None and os.path.exists(workdir) and not os.path.isdir(workdir):
        _fail("--workdir", workdir, "exists and is not a directory: choose a directory path")
    cache = c.get("compilation_cache_dir")
    if cache is not None and not isinstance(cache, str):
        _fail("compilation_cache_dir", cache, "give a directory path, or '' to turn the compilation cache off")
    if cache and os.path.exists(os.path.expanduser(cache)) and not os.path.isdir(os.path.expanduser(cache)):
        _fail("compilation_cache_dir", cache, "exists and is not a directory: give a directory path, or '' (off)")
    init = c.model.get("init_params")
    if init is not None and not holds_params(init):
        _fail("model.init_params", init, "no params checkpoint (jaxwebrl_params.json) or training checkpoint "
              "(<step>/state) there: give launch/sft.py's --workdir or a run's checkpoints/ dir")
    ckpt = c.checkpoint.restore_from
    if ckpt is not None and not os.path.isdir(ckpt):
        _fail("checkpoint.restore_from", ckpt, "checkpoint directory not found: give an existing checkpoints/ dir")
    for key in ("sample_episodes_every", "sample_episodes"):
        value = c.metrics.get(key, 0)
        if type(value) is not int or value < 0:
            _fail(f"metrics.{key}", value, "must be an int >= 0 (0 turns the TensorBoard episode samples off)")
    if c.metrics.wandb_project is not None:
        try:
            import wandb  # noqa: F401  (deferred: optional dependency; only checks it is installed)
        except ImportError:
            _fail("metrics.wandb_project", c.metrics.wandb_project, "wandb is not installed: pip install wandb, or unset it")


def _check_distributed(c) -> None:
    """Join settings as `distributed.initialize` will resolve them (config, then JAXWEBRL_* environment), and
    the trainer mesh; nothing is joined here."""
    if "distributed" not in c:
        return
    section = c.distributed.to_dict()
    try:
        settings = distributed.resolve_settings(multihost.initialize_settings(section))
    except ValueError as err:
        raise ConfigError(_one_line(err)) from None
    if section["server_devices"] < 0:
        _fail("distributed.server_devices", section["server_devices"], "must be >= 0 (0: the server shares a device)")
    for axis, size in section["mesh"].items():
        if size is not None and (size == 0 or size < -1):
            _fail(f"distributed.mesh.{axis}", size, "must be a positive size or -1 (all the devices the others leave)")
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
