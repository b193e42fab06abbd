r"""Audio Spectrogram Transformer (AST): a ViT on the (log-)mel spectrogram.

.. math::
    S \in \mathbb R^{F\times T}\ (\text{mel bins} \times \text{frames}) \;\to\;
    x_{ij} = \mathrm{vec}\,S[i s_F : i s_F + P_F,\ j s_T : j s_T + P_T] \in \mathbb R^{P_F P_T},\\
    N = N_F N_T,\quad N_F = 1 + \lfloor (F - P_F)/s_F \rfloor,\quad
    N_T = 1 + \lfloor (T - P_T)/s_T \rfloor,\\
    Z^{(0)} = [\,x_{class};\ x_{11} W_E + b_E;\ …;\ x_{N_F N_T} W_E + b_E\,] + E_{pos},\qquad
    y = \mathrm{softmax}(\mathrm{LN}(Z^{(L)}_0) W_h + b_h)

Bishop §12.4.3 (after Gong, Chung & Glass 2021): the mel spectrogram as an image cut into
possibly overlapping patches, flattened, embedded, learned positions, a ``<class>`` token, a
transformer encoder and linear + softmax on the ``<class>`` output (cross-entropy).

Everything after :func:`spectrogram_patches` *is* :class:`seqjax.models.ViT`: the grid
``[B, N_F, N_T, P_F P_T]`` is an ``N_F × N_T`` image of ``P_F P_T`` channels in ``1 × 1``
patches (raster order: frequency-major). Unlike ViT, patches may overlap (``patch_stride <
patch_size``; Gong et al.: 16 × 16, stride 10, so 128 × 1024 gives ``12 × 101 = 1212``
tokens), patch and stride may differ per axis, and a remainder short of a patch is dropped.
Unlike Gong et al. (ImageNet DeiT initialisation with a distillation token, normalised Kaldi
fbank input), the model trains from scratch with one ``<class>`` token on any spectrogram
(e.g. :func:`seqjax.data.audio.log_mel_spectrogram`).

Input ``[B, T, F]`` (frames, mel bins; :mod:`seqjax.data.audio`'s layout), transposed to
Bishop's frequency rows × time columns (Fig. 12.25). Parameters: ``vit/…``, exactly ViT's
(``patch_embed`` ``[P_F P_T, D]``, ``cls_token``, ``pos_embed`` ``[N + 1, D]``, ``encoder``,
``head``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import ConfigBase, check_count_or_off, check_rank
from seqjax.models._common import preset_constructor
from seqjax.models.vit import ViT, ViTConfig, _pair, vit_block
from seqjax.nn.transformer import BlockConfig

Array = jax.Array
Dtype = Any

__all__ = ["AST", "AST_PRESETS", "ASTConfig", "patch_grid", "spectrogram_patches"]


def patch_grid(spectrogram_size: tuple[int, int], patch_size: int | tuple[int, int],
               patch_stride: int | tuple[int, int] | None = None) -> tuple[int, int]:
    """``(N_F, N_T)``: ``N = 1 + (size - patch) // stride`` on each axis (Gong et al. 2021:
    128 × 1024 with 16 × 16 patches, stride 10 → ``(12, 101)``).

    Example:
        >>> patch_grid((128, 1024), 16, 10), patch_grid((32, 64), 8)
        ((12, 101), (4, 8))
    """
    f, t = _pair(spectrogram_size, "spectrogram_size")
    pf, pt = _pair(patch_size, "patch_size")
    sf, st = (pf, pt) if patch_stride is None else _pair(patch_stride, "patch_stride")
    if pf > f or pt > t:
        raise ValueError(
            f"`patch_size` {(pf, pt)} must fit in the spectrogram (mel bins, frames) {(f, t)}."
        )
    return 1 + (f - pf) // sf, 1 + (t - pt) // st


def spectrogram_patches(images_BxFxTxC: Array, patch_size: int | tuple[int, int],
                        patch_stride: int | tuple[int, int] | None = None) -> Array:
    r"""Possibly overlapping patches: ``[B, F, T, C] -> [B, N_F, N_T, P_F P_T C]``.

    Patch ``(i, j)`` is ``x[:, i s_F : i s_F + P_F, j s_T : j s_T + P_T, :]`` flattened
    ``(row, column, channel)``; with ``patch_stride = patch_size`` (default) and square
    patches, ``reshape(B, N, -1)`` of this is :func:`seqjax.models.vit.patchify` exactly.

    Example:
        >>> x = jnp.arange(4 * 6.0).reshape(1, 4, 6, 1)
        >>> spectrogram_patches(x, 2, (2, 2)).shape, spectrogram_patches(x, 2, 1).shape
        ((1, 2, 3, 4), (1, 3, 5, 4))
    """
    check_rank(images_BxFxTxC, "images", 4)
    b, f, t, c = images_BxFxTxC.shape
    pf, pt = _pair(patch_size, "patch_size")
    sf, st = (pf, pt) if patch_stride is None else _pair(patch_stride, "patch_stride")
    nf, nt = patch_grid((f, t), (pf, pt), (sf, st))
    rows_NfxPf = sf * np.arange(nf)[:, None] + np.arange(pf)[None, :]
    cols_NtxPt = st * np.arange(nt)[:, None] + np.arange(pt)[None, :]
    # [B, Nf, Pf, Nt, Pt, C] by gathering rows then columns (static index tables).
    x = images_BxFxTxC[:, rows_NfxPf][:, :, :, cols_NtxPt]
    x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, Nf, Nt, Pf, Pt, C]
    return x.reshape(b, nf, nt, pf * pt * c)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ASTConfig(ConfigBase):
    """Hyper-parameters of :class:`AST`.

    Attributes:
        num_frames, num_mel_bins: ``T`` frames (time), ``F`` mel bins (frequency).
        patch_size: ``P`` or ``(P_F, P_T)``: patch height (mel bins) and width (frames).
        patch_stride: ``s`` or ``(s_F, s_T)``; ``None`` = ``patch_size`` (no overlap).
        num_classes: classifier outputs (0: no head; the model returns features).
        num_layers, embed_dim: encoder depth and width.
        block, class_token, scan_layers, remat: as :class:`~seqjax.models.ViTConfig`
            (default block ``vit_block(12, mlp_dim=3072)``).
    """

    num_frames: int = 1024
    num_mel_bins: int = 128
    patch_size: int | tuple[int, int] = 16
    patch_stride: int | tuple[int, int] | None = 10
    num_classes: int = 527
    num_layers: int = 12
    embed_dim: int = 768
    block: BlockConfig = dataclasses.field(default_factory=lambda: vit_block(12, mlp_dim=3072))
    class_token: bool = True
    scan_layers: bool = False
    remat: bool = False

    def __post_init__(self) -> None:
        patch_grid((self.num_mel_bins, self.num_frames), self.patch_size, self.patch_stride)
        check_count_or_off(self.num_classes, "num_classes", "ASTConfig", "no head")

    @property
    def grid(self) -> tuple[int, int]:
        """``(N_F, N_T)``, the patch grid (:func:`patch_grid`)."""
        return patch_grid((self.num_mel_bins, self.num_frames), self.patch_size, self.patch_stride)

    def vit_config(self) -> ViTConfig:
        """The ViT on the patch grid (``N_F × N_T`` image, ``P_F P_T`` channels, 1 × 1 patches)."""
        pf, pt = _pair(self.patch_size, "patch_size")
        shared = ("num_classes", "num_layers", "embed_dim", "block", "class_token", "scan_layers",
                  "remat")
        return ViTConfig(image_size=self.grid, patch_size=1, channels=pf * pt,
                         **{name: getattr(self, name) for name in shared})


#: ``ast-base``: Gong et al. 2021's AudioSet shape (128 × 1024, 16 × 16 patches, stride 10,
#: ViT-B encoder, 527 classes); ``ast-tiny``: the DeiT-Ti encoder.
AST_PRESETS: dict[str, ASTConfig] = {
    "ast-base": ASTConfig(),
    "ast-tiny": ASTConfig(embed_dim=192, block=vit_block(3, mlp_dim=768)),
}


class AST(nn.Module):
    r"""Audio Spectrogram Transformer classifier (see the module docstring).

    ``model(spectrogram_BxTxF, *, deterministic=True)`` returns ``logits_BxK`` (float32), or
    the pooled features ``[B, D]`` when ``num_classes`` is 0.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = ASTConfig(num_frames=12, num_mel_bins=8, patch_size=4, patch_stride=(4, 2),
        ...                 num_classes=3, num_layers=1, embed_dim=16,
        ...                 block=vit_block(2, mlp_dim=32))
        >>> ast = AST(cfg)
        >>> x = jnp.zeros((2, 12, 8))  # [B, frames, mel bins]
        >>> v = ast.init(jax.random.PRNGKey(0), x)
        >>> ast.apply(v, x).shape, cfg.grid, v["params"]["vit"]["pos_embed"]["embedding"].shape
        ((2, 3), (2, 5), (11, 16))
    """

    config: ASTConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    from_preset = preset_constructor(AST_PRESETS)

    @nn.compact
    def __call__(self, spectrogram_BxTxF: Array, *, deterministic: bool = True) -> Array:
        cfg = self.config
        check_rank(spectrogram_BxTxF, "spectrogram", 3)
        want = (cfg.num_frames, cfg.num_mel_bins)
        if spectrogram_BxTxF.shape[1:] != want:
            raise ValueError(
                f"`spectrogram` must have shape [B, num_frames={want[0]}, "
                f"num_mel_bins={want[1]}]; got {spectrogram_BxTxF.shape}."
            )
        image_BxFxTx1 = jnp.swapaxes(spectrogram_BxTxF, 1, 2)[..., None]  # frequency rows
        grid_BxNfxNtxP = spectrogram_patches(image_BxFxTx1, cfg.patch_size, cfg.patch_stride)
        return ViT(cfg.vit_config(), dtype=self.dtype, param_dtype=self.param_dtype, name="vit")(
            grid_BxNfxNtxP, deterministic=deterministic
        )
