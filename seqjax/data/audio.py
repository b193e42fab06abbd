r"""Audio: the log-mel spectrogram in JAX, and a synthetic tone-order classification set.

Bishop §12.4.3 ("Audio data"): a waveform is turned into a **mel spectrogram**, time steps by
frequency bands spaced by the mel scale, then treated as an image (a CNN, or the Audio
Spectrogram Transformer, :class:`seqjax.models.AST`):

.. math::
    x_t[n] &= w[n]\, s[t h + n],\qquad n = 0, …, N_{fft}-1
        \quad\text{(frame } t \text{, hop } h\text{)}\\
    w[n] &= \tfrac12 - \tfrac12 \cos\!\big(2\pi n / N_w\big)
        \quad\text{(periodic Hann, length } N_w \le N_{fft}\text{, zero-padded to } N_{fft}
        \text{ at the centre)}\\
    P_t[k] &= \big|\textstyle\sum_n x_t[n]\, e^{-2\pi i k n / N_{fft}}\big|^2
        \quad k = 0, …, N_{fft}/2 \quad\text{(power spectrum, } |\mathrm{rfft}|^2\text{)}\\
    M_t[m] &= \textstyle\sum_k P_t[k]\, F[k, m],\qquad
    \mathrm{LogMel}_t[m] = \log(M_t[m] + \varepsilon)

with ``F`` the triangular mel filterbank (:func:`mel_filterbank`), its ``n_mels + 2`` edges
equally spaced in mels between ``f_min`` and ``f_max``. Two mel scales (``mel_scale``):

* ``"htk"`` (default; HTK, Kaldi's fbank features of Gong et al. 2021's AST, ``torchaudio``):
  :math:`m = 2595 \log_{10}(1 + f/700)`;
* ``"slaney"`` (Slaney's Auditory Toolbox; ``librosa``'s default): :math:`m = 3f/200` below
  1 kHz, :math:`m = 15 + 27 \ln(f/1000) / \ln 6.4` above.

The defaults (HTK, ``norm=None``, ``center=False``) match
``torchaudio.transforms.MelSpectrogram(mel_scale="htk", norm=None, center=False)``; with
``mel_scale="slaney", norm="slaney", center=True`` the mel power equals
``librosa.feature.melspectrogram``. All pure, ``jit``-able and differentiable. Shapes are
batch-major (``[B, L]`` samples → ``[B, T, n_mels]``); ``swapaxes(-1, -2)`` gives Bishop's
rows-are-frequency picture (Fig. 12.25).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_positive_ints, check_rank

Array = jax.Array

__all__ = [
    "MEL_SCALES",
    "TONE_BANDS",
    "frame",
    "hann_window",
    "hz_to_mel",
    "log_mel_spectrogram",
    "mel_filterbank",
    "mel_spectrogram",
    "mel_to_hz",
    "num_frames",
    "power_spectrogram",
    "tone_order_classes",
    "tone_order_dataset",
]

MEL_SCALES = ("htk", "slaney")

# Slaney's scale: 3 mels per 200 Hz up to 1 kHz (15 mels), then 27 mels per factor 6.4.
_SLANEY_F_SP = 200.0 / 3.0
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


# ----------------------------------------------------------------------------- checks


def _positive_ints(**values: Any) -> None:
    """Each value a positive int: ``TypeError`` for a non-int, else ``ValueError``."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"`{name}` must be an int; got {type(value).__name__} {value!r}.")
    check_positive_ints(**values)


def _check_scale(mel_scale: str) -> None:
    if mel_scale not in MEL_SCALES:
        raise ValueError(f"`mel_scale` must be one of {MEL_SCALES}; got {mel_scale!r}.")


# ----------------------------------------------------------------------------- mel scale


def hz_to_mel(frequencies: Any, mel_scale: str = "htk") -> np.ndarray:
    r"""Hertz to mels, HTK or Slaney (module docstring). NumPy, float64.

    Example:
        >>> round(float(hz_to_mel(1000.0, "slaney")), 6), round(float(hz_to_mel(700.0, "htk")), 3)
        (15.0, 781.173)
    """
    _check_scale(mel_scale)
    f = np.asarray(frequencies, dtype=np.float64)
    if mel_scale == "htk":
        return 2595.0 * np.log10(1.0 + f / 700.0)
    log = (_SLANEY_MIN_LOG_MEL
           + np.log(np.maximum(f, _SLANEY_MIN_LOG_HZ) / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP)
    return np.where(f >= _SLANEY_MIN_LOG_HZ, log, f / _SLANEY_F_SP)


def mel_to_hz(mels: Any, mel_scale: str = "htk") -> np.ndarray:
    """Inverse of :func:`hz_to_mel`. NumPy, float64.

    Example:
        >>> float(np.round(mel_to_hz(hz_to_mel(440.0, "slaney"), "slaney"), 6))
        440.0
    """
    _check_scale(mel_scale)
    m = np.asarray(mels, dtype=np.float64)
    if mel_scale == "htk":
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    log = _SLANEY_MIN_LOG_HZ * np.exp(
        _SLANEY_LOGSTEP * (np.maximum(m, _SLANEY_MIN_LOG_MEL) - _SLANEY_MIN_LOG_MEL))
    return np.where(m >= _SLANEY_MIN_LOG_MEL, log, _SLANEY_F_SP * m)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, *, f_min: float = 0.0,
                   f_max: float | None = None, mel_scale: str = "htk",
                   norm: str | None = None) -> np.ndarray:
    r"""Triangular mel filters as a ``[n_fft // 2 + 1, n_mels]`` matrix ``F`` (``P @ F``).

    Filter ``m`` (0-based) is :math:`\max(0, \min(\frac{f - f_m}{f_{m+1} - f_m},
    \frac{f_{m+2} - f}{f_{m+2} - f_{m+1}}))` at the FFT bin frequencies
    ``f = k · sample_rate / n_fft``, edges ``f_0 … f_{M+1}`` equally spaced in mels from
    ``f_min`` to ``f_max`` (default ``sample_rate / 2``); ``norm="slaney"`` multiplies it by
    ``2 / (f_{m+2} - f_m)`` (equal area), ``None`` leaves peaks at 1. Equals
    ``librosa.filters.mel(...).T`` (``htk=True`` for ``"htk"``). A float32 NumPy constant: build
    it once, outside ``jit``. ``ValueError`` when a filter falls between two FFT bins (too many
    mels for ``n_fft``).

    Example:
        >>> fb = mel_filterbank(8000, 256, 32)
        >>> fb.shape, bool((fb.max(axis=0) > 0).all())
        ((129, 32), True)
    """
    _positive_ints(sample_rate=sample_rate, n_fft=n_fft, n_mels=n_mels)
    _check_scale(mel_scale)
    if norm not in (None, "slaney"):
        raise ValueError(f"`norm` must be None or 'slaney'; got {norm!r}.")
    nyquist = sample_rate / 2.0
    f_max = nyquist if f_max is None else float(f_max)
    if not 0.0 <= f_min < f_max <= nyquist:
        raise ValueError(
            f"need 0 <= `f_min` < `f_max` <= sample_rate / 2 = {nyquist:g}; "
            f"got f_min={f_min}, f_max={f_max}."
        )
    fft_hz = np.linspace(0.0, nyquist, n_fft // 2 + 1)
    edges_hz = mel_to_hz(
        np.linspace(hz_to_mel(f_min, mel_scale), hz_to_mel(f_max, mel_scale), n_mels + 2), mel_scale
    )
    width = np.diff(edges_hz)  # [M + 1]
    ramps = edges_hz[:, None] - fft_hz[None, :]  # [M + 2, K]
    rise = -ramps[:-2] / width[:-1, None]
    fall = ramps[2:] / width[1:, None]
    weights_MxK = np.maximum(0.0, np.minimum(rise, fall))
    if norm == "slaney":
        weights_MxK *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    empty = np.flatnonzero(weights_MxK.max(axis=1) == 0)
    if empty.size:
        raise ValueError(
            f"`n_mels`={n_mels} is too many for `n_fft`={n_fft} at sample_rate={sample_rate} "
            f"(f_min={f_min:g}, f_max={f_max:g}): filters {empty.tolist()} fall between FFT "
            "bins and are empty; use fewer mels or a larger n_fft."
        )
    return weights_MxK.T.astype(np.float32)


# ----------------------------------------------------------------------------- STFT


def hann_window(win_length: int, n_fft: int | None = None) -> np.ndarray:
    r"""Periodic Hann window ``w[n]`` (module docstring; ``scipy.signal.get_window("hann", N_w)``),
    zero-padded at both ends to ``n_fft`` as ``librosa`` and ``torch.stft`` do. NumPy float32.

    Example:
        >>> hann_window(4).tolist()
        [0.0, 0.5, 1.0, 0.5]
    """
    n_fft = win_length if n_fft is None else n_fft
    _positive_ints(win_length=win_length, n_fft=n_fft)
    if win_length > n_fft:
        raise ValueError(f"`win_length`={win_length} must be at most `n_fft`={n_fft}.")
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(win_length) / win_length)
    left = (n_fft - win_length) // 2
    return np.pad(w, (left, n_fft - win_length - left)).astype(np.float32)


def num_frames(num_samples: int, n_fft: int, hop_length: int, center: bool = False) -> int:
    """``T = 1 + (L - n_fft) // hop`` (``L + 2·(n_fft // 2)`` samples when ``center``)."""
    if center:
        num_samples += 2 * (n_fft // 2)
    if num_samples < n_fft:
        raise ValueError(
            f"`waveform` has {num_samples} samples{' after centre padding' if center else ''}, "
            f"fewer than one frame of n_fft={n_fft}."
        )
    return 1 + (num_samples - n_fft) // hop_length


def frame(signal: Array, frame_length: int, hop_length: int) -> Array:
    """Overlapping frames ``[..., L] -> [..., T, frame_length]``, frame ``t`` starting at sample
    ``t · hop_length``; samples past the last whole frame are dropped.

    Example:
        >>> frame(jnp.arange(6.0), 4, 2).tolist()
        [[0.0, 1.0, 2.0, 3.0], [2.0, 3.0, 4.0, 5.0]]
    """
    _positive_ints(frame_length=frame_length, hop_length=hop_length)
    t = num_frames(signal.shape[-1], frame_length, hop_length)
    idx_TxN = hop_length * np.arange(t)[:, None] + np.arange(frame_length)[None, :]
    return jnp.asarray(signal)[..., idx_TxN]


def _stft_args(n_fft: int, hop_length: int | None, win_length: int | None) -> tuple[int, int, int]:
    """``(n_fft, hop_length, win_length)`` checked, defaults filled (:func:`power_spectrogram`)."""
    win_length = n_fft if win_length is None else win_length
    _positive_ints(n_fft=n_fft, win_length=win_length)
    if hop_length is not None:
        _positive_ints(hop_length=hop_length)
    if win_length > n_fft:
        raise ValueError(f"`win_length`={win_length} must be at most `n_fft`={n_fft}.")
    return n_fft, max(win_length // 4 if hop_length is None else hop_length, 1), win_length


def power_spectrogram(waveform: Array, *, n_fft: int = 400, hop_length: int | None = None,
                      win_length: int | None = None, center: bool = False) -> Array:
    r"""``|STFT|²``, periodic Hann window: ``[B, L]`` (or ``[L]``) -> ``[B, T, n_fft // 2 + 1]``.

    ``P_t[k]`` of the module docstring, in float32. ``hop_length`` defaults to ``win_length // 4``,
    ``win_length`` to ``n_fft``; ``center`` zero-pads ``n_fft // 2`` samples at both ends so frame
    ``t`` is centred on sample ``t · hop`` (``librosa``'s ``center=True, pad_mode="constant"``).

    Example:
        >>> power_spectrogram(jnp.ones((2, 1000)), n_fft=256, hop_length=128).shape
        (2, 6, 129)
    """
    check_rank(waveform, "waveform", (1, 2))
    dtype = np.asarray(waveform).dtype if not hasattr(waveform, "dtype") else waveform.dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"`waveform` must be a floating-point array of samples (e.g. in [-1, 1]); got "
            f"dtype {dtype}. Convert integer PCM first, e.g. x.astype(np.float32) / 32768.")
    n_fft, hop_length, win_length = _stft_args(n_fft, hop_length, win_length)
    num_frames(waveform.shape[-1], n_fft, hop_length, center)  # a clear error if too short
    x = jnp.asarray(waveform, jnp.float32)
    if center:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(n_fft // 2, n_fft // 2)])
    frames_BxTxN = frame(x, n_fft, hop_length) * hann_window(win_length, n_fft)
    spec_BxTxK = jnp.fft.rfft(frames_BxTxN, n=n_fft, axis=-1)
    return jnp.real(spec_BxTxK) ** 2 + jnp.imag(spec_BxTxK) ** 2


def mel_spectrogram(waveform: Array, sample_rate: int, *, n_fft: int = 400,
                    hop_length: int | None = None, win_length: int | None = None, n_mels: int = 64,
                    f_min: float = 0.0, f_max: float | None = None, mel_scale: str = "htk",
                    norm: str | None = None, center: bool = False) -> Array:
    r"""Mel power :math:`M_t = P_t F`: ``[B, L]`` (or ``[L]``) -> ``[B, T, n_mels]``; arguments as
    :func:`power_spectrogram` and :func:`mel_filterbank`.

    Example:
        >>> mel_spectrogram(jnp.zeros((3, 8000)), 8000, n_fft=256, hop_length=128,
        ...                 n_mels=32).shape
        (3, 61, 32)
    """
    power_BxTxK = power_spectrogram(waveform, n_fft=n_fft, hop_length=hop_length,
                                    win_length=win_length, center=center)
    fb_KxM = mel_filterbank(sample_rate, n_fft, n_mels, f_min=f_min, f_max=f_max,
                            mel_scale=mel_scale, norm=norm)
    return jnp.matmul(power_BxTxK, fb_KxM, precision=jax.lax.Precision.HIGHEST)


def log_mel_spectrogram(waveform: Array, sample_rate: int, *, n_fft: int = 400,
                        hop_length: int | None = None, win_length: int | None = None,
                        n_mels: int = 64, f_min: float = 0.0, f_max: float | None = None,
                        mel_scale: str = "htk", norm: str | None = None, center: bool = False,
                        eps: float = 1e-6) -> Array:
    r"""Log-mel spectrogram :math:`\log(P_t F + \varepsilon)` (natural log; Bishop §12.4.3).

    ``waveform``: float ``[B, L]`` or ``[L]`` samples. Returns float32 ``[B, T, n_mels]`` (or
    ``[T, n_mels]``), ``T = 1 + (L - n_fft) // hop_length`` (``L + n_fft`` padded samples when
    ``center``). Every argument but ``waveform`` is static (``static_argnames`` under ``jit``,
    or close over them); they are :func:`mel_spectrogram`'s, plus ``eps > 0``, which keeps
    silent bins finite. Divide by ``ln 10 / 10`` for decibels (``librosa.power_to_db``).

    Example:
        >>> import jax
        >>> f = jax.jit(lambda x: log_mel_spectrogram(x, 8000, n_fft=256, hop_length=128,
        ...                                           n_mels=32))
        >>> f(jnp.zeros((2, 8320))).shape
        (2, 64, 32)
    """
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise ValueError(f"`eps` must be a positive float; got {eps!r}.")
    mel_BxTxM = mel_spectrogram(
        waveform, sample_rate, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
        n_mels=n_mels, f_min=f_min, f_max=f_max, mel_scale=mel_scale, norm=norm, center=center)
    return jnp.log(mel_BxTxM + eps)


# ----------------------------------------------------------------------------- data set

#: Pitch bands of :func:`tone_order_dataset` in Hz (``low``, ``mid``, ``high``): each tone's
#: frequency is drawn log-uniformly inside its band; the bands are a factor ≥ 1.5 apart.
TONE_BANDS: dict[str, tuple[float, float]] = {
    "low": (300.0, 450.0),
    "mid": (700.0, 1000.0),
    "high": (1500.0, 2100.0),
}


def tone_order_classes() -> list[tuple[str, str]]:
    """The 6 ``(first band, second band)`` classes of :func:`tone_order_dataset`: ordered pairs of
    distinct :data:`TONE_BANDS`, in ``itertools.permutations`` order."""
    return list(itertools.permutations(TONE_BANDS, 2))


def tone_order_dataset(num_examples: int, *, sample_rate: int = 8000, num_samples: int = 8320,
                       min_gap: float = 0.4, margin: float = 0.0,
                       tone_duration: tuple[float, float] = (0.08, 0.14), noise: float = 0.05,
                       seed: int = 0) -> dict[str, np.ndarray]:
    r"""Synthetic clips whose class is the **order** of two tones far apart in time.

    Each clip (``num_samples`` at ``sample_rate``; 1.04 s by default) holds two tone bursts from
    two different bands of :data:`TONE_BANDS`, at least ``min_gap`` seconds apart and
    ``margin`` seconds from either end, in white Gaussian noise of sd ``noise``; the label
    indexes ``(first band, second band)`` in :func:`tone_order_classes` (6 classes, balanced).
    A tone is :math:`a \sin(2\pi f t + \phi)` under a Hann envelope, ``a ~ U(0.3, 1)``, ``f``
    log-uniform in its band, ``φ`` uniform, duration ``~ U(tone_duration)``; the onsets are
    uniform over all placements that keep the gap. The order needs relating two time steps
    ``min_gap`` apart, the long-range dependency Bishop §12.4.3 says CNNs struggle with (an
    order-blind model is right at most half the time; chance is 1/6); ``margin`` stops it being
    read from a tone's distance to the clip's ends.

    Returns ``{"audio": float32 [N, num_samples], "label": int32 [N], "onsets": float32 [N, 2]
    (seconds)}``, deterministic given ``seed``.

    Example:
        >>> d = tone_order_dataset(12, seed=0)
        >>> d["audio"].shape, d["label"].dtype.name, sorted(set(d["label"].tolist()))[:2]
        ((12, 8320), 'int32', [0, 1])
    """
    _positive_ints(num_examples=num_examples, sample_rate=sample_rate, num_samples=num_samples)
    lo_d, hi_d = (float(x) for x in tone_duration)
    if not 0.0 < lo_d <= hi_d:
        raise ValueError(
            f"`tone_duration` must be (low, high) with 0 < low <= high; got {tone_duration}."
        )
    if min_gap < 0 or margin < 0:
        raise ValueError(f"`min_gap` and `margin` must be >= 0; got {min_gap} and {margin}.")
    if 2 * hi_d + min_gap + 2 * margin >= num_samples / sample_rate:
        raise ValueError(
            f"two tones of up to {hi_d} s, a gap of `min_gap`={min_gap} s and margins of "
            f"`margin`={margin} s do not fit in "
            f"`num_samples`={num_samples} at {sample_rate} Hz ({num_samples / sample_rate} s)."
        )
    if noise < 0:
        raise ValueError(f"`noise` must be >= 0; got {noise}.")
    rng = np.random.default_rng(seed)
    classes = tone_order_classes()
    labels = rng.permutation(np.arange(num_examples) % len(classes)).astype(np.int32)
    audio = (noise * rng.standard_normal((num_examples, num_samples))).astype(np.float64)
    onsets = np.zeros((num_examples, 2), np.float32)
    t = np.arange(num_samples) / sample_rate
    for i, label in enumerate(labels):
        first, second = classes[label]
        d1, d2 = rng.uniform(lo_d, hi_d, size=2)
        n1, n2 = int(d1 * sample_rate), int(d2 * sample_rate)
        gap = int(np.ceil(min_gap * sample_rate))
        edge = int(np.ceil(margin * sample_rate))
        slack = num_samples - 2 * edge - (n1 + gap + n2)  # > 0 by the check above
        # Uniform over (start1, start2) with start2 >= start1 + n1 + gap: the two free
        # offsets are two sorted uniform points in [0, slack].
        a, b = np.sort(rng.integers(0, slack + 1, size=2))
        starts = (edge + int(a), edge + int(b) + n1 + gap)
        for start, n, band in zip(starts, (n1, n2), (first, second)):
            lo, hi = TONE_BANDS[band]
            f = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            amp = rng.uniform(0.3, 1.0)
            phase = rng.uniform(0.0, 2 * np.pi)
            env = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
            audio[i, start : start + n] += amp * env * np.sin(2 * np.pi * f * t[:n] + phase)
        onsets[i] = (starts[0] / sample_rate, starts[1] / sample_rate)
    return {"audio": audio.astype(np.float32), "label": labels, "onsets": onsets}
