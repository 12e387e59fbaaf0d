"""The attention kernel chosen per backend, the cuDNN custom calls found in compiled HLO, the splash kernel (run in
Pallas' interpreter here) against the dense masked kernel, and the splash path compiled for a TPU slice (libtpu)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.attention import attend, attend_unmasked, causal_mask
from jaxwebrl.models.attention_kernels import (config_kernel, cudnn_attention_calls, select_attention_kernel,
                                               splash_attention)
from jaxwebrl.models.layers import masked_attention
from jaxwebrl.parallel.topology import libtpu_available

BF16, F32 = jnp.bfloat16, jnp.float32


@pytest.mark.parametrize("requested, backend, dtype, chunk, chosen", [
    ("auto", "gpu", BF16, 0, "cudnn"),
    ("auto", "gpu", jnp.float16, 1024, "cudnn"),
    ("auto", "gpu", F32, 0, "xla"),          # cuDNN flash attention has no fp32: XLA
    ("auto", "gpu", F32, 512, "chunked"),
    ("auto", "tpu", BF16, 0, "splash"),
    ("auto", "tpu", F32, 1024, "splash"),
    ("auto", "cpu", F32, 0, "xla"),
    ("auto", "cpu", BF16, 128, "chunked"),   # the CPU keeps its chunks
    ("xla", "gpu", BF16, 1024, "xla"),
    ("chunked", "tpu", BF16, 256, "chunked"),
    ("cudnn", "gpu", BF16, 0, "cudnn"),
    ("splash", "tpu", F32, 0, "splash"),
])
def test_the_kernel_chosen_per_backend(requested, backend, dtype, chunk, chosen):
    assert select_attention_kernel(requested, backend, dtype=dtype, chunk=chunk) == chosen


@pytest.mark.parametrize("requested, backend, dtype, chunk, message", [
    ("cudnn", "cpu", BF16, 0, r"attention_impl='cudnn' needs a GPU, the backend is 'cpu': use 'auto'"),
    ("cudnn", "tpu", BF16, 0, r"needs a GPU"),
    ("cudnn", "gpu", F32, 0, r"computes in bf16/fp16, the model computes in float32: set model.dtype=bfloat16"),
    ("splash", "gpu", BF16, 0, r"attention_impl='splash' needs a TPU, the backend is 'gpu'"),
    ("chunked", "cpu", F32, 0, r"needs model.attention_chunk > 0"),
    ("fused", "gpu", BF16, 0, r"attention_impl='fused': use one of auto, xla, chunked, cudnn, splash"),
])
def test_a_kernel_that_cannot_run_there_is_refused_in_one_line(requested, backend, dtype, chunk, message):
    with pytest.raises(ValueError, match=message) as err:
        select_attention_kernel(requested, backend, dtype=dtype, chunk=chunk)
    assert "\n" not in str(err.value)


def test_a_configs_kernel_is_resolved_for_this_backend_or_a_named_one():
    from jaxwebrl.models.config import tiny_config

    config = tiny_config()
    assert config.attention_impl == "auto"
    assert config_kernel(config) == config_kernel(config, jax.default_backend()) == "xla"      # this CPU
    assert config_kernel(config.replace(attention_chunk=64)) == "chunked"
    assert config_kernel(config.replace(dtype="bfloat16"), "gpu") == "cudnn"
    assert config_kernel(config, "tpu") == "splash"


# The fused-attention custom calls of a GPU train step, as XLA prints them in `compiled.as_text()` (lines of the
# form JAX's own cuDNN tests assert on; backend configs shortened).
GPU_HLO = """
  custom-call.7 = (bf16[4,4,1024,64]{3,1,2,0}, f32[4,4,1024]{2,1,0}, u8[0]{0}) custom-call(Arg_0.1, Arg_1.2, \
Arg_2.3, broadcast.6, broadcast.6), custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={}, \
api_version=API_VERSION_STATUS_RETURNING, backend_config={"cudnn_fmha_backend_config": {"mask_type": "PADDING_CAUSAL"}}
  custom-call.9 = (bf16[4,1024,4,64]{3,2,1,0}, bf16[4,1024,4,64]{3,2,1,0}, bf16[4,1024,4,64]{3,2,1,0}, u8[0]{0}) \
custom-call(p0, p1, p2, p3, p4, p5), custom_call_target="__cudnn$fmhaSoftmaxBackward", operand_layout_constraints={}
  fusion.2 = f32[4,4,1024]{2,1,0} fusion(custom-call.7), kind=kLoop, calls=fused_computation.2
  cublas-gemm.1 = (bf16[1024,2048]{1,0}, s8[4194304]{0}) custom-call(p6, p7), custom_call_target="__cublas$gemm"
"""


def test_the_cudnn_custom_calls_are_counted_in_compiled_hlo():
    assert cudnn_attention_calls(GPU_HLO) == {"forward": 1, "backward": 1}
    assert cudnn_attention_calls(GPU_HLO.replace("fmha", "gemm")) == {"forward": 0, "backward": 0}
    # a real compiled program of the XLA kernel (this CPU) holds none
    q = jnp.ones((1, 8, 2, 8), F32)
    compiled = jax.jit(jax.grad(lambda q_: attend(q_, q_, q_, causal_mask(jnp.ones((1, 8), bool)), 0.3, 0, "xla")
                                .sum())).lower(q).compile()
    assert cudnn_attention_calls(compiled.as_text()) == {"forward": 0, "backward": 0}


def test_the_device_check_flags_a_cudnn_run_without_the_custom_call():
    from bench.device_check import attention_kernel_check

    assert attention_kernel_check("cudnn", cudnn_attention_calls(GPU_HLO))["attention_kernel_ok"]
    assert not attention_kernel_check("cudnn", {"forward": 1, "backward": 0})["attention_kernel_ok"]
    assert attention_kernel_check("xla", {"forward": 0, "backward": 0})["attention_kernel_ok"]


@pytest.mark.parametrize("kind, chip", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("Tesla T4", None)])
def test_the_device_check_predicts_with_the_local_gpus_own_numbers(monkeypatch, kind, chip):
    """An H100's decode roofline is at its 3.35 TB/s, not the H200's 4.8; a GPU with no numbers is refused."""
    import types

    from bench.device_check import chip_of
    from jaxwebrl.parallel.topology import CHIPS

    monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(platform="gpu", device_kind=kind)])
    if chip is None:
        with pytest.raises(SystemExit, match="Tesla T4.*--chip"):
            chip_of(None)
    else:
        assert chip_of(None) is CHIPS[chip]
    assert chip_of("v5p") is CHIPS["v5p"]


@pytest.mark.parametrize("key", ["h100", "h200"])
def test_the_device_checks_remat_fit_is_the_committed_fit_for_the_chip(key):
    """`--remat=fit` takes the policy and rows that `launch/compile.py --fit_remat` chose for that chip (an H100's 80
    GB fit fewer rows than an H200's 141), for the old and new paths alike; a named policy and `--rows` pass
    through; a chip with no fit is refused by name."""
    import json
    import types

    from bench.device_check import FIT_RECORD, train_shape
    from jaxwebrl.parallel.topology import CHIPS

    with open(FIT_RECORD.format(chip=key)) as f:
        fit = next(r for r in map(json.loads, f) if r["program"] == "remat_fit")
    assert fit["topology"] == f"{key}-1" and fit["chip"] == CHIPS[key].name and fit["choice"]

    def shape(**args):
        return train_shape(types.SimpleNamespace(**{"chip": key, "remat": "fit", "rows": None, **args}))

    assert shape() == (fit["choice"], fit["rows"])
    assert shape(remat="full") == ("full", fit["rows"]) and shape(rows=2) == (fit["choice"], 2)
    assert (shape(chip="h100")[1], shape(chip="h200")[1]) == (4, 8)
    with pytest.raises(SystemExit, match="no fitting policy for TPU v5e"):
        shape(chip="v5e")


def test_splash_equals_the_masked_kernel_on_padded_packed_and_unmasked_rows():
    """The splash kernel in Pallas' interpreter: causal rows of two packed sequences (segment ids) with right
    padding and with left padding, and unmasked rows (a batch of images); T = 150 is padded to 256 inside.
    Outputs and gradients of real tokens equal the dense masked kernel's."""
    rng = np.random.default_rng(0)
    b, t, h, kv, d = 2, 150, 2, 1, 16
    q, k, v = (jnp.asarray(rng.standard_normal((b, t, n, d)), F32) for n in (h, kv, kv))
    real = np.ones((b, t), bool)
    real[0, 97:] = False                                     # right padding
    real[1, :20] = False                                     # left padding
    segment_ids = jnp.asarray(np.where(np.arange(t) < 60, 1, 2)[None].repeat(b, 0), jnp.int32)
    mask = causal_mask(jnp.asarray(real), segment_ids)
    keep = jnp.asarray(real)[:, :, None, None]

    def splash_text(q_, k_, v_):
        return splash_attention(q_, k_, v_, 0.25, causal=True, key_valid=mask.key_valid, segment_ids=segment_ids,
                                interpret=True) * keep

    def dense_text(q_, k_, v_):
        return masked_attention(q_, k_, v_, mask.dense(0, t), 0.25) * keep

    def splash_images(q_, k_, v_):
        return splash_attention(q_, k_, v_, 0.25, causal=False, interpret=True)

    def dense_images(q_, k_, v_):
        return attend_unmasked(q_, k_, v_, 0.25, 0, "xla")

    for fast, reference in ((splash_text, dense_text), (splash_images, dense_images)):
        np.testing.assert_allclose(np.asarray(fast(q, k, v)), np.asarray(reference(q, k, v)), atol=2e-6)
        loss = lambda f: (lambda *xs: (f(*xs) ** 2).sum())
        for a, r in zip(jax.grad(loss(fast), (0, 1, 2))(q, k, v), jax.grad(loss(reference), (0, 1, 2))(q, k, v)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=2e-5)


@pytest.mark.skipif(not libtpu_available(), reason='libtpu is not installed here: pip install -e ".[tpu]"')
def test_splash_compiles_for_a_tpu_slice_sharded_over_its_rows():
    """The text (causal, padded, packed) and image (unmasked) paths on kernel "auto", resolved for a v5e-4 slice's
    compile-only devices as the AOT report resolves it, compile with XLA's TPU compiler (libtpu, no TPU): one
    Pallas call per kernel pass (forward, dq, dkv), rows split over the mesh and never gathered."""
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxwebrl.models.config import tiny_config
    from jaxwebrl.parallel.mesh import make_mesh
    from jaxwebrl.parallel.topology import topology_devices
    from jaxwebrl.train.aot import with_attention_kernel

    devices, _ = topology_devices("v5e-4")
    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 1}, devices)
    kernel = with_attention_kernel(tiny_config().replace(dtype="bfloat16"), mesh).attention_impl
    assert kernel == "splash"
    b, t, h, kv, d = 4, 200, 4, 2, 64                      # the Qwen3-VL-2B vision head_dim; T padded to 256
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)

    def loss(q, k, v, real, segment_ids):
        text = attend(q, k, v, causal_mask(real, segment_ids), 0.125, 0, kernel)
        images = attend_unmasked(q, k, v, 0.125, 0, kernel)
        return (text.astype(F32) ** 2).sum() + (images.astype(F32) ** 2).sum()

    with jax.set_mesh(mesh):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
            spec((b, t, h, d), BF16), spec((b, t, kv, d), BF16), spec((b, t, kv, d), BF16), spec((b, t), bool),
            spec((b, t), jnp.int32)).compile()
    text = compiled.as_text()
    assert text.count('custom_call_target="tpu_custom_call"') == 6       # 2 paths x (forward, dq, dkv)
    assert "all-gather" not in text
