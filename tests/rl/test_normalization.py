"""NormConfig normalisation: hand-computed cases, variable-size groups, exact zeros, jit, NumPy parity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxwebrl.rl.normalization import NormConfig, normalize
from tests.rl import numpy_reference as ref


def test_leave_one_out_hand_computed():
    cfg = NormConfig(mean_level="group", std_level=None, mean_leave1out=True)
    out = normalize(np.array([1.0, 2.0, 3.0, 4.0]), cfg, group_ids=np.zeros(4, int))
    np.testing.assert_allclose(out, [-2.0, -2.0 / 3.0, 2.0 / 3.0, 2.0], rtol=1e-6)


def test_leave_one_out_singleton_baseline_is_zero():
    cfg = NormConfig(mean_level="group", std_level=None, mean_leave1out=True)
    out = normalize(np.array([1.0, 3.0, 5.0]), cfg, group_ids=np.array([0, 0, 7]))
    np.testing.assert_allclose(out, [-2.0, 2.0, 5.0], rtol=1e-6)


def test_population_vs_sample_std():
    x = np.array([0.0, 2.0])
    pop = normalize(x, NormConfig("batch", "batch", std_unbiased=False, eps=0.0))
    samp = normalize(x, NormConfig("batch", "batch", std_unbiased=True, eps=0.0))
    np.testing.assert_allclose(pop, [-1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(samp, [-1.0 / np.sqrt(2.0), 1.0 / np.sqrt(2.0)], rtol=1e-6)


@pytest.mark.parametrize("value", [0.1, 1.0, 0.3, 7.77])
@pytest.mark.parametrize("leave1out", [False, True])
def test_zero_variance_groups_are_exactly_zero(value, leave1out):
    cfg = NormConfig("group", "group", mean_leave1out=leave1out, std_unbiased=True)
    x = np.array([value, value, value, 0.0, 1.0])
    out = np.asarray(normalize(x, cfg, group_ids=np.array([3, 3, 3, 9, 9])))
    assert np.all(np.isfinite(out))
    assert np.all(out[:3] == 0.0)
    assert out[3] < 0 < out[4]


def test_partially_filtered_group_normalises_within_itself():
    cfg = NormConfig("group", "group", std_unbiased=False, eps=0.0)
    # group 5 lost two of its four members, group 2 is whole: sizes 2 and 4
    x = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    g = np.array([5, 5, 2, 2, 2, 2])
    out = normalize(x, cfg, group_ids=g)
    np.testing.assert_allclose(out, [1, -1, 1, 1, -1, -1], rtol=1e-6)


def test_mask_excludes_elements_from_statistics():
    cfg = NormConfig("batch", "batch", std_unbiased=False, eps=0.0)
    x = np.array([[1.0, 3.0, 100.0]])
    out = normalize(x, cfg, mask=np.array([[1, 1, 0]]))
    np.testing.assert_allclose(out, [[-1.0, 1.0, 0.0]], rtol=1e-6)


def test_group_level_needs_group_ids():
    with pytest.raises(ValueError, match="group_ids"):
        normalize(np.ones(3), NormConfig("group", None))
    with pytest.raises(ValueError, match="mean_level"):
        NormConfig(mean_level="episode")


def test_jit_with_variable_group_sizes_matches_eager():
    cfg = NormConfig("group", "group", std_unbiased=False)
    x = np.array([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
    g = np.array([10, 10, 10, 42, 42, 3, 3])
    f = jax.jit(lambda x, g: normalize(x, cfg, group_ids=g))
    np.testing.assert_allclose(f(x, g), normalize(x, cfg, group_ids=g), rtol=1e-6)


levels = st.sampled_from(["batch", "group", None])


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 11),
    mean_level=levels,
    std_level=levels,
    leave1out=st.booleans(),
    unbiased=st.booleans(),
)
def test_matches_numpy_reference(data, n, mean_level, std_level, leave1out, unbiased):
    if mean_level is None:
        leave1out = False
    x = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -2.0, 3.25]), min_size=n, max_size=n)))
    g = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    cfg = NormConfig(mean_level, std_level, mean_leave1out=leave1out, std_unbiased=unbiased, eps=1e-3)
    pad = 12 - n  # fixed shape (eager op cache hits); padded elements are masked out and must not matter
    got = np.asarray(normalize(np.pad(x, (0, pad), constant_values=99.0), cfg,
                               mask=np.pad(mask, (0, pad)), group_ids=np.pad(g, (0, pad))))
    assert np.all(got[n:] == 0.0)
    got = got[:n]
    want = ref.normalize(x, mask, g, mean_level=mean_level, std_level=std_level, leave1out=leave1out,
                         unbiased=unbiased, eps=1e-3)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_token_level_group_normalisation_uses_all_tokens_of_the_group():
    cfg = NormConfig("group", "group", std_unbiased=False, eps=0.0)
    adv = jnp.array([[1.0, 1.0, 9.0], [3.0, 3.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0]])
    out = normalize(adv, cfg, mask=mask, group_ids=np.array([0, 0]))
    np.testing.assert_allclose(out, [[-1, -1, 0], [1, 1, 0]], rtol=1e-6)
