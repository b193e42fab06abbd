"""Audio Spectrogram Transformer (Bishop §12.4.3; Gong et al. 2021): patches, shapes, the
``<class>`` path, and that it is ViT on the patch grid."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models import AST, AST_PRESETS, ASTConfig, ViT, patch_grid, patchify, vit_block
from seqjax.models.ast import spectrogram_patches
from seqjax.utils import count_params

SMALL = dict(
    num_frames=12,
    num_mel_bins=8,
    patch_size=4,
    patch_stride=(4, 2),
    num_classes=3,
    num_layers=1,
    embed_dim=16,
    block=vit_block(2, mlp_dim=32),
)


def _numpy_patches(x_BxFxTxC, pf, pt, sf, st):
    b, f, t, c = x_BxFxTxC.shape
    nf, nt = 1 + (f - pf) // sf, 1 + (t - pt) // st
    out = np.zeros((b, nf, nt, pf * pt * c), x_BxFxTxC.dtype)
    for i in range(nf):
        for j in range(nt):
            out[:, i, j] = x_BxFxTxC[:, i * sf : i * sf + pf, j * st : j * st + pt].reshape(b, -1)
    return out


@pytest.mark.parametrize("pf,pt,sf,st", [(4, 4, 4, 4), (4, 4, 2, 3), (2, 3, 1, 2), (8, 2, 3, 2)])
def test_patches_match_a_numpy_loop(pf, pt, sf, st):
    x = np.random.default_rng(0).standard_normal((2, 10, 13, 1)).astype(np.float32)
    got = np.asarray(spectrogram_patches(jnp.asarray(x), (pf, pt), (sf, st)))
    np.testing.assert_array_equal(got, _numpy_patches(x, pf, pt, sf, st))


def test_non_overlapping_patches_are_vit_patchify():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 12, 3)), jnp.float32)
    got = spectrogram_patches(x, 4)
    np.testing.assert_array_equal(np.asarray(got.reshape(2, 6, 48)), np.asarray(patchify(x, 4)))


def test_patch_grid_of_the_paper_and_the_book():
    # Gong et al. 2021: 128 × 1024 fbank, 16 × 16 patches, stride 10 -> 12 × 101 = 1212
    assert patch_grid((128, 1024), 16, 10) == (12, 101)
    # Bishop §12.4.3: each flattened patch has length 256 (= 16 · 16 · 1 channel)
    x = jnp.zeros((1, 128, 1024, 1))
    assert spectrogram_patches(x, 16, 10).shape == (1, 12, 101, 256)


def test_shapes_and_logits():
    cfg = ASTConfig(**SMALL)
    model = AST(cfg)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 12, 8)), jnp.float32)
    v = model.init(jax.random.PRNGKey(0), x)
    p = v["params"]["vit"]
    assert cfg.grid == (2, 5)
    assert p["patch_embed"]["kernel"].shape == (16, 16)  # [P_F P_T, D]
    assert p["cls_token"].shape == (1, 1, 16)
    assert p["pos_embed"]["embedding"].shape == (2 * 5 + 1, 16)  # N + <class>
    logits = model.apply(v, x)
    assert logits.shape == (3, 3) and logits.dtype == jnp.float32
    probs = jax.nn.softmax(logits)
    np.testing.assert_allclose(np.asarray(probs.sum(-1)), 1.0, rtol=1e-6)


def test_ast_is_vit_on_the_patch_grid():
    """The equation of the module docstring: AST(S) = ViT(patches of Sᵀ as an N_F × N_T
    image of P_F·P_T channels, 1 × 1 patches), with the same parameters."""
    cfg = ASTConfig(**{**SMALL, "num_classes": 0})
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 12, 8)), jnp.float32)
    v = AST(cfg).init(jax.random.PRNGKey(1), x)
    grid = _numpy_patches(np.asarray(x).transpose(0, 2, 1)[..., None], 4, 4, 4, 2)
    want = ViT(cfg.vit_config()).apply({"params": v["params"]["vit"]}, jnp.asarray(grid))
    np.testing.assert_allclose(np.asarray(AST(cfg).apply(v, x)), np.asarray(want), rtol=1e-6)


def test_class_token_path():
    """The logits read the <class> output only: patches reach them through attention, the
    <class> token's own value moves them, and without it the model mean-pools."""
    cfg = ASTConfig(**SMALL)
    model = AST(cfg)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 12, 8)), jnp.float32)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    head = params["vit"]["head"]
    rng = np.random.default_rng(5)
    params = jax.tree_util.tree_map(lambda a: a, params)
    params["vit"]["head"] = {
        "kernel": jnp.asarray(rng.standard_normal(head["kernel"].shape), jnp.float32),
        "bias": head["bias"],
    }
    base = model.apply({"params": params}, x)
    # (a random change: a uniform shift of every feature would be removed by the norms)
    bump = jnp.asarray(rng.standard_normal(params["vit"]["cls_token"].shape), jnp.float32)
    moved = dict(params["vit"], cls_token=params["vit"]["cls_token"] + bump)
    assert not np.allclose(np.asarray(model.apply({"params": {"vit": moved}}, x)), np.asarray(base))
    # the class output depends on the whole spectrogram: the gradient reaches every frame
    g = jax.grad(lambda s: model.apply({"params": params}, s)[0, 0])(x)
    assert bool((jnp.abs(g[0]).sum(-1) > 0).all())
    pooled = AST(cfg.replace(class_token=False))
    vp = pooled.init(jax.random.PRNGKey(0), x)["params"]
    assert "cls_token" not in vp["vit"] and vp["vit"]["pos_embed"]["embedding"].shape[0] == 10


def test_presets():
    for name, want_grid in (("ast-base", (12, 101)), ("ast-tiny", (12, 101))):
        cfg = AST_PRESETS[name]
        assert cfg.grid == want_grid
    shapes = jax.eval_shape(
        AST.from_preset("ast-tiny").init,
        jax.random.PRNGKey(0),
        jax.ShapeDtypeStruct((1, 1024, 128), jnp.float32),
    )
    # DeiT-Ti encoder (5.5M) + 1213 positions × 192 + 256 × 192 patch embedding + 527 classes
    assert count_params(shapes["params"]) == 5_722_895
    with pytest.raises(ValueError, match="unknown preset"):
        AST.from_preset("ast-huge")


def test_bad_inputs():
    model = AST(ASTConfig(**SMALL))
    x = jnp.zeros((2, 12, 8))
    v = model.init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match=r"`spectrogram` must have shape \[B, num_frames=12"):
        model.apply(v, jnp.zeros((2, 8, 12)))
    with pytest.raises(ValueError, match="`spectrogram` must have rank 3"):
        model.apply(v, jnp.zeros((2, 12, 8, 1)))
    with pytest.raises(ValueError, match="`patch_size`"):
        ASTConfig(**{**SMALL, "patch_size": 16})
    with pytest.raises(ValueError, match="`patch_stride` must be a positive int"):
        ASTConfig(**{**SMALL, "patch_stride": 0})
