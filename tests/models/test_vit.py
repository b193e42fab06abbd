"""Vision transformer (Bishop §12.4.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models.vit import ViT, ViTConfig, num_patches, patchify, unpatchify, vit_block
from seqjax.train.losses import token_cross_entropy
from seqjax.utils import count_params
from tests.models.helpers import accuracy, fit, np_init


@pytest.mark.parametrize("h,w,c,p", [(8, 8, 3, 4), (6, 10, 1, 2), (28, 28, 1, 7)])
def test_patchify_roundtrip_and_reference(h, w, c, p):
    x = np.random.default_rng(0).standard_normal((2, h, w, c)).astype(np.float32)
    patches = patchify(jnp.asarray(x), p)
    n = h * w // p**2  # Bishop §12.4.1
    assert patches.shape == (2, n, p * p * c) and num_patches((h, w), p) == n
    np.testing.assert_array_equal(unpatchify(patches, p, (h, w)), x)
    # Reference: patch n = (row i, column j) in raster order, flattened (row, col, channel).
    i, j = 1, w // p - 1
    np.testing.assert_array_equal(patches[:, i * (w // p) + j],
                                  x[:, i * p:(i + 1) * p, j * p:(j + 1) * p].reshape(2, -1))
    bad = next(q for q in range(2, 30) if h % q or w % q)
    with pytest.raises(ValueError, match="patch_size"):
        patchify(jnp.asarray(x), bad)


def test_token_count_and_parameters():
    """N = HW/P² patches (+1 <class> token); ViT-B/16 has 86,567,656 parameters."""
    def shapes(cfg):
        return jax.eval_shape(ViT(cfg).init, jax.random.PRNGKey(0),
                              jnp.zeros((1, *((cfg.image_size,) * 2), cfg.channels)))["params"]

    base = shapes(ViTConfig())
    assert base["pos_embed"]["embedding"].shape == (224 * 224 // 16**2 + 1, 768)
    assert count_params(base) == 86_567_656
    small = ViTConfig(image_size=8, patch_size=2, channels=1, num_classes=0, num_layers=1,
                      embed_dim=8, block=vit_block(2, mlp_dim=16), class_token=False)
    p = shapes(small)
    assert p["pos_embed"]["embedding"].shape == (16, 8) and "cls_token" not in p
    assert "head" not in p


def test_vit_learns_where_the_bright_patch_is():
    """Class = the quadrant holding a bright 2×2 square on a noisy 8×8 image."""
    cfg = ViTConfig(image_size=8, patch_size=2, channels=1, num_classes=4, num_layers=1,
                    embed_dim=16, block=vit_block(2, mlp_dim=32))
    model = ViT(cfg)
    rng = np.random.default_rng(0)
    n = 150 * 32
    labels = rng.integers(0, 4, n)
    images = 0.3 * rng.standard_normal((n, 8, 8, 1)).astype(np.float32)
    rows = 4 * (labels // 2) + 2 * rng.integers(0, 2, n)
    cols = 4 * (labels % 2) + 2 * rng.integers(0, 2, n)
    for k in range(n):
        images[k, rows[k]:rows[k] + 2, cols[k]:cols[k] + 2] += 2.0
    images = jnp.asarray(images.reshape(150, 32, 8, 8, 1))
    labels = jnp.asarray(labels.reshape(150, 32), jnp.int32)
    v = np_init(model, images[0], scale=None)
    # Distinct position vectors from the start (std 1) avoid a long plateau in which the
    # <class> token cannot yet tell the patches apart.
    v["params"]["pos_embed"]["embedding"] = 10.0 * v["params"]["pos_embed"]["embedding"]

    def loss(p, batch):
        x, y = batch
        logits = model.apply(p, x)
        return token_cross_entropy(logits[:, None], y[:, None]).mean(), accuracy(logits, y)

    _, (_, acc) = fit(loss, v, (images, labels), lr=1e-2, has_aux=True)
    assert float(acc[-10:].mean()) > 0.97  # on batches before training on them
