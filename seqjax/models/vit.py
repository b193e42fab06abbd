r"""Vision transformer (ViT): images as sequences of patches.

.. math::
    x \in \mathbb R^{H\times W\times C} \;\to\; x_p \in \mathbb R^{N\times P^2C},\quad
    N = HW/P^2,\qquad
    Z^{(0)} = [\,x_{class};\ x_p W_E + b_E\,] + E_{pos},\qquad
    y = \mathrm{softmax}(\mathrm{LN}(Z^{(L)}_0) W_h + b_h)

Bishop §12.4.1 (Fig. 12.22): non-overlapping ``P × P`` patches flattened into tokens, a
learned linear embedding, a ``<class>`` token whose output feeds the classifier, learned
positions; Dosovitskiy et al. 2020 (pre-norm encoder, GELU MLPs).

Parameters: ``patch_embed/{kernel,bias}`` (``[P²C, D]``, a stride-``P`` convolution as a
matmul), ``cls_token`` ``[1, 1, D]``, ``pos_embed/embedding`` ``[N (+1), D]``,
``encoder/layers_{i}``, ``encoder/final_norm``, ``head/{kernel,bias}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import ConfigBase, check_count_or_off, check_rank
from seqjax.models._common import block_stack, preset_constructor
from seqjax.nn._block_config import check_block
from seqjax.nn.dense import Dense
from seqjax.nn.positional import LearnedPositionalEmbedding
from seqjax.nn.transformer import BlockConfig, TransformerEncoder

Array = jax.Array
Dtype = Any

__all__ = [
    "VIT_PRESETS", "ViT", "ViTConfig", "num_patches", "patchify", "unpatchify", "vit_block",
]


def _pair(x: int | tuple[int, int], name: str) -> tuple[int, int]:
    pair = (x, x) if isinstance(x, (int, np.integer)) else tuple(x)
    if len(pair) != 2 or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in pair
    ):
        raise ValueError(f"`{name}` must be a positive int or a pair of them; got {x!r}.")
    return int(pair[0]), int(pair[1])


def num_patches(image_size: int | tuple[int, int], patch_size: int) -> int:
    """``N = HW / P²`` (Bishop §12.4.1); ``H`` and ``W`` must be multiples of ``P``."""
    h, w = _pair(image_size, "image_size")
    if h % patch_size or w % patch_size:
        raise ValueError(
            f"image size {(h, w)} must be a multiple of patch_size={patch_size} on both axes."
        )
    return (h // patch_size) * (w // patch_size)


def patchify(images_BxHxWxC: Array, patch_size: int) -> Array:
    r"""Flattened non-overlapping patches, ``[B, H, W, C] -> [B, N, P²C]``, ``N = HW/P²``.

    Patches in raster order; features inside a patch ordered ``(row, column, channel)``.

    Example:
        >>> patchify(jnp.zeros((2, 28, 28, 1)), 7).shape
        (2, 16, 49)
    """
    check_rank(images_BxHxWxC, "images", 4)
    b, h, w, c = images_BxHxWxC.shape
    num_patches((h, w), patch_size)
    p = patch_size
    x = images_BxHxWxC.reshape(b, h // p, p, w // p, p, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, H/P, W/P, P, P, C]
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def unpatchify(patches_BxNxF: Array, patch_size: int, image_size: int | tuple[int, int]) -> Array:
    r"""Inverse of :func:`patchify`: ``[B, N, P²C] -> [B, H, W, C]``.

    Example:
        >>> x = jnp.arange(2 * 8 * 8 * 3.0).reshape(2, 8, 8, 3)
        >>> bool((unpatchify(patchify(x, 4), 4, 8) == x).all())
        True
    """
    check_rank(patches_BxNxF, "patches", 3)
    h, w = _pair(image_size, "image_size")
    n = num_patches((h, w), patch_size)
    b, n_got, f = patches_BxNxF.shape
    p = patch_size
    if n_got != n or f % (p * p):
        raise ValueError(
            f"`patches` must have shape [B, {n}, P²C] with P={p} for image size {(h, w)}; "
            f"got {patches_BxNxF.shape}."
        )
    c = f // (p * p)
    x = patches_BxNxF.reshape(b, h // p, w // p, p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


def vit_block(num_heads: int, **options: Any) -> BlockConfig:
    """ViT's encoder block (Dosovitskiy et al. 2021): bidirectional, pre-norm, exact GELU,
    LayerNorm ``ε = 1e-6``, no dropout; ``options``: other :class:`~seqjax.nn.BlockConfig` fields.

    Example:
        >>> vit_block(3, mlp_dim=768).norm, vit_block(3).norm_epsilon
        ('pre', 1e-06)
    """
    return BlockConfig.encoder(
        num_heads, **{"norm": "pre", "activation": "gelu", "norm_epsilon": 1e-6, **options}
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTConfig(ConfigBase):
    """Hyper-parameters of :class:`ViT`.

    Attributes:
        image_size, patch_size, channels: ``H`` (= ``W``) or ``(H, W)``; ``P``; ``C``.
        num_classes: classifier outputs (0: no head; the model returns features).
        num_layers, embed_dim: encoder depth and width.
        block: every encoder block's :class:`~seqjax.nn.BlockConfig`, bidirectional without
            cross-attention (default ``vit_block(12, mlp_dim=3072)``, ViT-B). Its
            ``dropout_rate`` also drops the patch embeddings; a ``dtype``/``param_dtype``
            other than the default or the model's is a ``ValueError``.
        class_token: prepend a learned ``<class>`` token (else mean-pool the patches).
        scan_layers, remat: see :class:`~seqjax.nn.transformer.TransformerEncoder`.
    """

    image_size: int | tuple[int, int] = 224
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 1000
    num_layers: int = 12
    embed_dim: int = 768
    block: BlockConfig = dataclasses.field(default_factory=lambda: vit_block(12, mlp_dim=3072))
    class_token: bool = True
    scan_layers: bool = False
    remat: bool = False

    def __post_init__(self) -> None:
        check_block(self.block, causal=False, cross_attention=False, owner="ViTConfig")
        check_count_or_off(self.num_classes, "num_classes", "ViTConfig", "no head")


#: ``vit-base-16`` (ViT-B/16 at 224², 1000 classes: 86,567,656 parameters) and
#: ``vit-tiny-16`` (DeiT-Ti: 192 wide, 3 heads).
VIT_PRESETS: dict[str, ViTConfig] = {
    "vit-base-16": ViTConfig(),
    "vit-tiny-16": ViTConfig(embed_dim=192, block=vit_block(3, mlp_dim=768)),
}


class ViT(nn.Module):
    r"""Vision transformer classifier (see the module docstring).

    ``model(images_BxHxWxC, *, deterministic=True)`` returns ``logits_BxK`` (float32), or the
    pooled features ``[B, D]`` when ``num_classes`` is 0.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = ViTConfig(image_size=8, patch_size=4, channels=1, num_classes=3,
        ...                 num_layers=1, embed_dim=16, block=vit_block(2, mlp_dim=32))
        >>> vit = ViT(cfg)
        >>> x = jnp.zeros((2, 8, 8, 1))
        >>> v = vit.init(jax.random.PRNGKey(0), x)
        >>> vit.apply(v, x).shape, v["params"]["pos_embed"]["embedding"].shape
        ((2, 3), (5, 16))
    """

    config: ViTConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    from_preset = preset_constructor(VIT_PRESETS)

    @nn.compact
    def __call__(self, images_BxHxWxC: Array, *, deterministic: bool = True) -> Array:
        cfg = self.config
        check_rank(images_BxHxWxC, "images", 4)
        h, w = _pair(cfg.image_size, "image_size")
        if images_BxHxWxC.shape[1:] != (h, w, cfg.channels):
            raise ValueError(
                f"`images` must have shape [B, {h}, {w}, {cfg.channels}]; "
                f"got {images_BxHxWxC.shape}."
            )
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x_BxNxF = patchify(images_BxHxWxC, cfg.patch_size)
        x_BxNxD = Dense(cfg.embed_dim, name="patch_embed", **kw)(x_BxNxF)
        batch = x_BxNxD.shape[0]
        if cfg.class_token:
            cls = self.param(
                "cls_token", nn.initializers.zeros_init(), (1, 1, cfg.embed_dim), self.param_dtype
            )
            cls_Bx1xD = jnp.broadcast_to(cls.astype(x_BxNxD.dtype), (batch, 1, cfg.embed_dim))
            x_BxNxD = jnp.concatenate([cls_Bx1xD, x_BxNxD], axis=1)
        x_BxNxD = LearnedPositionalEmbedding(x_BxNxD.shape[1], name="pos_embed", **kw)(x_BxNxD)
        x_BxNxD = nn.Dropout(cfg.block.dropout_rate)(x_BxNxD, deterministic=deterministic)
        encoder = block_stack(self, TransformerEncoder, cfg.block, cfg.num_layers, name="encoder")
        z_BxNxD = encoder(x_BxNxD, deterministic=deterministic)
        pooled_BxD = z_BxNxD[:, 0] if cfg.class_token else jnp.mean(z_BxNxD, axis=1)
        if not cfg.num_classes:
            return pooled_BxD
        head = Dense(cfg.num_classes, kernel_init=nn.initializers.zeros, name="head", **kw)
        return head(pooled_BxD).astype(jnp.float32)
