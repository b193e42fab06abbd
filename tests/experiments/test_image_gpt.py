"""Raster-order image transformer (Bishop §12.4.2): tokenisation pieces and smoke run."""

from pathlib import Path

import numpy as np
import pytest

from seqjax.experiments import _images, image_gpt
from tests.experiments._devices import assert_trained_on_all_devices

RESULTS = Path(__file__).resolve().parents[2] / "seqjax" / "experiments" / "results"


def test_raster_order_is_row_major_4x4():
    """Bishop Fig. 12.23: pixel x_n of a 4×4 grid sits at row (n−1)//4, column (n−1)%4."""
    img = np.arange(1, 17).reshape(1, 4, 4)
    np.testing.assert_array_equal(_images.raster_patches(img, 1)[0, :, 0], np.arange(1, 17))
    p = _images.raster_patches(img, 2)
    np.testing.assert_array_equal(p[0, 1], [3, 4, 7, 8])  # top-right 2×2 patch, second token
    for patch in (1, 2, 4):
        back = _images.from_raster_patches(_images.raster_patches(img, patch), 4, patch)
        np.testing.assert_array_equal(back, img)
    with pytest.raises(ValueError, match="`patch` must divide"):
        _images.raster_patches(img, 3)


def test_encode_is_the_nearest_code():
    rng = np.random.default_rng(0)
    imgs = rng.uniform(size=(3, 8, 8)).astype(np.float32)
    cb = np.array([[0.1], [0.5], [0.9]], np.float32)
    tok = _images.encode(imgs, cb, 1)
    ref = np.abs(imgs.reshape(3, 64, 1) - cb[:, 0]).argmin(-1)
    np.testing.assert_array_equal(tok, ref)
    np.testing.assert_allclose(_images.decode(tok, cb, 1), cb[ref, 0].reshape(3, 8, 8))


def test_independent_baseline_is_the_per_position_entropy():
    train = np.array([[0, 1], [0, 1], [0, 0]])
    test = np.array([[0, 1]])
    # position 1: counts (1+3, 1+0) -> p(0) = 4/5; position 2: (1+1, 1+2) -> p(1) = 3/5
    want = -(np.log2(4 / 5) + np.log2(3 / 5))
    assert _images.independent_baseline(train, test, 2) == pytest.approx(want)


def test_lm_arrays_shift_by_one_and_mask_the_prompt():
    prompt = np.array([[7, 8, 9]])
    codes = np.array([[0, 1, 2, 3]])
    a = _images.lm_arrays(prompt, codes)
    np.testing.assert_array_equal(a["inputs"], [[7, 8, 9, 0, 1, 2]])
    np.testing.assert_array_equal(a["targets"], [[8, 9, 0, 1, 2, 3]])
    # the loss is on the image codes only: every code is a target once, the prompt never
    np.testing.assert_array_equal(a["mask"], [[False, False, True, True, True, True]])


def test_image_bits_is_the_code_nll_in_bits():
    """numpy reference: −Σ log₂ softmax over the codes only, at the masked (code) targets."""
    import jax

    from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block

    model = TransformerLM(
        TransformerLMConfig(vocab_size=6, num_layers=1, embed_dim=8, block_size=4,
                            block=gpt_block(1))
    )
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.int32))["params"]
    a = _images.lm_arrays(np.array([[4, 5], [5, 4]]), np.array([[0, 3, 1], [2, 2, 0]]))
    logits = np.asarray(model.apply({"params": params}, a["inputs"]), np.float64)[..., :4]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # over the 4 codes
    picked = np.take_along_axis(logp, a["targets"][..., None] % 4, -1)[..., 0]
    want = -(picked * a["mask"]).sum(-1) / np.log(2.0)
    got = _images.image_bits(model, params, a, num_codes=4)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_digit_splits_hold_out_validation_from_training_only():
    d = _images.digit_splits(0.1)
    assert len(d["fit"]["x"]) == len(d["train"]["x"]) + len(d["val"]["x"]) == 1438
    assert len(d["test"]["x"]) == 359
    assert "val" not in _images.digit_splits(0.0)
    with pytest.raises(ValueError, match="`val_fraction` must lie in"):
        _images.digit_splits(1.0)


def test_image_gpt_smoke_beats_the_independent_baseline(tmp_path):
    """The smoke size (2×2 patches, 1 layer, d = 32, 200 steps): the transformer's held-out
    bits/image are below the independent-position baseline's (same codes, same test images;
    by 4.9–6.5 bits on seeds 0–3, 42.0–42.8 vs 47.4–48.5), and training moved the loss."""
    s = image_gpt.main(["--smoke", "--workdir", str(tmp_path)])
    assert_trained_on_all_devices(tmp_path, tmp_path / "patches")
    (r,) = s["runs"]
    assert r["tokens"] == "patches" and r["sequence_length"] == 16 and r["codes"] == 32
    assert s["n_train"] + s["n_val"] == s["n_fit"] and s["n_val"] > 0
    assert r["test_bits_per_image"] < r["independent_bits_per_image"] - 3.0, r
    assert r["independent_bits_per_image"] < r["uniform_bits_per_image"]
    # ~3.47 -> ~1.92 nats per code; with a learning rate of 1e-9, 3.472 -> 3.476 (and the
    # transformer's 80.2 bits/image fail the baseline check above too)
    assert r["first_loss"] - r["last_loss"] > 1.0, r
    # early stopping keeps the step with the lowest validation bits/image
    steps, bits = zip(*r["val_curve"])
    assert steps[-1] == 200 and r["best_step"] == steps[int(np.argmin(bits))]
    assert (tmp_path / "image_gpt.md").exists() and (tmp_path / "image_gpt_samples.png").exists()
    # The smoke shrinks only the transformer: the splits and the K-means codebook are the full
    # run's, so the `patches` row's codebook and baselines are the results file's figures.
    line = next(ln for ln in (RESULTS / "image_gpt.md").read_text(encoding="utf-8").splitlines()
                if ln.startswith("| patches |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:4] == [str(r["codes"]), str(r["sequence_length"]),
                          f"{r['reconstruction_rmse']:.3f}"], cells
    assert cells[9:11] == [f"{r['independent_bits_per_image']:.1f}",
                           f"{r['uniform_bits_per_image']:.0f}"], cells
