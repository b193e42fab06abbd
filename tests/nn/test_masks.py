"""Tests for seqjax.nn.masks: causal, padding, pairwise, segment masks and their combination."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.masks import (
    causal_mask,
    combine_masks,
    make_attention_mask,
    padding_mask,
    segment_mask,
)


def test_causal_mask_is_lower_triangle():
    np.testing.assert_array_equal(causal_mask(4), np.tril(np.ones((4, 4), bool)))
    assert causal_mask(4).dtype == jnp.bool_


def test_causal_mask_rectangular_and_offset():
    # Query i at absolute position i + offset sees keys j <= i + offset.
    np.testing.assert_array_equal(causal_mask(2, 5, offset=3),
                                  np.tril(np.ones((2, 5), bool), k=3))
    np.testing.assert_array_equal(causal_mask(3, 2), np.tril(np.ones((3, 2), bool)))


def test_causal_mask_per_row_offset_traced():
    offsets = jnp.array([0, 2])
    m = jax.jit(lambda o: causal_mask(2, 4, offset=o))(offsets)
    assert m.shape == (2, 1, 2, 4)
    np.testing.assert_array_equal(m[0, 0], np.tril(np.ones((2, 4), bool), k=0))
    np.testing.assert_array_equal(m[1, 0], np.tril(np.ones((2, 4), bool), k=2))


def test_padding_mask():
    m = padding_mask(jnp.array([0, 2, 3]), 3)
    np.testing.assert_array_equal(m, [[0, 0, 0], [1, 1, 0], [1, 1, 1]])


def test_padding_mask_errors():
    with pytest.raises(ValueError, match="lengths"):
        padding_mask(jnp.array([4]), 3)
    with pytest.raises(TypeError, match="lengths"):
        padding_mask(jnp.array([1.0]), 3)
    with pytest.raises(ValueError, match="rank"):
        padding_mask(jnp.array([[1]]), 3)


def test_make_attention_mask_outer_and():
    q = jnp.array([[True, True, False]])
    k = jnp.array([[True, False]])
    m = make_attention_mask(q, k)
    assert m.shape == (1, 1, 3, 2)
    np.testing.assert_array_equal(m[0, 0], np.outer([1, 1, 0], [1, 0]).astype(bool))
    with pytest.raises(TypeError, match="query_valid"):
        make_attention_mask(q.astype(jnp.int32), k)
    with pytest.raises(ValueError, match="batch"):
        make_attention_mask(q, jnp.ones((2, 2), bool))


def test_segment_mask_block_diagonal():
    seg = jnp.array([[1, 1, 2, 2, 0]])
    m = segment_mask(seg, seg)[0, 0]
    expected = np.asarray(seg[0])[:, None] == np.asarray(seg[0])[None, :]
    np.testing.assert_array_equal(m, expected)
    with pytest.raises(TypeError, match="segment_ids_q"):
        segment_mask(seg.astype(jnp.float32), seg)


def test_combine_masks():
    assert combine_masks(None, None) is None
    a = causal_mask(3)
    b = jnp.array([True, True, False])
    np.testing.assert_array_equal(combine_masks(a, None, b), np.asarray(a) & np.asarray(b))
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(a, jnp.ones((3, 3)))


def _count_lengths_reads(monkeypatch):
    """Count the host reads of a concrete lengths array made by the one check."""
    from seqjax import _checks

    reads = []
    real = _checks.check_range

    def counting(x, name, low, high):
        if "lengths" in name and _checks.is_concrete(x):
            reads.append(name)
        return real(x, name, low, high)

    monkeypatch.setattr(_checks, "check_range", counting)
    return reads


@pytest.mark.parametrize("family", ["gpt", "rnn"])
def test_lengths_read_once_per_model_call_and_layers_still_check(monkeypatch, family):
    """From a model down, ``lengths`` is validated once per model call (one host read), not
    once per layer, and nothing is remembered between calls (no cache keyed on the array);
    each layer called on its own still rejects bad lengths."""
    from seqjax.models import (
        RNNClassifier,
        RNNClassifierConfig,
        TransformerLM,
        TransformerLMConfig,
        gpt_block,
    )
    from seqjax.nn import MultiHeadAttention, StackedRNN

    tokens = jnp.ones((3, 5), jnp.int32)
    lengths = jnp.array([5, 2, 0])
    if family == "gpt":
        model = TransformerLM(TransformerLMConfig(vocab_size=7, num_layers=3, embed_dim=8,
                                                  block_size=8, block=gpt_block(2)))
        layer = MultiHeadAttention(num_heads=2)
    else:
        model = RNNClassifier(RNNClassifierConfig(vocab_size=7, num_classes=2, embed_dim=4,
                                                  hidden_size=4, num_layers=3, cell_type="lstm"))
        layer = StackedRNN(4, num_layers=2, cell_type="gru")
    params = model.init(jax.random.PRNGKey(0), tokens, lengths)
    reads = _count_lengths_reads(monkeypatch)
    model.apply(params, tokens, jnp.array([5, 2, 0]))
    assert reads == ["lengths"]
    model.apply(params, tokens, lengths)  # the same array again: checked again, once
    assert reads == ["lengths", "lengths"]

    x = jnp.ones((3, 5, 4))
    layer_params = layer.init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match=r"`lengths` must lie in \[0, 5\]; got values in \[0, 6\]"):
        layer.apply(layer_params, x, lengths=jnp.array([6, 2, 0]))
    with pytest.raises(ValueError, match=r"`lengths` must have shape \(batch,\) = \(3,\)"):
        layer.apply(layer_params, x, lengths=jnp.array([1, 2]))


def test_valid_lengths_marker_is_the_only_way_past_the_value_check(monkeypatch):
    """``check_lengths`` returns a ``ValidLengths``; layers take it in place of ``lengths``
    without a second host read, still check its shape, and re-read it only against a
    tighter bound."""
    from seqjax._checks import ValidLengths, check_lengths
    from seqjax.models import masked_pool
    from seqjax.nn import RNN, ElmanCell

    checked = check_lengths(jnp.array([3, 1]), "lengths", 2, 3)
    assert isinstance(checked, ValidLengths) and checked.value.dtype == jnp.int32
    assert (checked.max_len, checked.low) == (3, 0)
    reads = _count_lengths_reads(monkeypatch)
    np.testing.assert_array_equal(padding_mask(checked, 3), padding_mask(jnp.array([3, 1]), 3))
    assert reads == ["lengths"]  # the plain array only
    h = jnp.ones((2, 3, 4))
    masked_pool(h, checked, "mean")
    rnn = RNN(ElmanCell(4))
    params = rnn.init(jax.random.PRNGKey(0), h)
    rnn.apply(params, h, checked)
    assert reads == ["lengths"]
    # a pytree: through jit and back
    out = jax.jit(lambda v: padding_mask(v, 3))(checked)
    np.testing.assert_array_equal(out, padding_mask(checked, 3))
    # the shape is still checked; a looser bound than the layer's is read again
    with pytest.raises(ValueError, match=r"`lengths` must have shape \(batch,\) = \(3,\)"):
        rnn.apply(params, jnp.ones((3, 3, 4)), checked)
    with pytest.raises(ValueError, match=r"`lengths` must lie in \[0, 2\]; got values in \[1, 3\]"):
        padding_mask(checked, 2)
