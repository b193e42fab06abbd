"""ImageCaptioner (MEDL Fig. 7.1(d)): numpy reference, conditioning, decoding, a tiny fit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.decoding import greedy_search
from seqjax.models import ImageCaptioner, ImageCaptionerConfig

RNG = np.random.default_rng(0)


def _np_forward(p, tokens, images, condition):
    """MEDL Fig. 7.1(d) / slides: h_0 = tanh(W_I f + b_I); x_t = [E y_{t-1}; W_A f];
    h_t = tanh(W_hx x_t + b_h + W_hh h_{t-1}); logits = W_yh h_t + b_y (Elman cell)."""
    p = jax.tree_util.tree_map(np.asarray, p)
    b, t = tokens.shape
    cell = p["rnn"]["cell"]
    h = np.zeros((b, cell["recurrent_kernel"].shape[0]))
    if condition in ("init", "both"):
        h = np.tanh(images @ p["init_proj"]["kernel"] + p["init_proj"]["bias"])
    out = []
    for s in range(t):
        x = p["embed"]["embedding"][tokens[:, s]]
        if condition in ("input", "both"):
            x = np.concatenate([x, images @ p["image_proj"]["kernel"]], -1)
        h = np.tanh(x @ cell["input"]["kernel"] + cell["input"]["bias"]
                    + h @ cell["recurrent_kernel"])
        out.append(h @ p["head"]["kernel"] + p["head"]["bias"])
    return np.stack(out, 1)


@pytest.mark.parametrize("condition", ["init", "input", "both"])
def test_matches_numpy_and_images_change_the_outputs(condition):
    m = ImageCaptioner(ImageCaptionerConfig(vocab_size=9, embed_dim=4, hidden_size=6,
                                            cell_type="elman", condition=condition))
    tokens = jnp.asarray(RNG.integers(0, 9, size=(3, 5)), jnp.int32)
    images = jnp.asarray(RNG.normal(size=(3, 7)), jnp.float32)
    params = m.init(jax.random.PRNGKey(0), tokens, images)["params"]
    got = m.apply({"params": params}, tokens, images)
    np.testing.assert_allclose(got, _np_forward(params, np.asarray(tokens), np.asarray(images),
                                                condition), rtol=1e-5, atol=1e-5)
    other = m.apply({"params": params}, tokens, images[::-1])
    # rows 0 and 2 see another image: every position's output changes; row 1 keeps its own
    assert np.all(np.abs(np.asarray(got - other))[[0, 2]].max(-1) > 1e-4)
    np.testing.assert_array_equal(got[1], other[1])
    # the image gradient is nonzero at the last step too
    g = jax.grad(lambda f: m.apply({"params": params}, tokens, f)[:, -1].sum())(images)
    assert float(jnp.abs(g).min(axis=-1).max()) > 0.0


@pytest.mark.parametrize("cell_type", ["lstm", "gru"])
def test_greedy_decoding_equals_teacher_forced_argmax(cell_type):
    m = ImageCaptioner(ImageCaptionerConfig(vocab_size=7, embed_dim=4, hidden_size=8,
                                            cell_type=cell_type, condition="both",
                                            image_hidden=5))
    images = jnp.asarray(RNG.normal(size=(2, 6)), jnp.float32)
    start = jnp.zeros((2, 1), jnp.int32)
    params = m.init(jax.random.PRNGKey(1), start, images)["params"]
    out = greedy_search(m, params, start, max_new_tokens=4, inputs={"images": images})
    seq = jnp.concatenate([start, out.tokens], 1)
    logits = m.apply({"params": params}, seq[:, :-1], images)
    np.testing.assert_array_equal(jnp.argmax(logits, -1), out.tokens)


def test_errors_name_the_argument():
    m = ImageCaptioner(ImageCaptionerConfig(vocab_size=5, embed_dim=32, hidden_size=64,
                                            condition="init"))
    with pytest.raises(ValueError, match="`images` must have the tokens' batch size 2"):
        m.init(jax.random.PRNGKey(0), jnp.zeros((2, 3), jnp.int32), jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="`condition` must be one of"):  # when built
        ImageCaptionerConfig(vocab_size=5, condition="late")


WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def test_captions_digits_with_their_number_word():
    """A tiny fit: 8×8 scikit-learn digits captioned letter by letter ("seven<stop>"); after
    80 Adam steps on 300 images most greedy captions of 200 held-out images are exact."""
    from seqjax.data.packaged import digits

    data = digits("images")
    images = data["inputs"][:500].reshape(500, 64)
    labels = data["labels"][:500]
    letters = sorted(set("".join(WORDS)))
    pad, start, stop = 0, 1, 2
    ids = {c: i + 3 for i, c in enumerate(letters)}
    width = max(map(len, WORDS)) + 1
    tgt = np.full((500, width), pad, np.int32)
    for i, y in enumerate(labels):
        w = [ids[c] for c in WORDS[y]] + [stop]
        tgt[i, :len(w)] = w
    inp = np.concatenate([np.full((500, 1), start, np.int32), tgt[:, :-1]], 1)
    mask = tgt != pad
    m = ImageCaptioner(ImageCaptionerConfig(vocab_size=len(letters) + 3, embed_dim=16,
                                            hidden_size=48, cell_type="gru", condition="both",
                                            image_hidden=32))
    params = m.init(jax.random.PRNGKey(0), inp[:1], images[:1])["params"]
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    def loss_fn(p):
        logits = m.apply({"params": p}, inp[:300], images[:300])
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, tgt[:300])
        return jnp.sum(nll * mask[:300]) / jnp.sum(mask[:300])

    @jax.jit
    def step(p, o):
        loss, g = jax.value_and_grad(loss_fn)(p)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    first = None
    for _ in range(80):
        params, opt, loss = step(params, opt)
        first = float(loss) if first is None else first
    assert float(loss) < 0.25 * first
    out = greedy_search(m, params, np.full((200, 1), start, np.int32), max_new_tokens=width,
                        eos_id=stop, inputs={"images": images[300:]})
    exact = np.mean([np.array_equal(np.asarray(out.tokens[i - 300, :mask[i].sum()]),
                                    tgt[i, :mask[i].sum()]) for i in range(300, 500)])
    assert exact > 0.7, exact  # 0.92 when written
