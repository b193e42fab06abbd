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
