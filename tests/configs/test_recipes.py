"""Every recipe in configs/ loads in every variant, validates, documents its launch command, and bad values fail."""

import importlib.util
import os

import pytest

from jaxwebrl.train.config_validation import ConfigError, validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py") and f != "common.py")


def load(name, arg=None):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.get_config(arg)


def test_the_family_is_complete():
    expected = {"constT10", "grpo", "raftpp", "drgrpo", "rloo", "gspo", "dapo", "sapo", "cispo", "icepop", "sao"}
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


def test_toy_variant_needs_no_browser(tmp_path):
    _, c = load("constT10", "toy")
    c.env.chromium = "/nonexistent/chromium"
    validate(c, str(tmp_path))
