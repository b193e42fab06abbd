"""The encoder–decoder transformer's input layer against MEDL (7.29)–(7.30): the two
departures its docstring states (positions from 0, √d embedding scaling) hold."""

import math

import jax.numpy as jnp
import numpy as np

from seqjax.models.encoder_decoder import Transformer, TransformerConfig, vaswani_block
from tests.models.helpers import np_init

D = 8


def medl_sinusoid(t, p, m=10_000.0):
    """MEDL (7.29): r_{2i} = sin(t / M^{2i/p}), r_{2i+1} = cos(t / M^{2i/p}), t = 1..T."""
    i = np.arange(p // 2)
    r = np.empty(p)
    r[0::2], r[1::2] = np.sin(t / m ** (2 * i / p)), np.cos(t / m ** (2 * i / p))
    return r


def test_positions_from_zero_and_sqrt_d_scaling():
    tokens = jnp.array([[3, 1, 4, 1, 5]], jnp.int32)
    for scale in (True, False):
        cfg = TransformerConfig(src_vocab_size=11, num_layers=1, embed_dim=D,
                                block=vaswani_block(2, mlp_dim=16, dropout_rate=0.0),
                                scale_embeddings=scale)
        model = Transformer(cfg)
        v = np_init(model, tokens, tokens)
        x = np.asarray(model.apply(v, tokens, True, None, True, method=Transformer._embed))
        table = np.asarray(v["params"]["shared_embed"]["embedding"], np.float64)
        factor = math.sqrt(D) if scale else 1.0  # MEDL (7.30) is the unscaled sum
        for t in range(tokens.shape[1]):
            # index t carries MEDL's r^{<t+1>} shifted back by one: r at position t (from 0)
            np.testing.assert_allclose(x[0, t], factor * table[int(tokens[0, t])]
                                       + medl_sinusoid(t, D), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(x[0, 0] - factor * table[3], [0, 1] * (D // 2), atol=1e-6)
