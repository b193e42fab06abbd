"""mlm_mask's random replacements: BERT's whole-vocabulary draw and ``special_ids``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models.bert import mlm_mask

VOCAB, PAD, CLS, MASK = 12, 0, 1, 2


def _draw(**kwargs):
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, VOCAB, (200, 100)), jnp.int32)
    inputs, selected = mlm_mask(
        jax.random.PRNGKey(3),
        tokens,
        vocab_size=VOCAB,
        mask_id=MASK,
        select_rate=0.5,
        mask_rate=0.0,
        random_rate=1.0,
        **kwargs,
    )
    return np.asarray(tokens), np.asarray(inputs), np.asarray(selected)


def test_default_draws_from_the_whole_vocabulary_as_bert_does():
    """google-research/bert: ``vocab_words[rng.randint(0, len(vocab_words) - 1)]`` — the
    specials are drawn like any word."""
    _, inputs, selected = _draw()
    counts = np.bincount(inputs[selected], minlength=VOCAB) / selected.sum()
    np.testing.assert_allclose(counts, 1 / VOCAB, atol=0.01)  # ~10,000 draws: sd 0.003


def test_special_ids_are_never_drawn_and_the_rest_is_uniform():
    tokens, inputs, selected = _draw(special_ids=(PAD, CLS, MASK))
    drawn = inputs[selected]
    assert not np.isin(drawn, (PAD, CLS, MASK)).any()
    counts = np.bincount(drawn, minlength=VOCAB)[3:] / drawn.size
    np.testing.assert_allclose(counts, 1 / (VOCAB - 3), atol=0.01)
    assert (inputs[~selected] == tokens[~selected]).all()
    # An empty list excludes nothing: the same draws as the default's distribution.
    _, inputs0, selected0 = _draw(special_ids=())
    assert np.isin(inputs0[selected0], (PAD, CLS, MASK)).any()


def test_mask_share_is_exact_with_mask_excluded():
    """80/10/10 with <mask> out of the random draws: every <mask> comes from the 80%."""
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, VOCAB, (100, 100)), jnp.int32)
    inputs, selected = mlm_mask(
        jax.random.PRNGKey(0), tokens, vocab_size=VOCAB, mask_id=MASK, special_ids=(PAD, CLS, MASK)
    )
    key_kind = jax.random.split(jax.random.PRNGKey(0), 3)[1]
    u = np.asarray(jax.random.uniform(key_kind, tokens.shape))
    inputs, selected = np.asarray(inputs), np.asarray(selected)
    np.testing.assert_array_equal(inputs == MASK, selected & (u < 0.8))


@pytest.mark.parametrize(
    "special_ids, error, match",
    [
        ((0, 12), ValueError, r"`special_ids` must lie in \[0, vocab_size = 12\)"),
        ((-1,), ValueError, "`special_ids` must lie in"),
        ((0.5,), TypeError, "`special_ids` must be integer"),
        (tuple(range(12)), ValueError, "exclude every id"),
    ],
)
def test_bad_special_ids(special_ids, error, match):
    with pytest.raises(error, match=match):
        mlm_mask(
            jax.random.PRNGKey(0),
            jnp.zeros((1, 4), jnp.int32),
            vocab_size=VOCAB,
            mask_id=MASK,
            special_ids=special_ids,
        )


def test_bad_vocab_size():
    with pytest.raises(ValueError, match="`vocab_size` must be a positive int; got 0"):
        mlm_mask(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32), vocab_size=0, mask_id=0)
