"""seqjax.data.audio: the log-mel spectrogram against librosa, its pieces against numpy,
bad inputs, and the synthetic tone-order data set.

librosa is in the ``test`` extra, so the reference tests run (they are not skipped). Its
first import after a fresh install compiles numba kernels (~20 s once; cached after).
"""

import jax
import jax.numpy as jnp
import librosa
import numpy as np
import pytest
import scipy.signal

from seqjax.data import audio

SR = 8000


def _noise(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "scale,norm,f_min,f_max",
    [
        ("htk", None, 0.0, None),
        ("htk", "slaney", 50.0, 3800.0),
        ("slaney", "slaney", 0.0, None),
        ("slaney", None, 100.0, 3000.0),
    ],
)
def test_filterbank_matches_librosa(scale, norm, f_min, f_max):
    fb = audio.mel_filterbank(SR, 256, 32, f_min=f_min, f_max=f_max, mel_scale=scale, norm=norm)
    ref = librosa.filters.mel(
        sr=SR, n_fft=256, n_mels=32, fmin=f_min, fmax=f_max, htk=scale == "htk", norm=norm
    )
    assert fb.shape == (129, 32) and fb.dtype == np.float32
    np.testing.assert_allclose(fb, ref.T, rtol=1e-5, atol=1e-8)


def test_mel_scales_match_librosa_and_invert():
    f = np.array([0.0, 50.0, 440.0, 999.0, 1000.0, 1001.0, 3999.0])
    for scale in audio.MEL_SCALES:
        m = audio.hz_to_mel(f, scale)
        np.testing.assert_allclose(m, librosa.hz_to_mel(f, htk=scale == "htk"), rtol=1e-12)
        np.testing.assert_allclose(audio.mel_to_hz(m, scale), f, atol=1e-9)
    # the formulas as stated: HTK 2595 log10(1 + f/700); Slaney 3f/200 below 1 kHz
    np.testing.assert_allclose(audio.hz_to_mel(700.0, "htk"), 2595 * np.log10(2))
    np.testing.assert_allclose(audio.hz_to_mel(600.0, "slaney"), 9.0)
    np.testing.assert_allclose(audio.hz_to_mel(6400.0, "slaney"), 15 + 27.0)


@pytest.mark.parametrize("center", [False, True])
@pytest.mark.parametrize("win_length", [None, 200])
def test_mel_spectrogram_matches_librosa(center, win_length):
    """librosa.feature.melspectrogram (power 2, Slaney scale and norm, zero padding)."""
    y = _noise((2, 4000))
    ours = audio.mel_spectrogram(
        jnp.asarray(y),
        SR,
        n_fft=256,
        hop_length=100,
        win_length=win_length,
        n_mels=32,
        mel_scale="slaney",
        norm="slaney",
        center=center,
    )
    ref = librosa.feature.melspectrogram(
        y=y,
        sr=SR,
        n_fft=256,
        hop_length=100,
        win_length=win_length,
        n_mels=32,
        center=center,
        pad_mode="constant",
        power=2.0,
    )
    ref = np.swapaxes(ref, -1, -2)  # librosa: [B, n_mels, T]; seqjax: [B, T, n_mels]
    assert ours.shape == ref.shape
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=2e-5, atol=1e-5 * ref.max())


def test_log_mel_is_log_of_librosa_power_htk():
    y = _noise((3000,), seed=1)
    ours = audio.log_mel_spectrogram(
        jnp.asarray(y), SR, n_fft=256, hop_length=128, n_mels=24, eps=1e-6
    )
    ref = librosa.feature.melspectrogram(
        y=y,
        sr=SR,
        n_fft=256,
        hop_length=128,
        n_mels=24,
        center=False,
        htk=True,
        norm=None,
        power=2.0,
    )
    np.testing.assert_allclose(np.asarray(ours), np.log(ref.T + 1e-6), rtol=1e-4, atol=1e-4)


def test_power_spectrogram_is_numpy_stft():
    """|rfft(window · frame)|² frame by frame, with scipy's periodic Hann window."""
    y = _noise((1, 700), seed=2)
    n_fft, hop, win = 128, 48, 100
    ours = np.asarray(
        audio.power_spectrogram(jnp.asarray(y), n_fft=n_fft, hop_length=hop, win_length=win)
    )
    w = np.zeros(n_fft)
    w[(n_fft - win) // 2 : (n_fft - win) // 2 + win] = scipy.signal.get_window("hann", win)
    t = 1 + (700 - n_fft) // hop
    ref = np.stack(
        [np.abs(np.fft.rfft(w * y[0, i * hop : i * hop + n_fft])) ** 2 for i in range(t)]
    )
    assert ours.shape == (1, t, n_fft // 2 + 1)
    np.testing.assert_allclose(ours[0], ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(
        audio.hann_window(win), scipy.signal.get_window("hann", win), atol=1e-7
    )


def test_a_tone_peaks_in_its_mel_band():
    f0 = 1000.0
    y = np.sin(2 * np.pi * f0 * np.arange(4000) / SR).astype(np.float32)
    lm = np.asarray(
        audio.log_mel_spectrogram(jnp.asarray(y), SR, n_fft=256, hop_length=128, n_mels=32)
    )
    fb = audio.mel_filterbank(SR, 256, 32)
    assert (lm.argmax(-1) == fb[round(f0 / (SR / 256))].argmax()).all()


def test_jit_batch_and_grad():
    y = jnp.asarray(_noise((4, 2000), seed=3))
    f = jax.jit(lambda x: audio.log_mel_spectrogram(x, SR, n_fft=256, hop_length=128, n_mels=16))
    batched = f(y)
    assert batched.shape == (4, 1 + (2000 - 256) // 128, 16) and batched.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(f(y[2])), np.asarray(batched[2]), rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda x: f(x).sum())(y)
    assert g.shape == y.shape and bool(jnp.isfinite(g).all())


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(waveform=np.zeros((2, 3, 400), np.float32)), ValueError, "`waveform` must have rank"),
        (dict(waveform=np.zeros((400,), np.int16)), TypeError, "`waveform` must be a floating"),
        (dict(waveform=np.zeros((100,), np.float32)), ValueError, "`waveform` has 100 samples"),
        (dict(n_fft=0), ValueError, "`n_fft` must be a positive int"),
        (dict(n_fft=256.0), TypeError, "`n_fft` must be an int"),
        (dict(hop_length=-1), ValueError, "`hop_length` must be a positive int"),
        (dict(win_length=300), ValueError, "`win_length`=300 must be at most `n_fft`=256"),
        (dict(n_mels=200), ValueError, "`n_mels`=200 is too many"),
        (dict(f_max=5000.0), ValueError, "`f_max`"),
        (dict(f_min=-1.0), ValueError, "`f_min`"),
        (dict(mel_scale="bark"), ValueError, "`mel_scale` must be one of"),
        (dict(norm="area"), ValueError, "`norm` must be None or 'slaney'"),
        (dict(eps=0.0), ValueError, "`eps` must be a positive"),
        (dict(sample_rate=0), ValueError, "`sample_rate` must be a positive int"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, err, match):
    args = dict(
        waveform=np.zeros((2, 1000), np.float32),
        sample_rate=SR,
        n_fft=256,
        hop_length=128,
        n_mels=32,
    )
    args.update(kwargs)
    with pytest.raises(err, match=match):
        audio.log_mel_spectrogram(args.pop("waveform"), args.pop("sample_rate"), **args)


def test_frame():
    x = jnp.arange(10.0)
    np.testing.assert_array_equal(
        np.asarray(audio.frame(x, 4, 3)), [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    )
    assert audio.num_frames(1000, 256, 128) == 6
    assert audio.num_frames(1000, 256, 128, center=True) == 1 + (1000 + 256 - 256) // 128


def test_tone_order_dataset():
    d = audio.tone_order_dataset(60, seed=5)
    assert d["audio"].shape == (60, 8320) and d["audio"].dtype == np.float32
    assert np.bincount(d["label"], minlength=6).tolist() == [10] * 6
    # the two tones never overlap and keep the gap: onset2 >= onset1 + duration1 + 0.4 s
    assert (d["onsets"][:, 1] - d["onsets"][:, 0] >= 0.4 + 0.08 - 1e-6).all()
    again = audio.tone_order_dataset(60, seed=5)
    np.testing.assert_array_equal(d["audio"], again["audio"])
    # the class is the order: the loudest mel band at each onset is that tone's band
    centres_hz = audio.mel_to_hz(np.linspace(0.0, audio.hz_to_mel(SR / 2), 34))[1:-1]
    lm = np.asarray(
        audio.log_mel_spectrogram(jnp.asarray(d["audio"]), SR, n_fft=256, hop_length=128, n_mels=32)
    )
    classes = audio.tone_order_classes()
    for i in range(12):
        for k, band in enumerate(classes[d["label"][i]]):
            frame_t = int(d["onsets"][i, k] * SR / 128) + 2  # a frame inside the tone
            lo, hi = audio.TONE_BANDS[band]
            assert 0.8 * lo <= centres_hz[lm[i, frame_t].argmax()] <= 1.2 * hi, (i, k, band)
    # `margin` keeps both tones away from the clip's ends
    m = audio.tone_order_dataset(30, num_samples=12416, margin=0.3, seed=6)
    assert (m["onsets"][:, 0] >= 0.3).all()
    assert (m["onsets"][:, 1] + 0.08 <= 12416 / SR - 0.3 + 1e-6).all()  # shortest tone
    with pytest.raises(ValueError, match="do not fit in `num_samples`"):
        audio.tone_order_dataset(4, num_samples=2000)
    with pytest.raises(ValueError, match="`num_examples` must be a positive int"):
        audio.tone_order_dataset(0)
