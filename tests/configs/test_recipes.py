"""Every recipe in configs/ loads in every variant, validates, documents its launch command, and bad values fail."""

import importlib.util
import os

import pytest

from jaxwebrl.train import rl_config
from jaxwebrl.train.config_validation import ConfigError, validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "configs"))
                 if f.endswith(".py") and f not in ("base.py", "fields.py", "__init__.py"))


def load(name, arg=None):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.get_config(arg)


def test_the_family_is_complete():
    expected = {"constT10", "grpo", "raftpp", "drgrpo", "rloo", "gspo", "dapo", "sapo", "cispo", "icepop", "sao", "m2po"}
    assert expected <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_variants_validate_and_document_their_launch(name, tmp_path):
    module, config = load(name)
    assert config.variant == "tiny"
    validate(config, str(tmp_path))
    validate(load(name, "toy")[1], str(tmp_path))
    assert f"launch/train.py --config=configs/{name}.py" in module.__doc__
    real = load(name, "qwen3vl_8b")[1]
    with pytest.raises(ConfigError, match=r"^model\.checkpoint=None: .*--config\.model\.checkpoint="):
        validate(real, str(tmp_path))
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    real.model.checkpoint = str(hf_dir)
    validate(real, str(tmp_path))


def test_constT10_is_the_paper_recipe():
    _, c = load("constT10", "qwen3vl_8b")
    assert (c.env.group_size, c.train.consumer_batch_size, c.rollout.max_head_offpolicyness) == (8, 128, 2)
    assert (c.train.lr, c.actor.kl_ctl, c.actor.c_clip, c.actor.behav_imp_weight_cap) == (5e-6, 0.0, 3.0, 5.0)
    assert (c.train.ppo_n_minibatches, c.train.ppo_n_epochs) == (2, 3)
    assert c.actor.use_decoupled_loss and c.actor.step_adv_const_length == 10.0
    assert (c.actor.reward_norm.mean_level, c.actor.reward_norm.std_level) == ("group", "group")
    assert c.actor.reward_norm.std_unbiased is False
    assert load("grpo")[1].actor.step_adv_const_length is None


def test_only_constT10_sets_k_and_the_base_is_no_recipe():
    """configs/base.py is neutral (1/|τ|); constT10.py is the one recipe file that sets k = 10."""
    from configs import base

    assert base.config().actor.step_adv_const_length is None
    for name in RECIPES:
        with open(os.path.join(REPO, "configs", f"{name}.py")) as f:
            sets_k = "c.actor.step_adv_const_length" in f.read()
        assert sets_k == (name == "constT10"), name
        assert (load(name)[1].actor.step_adv_const_length == 10.0) == (name == "constT10"), name


def test_every_recipe_takes_every_scale_variant():
    from configs import base

    for name in RECIPES:
        for variant in base.SCALES:
            assert load(name, variant)[1].variant == variant, (name, variant)
    with pytest.raises(ValueError, match="unknown config variant 'nope': use one of tiny, toy"):
        load("grpo", "nope")


@pytest.mark.parametrize("key, value, message", [
    ("actor.c_clip", 0.5, r"^actor\.c_clip=0\.5: the dual clip must be > 1"),
    ("actor.c_clip", 1.0, r"^actor\.c_clip=1\.0: "),
    ("actor.eps_clip", 1.5, r"^actor\.eps_clip=1\.5: "),
    ("actor.loss", "nosuchloss", r"^actor\.loss='nosuchloss': not a registered loss"),
    ("actor.reward_norm.std_level", "episode", r"^actor\.reward_norm\.std_level='episode': use 'group'"),
    ("train.consumer_batch_size", 10, r"^train\.consumer_batch_size=10: must be a multiple of env\.group_size=4"),
    ("rollout.mode", "semi", r"^rollout\.mode='semi': use one of"),
    ("rollout.max_head_offpolicyness", -1, r"^rollout\.max_head_offpolicyness=-1: "),
    ("env.tasks", "miniwob/no-such-task", r"^env\.tasks='miniwob/no-such-task': unknown MiniWoB"),
    ("env.chromium", "/nonexistent/chromium", r"^env\.chromium='/nonexistent/chromium': Chromium not found: apt-get install"),
    ("env.chromedriver", "no-such-chromedriver", r"^env\.chromedriver=.*apt-get install -y chromium-driver"),
    ("checkpoint.restore_from", "/nonexistent/ckpts", r"^checkpoint\.restore_from='/nonexistent/ckpts': checkpoint directory not found"),
    ("model.name", "pretrained", r"^model\.checkpoint=None: name a local HF directory"),
    ("actor.estimator", "drgrpo", r"^actor\.estimator='drgrpo' implies reward_norm mean_level='group', std_level=None"),
    ("actor.estimator", "vtrace", r"^actor\.estimator='vtrace' is not an advantage estimator: use one of"),
    ("actor.reward_norm.mean_leave1out", True, r"^actor\.estimator='grpo' implies .*change one to match"),
    ("actor.agg_normalizer", 48.0, r"^actor\.agg_normalizer=48\.0: loss 'ppo' does not use it"),
    ("actor.eps_clip", None, r"^actor\.eps_clip=None: only CISPO and M2PO"),
    ("actor.m2_threshold", -1.0, r"^actor\.m2_threshold=-1\.0: must be > 0"),
    ("model.top_k", -1, r"^model\.top_k=-1: must be >= 0"),
    ("model.attention_impl", "flash", r"^model\.attention_impl='flash': use one of"),
    ("model.attention_impl", "cudnn", r"^model\.attention_impl='cudnn': cuDNN flash attention computes in bf16"),
    ("env.latency.regime", "Web", r"^env\.latency\.regime='Web': use 'local' \(off\) or 'web'"),
    ("rollout.worker_nice", 25, r"^rollout\.worker_nice=25: must be a niceness in 0\.\.19"),
    ("rollout.worker_cpus", "0,x", r"^rollout\.worker_cpus='0,x': must be comma-separated CPU ids"),
    ("env.latency.page_delay_p95_s", 0.5, r"^env\.latency\.page_delay_p95_s=0\.5: must be >= page_delay_median_s"),
    ("env.latency.page_delay_max_s", 4.0, r"^env\.latency\.page_delay_max_s=4\.0: must be above page_delay_p95_s"),
    ("env.latency.download_kbps", -1.0, r"^env\.latency\.download_kbps=-1\.0: must be a finite number >= 0"),
])
def test_bad_values_fail_in_one_line_naming_the_key(key, value, message, tmp_path):
    _, c = load("constT10")
    section, _, field = key.rpartition(".")
    node = c
    for part in section.split("."):
        node = node[part]
    node[field] = value
    with pytest.raises(ConfigError, match=message) as err:
        validate(c, str(tmp_path))
    assert "\n" not in str(err.value)


def test_sapo_refuses_the_decoupled_loss(tmp_path):
    _, c = load("sapo")
    validate(c, str(tmp_path))
    c.actor.use_decoupled_loss = True
    with pytest.raises(ConfigError, match=r"^actor\.use_decoupled_loss=True: sapo .*=False$"):
        validate(c, str(tmp_path))


def test_web_latency_regime_validates_and_its_cap_must_fit_the_step_timeout(tmp_path):
    _, c = load("constT10", "toy")
    c.env.latency.regime = "web"
    validate(c, str(tmp_path))   # the defaults: 20 s cap + 5 s headroom within the 30 s step timeout
    c.env.step_timeout_s = 20.0
    with pytest.raises(ConfigError, match=r"^env\.latency\.page_delay_max_s=20\.0: .*env\.step_timeout_s=20\.0\): "
                                          r"raise env\.step_timeout_s to at least 25") as err:
        validate(c, str(tmp_path))
    assert "\n" not in str(err.value)
    c.env.latency.regime = "local"   # off: the cap is not used, the short timeout is fine
    validate(c, str(tmp_path))


def test_toy_variant_needs_no_browser(tmp_path):
    _, c = load("constT10", "toy")
    c.env.chromium = "/nonexistent/chromium"
    validate(c, str(tmp_path))


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_names_its_estimator(name):
    """The estimator is stated in the recipe file itself (not inherited silently) and agrees with reward_norm."""
    with open(os.path.join(REPO, "configs", f"{name}.py")) as f:
        assert "c.actor.estimator = " in f.read()
    _, c = load(name)
    assert rl_config.advantage_config(c.actor, max_new_tokens=c.model.max_new_tokens).estimator == c.actor.estimator


def test_estimators_of_the_recipes():
    named = {name: load(name)[1].actor.estimator for name in ("constT10", "grpo", "drgrpo", "rloo", "raftpp", "m2po")}
    assert named == {"constT10": "grpo", "grpo": "grpo", "drgrpo": "drgrpo", "rloo": "rloo",
                     "raftpp": "success_filter", "m2po": "grpo"}


def test_drgrpo_normaliser_defaults_to_the_response_budget():
    _, c = load("drgrpo", "qwen3vl_8b")
    assert dict(rl_config.loss_kwargs(c.actor, max_new_tokens=c.model.max_new_tokens))["agg_normalizer"] == 512.0
    c.actor.agg_normalizer = 256.0
    assert dict(rl_config.loss_kwargs(c.actor, max_new_tokens=512))["agg_normalizer"] == 256.0
    assert "agg_normalizer" not in dict(rl_config.loss_kwargs(load("grpo")[1].actor, max_new_tokens=48))


def test_m2po_recipe_binds_the_threshold_and_no_clip():
    _, c = load("m2po")
    kwargs = dict(rl_config.loss_kwargs(c.actor, max_new_tokens=48))
    assert kwargs["m2_threshold"] == 0.04 and "eps_clip" not in kwargs and "c_clip" not in kwargs
