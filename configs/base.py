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
  toy_2b        the toy at Qwen3-VL-2B widths (random weights, real vocabulary, bf16): the loop on an accelerator
  long          the paper's regime at CPU scale: the tiny policy on the chain family (10/20/30-step horizons, held-out
                goals) writing a free, bounded memory every step (`--config=configs/constT10.py:long`)
  qwen3vl_8b    the paper's scale: Qwen3-VL-8B from a local HF directory (--config.model.checkpoint=DIR)
  qwen3vl_2b    the same on Qwen3-VL-2B; qwen2_5vl_7b: on Qwen2.5-VL-7B
  rehearsal     CPU rehearsal at real width: Qwen3-VL-2B widths and vocabulary (random weights, real Qwen
                tokenizer), 2 decoder layers, 2 vision blocks, 1280x720 screenshots, free-form tool-call actions

Every field is declared once, in SCHEMA below: its default, one line of help and the values it allows
(configs/fields.py; `launch/train.py --config=... --print_config_help` lists them). Any field can be overridden
with `--config.a.b=value`; a field declared with a `type` may be None (a typed placeholder, still overridable).
"""

import functools

from ml_collections import config_dict

from configs.fields import Check, Field, above, at_least, between, build, count, flatten, one_of

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


# Every field: its default, one line of help and the values it allows (configs/fields.py). `--print_config_help`
# lists them with the resolved values; jaxwebrl/train/config_validation.py runs these checks, then the ones that
# relate several fields or that another layer owns.
LOSS_KNOB = "jaxwebrl.rl.losses.knob_problem"    # owns the clips', the cap's and the losses' own knobs' ranges
JOIN = "jaxwebrl.parallel.distributed.resolve_settings"  # owns the join settings' ranges (config or JAXWEBRL_*)
KL_ESTIMATOR = "jaxwebrl.rl.kl.estimator_problem"   # the KL estimators' names (configs/ imports no jaxwebrl)
LATENCY = "jaxwebrl.env.latency.LatencyConfig"   # owns env.latency's ranges (and checks them against the timeout)
MODEL_NAMES = ("tiny", "tiny_hd32", "pretrained", "random")
DTYPES = ("float32", "bfloat16")
NORM_LEVELS = ("group", "batch", None)
ATTENTION_KERNELS = ("auto", "xla", "chunked", "cudnn", "splash")   # jaxwebrl.models.attention_kernels.KERNELS
_RATE = between(0, 1, "must be a success rate in (0, 1], or unset to run to max_steps", low_open=True)
_COUNT = count("must be an int >= 0 (0 turns the TensorBoard episode samples off)")
_MESH_SIZE = Check(lambda v: v == -1 or v > 0, "must be a positive size or -1 (all the devices the others leave)")


def _norm(mean_level, std_level) -> dict:
    """AReaL NormConfig: levels are "group", "batch" or None; the paper's text uses the population std."""
    level = one_of(NORM_LEVELS, "use 'group', 'batch' or None")
    return {
        "mean_level": Field(mean_level, "subtract the mean over the 'group' or the 'batch' (None: not centred)",
                            level, type=str),
        "std_level": Field(std_level, "divide by the std over the 'group' or the 'batch' (None: not scaled)",
                           level, type=str),
        "mean_leave1out": Field(False, "the mean of the others in the group/batch (RLOO's leave-one-out baseline)"),
        "std_unbiased": Field(False, "unbiased std (the reference code's); False: the population std (the paper's "
                                     "text)"),
        "eps": Field(1e-5, "added to the std before dividing", above(0, "must be > 0 (e.g. 1e-5)")),
    }


SCHEMA = {
    "variant": Field("tiny", "the scale this config was built at (a name in SCALES: tiny, toy, qwen3vl_8b, ...)"),
    "seed": Field(0, "the run's seed (initial weights, sampling, task instances)",
                  count("must be an int >= 0 (numpy's generators take no negative seed)")),
    "extensions": Field("", "comma-separated modules every process imports first (they register losses, "
                            "estimators, envs: jaxwebrl/extensions.py)"),
    "compilation_cache_dir": Field("~/.cache/jaxwebrl/xla", "compiled programs kept across runs (a rerun, a "
                                   "resume, the next seed compiles nothing it compiled before); '': off"),
    "model": {
        "name": Field("tiny", "'tiny' (random init; 'tiny_hd32': head_dim 32, for vLLM's CPU attention), 'pretrained' "
                              "(load model.checkpoint) or 'random' (model.preset's published shapes, random weights)",
                      one_of(MODEL_NAMES)),
        "checkpoint": Field(None, "local HF directory with config.json + safetensors", type=str),
        "preset": Field(None, "published shapes (jaxwebrl/models/presets.py): 'random' weights, or "
                              "launch/compile.py's shapes when no checkpoint is given", type=str),
        "init_params": Field(None, "warm start: launch/sft.py's --workdir (or a params/training checkpoint); the "
                                   "run still starts at step 0", type=str),
        "dtype": Field("float32", "compute dtype", one_of(DTYPES, "use 'float32' or 'bfloat16'")),
        "param_dtype": Field(None, "weight storage dtype (None: model.dtype); 'float32' with dtype 'bfloat16' = "
                                   "fp32 master weights, bf16 compute",
                             one_of(DTYPES, "use 'float32', 'bfloat16' or None (= model.dtype)"), type=str),
        "remat": Field("none", "rematerialisation policy, least recompute first: 'none', 'minimal', "
                               "'save_dot_except_mlp', 'save_qkv_proj', 'save_out_proj', 'full' (models/layers.py)",
                      checked_by="jaxwebrl.models.layers.remat_problem"),
        "scan_layers": Field(False, "decoder as one scan over stacked layer params (compile time)"),
        "attention_chunk": Field(0, "queries per attention chunk (0: whole rows at once)",
                                 at_least(0, "must be >= 0 (0: no chunking)")),
        "attention_impl": Field("auto", "attention kernel (jaxwebrl/models/attention_kernels.py): 'auto' (GPU cudnn, "
                                        "TPU splash, CPU chunked if attention_chunk > 0 else xla), 'xla', 'chunked', "
                                        "'cudnn', 'splash'", one_of(ATTENTION_KERNELS)),
        "logits_chunk": Field(0, "vocabulary entries per LM-head chunk in the trainer's log-probs (0: all)",
                              at_least(0, "must be >= 0 (0: no chunking)")),
        "num_layers": Field(None, "fewer decoder layers than model.preset (rehearsals)", type=int,
                            checked_by="jaxwebrl.models.presets.preset_config"),
        "vision_depth": Field(None, "fewer vision blocks than model.preset", type=int,
                              checked_by="jaxwebrl.models.presets.preset_config"),
        # 48 fits the byte-level tiny tokenizer's 'Memory: {}\nAction: click(x, y)'.
        "max_new_tokens": Field(48, "response-token budget of a step", at_least(1)),
        "temperature": Field(1.0, "sampling temperature (the trainer's log-probs replay it)",
                             above(0, "must be > 0 (training samples; greedy decoding is for eval only)")),
        "top_p": Field(1.0, "nucleus sampling mass (1: off)", between(0, 1, "must be in (0, 1]", low_open=True)),
        "top_k": Field(0, "top-k truncation (0: none)", at_least(0, "must be >= 0 (0 = no top-k truncation)")),
        "constrained_actions": Field(True, "token mask that admits only well-formed actions (tiny policy)"),
        # Which weights train (jaxwebrl/train/trainable.py): LoRA adapters on a frozen base, a frozen vision tower.
        "lora": {
            "rank": Field(None, "LoRA rank r: adapters on model.lora.target_modules, every other weight frozen "
                                "(None: no LoRA, every weight trains)",
                          Check(lambda v: type(v) is int and v >= 1, "must be an int >= 1 (e.g. 8), or None for no "
                                                                      "LoRA"), type=int),
            "alpha": Field(16.0, "LoRA alpha: the adapters' update is scaled by alpha / rank",
                           above(0, "must be > 0 (e.g. 16)")),
            "target_modules": Field("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                                    "comma-separated decoder projections that get adapters (the known names: "
                                    "jaxwebrl/models/lora_config.py TARGET_MODULES, checked there)",
                                    Check(lambda v: isinstance(v, str) and bool(v.strip(",  ")),
                                          "name at least one projection, e.g. 'q_proj,v_proj'")),
            "base_dtype": Field("bfloat16", "storage dtype of the frozen base weights under LoRA (the adapters: "
                                            "model.param_dtype)", one_of(DTYPES, "use 'float32' or 'bfloat16'")),
        },
        "freeze_vision": Field(False, "train no vision-tower weight (no gradient, no optimizer state); with or "
                                      "without LoRA (LoRA alone already freezes it)"),
    },
    "env": {
        "tasks": Field(",".join(TINY_MINIWOB_TASKS), "comma-separated env specs: 'toy', 'miniwob/<task>', "
                                                     "'chain/<split>', JSON paths, 'webgym:FILE.jsonl', 'sites' "
                                                     "(docs/env.md)"),
        "group_size": Field(4, "G: episodes per task instance",
                            at_least(1, "must be >= 1 episode per task instance")),
        "max_episode_steps": Field(5, "horizon cap: a task plays min(its own horizon, this) steps "
                                      "(1..jaxwebrl.env.tasks.webtask.task_spec.MAX_STEPS; docs/env.md)",
                                   checked_by="jaxwebrl.env.tasks.webtask.task_spec.max_steps_problem"),
        "screenshot_height": Field(64, "screenshot height in pixels",
                                   at_least(8, "screenshots must be at least 8×8")),
        "screenshot_width": Field(64, "screenshot width in pixels", at_least(8, "screenshots must be at least 8×8")),
        "prompt_window": Field(0, "past rounds kept with their screenshots (K = window + 1)",
                               at_least(0, "must be >= 0 past rounds")),
        "action_style": Field("call", "'call': click(x, y); 'tool_call': Qwen3-VL tool calls",
                              one_of(("call", "tool_call"), "use 'call' or 'tool_call'")),
        "system_prompt": Field(None, "None: the default agent prompt listing the actions", type=str),
        "summary_steps": Field(30, "the prompt's summary window: older steps listed one line each (the ones "
                                   "before are only counted)", at_least(0, "must be >= 0 summary lines")),
        # The constrained policy's memory section (jaxwebrl/env/agent/action_space.py): "empty" forces
        # 'Memory: {}'; "free" lets it write a bounded JSON object every step (keys from content and generic
        # words, short values), so memory can grow or shrink under RL. model.max_new_tokens must cover it.
        "memory": Field("empty", "'empty': Memory: {}; 'free': the policy writes a bounded memory every step",
                        one_of(("empty", "free"))),
        "memory_max_keys": Field(3, "free memory: at most this many entries", between(1, 8, "must be in 1..8")),
        "memory_value_chars": Field(6, "free memory: a value's at most this many [a-z0-9] characters",
                                    between(1, 16, "must be in 1..16")),
        "step_timeout_s": Field(30.0, "seconds an env reset or step may take before the worker gives up on it",
                                above(0, "must be > 0 seconds")),
        "browser_memory_mb": Field(2048, "one bound on the resident anonymous memory of all a worker's browsers "
                                         "together (env/browser/memory_bound.py); over it the largest is killed and "
                                         "its episode is a page fault (docs/env.md)",
                                   between(256, 1 << 20, "must be in 256..1048576 MB (an idle MiniWoB++ browser "
                                                         "holds ~250 MB)")),
        "chromium": Field("chromium", "Chromium binary name or path"),
        "chromedriver": Field("chromedriver", "chromedriver binary name or path"),
        # The latency regime (jaxwebrl/env/latency.py, docs/env.md): a benchmark regime, off ("local") by default.
        # "web": after every reset and step a page delay ~ lognormal(median, p95) capped at page_delay_max_s
        # (which must leave 5 s of env.step_timeout_s), and Chromium's network conditions (DevTools' "Fast 4G"
        # preset; all three 0: not emulated) for browser envs. Their ranges are LatencyConfig's (env/latency.py).
        "latency": {
            "regime": Field("local", "'local' (off) or 'web' (page delays and network conditions)"),
            "page_delay_median_s": Field(0.8, "median page delay after a reset or step (0: no page delay)",
                                         checked_by=LATENCY),
            "page_delay_p95_s": Field(5.0, "the page delay's long tail (== median: a constant delay)",
                                      checked_by=LATENCY),
            "page_delay_max_s": Field(20.0, "the cap on one page delay", checked_by=LATENCY),
            "network_latency_ms": Field(165.0, "added round trip of every request", checked_by=LATENCY),
            "download_kbps": Field(8100.0, "download throughput (0: not throttled)", checked_by=LATENCY),
            "upload_kbps": Field(1350.0, "upload throughput (0: not throttled)", checked_by=LATENCY),
        },
        # The judge of WebGym tasks (jaxwebrl/env/tasks/webgym/judge.py, docs/env.md): "ground_truth" (the
        # programmatic answer), "chat" (an OpenAI-compatible endpoint that takes images; its key from the
        # environment variable api_key_env names) or "engine" (the run's own policy server and weights, greedy,
        # the verdict grammar-constrained: rollout/engine_judge.py). A failed or malformed verdict drops the
        # episode as an env failure.
        "judge": {
            "backend": Field("ground_truth", "'ground_truth', 'chat' (an OpenAI-compatible endpoint) or 'engine' "
                                             "(the run's own policy server)",
                             one_of(("ground_truth", "chat", "engine"))),
            "url": Field(None, "chat: the endpoint's base URL, e.g. 'http://127.0.0.1:8000/v1'", type=str),
            "model": Field(None, "chat: the judge model's name at the endpoint", type=str),
            "api_key_env": Field(None, "chat: the environment variable holding the API key (None: no key)",
                                 type=str),
            "timeout_s": Field(60.0, "chat, engine: seconds a verdict may take", above(0, "must be > 0 seconds")),
            "max_screenshots": Field(48, "chat, engine: the episode's last screenshots a verdict is sent (a vLLM "
                                         "server refuses more images than its --limit-mm-per-prompt; the engine's "
                                         "must fit one transport message)",
                                     at_least(1, "must be >= 1")),
            "check_blocked": Field(True, "chat, engine: the judge flags blocked pages (CAPTCHA, access denied: the "
                                         "episode is dropped); False where no page can be blocked (the bundled "
                                         "loopback sites), so a judge's false alarm drops nothing"),
            "retries": Field(2, "chat, engine: retries after a timeout, 429 or 5xx (engine: a lost connection or a "
                                "server error)", at_least(0, "must be >= 0")),
            "backoff_s": Field(1.0, "chat, engine: the first retry's pause (doubled each retry)",
                               at_least(0, "must be >= 0 seconds")),
            "concurrency": Field(8, "chat, engine: verdicts in flight at once per worker process",
                                 at_least(1, "must be >= 1")),
            "rate_per_s": Field(None, "chat, engine: at most this many requests started a second per worker "
                                      "process (None: no limit)", above(0, "must be > 0 requests a second, or None "
                                                                           "for no limit"), type=float),
        },
    },
    "rollout": {
        "mode": Field("async", "'async' (the paper) or 'sync' (rollout round, then train; strictly on-policy: "
                               "η = 0, leftovers dropped as stale)", one_of(("async", "sync"))),
        "num_workers": Field(2, "rollout worker processes", at_least(1, "need at least 1 rollout worker")),
        "launcher": Field("local", "'local': worker processes on this host; 'ray': a Ray cluster",
                          one_of(("local", "ray"))),
        "ray_address": Field(None, "e.g. 'ray://head:10001' (None: local/auto)", type=str),
        "ray_cpus_per_worker": Field(1.0, "CPUs Ray reserves for each worker", above(0, "must be > 0 (e.g. 1.0)")),
        "ray_resources": Field(None, "custom Ray resources of a worker, JSON, e.g. '{\"browser\": 1}'", type=str),
        "max_head_offpolicyness": Field(2, "η: drop episodes with tokens older than version − η",
                                        at_least(0, "the staleness bound η must be >= 0 (0 = on-policy only; the "
                                                    "paper uses 2)")),
        "admission_control": Field(True, "admit a new group only while at most (η + 1) batches are in flight or "
                                         "unconsumed (AReaL's rollout capacity)"),
        "server_max_batch": Field(8, "generation requests decoded together", at_least(1, "must be >= 1")),
        "server_deadline_ms": Field(0.0, "> 0: wait this long for more requests to fill a batch (0: a batch is "
                                         "what is queued when the server is free)",
                                    at_least(0, "must be >= 0 milliseconds")),
        "decode_chunk": Field(8, "decode steps between weight-swap checks", at_least(1, "must be >= 1 decode step")),
        "decode_block": Field(0, "0: a decode step reads every cache slot in one pass; > 0: only the key blocks "
                                 "of that many slots up to the batch's furthest filled one (ragged; "
                                 "models/decode_attention.py says when it pays)",
                              at_least(0, "must be >= 0 (0: dense read)")),
        "continuous_batching": Field(False, "rollout.engine='jax': decode from server_max_batch slots that requests "
                                            "join and leave at every decode chunk (rollout/continuous_server.py), "
                                            "not static batches decoded to their end; off until a GPU measurement "
                                            "says it pays (bench/device_check.py decode, variant continuous)"),
        "serve_dtype": Field(None, "dtype of the weights the policy server decodes from (None: model.dtype, so a "
                                   "bf16 run serves a bf16 copy of its fp32 master weights)",
                             one_of(DTYPES, "use 'float32', 'bfloat16' or None (= model.dtype)"), type=str),
        "worker_nice": Field(0, "niceness of worker processes and their browsers (0..19)",
                             between(0, 19, "must be a niceness in 0..19 (higher: workers yield the CPU)")),
        "worker_cpus": Field("", "'0,1': pin workers and their browsers to these CPUs ('' any)"),
        "fresh_envs_per_group": Field(False, "True: every group starts new browser sessions (the paper's "
                                             "synchronous baseline, WebGym's per-iteration pool; benchmarks)"),
        "engine": Field("jax", "the policy server's generation: 'jax' (this package's sampler) or 'vllm' (a vLLM "
                               "engine process in .ci/install-vllm's venv: continuous batching, prefix caching)",
                        one_of(("jax", "vllm"), "use 'jax' or 'vllm' (run `bash .ci/install-vllm` first)")),
        "engine_tensor_parallel_size": Field(1, "rollout.engine='vllm': devices the engine shards the model over",
                                             at_least(1, "must be >= 1 device")),
        "engine_replicas": Field(1, "rollout.engine='vllm': engine processes behind the one policy server (each "
                                    "request goes to the least loaded; a push goes to all)",
                                 at_least(1, "must be >= 1 engine")),
        "host": Field("127.0.0.1", "the policy server's address"),
        "curve": Field(False, "CurveZMQ-encrypt the policy server's transport (any other host)"),
    },
    "buffer": {
        "path": Field(None, "the ring buffer's directory (None: WORKDIR/buffer)", type=str),
        "capacity_steps": Field(4096, "step rows the ring holds", at_least(1)),
        "max_seq_len": Field(1024, "tokens a step row holds (prompt, screenshots and response)", at_least(1)),
    },
    "train": {
        "max_steps": Field(200, "optimizer updates (train steps) before the run stops", at_least(1)),
        "consumer_batch_size": Field(8, "trajectories per train step (= groups × G)", at_least(1)),
        "ppo_n_minibatches": Field(2, "minibatches each train step's batch splits into", at_least(1)),
        "ppo_n_epochs": Field(3, "passes over each train step's batch", at_least(1)),
        "length_groups": Field(8, "a minibatch's rows, longest first, run in up to this many groups, each padded "
                                  "to its own length bucket (1: every row to the minibatch's longest)", at_least(1)),
        "length_layouts": Field(8, "the most length-group layouts compiled per minibatch shape; a minibatch whose "
                                   "own is not kept runs in a wider kept one (or every row at full width), so "
                                   "varied rows stop recompiling the update (train/length_layouts.py)", at_least(1)),
        "dynamic_sampling": Field(True, "drop groups whose episodes all succeed or all fail"),
        # Guarded inside the jitted update (jaxwebrl/train/update.py): no copy of the train state is kept.
        "rollback_non_finite": Field(True, "skip a minibatch update whose loss or gradient norm is NaN/inf inside "
                                           "the jitted step (weights unchanged; a batch with every update skipped "
                                           "is skipped); False: a NaN/inf step stops the run"),
        "lr": Field(5e-6, "AdamW learning rate", above(0, "the learning rate must be > 0 (the paper uses 5e-6)")),
        "lr_schedule": Field("constant", "'constant' or 'cosine'",
                             checked_by="jaxwebrl.train.update.schedule_problem"),
        "warmup_steps": Field(0, "train steps of linear warm-up", at_least(0)),
        "weight_decay": Field(0.05, "AdamW weight decay", at_least(0, "must be >= 0 (0: none)")),
        "adam_b1": Field(0.9, "AdamW β1", Check(lambda v: 0 <= v < 1, "must be in [0, 1) (e.g. 0.9)")),
        "adam_b2": Field(0.999, "AdamW β2", Check(lambda v: 0 <= v < 1, "must be in [0, 1) (e.g. 0.999)")),
        "adam_eps": Field(1e-8, "AdamW ε", above(0, "must be > 0 (e.g. 1e-8)")),
        "max_grad_norm": Field(1.0, "global gradient-norm clip", above(0, "must be > 0 (e.g. 1.0)")),
        "moments_dtype": Field(None, "AdamW moments dtype (None: the params'); 'float32' with model.param_dtype "
                                     "'bfloat16' = bf16 weights, fp32 moments",
                               one_of(DTYPES, "use 'float32', 'bfloat16' or None (= the params')"), type=str),
        "idle_sleep_s": Field(0.05, "trainer poll interval while the batch fills", above(0, "must be > 0 (e.g. 0.05)")),
        "stop_at_success": Field(None, "stop early once the success of every episode read since the previous step "
                                       "(rollout/success_rate_seen) reaches this on 2 steps in a row (None: run to "
                                       "max_steps)", _RATE, type=float),
        # The greedy check is a second sampler (jaxwebrl/eval/probe.py): for small runs.
        "stop_at_greedy_success": Field(None, "stop early once the greedy policy's success on "
                                              "train.greedy_check_seeds held-out instances of every task, played "
                                              "after every step (eval/greedy_success), reaches this", _RATE,
                                        type=float),
        # A run stopped on these seeds (EVAL_SEED_START + 0..n-1) is selected on them: report held-out success on
        # other seeds (launch/eval.py --seed_start).
        "greedy_check_seeds": Field(4, "instances per task of the greedy check",
                                    at_least(1, "the greedy check needs >= 1 instance a task")),
        "stop_after_unusable_episodes": Field(64, "stop the run, naming the cause, once this many episodes in a row "
                                                  "were all cut (a step > buffer.max_seq_len) or all env-failed "
                                                  "(0: never)", at_least(0, "must be >= 0 episodes (0 = never)")),
        # 128 groups of a policy at 2% success and G = 8 are all uniform by chance with p ~ 1e-9.
        "stop_after_uniform_groups": Field(128, "stop the run, naming the likely cause, once this many groups in a "
                                                "row each got one reward (an evaluator never or always satisfied: "
                                                "no advantage signal; 0: never)",
                                           at_least(0, "must be >= 0 groups (0 = never)")),
    },
    "actor": {
        "loss": Field("ppo", "name in the jaxwebrl.rl.losses registry"),
        "estimator": Field("grpo", "advantage estimator (jaxwebrl.rl.estimators registry); must match "
                                   "reward_norm's levels: grpo group/group, drgrpo and rloo group/None, "
                                   "success_filter and raw None/None"),
        "use_decoupled_loss": Field(True, "behaviour weight w = exp(prox − behave)"),
        # The clips' and the cap's ranges are the losses' own: jaxwebrl.rl.losses.check_clip, run by validation.
        "eps_clip": Field(0.2, "PPO clip ε in (0, 1); None only for CISPO and M2PO (unbounded below)", type=float,
                          checked_by=LOSS_KNOB),
        "eps_clip_higher": Field(None, "DAPO asymmetric upper clip (> 0, >= eps_clip); None: eps_clip", type=float,
                                 checked_by=LOSS_KNOB),
        "c_clip": Field(3.0, "dual clip c > 1 capping the loss at c·|A| for A < 0 (None: off)", type=float,
                        checked_by=LOSS_KNOB),
        "behav_imp_weight_cap": Field(5.0, "drop tokens whose behaviour weight w exceeds this cap > 1 (None: drop "
                                           "none)", type=float, checked_by=LOSS_KNOB),
        # The reference policy (jaxwebrl/train/reference.py): actor.ref_checkpoint, else model.init_params, else
        # the recipe's initial weights; a resume reloads the step WORKDIR/reference.json recorded.
        "kl_ctl": Field(0.0, "KL-to-reference penalty in the reward (AReaL's kl_ctl; > 0 loads the reference)",
                        at_least(0)),
        "kl_estimator": Field("k1", "the reward's KL estimator: 'k1', 'k2' or 'k3' (AReaL's kl_estimator)",
                              checked_by=KL_ESTIMATOR),
        "kl_loss_coef": Field(0.0, "KL-to-reference term in the loss (veRL's use_kl_loss; > 0 loads the reference)",
                              at_least(0)),
        "kl_loss_estimator": Field("k3", "the loss term's KL estimator: 'k1', 'k2' or 'k3' (veRL's low_var_kl = k3)",
                                   checked_by=KL_ESTIMATOR),
        "ref_checkpoint": Field(None, "the reference policy: a run's workdir or checkpoints/ dir (its latest step at "
                                      "the start) or a params dir; None: model.init_params, else the recipe's "
                                      "initial weights", type=str),
        "ref_dtype": Field(None, "the reference's weight dtype (None: the params'; 'bfloat16' halves fp32)",
                           one_of(DTYPES, "use 'float32', 'bfloat16' or None (= the params')"), type=str),
        "ref_offload": Field(False, "hold the reference in pinned host memory, on the devices only for its pass"),
        "agg_mode": Field(None, "None: the loss's own aggregation (token-mean); else one of "
                                "jaxwebrl.rl.aggregation.AGG_MODES", type=str),
        "agg_normalizer": Field(None, "Dr.GRPO's constant (seq-mean-token-sum-norm); None: the response-token "
                                      "budget model.max_new_tokens",
                                above(0, "must be > 0 or None (the response-token budget)"), type=float),
        "m2_threshold": Field(None, "M2PO second-moment bound > 0 (e.g. 0.04); None: off", type=float,
                              checked_by=LOSS_KNOB),
        "sapo_tau_pos": Field(None, "SAPO gate temperature for A > 0 (> 0; None: the loss's default)", type=float,
                              checked_by=LOSS_KNOB),
        "sapo_tau_neg": Field(None, "SAPO gate temperature for A < 0 (> 0; None: the loss's default)", type=float,
                              checked_by=LOSS_KNOB),
        "step_adv_const_length": Field(None, "k of the step normaliser 1/k (> 0); None → 1/|τ| (constT10: 10)",
                                       type=float, checked_by="jaxwebrl.rl.advantages.check_const_length"),
        "discount": Field(1.0, "γ in (0, 1]", between(0, 1, "need 0 < discount <= 1", low_open=True)),
        "gae_lambda": Field(1.0, "GAE λ in [0, 1]", between(0, 1, "need 0 <= gae_lambda <= 1")),
        "gae_lambda_fn": Field(None, "per-row λ from the row's length instead of gae_lambda: 'vapo_length_adaptive' "
                                     "or 'relative_position' (jaxwebrl/rl/gae.py)", type=str),
        "gae_lambda_kwargs": Field("", "gae_lambda_fn's arguments as JSON: '{\"alpha\": 0.05}' (vapo) or "
                                       "'{\"q\": 0.5}' (relative_position); '': none"),
        "gae_timestep_unit": Field("token", "GAE's time step: 'token' (each policy token) or 'turn' (each response "
                                            "of a step row, its tokens share one advantage; V at its first token)",
                                   one_of(("token", "turn"), "use 'token' or 'turn'")),
        "max_turns": Field(1, "turns a step row holds at most (turn GAE's static bound; a step row holds one "
                              "response)", at_least(1, "must be >= 1 turn a row")),
        "reward_bias": Field(0.0, "added to every reward before scaling",
                             any_value="a shift of every reward: any real number moves the baseline, not the sign "
                                       "of an advantage"),
        "reward_scaling": Field(1.0, "rewards are multiplied by this",
                                above(0, "must be > 0 (0 erases the reward; < 0 rewards failure)")),
        "reward_clip": Field(20.0, "rewards are clipped to ± this", above(0, "must be > 0 (rewards clip to ± this)")),
        "overlong_tokens": Field(None, "DAPO soft overlong penalty window (0 < it <= model.max_new_tokens)", type=int,
                                 checked_by="jaxwebrl.rl.advantages.check_overlong"),
        "overlong_penalty_factor": Field(None, "DAPO overlong penalty at the full window", type=float,
                                         checked_by="jaxwebrl.rl.advantages.check_overlong"),
        "reward_norm": _norm("group", "group"),
        "adv_norm": _norm(None, None),
    },
    # Critic PPO (configs/ppo.py): a value head on a copy of the policy's trunk (jaxwebrl/train/critic.py), trained
    # with its own AdamW next to the policy and saved in the same checkpoint; actor.estimator 'gae' needs it.
    "critic": {
        "enabled": Field(False, "train a value model; GAE reads its values (actor.estimator 'gae', 'ppo' or 'raw')"),
        "lr": Field(1e-5, "the critic's AdamW learning rate (schedule, betas, decay and clip: train.*'s)",
                    above(0, "the critic's learning rate must be > 0")),
        "value_eps_clip": Field(0.2, "AReaL's value clip: V moves at most this far from its value before the step "
                                     "(None: no clip)", above(0, "must be > 0 (AReaL: 0.2) or None"), type=float),
        "value_loss_coef": Field(1.0, "scales the value loss (its own AdamW: matters through train.max_grad_norm)",
                                 above(0, "must be > 0 (e.g. 1.0)")),
    },
    "checkpoint": {
        "save_every_steps": Field(1, "train steps between checkpoints", at_least(1)),
        "keep": Field(3, "last K checkpoints kept", at_least(1, "keep at least the last checkpoint (>= 1)")),
        "keep_best": Field(True, "also keep the best by checkpoint.best_metric"),
        "best_metric": Field("rollout/reward", "the metric that names the best checkpoint"),
        "async_save": Field(True, "write checkpoints in the background"),
        "restore_from": Field(None, "another run's checkpoints/ dir to start from", type=str),
    },
    "metrics": {
        "tensorboard": Field(True, "write TensorBoard event files"),
        "wandb_project": Field(None, "log to this Weights & Biases project (None: off)", type=str),
        "wandb_entity": Field(None, "the Weights & Biases entity", type=str),
        "progress_bar": Field(True, "a progress bar on the console"),
        "sample_episodes_every": Field(50, "every N train steps, a few trained episodes go to TensorBoard "
                                           "(screenshot strip + step texts); 0 = off", _COUNT),
        "sample_episodes": Field(4, "episodes in each such sample; 0 = off", _COUNT),
    },
    # Multi-host trainer: run launch/train.py once per process with the same flags; unset fields fall back to the
    # JAXWEBRL_* environment (docs/scaling.md). One process and no mesh axis set: the plain one-device trainer.
    "distributed": {
        "coordinator_address": Field(None, "process 0's 'host:port' ($JAXWEBRL_COORDINATOR)", type=str),
        "num_processes": Field(None, "$JAXWEBRL_NUM_PROCESSES (unset: 1)", type=int, checked_by=JOIN),
        "process_id": Field(None, "this process's rank ($JAXWEBRL_PROCESS_ID)", type=int, checked_by=JOIN),
        "local_device_ids": Field(None, "'0,1,2,3': GPUs this process owns", type=str),
        "local_device_count": Field(None, "CPU backend only: fake devices (tests)", type=int, checked_by=JOIN),
        "auto": Field(None, "True: JAX detects TPU slice / SLURM / MPI", type=bool),
        "server_devices": Field(0, "each process's last k local devices kept for the policy server",
                                at_least(0, "must be >= 0 (0: the server shares a device)")),
        # The trainer mesh; several processes: data = #processes, fsdp = -1.
        "mesh": {axis: Field(None, f"trainer mesh size of the {axis!r} axis (-1: the devices the others leave)",
                             _MESH_SIZE, type=int) for axis in ("data", "fsdp", "tensor")},
    },
}
FIELDS = flatten(SCHEMA)


def config() -> config_dict.ConfigDict:
    """Every field of a run config at its default (the tiny CPU scale); a recipe applies a scale and its own
    settings on top."""
    return build(SCHEMA)


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
    # 2 length groups: toy rows are short, and 8 groups only compiled a larger update (step_fn 22.6 s against 13.5,
    # the proximal log-probs 6.4 against 4.0, in cold GRPO toy runs) for no faster steps (5.6 s against 5.2):
    # house/length_groups_toy_runs.json
    c.train.length_groups = 2


def toy_2b(c: config_dict.ConfigDict) -> None:
    """The browser-free toy at Qwen3-VL-2B widths (random weights, the real Qwen vocabulary, bf16 compute): the
    whole loop on one accelerator with no Chromium, as bench/device_loop.sh runs it."""
    toy(c)
    c.variant = "toy_2b"
    c.model.name = "random"
    c.model.preset = "qwen3vl_2b"
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"            # fp32 master weights, bf16 compute, as the paper scale
    c.model.remat = "full"
    c.model.scan_layers = True
    c.model.logits_chunk = 8192
    c.rollout.num_workers = 8                  # the toy steps in microseconds: the policy server is the work
    c.rollout.server_max_batch = 64
    c.train.consumer_batch_size = 64
    c.train.lr = 5e-6


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
    # (~50 s each); with 2 epochs, 10 updates gave +5 points and 30 gave none (docs/learning.md).
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
    # 4 length groups: on a fixed 143-row batch (rows of 100-291 tokens) the update took 4.1-4.2 s with 4 groups and
    # 4.1-5.8 s with 8, 4.9-6.4 s with 2 and 9.6-10.1 s with 1, and each compiled layout cost ~23 s with 4 groups
    # against ~46 s with 8 (a run compiles up to train.length_layouts of them): house/length_groups_update_ab.json
    c.train.length_groups = 4


# The cue variant on the fixed layout: the strip shows the colour to press next, the buttons keep their places.
# Measured warm starts of the tiny policy (held-out success, 20 goals a split): shuffled buttons 0-3%, fixed
# plain (the agent counts its presses) 7%, fixed cue 5% / 90% after 150 / 600 SFT steps (bench/ablation.py).
LONG_TASKS = "chain/easy-cue?layout=fixed,chain/medium-cue?layout=fixed,chain/hard-cue?layout=fixed"


def long(c: config_dict.ConfigDict) -> None:
    """The paper's regime at CPU scale: the tiny policy on the long-horizon chain family (horizons 10/20/30 around
    k = 10, failures that run to the horizon, held-out goals) writing a free, bounded memory every step."""
    tiny(c)
    c.variant = "long"
    c.env.tasks = LONG_TASKS                   # traps off: failures run long ("&trap=1" each: failures stop early)
    c.env.max_episode_steps = 30               # the cap; each chain split plays its own horizon (10/20/30)
    c.env.memory = "free"                      # at most 3 entries of 6-character values: <= 69 characters
    c.env.summary_steps = 4                    # the last 4 older steps listed, earlier ones only counted: the
                                               # memory is what carries progress past them
    c.model.max_new_tokens = 112               # 'Memory: {<= 69 chars}\nAction: click(x, y)' + the end token
    c.buffer.max_seq_len = 640
    c.train.consumer_batch_size = 16           # 4 groups of 4: episodes run up to 30 steps, so an update's
                                               # rollouts take ~3x the tiny default's at half the trajectories


def webgym(c: config_dict.ConfigDict) -> None:
    """The tiny policy on the bundled offline sites: WebGym-format tasks (training split) in Chromium, answered
    with `answer(...)`, scored by the ground-truth judge (env.judge). Its grammar adds each task's reference answer
    to the click grid, so the tiny policy chooses among the run's answers (docs/env.md)."""
    tiny(c)
    c.variant = "webgym"
    c.env.tasks = "sites?split=train"
    c.env.system_prompt = ("You are a web agent. Reply with 'Memory: {...}' then 'Action: click(x, y)' (0-1000 "
                           "coordinates) or 'Action: answer(\"text\")' when you know the answer.")
    c.env.max_episode_steps = 10               # easy tasks' horizon; medium and hard ones play 10 of their 20/30
    c.env.screenshot_height = 168              # the 1024 x 768 pages at 4:3 (12 x 9 patches of 14 px)
    c.env.screenshot_width = 224
    c.env.judge.check_blocked = False          # loopback pages cannot be blocked: a judge's flag is a false alarm
    c.train.dynamic_sampling = False           # a random policy's groups are mostly all-failure: keep them
    c.train.consumer_batch_size = 8
    c.buffer.max_seq_len = 1024


def paper_scale(c: config_dict.ConfigDict, preset: str) -> None:
    """The paper's scale on the model `preset` names, from a local HF checkpoint (--config.model.checkpoint=DIR)."""
    c.variant = preset
    c.model.name = "pretrained"
    c.model.preset = preset                    # shapes for launch/compile.py until model.checkpoint is set
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"            # fp32 master weights, bf16 compute (launch/compile.py: fits v5p-8)
    c.model.remat = "full"                     # the least memory; launch/compile.py --fit_remat names the least
                                               # recompute that fits a slice (not yet run at these shapes)
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
    c.train.rollback_non_finite = False        # measured without the in-jit guard, whose select adds temporaries
    c.checkpoint.async_save = False


SCALES = {"tiny": tiny, "toy": toy, "toy_2b": toy_2b, "long": long, "webgym": webgym,
      "qwen3vl_8b": functools.partial(paper_scale, preset="qwen3vl_8b"),
      "qwen3vl_2b": functools.partial(paper_scale, preset="qwen3vl_2b"),
      "qwen2_5vl_7b": functools.partial(paper_scale, preset="qwen2_5vl_7b"),
      "rehearsal": rehearsal}
