"""Every kernel of dot_product_attention against the plain-autodiff reference.

The reference (``implementation="reference"``) is checked against finite differences
(``jax.test_util.check_grads``, float64); every other kernel — the XLA sub-paths,
reached by their threshold arguments, the Pallas TPU kernel in interpret mode, cuDNN on
a GPU — must equal it in output and in gradients, with GQA, key padding from lengths,
causal masks, sliding windows, general masks and rows that see no key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from seqjax.nn.attention import dot_product_attention
from seqjax.nn.attention.dot_product import IMPLEMENTATIONS, KERNELS
from seqjax.nn.masks import padding_mask

B, T, H, G, D = 2, 16, 4, 2, 8  # T = 16: the Pallas kernel's smallest tiling (a multiple of 8)


def _qkv(seed, b=B, q=T, k=T, h=H, g=G, d=D, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((b, q, h, d), (b, k, g, d),
                                                                 (b, k, g, d)))


def _cases():
    """name -> keyword arguments of dot_product_attention (masks as numpy arrays)."""
    rng = np.random.default_rng(7)
    key_pad = np.asarray(padding_mask(jnp.array([11, 0]), T))[:, None, None, :]  # row 1: no key
    general = rng.random((B, 1, T, T)) < 0.6
    general[0, 0, 3] = False  # a query row with no visible key
    return {  # every case has GQA (H = 4 query heads over G = 2 kv heads)
        "lengths": {"mask": key_pad},
        "causal+mask": {"is_causal": True, "mask": general},
        "window+lengths": {"window": 3, "mask": key_pad},
        "bias+mask": {"bias": 0.5 * rng.standard_normal((1, H, T, T)).astype(np.float32),
                      "mask": general},
    }


CASES = _cases()
# (implementation, threshold arguments that force a sub-path, cases it applies to)
VARIANTS = {
    "xla-block": ("xla", {}, None),
    "xla-causal-chunks": ("xla", {"query_chunk": 4}, ("causal+mask", "window+lengths")),
    "xla-scan": ("xla", {"scan_min_keys": 8, "query_chunk": 4}, ("lengths",)),
    "xla-fused-chunks": ("xla", {"fused_rows": 4}, None),
    # (a bias with -inf rows: tests/nn/test_attention.py, at T = 128)
    "pallas": ("pallas", {}, ("lengths", "causal+mask", "window+lengths")),
    "cudnn": ("cudnn", {}, None),
}


def _loss(impl, kw):
    def f(q, k, v):
        return jnp.sum(jnp.sin(dot_product_attention(q, k, v, implementation=impl, **kw)))
    return jax.jit(jax.grad(f, argnums=(0, 1, 2)))


_REFERENCE = {}


def _reference(name):
    """Reference output and gradients of case ``name`` (computed once per session)."""
    if name not in _REFERENCE:
        q, k, v = _qkv(1)
        kw = CASES[name]
        out = dot_product_attention(q, k, v, implementation="reference", **kw)
        _REFERENCE[name] = out, _loss("reference", kw)(q, k, v)
    return _REFERENCE[name]


def _context(impl):
    if impl == "pallas":
        pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
        return pltpu.force_tpu_interpret_mode()
    if impl == "cudnn" and jax.default_backend() != "gpu":
        pytest.skip("cuDNN attention needs a GPU (checked by tests/test_gpu_paths.py)")
    return _nullcontext()


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_every_implementation_is_in_the_table():
    assert set(IMPLEMENTATIONS) == {"auto", *KERNELS}
    assert set(KERNELS) == {v[0] for v in VARIANTS.values()} | {"reference"}


def test_reference_gradients_match_finite_differences():
    # Plain autodiff through the reference (no custom VJP) == central differences in float64,
    # forward and reverse mode, with GQA, a bias, a causal mask and a row that sees no key.
    with jax.enable_x64(True):
        q, k, v = (jnp.asarray(a, jnp.float64) for a in _qkv(3, b=1, q=3, k=4, h=2, g=1, d=3,
                                                              dtype=np.float64))
        mask = np.ones((1, 1, 3, 4), bool)
        mask[..., 1, :] = False  # query 1 sees nothing: zeros, zero gradients
        bias = jnp.asarray(np.random.default_rng(4).standard_normal((1, 2, 3, 4)))
        for kw in ({}, {"is_causal": True, "mask": mask}, {"window": 2}):
            def f(q, k, v, bias, kw=kw):
                return dot_product_attention(q, k, v, bias=bias, implementation="reference",
                                             **kw)
            out = f(q, k, v, bias)
            assert out.dtype == jnp.float64
            check_grads(f, (q, k, v, bias), order=1, modes=("fwd", "rev"), eps=1e-6,
                        atol=1e-6, rtol=1e-6)
        np.testing.assert_array_equal(
            dot_product_attention(q, k, v, mask=mask, implementation="reference")[:, 1], 0.0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_output_and_gradients_equal_the_reference(variant):
    impl, options, only = VARIANTS[variant]
    q, k, v = _qkv(1)
    names = [n for n in CASES if only is None or n in only]
    with _context(impl):
        for name in names:
            kw = {**CASES[name], **options}
            ref_out, ref_grads = _reference(name)
            out = dot_product_attention(q, k, v, implementation=impl, **kw)
            np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5, err_msg=name)
            grads = _loss(impl, kw)(q, k, v)
            for got, want, arg in zip(grads, ref_grads, "qkv"):
                assert np.isfinite(got).all(), (name, arg)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{name}: d{arg}")
            if "mask" in CASES[name] and name != "bias+mask":
                visible = np.broadcast_to(np.asarray(CASES[name]["mask"]), (B, 1, T, T)).any(-1)
                empty = ~visible[:, 0]  # [B, Q]: rows with no visible key are exactly zero
                np.testing.assert_array_equal(np.asarray(out)[empty], 0.0)


def test_threshold_arguments_reach_their_sub_paths():
    q, k, v = _qkv(2)
    jaxpr = lambda **kw: str(jax.make_jaxpr(  # noqa: E731
        lambda q: dot_product_attention(q, k, v, implementation="xla", **kw))(q))
    default = jaxpr(is_causal=True)
    assert default.count("dot_general") == 2 and "scan" not in default  # one block
    assert jaxpr(is_causal=True, query_chunk=4).count("dot_general") == 8  # 4 chunks
    assert "scan" in jaxpr(scan_min_keys=8, query_chunk=4)
    assert "scan" not in jaxpr(scan_min_keys=8, query_chunk=4, is_causal=True)
    assert jaxpr(fused_rows=4).count("dot_general") == 8  # 4 fused forward chunks
    for name in ("query_chunk", "scan_min_keys", "fused_rows"):
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match=f"`{name}` must be a positive int"):
                dot_product_attention(q, k, v, **{name: bad})
    # window: 0 is off (every key), the one spelling of off; None names it
    np.testing.assert_array_equal(dot_product_attention(q, k, v, window=0),
                                  dot_product_attention(q, k, v))
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"`window` of dot_product_attention must be an int"):
            dot_product_attention(q, k, v, window=bad)
    with pytest.raises(TypeError, match="`window=None` of dot_product_attention is spelled "
                                        "`window=0`"):
        dot_product_attention(q, k, v, window=None)
