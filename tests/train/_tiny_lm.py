r"""``TinyLM``: a small recurrent language model, a test fixture for :mod:`seqjax.train`.

.. math::  e_t = E[w_t],\quad (h_t, c_t) = \mathrm{cell}(h_{t-1}, e_t),\quad
           z_t = W_{out}\,\mathrm{dropout}(h_t) + b

i.e. the RNN language model of J&M §9.3 (J&M (9.5)–(9.7); MEDL §7.2 with learned
embeddings instead of one-hot inputs). The real models live in :mod:`seqjax.models`; this
one only exercises :mod:`seqjax.train` without depending on them (it lives in ``tests/``,
not in the wheel).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from seqjax._checks import check_integer, check_rank
from seqjax.nn.dense import Dense
from seqjax.nn.recurrent import CELL_TYPES, RNN

Array = jax.Array

__all__ = ["TinyLM"]


class TinyLM(nn.Module):
    """Embedding → ``RNN(cell)`` → dropout → ``Dense`` logits.

    Call: ``model(tokens_BxT, initial_carry=None, deterministic=True)`` returns
    ``logits_BxTxV``; ``with_state`` (same arguments) returns ``(logits_BxTxV, carry)``
    (truncated BPTT). Carry layout: the cell's (LSTM ``(c, h)``).
    Parameters: ``embed/embedding [V, E]``, ``rnn/cell/...``, ``head/kernel [H, V]``,
    ``head/bias [V]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> model = TinyLM(vocab_size=11, embed_dim=4, hidden=8)
        >>> tokens = jnp.zeros((2, 5), jnp.int32)
        >>> params = model.init(jax.random.PRNGKey(0), tokens)["params"]
        >>> model.apply({"params": params}, tokens).shape
        (2, 5, 11)

    Attributes:
        vocab_size: ``V``. embed_dim: ``E``. hidden: ``H``.
        cell: ``"lstm"``, ``"gru"`` or ``"elman"``.
        dropout: rate on the RNN outputs (``deterministic=False`` only).
        dtype / param_dtype: compute / storage dtypes.
    """

    vocab_size: int
    embed_dim: int = 16
    hidden: int = 32
    cell: str = "lstm"
    dropout: float = 0.0
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def _cell(self) -> nn.Module:
        if self.cell not in CELL_TYPES:
            raise ValueError(f"`cell` must be one of {sorted(CELL_TYPES)}; got {self.cell!r}.")
        # parent=None: the cell is adopted by the RNN that holds it (param path rnn/cell/...).
        return CELL_TYPES[self.cell](
            self.hidden, dtype=self.dtype, param_dtype=self.param_dtype, parent=None
        )

    def zero_carry(self, batch_size: int) -> Any:
        """The all-zero carry for ``batch_size`` rows (the start of every stream)."""
        return self._cell().initialize_carry(jax.random.PRNGKey(0), (batch_size, self.embed_dim))

    def __call__(
        self, tokens_BxT: Array, initial_carry: Any = None, deterministic: bool = True
    ) -> Array:
        return self.with_state(tokens_BxT, initial_carry, deterministic)[0]

    @nn.compact
    def with_state(
        self, tokens_BxT: Array, initial_carry: Any = None, deterministic: bool = True
    ) -> tuple[Array, Any]:
        """``(logits_BxTxV, carry)``: the call's logits and the final carry."""
        check_rank(tokens_BxT, "tokens_BxT", 2)
        check_integer(tokens_BxT, "tokens_BxT")
        e_BxTxE = nn.Embed(
            self.vocab_size, self.embed_dim, dtype=self.dtype, param_dtype=self.param_dtype,
            name="embed",
        )(tokens_BxT)
        h_BxTxH, carry = RNN(self._cell(), name="rnn").with_state(
            e_BxTxE, initial_carry=initial_carry
        )
        h_BxTxH = nn.Dropout(self.dropout)(h_BxTxH, deterministic=deterministic)
        logits_BxTxV = Dense(
            self.vocab_size, dtype=self.dtype, param_dtype=self.param_dtype, name="head"
        )(h_BxTxH)
        return logits_BxTxV, carry
