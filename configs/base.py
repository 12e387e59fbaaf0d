"""The neutral base of every recipe in configs/: every field and its default, and the scales a recipe runs at.

No recipe lives here: the defaults are the decoupled PPO family's shared settings (AReaL's decoupled loss with a
behaviour-weight cap and a dual clip, GRPO group normalisation) with the per-trajectory step normaliser 1/|τ|.
A recipe file (constT10.py, grpo.py, ...) builds on it in its own `get_config(arg)`:

    def get_config(arg=None):
        c = base.config()                         # every field
        base.SCALES[base.variant(arg)](c)         # the scale the variant names (`--config=configs/X.py:variant`)
        c.actor.step_adv_const_length = 10.0      # what makes it that recipe
        return c

Scales (the variant names every recipe takes):

  tiny          (default) tiny random Qwen3-VL policy on the CPU, bundled MiniWoB++ tasks in headless Chromium
  toy           tiny policy on the browser-free toy environment (~4.5 s an update; grpo solves it in ~20 updates)
  qwen3vl_8b    the paper's scale: Qwen3-VL-8B from a local HF directory (--config.model.checkpoint=DIR)
  qwen3vl_2b    the same on Qwen3-VL-2B; qwen2_5vl_7b: on Qwen2.5-VL-7B
  rehearsal     CPU rehearsal at real width: Qwen3-VL-2B widths and vocabulary (random weights, real Qwen
                tokenizer), 2 decoder layers, 2 vision blocks, 1280x720 screenshots, free-form tool-call actions

Every field has a default here, so any of them can be overridden with `--config.a.b=value`; optional fields
are `config_dict.placeholder(type)` (None until set, but still typed and overridable).
"""

import functools

from ml_collections import config_dict

# The Easy MiniWoB++ tasks the tiny default trains on (bench/learning_run_tasks.py measured them; 20 training seeds,
# 5 steps): random clicks on the 10 x 10 grid win 5% / 0% / 15%, the oracle snapped to that grid 100% of each, and
# their targets move with the goal text and the page (3 / 5 / 11 grid cells), so the policy must read both.
TINY_MINIWOB_TASKS = ("miniwob/click-tab", "miniwob/click-dialog", "miniwob/click-dialog-2")


def variant(arg: str | None) -> str:
    """The variant `arg` names (default "tiny"); ValueError naming the known ones otherwise."""
    name = arg or "tiny"
    if name not in SCALES:
        raise ValueError(f"unknown config variant {name!r}: use one of {', '.join(SCALES)} "
                         f"(e.g. --config=configs/constT10.py:tiny)")
    return name


def config() -> config_dict.ConfigDict:
    """Every field of a run config at its default (the tiny CPU scale); a recipe applies a scale and its own
    settings on top."""
    c = config_dict.ConfigDict()
    c.variant = "tiny"
    c.seed = 0
    c.extensions = ""                              # comma-separated modules every process imports first (they
                                                   # register losses, estimators, envs: jaxwebrl/extensions.py)
    c.compilation_cache_dir = "~/.cache/jaxwebrl/xla"   # compiled programs kept across runs (a rerun, a resume,
                                                   # the next seed compiles nothing it compiled before); "": off

    c.model = config_dict.ConfigDict()
    c.model.name = "tiny"                          # "tiny" (random init), "pretrained" (load model.checkpoint) or
                                                   # "random" (model.preset's published shapes, random weights)
    c.model.checkpoint = config_dict.placeholder(str)   # local HF directory with config.json + safetensors
    c.model.preset = config_dict.placeholder(str)  # published shapes (jaxwebrl/models/presets.py): "random" weights,
                                                   # or launch/compile.py's shapes when no checkpoint is given
    c.model.init_params = config_dict.placeholder(str)  # warm start: launch/sft.py's --workdir (or a params/
                                                         # training checkpoint); the run still starts at step 0
    c.model.dtype = "float32"                      # compute dtype
    c.model.param_dtype = config_dict.placeholder(str)  # weight storage dtype (None: model.dtype); "float32" with
                                                   # dtype "bfloat16" = fp32 master weights, bf16 compute
    c.model.remat = "none"                         # rematerialisation policy: "none", "full", "dots", "dots_no_batch"
    c.model.scan_layers = False                    # decoder as one scan over stacked layer params (compile time)
    c.model.attention_chunk = 0                    # queries per attention chunk (0: whole rows at once)
    c.model.logits_chunk = 0                       # vocabulary entries per LM-head chunk in the trainer's log-probs (0: all)
    c.model.num_layers = config_dict.placeholder(int)    # fewer decoder layers than model.preset (rehearsals)
    c.model.vision_depth = config_dict.placeholder(int)  # fewer vision blocks than model.preset
    c.model.max_new_tokens = 48                    # byte-level tiny tokenizer: 'Memory: {}\nAction: click(x, y)'
    c.model.temperature = 1.0
    c.model.top_p = 1.0
    c.model.top_k = 0                              # 0 = no top-k truncation
    c.model.constrained_actions = True             # token mask that admits only well-formed actions (tiny policy)

    c.env = config_dict.ConfigDict()
    c.env.tasks = ",".join(TINY_MINIWOB_TASKS)     # comma-separated env specs: "toy", "miniwob/<task>", JSON paths
    c.env.group_size = 4                           # G: episodes per task instance
    c.env.max_episode_steps = 5                    # horizon per episode
    c.env.screenshot_height = 64
    c.env.screenshot_width = 64
    c.env.prompt_window = 0                        # past rounds kept with their screenshots (K = window + 1)
    c.env.action_style = "call"                    # "call": click(x, y); "tool_call": Qwen3-VL tool calls
    c.env.system_prompt = config_dict.placeholder(str)   # None: the default agent prompt listing the actions
    c.env.step_timeout_s = 30.0
    c.env.chromium = "chromium"                    # binary name or path
    c.env.chromedriver = "chromedriver"
    # The latency regime (jaxwebrl/env/latency.py, docs/env.md): a benchmark regime, off ("local") by default.
    # "web": after every reset and step a page delay ~ lognormal(median, p95) capped at page_delay_max_s (which
    # must leave 5 s of env.step_timeout_s), and Chromium's network conditions (DevTools' "Fast 4G" preset;
    # all three 0: not emulated) for browser envs.
    c.env.latency = config_dict.ConfigDict()
    c.env.latency.regime = "local"                 # "local" (off) or "web"
    c.env.latency.page_delay_median_s = 0.8        # 0: no page delay
    c.env.latency.page_delay_p95_s = 5.0           # the long tail (== median: a constant delay)
    c.env.latency.page_delay_max_s = 20.0          # the cap on one delay
    c.env.latency.network_latency_ms = 165.0       # added round trip of every request
    c.env.latency.download_kbps = 8100.0           # 0: not throttled
    c.env.latency.upload_kbps = 1350.0             # 0: not throttled

    c.rollout = config_dict.ConfigDict()
    c.rollout.mode = "async"                       # "async" (the paper) or "sync" (rollout round, then train;
                                                   # strictly on-policy: η = 0, leftovers dropped as stale)
    c.rollout.num_workers = 2
    c.rollout.launcher = "local"                   # "local": worker processes on this host; "ray": a Ray cluster
    c.rollout.ray_address = config_dict.placeholder(str)        # e.g. "ray://head:10001" (None: local/auto)
    c.rollout.ray_cpus_per_worker = 1.0
    c.rollout.ray_resources = config_dict.placeholder(str)      # JSON, e.g. '{"browser": 1}'
    c.rollout.max_head_offpolicyness = 2           # η: drop episodes with tokens older than version − η
    c.rollout.admission_control = True             # admit a new group only while at most (η + 1) batches are in
                                                   # flight or unconsumed (AReaL's rollout capacity)
    c.rollout.server_max_batch = 8                 # generation requests decoded together
    c.rollout.server_deadline_ms = 0.0             # > 0: wait this long for more requests to fill a batch (0: a
                                                   # batch is what is queued when the server is free)
    c.rollout.decode_chunk = 8                     # decode steps between weight-swap checks
    c.rollout.worker_nice = 0                      # niceness of worker processes and their browsers (0..19)
    c.rollout.worker_cpus = ""                     # "0,1": pin workers and their browsers to these CPUs ("" any)
    c.rollout.fresh_envs_per_group = False         # True: every group starts new browser sessions (the paper's
                                                   # synchronous baseline, WebGym's per-iteration pool; benchmarks)
    c.rollout.host = "127.0.0.1"
    c.rollout.curve = False                        # CurveZMQ-encrypt the policy server's transport (any other host)

    c.buffer = config_dict.ConfigDict()
    c.buffer.path = config_dict.placeholder(str)   # default: WORKDIR/buffer
    c.buffer.capacity_steps = 4096
    c.buffer.max_seq_len = 1024

    c.train = config_dict.ConfigDict()
    c.train.max_steps = 200                        # optimizer updates (train steps) before the run stops
    c.train.consumer_batch_size = 8                # trajectories per train step (= groups × G)
    c.train.ppo_n_minibatches = 2
    c.train.ppo_n_epochs = 3
    c.train.dynamic_sampling = True                # drop groups whose episodes all succeed or all fail
    c.train.rollback_non_finite = True             # keep a copy of the train state during each step so a NaN/inf
                                                   # step is rolled back and its batch skipped (costs one state:
                                                   # at 8B fp32 + AdamW, ~26 GB a chip on v5p-8); False: stop instead
    c.train.lr = 5e-6
    c.train.lr_schedule = "constant"               # "constant" or "cosine"
    c.train.warmup_steps = 0
    c.train.weight_decay = 0.05
    c.train.adam_b1 = 0.9
    c.train.adam_b2 = 0.999
    c.train.adam_eps = 1e-8
    c.train.max_grad_norm = 1.0
    c.train.moments_dtype = config_dict.placeholder(str)   # AdamW moments dtype (None: the params'); "float32" with
                                                   # model.param_dtype "bfloat16" = bf16 weights, fp32 moments
    c.train.idle_sleep_s = 0.05                    # trainer poll interval while the batch fills
    c.train.stop_at_success = config_dict.placeholder(float)   # stop early once the success of every episode
                                                   # read since the previous step (rollout/success_rate_seen)
                                                   # reaches this on 2 steps in a row (None: run to max_steps)
    c.train.stop_at_greedy_success = config_dict.placeholder(float)   # stop early once the greedy policy's success
                                                   # on train.greedy_check_seeds held-out instances of every task,
                                                   # played after every step (eval/greedy_success), reaches this
                                                   # (jaxwebrl/eval/probe.py: a second sampler; for small runs)
    c.train.greedy_check_seeds = 4                 # instances per task of that check (EVAL_SEED_START + 0..n-1:
                                                   # a run stopped on them is selected on them, so report held-out
                                                   # success on other seeds, launch/eval.py --seed_start)

    c.actor = config_dict.ConfigDict()
    c.actor.loss = "ppo"                           # name in jaxwebrl.rl.losses registry
    c.actor.estimator = "grpo"                     # advantage estimator (jaxwebrl.rl.estimators registry); must match
                                                   # reward_norm's levels: grpo group/group, drgrpo group/None, rloo
                                                   # group/None leave-one-out, success_filter and raw None/None
    c.actor.use_decoupled_loss = True              # behaviour weight w = exp(prox − behave)
    c.actor.eps_clip = config_dict.placeholder(float)          # None only for CISPO (unbounded below)
    c.actor.eps_clip = 0.2
    c.actor.eps_clip_higher = config_dict.placeholder(float)   # DAPO asymmetric upper clip
    c.actor.c_clip = config_dict.placeholder(float)            # dual clip, must be > 1 when set
    c.actor.c_clip = 3.0
    c.actor.behav_imp_weight_cap = config_dict.placeholder(float)
    c.actor.behav_imp_weight_cap = 5.0
    c.actor.kl_ctl = 0.0
    c.actor.agg_mode = config_dict.placeholder(str)            # None: the loss's own aggregation (token-mean)
    c.actor.agg_normalizer = config_dict.placeholder(float)    # Dr.GRPO's constant (seq-mean-token-sum-norm); None:
                                                               # the response-token budget model.max_new_tokens
    c.actor.m2_threshold = config_dict.placeholder(float)      # M2PO second-moment bound (e.g. 0.04); None: off
    c.actor.sapo_tau_pos = config_dict.placeholder(float)      # SAPO gate temperatures (None: loss defaults)
    c.actor.sapo_tau_neg = config_dict.placeholder(float)
    c.actor.step_adv_const_length = config_dict.placeholder(float)   # k of 1/k; None → 1/|τ| (constT10: 10)
    c.actor.discount = 1.0
    c.actor.gae_lambda = 1.0
    c.actor.reward_bias = 0.0
    c.actor.reward_scaling = 1.0
    c.actor.reward_clip = 20.0
    c.actor.overlong_tokens = config_dict.placeholder(int)           # DAPO soft overlong penalty window
    c.actor.overlong_penalty_factor = config_dict.placeholder(float)
    c.actor.reward_norm = _norm_config("group", "group")
    c.actor.adv_norm = _norm_config(None, None)

    c.checkpoint = config_dict.ConfigDict()
    c.checkpoint.save_every_steps = 1
    c.checkpoint.keep = 3                          # last K checkpoints
    c.checkpoint.keep_best = True                  # also keep the best by best_metric
    c.checkpoint.best_metric = "rollout/reward"
    c.checkpoint.async_save = True
    c.checkpoint.restore_from = config_dict.placeholder(str)   # another run's checkpoints/ dir to start from

    c.metrics = config_dict.ConfigDict()
    c.metrics.tensorboard = True
    c.metrics.wandb_project = config_dict.placeholder(str)
    c.metrics.wandb_entity = config_dict.placeholder(str)
    c.metrics.progress_bar = True
    c.metrics.sample_episodes_every = 50           # every N train steps, a few trained episodes go to TensorBoard
    c.metrics.sample_episodes = 4                  # (screenshot strip + step texts); 0 = off

    # Multi-host trainer: run launch/train.py once per process with the same flags; unset fields fall back to the
    # JAXWEBRL_* environment (docs/scaling.md). One process and no mesh axis set: the plain one-device trainer.
    c.distributed = config_dict.ConfigDict()
    c.distributed.coordinator_address = config_dict.placeholder(str)   # process 0's "host:port" ($JAXWEBRL_COORDINATOR)
    c.distributed.num_processes = config_dict.placeholder(int)         # $JAXWEBRL_NUM_PROCESSES (unset: 1)
    c.distributed.process_id = config_dict.placeholder(int)            # this process's rank ($JAXWEBRL_PROCESS_ID)
    c.distributed.local_device_ids = config_dict.placeholder(str)      # "0,1,2,3": GPUs this process owns
    c.distributed.local_device_count = config_dict.placeholder(int)    # CPU backend only: fake devices (tests)
    c.distributed.auto = config_dict.placeholder(bool)                 # True: JAX detects TPU slice / SLURM / MPI
    c.distributed.server_devices = 0               # each process's last k local devices kept for the policy server
    c.distributed.mesh = config_dict.ConfigDict()  # trainer mesh; several processes: data = #processes, fsdp = -1
    c.distributed.mesh.data = config_dict.placeholder(int)
    c.distributed.mesh.fsdp = config_dict.placeholder(int)
    c.distributed.mesh.tensor = config_dict.placeholder(int)
    return c


def _norm_config(mean_level, std_level) -> config_dict.ConfigDict:
    """AReaL NormConfig: levels are "group", "batch" or None; the paper's text uses the population std."""
    n = config_dict.ConfigDict()
    n.mean_level = config_dict.placeholder(str)
    n.mean_level = mean_level
    n.std_level = config_dict.placeholder(str)
    n.std_level = std_level
    n.mean_leave1out = False
    n.std_unbiased = False      # the reference code used True; the paper's text states the population std
    n.eps = 1e-5
    return n


# The tiny policy decodes under an action constraint, so a one-line system prompt serves it as well as the full
# action list, at a third of the tokens (the CPU's cost is the sequence length).
TINY_SYSTEM_PROMPT = "You are a web agent. Reply with 'Memory: {...}' then 'Action: click(x, y)' (0-1000 coordinates)."


# The toy goal names the presses, so the toy prompt needs no instructions at all; every token it saves is one the
# tiny policy's attention does not have to look past to find the goal.
TOY_SYSTEM_PROMPT = "Do the task."


def toy(c: config_dict.ConfigDict) -> None:
    """The tiny policy on the browser-free toy environment."""
    c.variant = "toy"
    c.buffer.max_seq_len = 512
    # Measured (grpo, 2-core CPU): from the random tiny policy, sampled success 0.13 -> 0.9 over updates 1-20
    # and 0.95 by 25, ~5 s an update; the greedy policy solves all four instructions by update 12-14. lr 1e-3 learned sooner but swung 0.68 -> 0.1 -> 0.67 -> 0.03; with 8
    # trajectories an update it had not learned after 20 updates.
    c.env.tasks = "toy"
    c.env.system_prompt = TOY_SYSTEM_PROMPT
    c.env.max_episode_steps = 3
    c.rollout.num_workers = 2
    c.train.consumer_batch_size = 32
    c.train.ppo_n_minibatches = 1
    c.train.ppo_n_epochs = 4
    c.train.lr = 3e-4


def tiny(c: config_dict.ConfigDict) -> None:
    """The tiny random policy on the bundled MiniWoB++ tasks (the default)."""
    c.variant = "tiny"
    c.buffer.max_seq_len = 512
    c.env.system_prompt = TINY_SYSTEM_PROMPT
    # Measured on the 2-core CPU under load: 8 trajectories x (2 minibatches x 3 epochs) took 42 s a step and
    # recompiled as the row count wandered over 8..64; 32 trajectories (~80 rows: one 128-row shape) x (1 x 2)
    # take ~45 s, so the trainer uses ~4x the trajectories per minute (the workers make ~60 episodes/min).
    # (Measured with power-of-two row buckets; rows now bucket in quarter octaves, ~80 rows -> 80/96/112/128.)
    # 4 epochs (not 2) per batch: from the SFT warm start, constT10 went 48.3% -> 66.7% held out in 15 updates
    # (~50 s each); with 2 epochs, 10 updates gave +5 points and 30 gave none (README, Results).
    c.train.consumer_batch_size = 32
    c.train.ppo_n_minibatches = 1
    c.train.ppo_n_epochs = 4
    c.train.lr = 3e-4                          # a tiny policy needs a larger step than 8B
    c.env.screenshot_height = 140              # 10 x 8 patches of 14 px (20 image tokens): one patch row per
    c.env.screenshot_width = 112               # click-grid row; 64 x 64 leaves the ViT only 4 tokens
    # Rows are 234-378 tokens (byte-level tokens): attention over them in causal chunks of 128 queries skips the
    # keys after each chunk and keeps the scores in cache. Measured alone on 143-row batches: the update (proximal
    # pass + 4 epochs) took 10.2-11.4 s dense, 7.4-8.3 s chunked; the sampler's prefill 18 -> 20 ms a step.
    c.model.attention_chunk = 128


def paper_scale(c: config_dict.ConfigDict, preset: str) -> None:
    """The paper's scale on the model `preset` names, from a local HF checkpoint (--config.model.checkpoint=DIR)."""
    c.variant = preset
    c.model.name = "pretrained"
    c.model.preset = preset                    # shapes for launch/compile.py until model.checkpoint is set
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"            # fp32 master weights, bf16 compute (launch/compile.py: fits v5p-8)
    c.model.remat = "full"
    c.model.scan_layers = True
    c.model.attention_chunk = 1024
    c.model.logits_chunk = 8192
    c.model.max_new_tokens = 512
    c.model.constrained_actions = False
    c.env.tasks = "miniwob"                    # all bundled MiniWoB++ tasks; JSON specs for WebGym-style sets
    c.env.group_size = 8
    c.env.max_episode_steps = 30
    c.env.screenshot_height = 720
    c.env.screenshot_width = 1280
    c.env.prompt_window = 2
    c.env.action_style = "tool_call"
    c.rollout.num_workers = 64
    c.rollout.server_max_batch = 64
    c.buffer.capacity_steps = 262144
    c.buffer.max_seq_len = 16384
    c.train.consumer_batch_size = 128
    c.train.max_steps = 1000


def rehearsal(c: config_dict.ConfigDict) -> None:
    """The real-width CPU rehearsal (bench/scale.py, tests/launch/test_rehearsal.py)."""
    c.variant = "rehearsal"
    # Real width on the CPU: Qwen3-VL-2B's hidden/heads/MLP/vocabulary and vision patch/merge sizes, 2 decoder
    # layers, 2 vision blocks, random weights with the real Qwen tokenizer, 1280x720 screenshots, unconstrained
    # tool-call actions. Sized for a 2-core, 24 GB machine (bench/scale.py, tests/launch/test_rehearsal.py): bf16
    # weights and AdamW moments (fp32 compute) keep the ~0.5B parameters (311M of them the 151,936 x 2048
    # embedding) and their three copies (recipe, trainer, policy server) near 10 GB all told.
    c.model.name = "random"
    c.model.param_dtype = "bfloat16"
    c.model.preset = "qwen3vl_2b"
    c.model.num_layers = 2
    c.model.scan_layers = True                 # remat under scan: a third of the unrolled train step's memory
    c.model.remat = "full"
    c.model.vision_depth = 2
    c.model.attention_chunk = 512
    c.model.logits_chunk = 8192
    c.model.max_new_tokens = 24
    c.model.constrained_actions = False
    c.env.tasks = "miniwob/click-test"
    c.env.group_size = 2
    c.env.max_episode_steps = 1                # 2 step rows a train step: ~10 GB peak on the CPU
    c.env.screenshot_height = 720
    c.env.screenshot_width = 1280
    c.env.prompt_window = 0
    c.env.action_style = "tool_call"
    c.rollout.num_workers = 1
    c.rollout.server_max_batch = 2
    c.buffer.capacity_steps = 256
    c.buffer.max_seq_len = 1536                # a 1280x720 screenshot is 880 image tokens
    c.train.consumer_batch_size = 2
    c.train.ppo_n_minibatches = 1
    c.train.ppo_n_epochs = 1
    c.train.max_steps = 2
    c.train.dynamic_sampling = False
    c.train.rollback_non_finite = False        # the rollback copy is ~3 GB more here: over a 24 GB machine's budget
    c.checkpoint.async_save = False


SCALES = {"tiny": tiny, "toy": toy,
      "qwen3vl_8b": functools.partial(paper_scale, preset="qwen3vl_8b"),
      "qwen3vl_2b": functools.partial(paper_scale, preset="qwen3vl_2b"),
      "qwen2_5vl_7b": functools.partial(paper_scale, preset="qwen2_5vl_7b"),
      "rehearsal": rehearsal}
