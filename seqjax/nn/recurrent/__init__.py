r"""Recurrent layers: a cell run over time, both directions, and stacks of them.

Every layer computes its cell's recurrence ``(carry_t, y_t) = cell(carry_{t-1}, x_t)``,
``t = 1..T`` (MEDL (7.1)–(7.2); J&M Fig. 9.2); the equations are in :mod:`seqjax.nn.cells`.
Modules (each kernel tested to equal the plain scan of the cell's ``step``):

* ``layers.py``: :class:`RNN` (``implementation="auto" | "scan" | "fused" | "cudnn"``, chosen
  in ``RNN._implementation``), :class:`Bidirectional` (MEDL (7.14); J&M (9.18)–(9.20)),
  :class:`StackedRNN` (MEDL (7.15); J&M §9.5), :data:`CELL_TYPES`, :data:`GPU_SCAN_UNROLL`;
* ``_layer_kernels.py``: ``"fused"``, whole-layer Elman, LSTM and reset-after GRU with
  hand-written backward passes;
* ``_cudnn.py``: ``"cudnn"``, LSTM weights in cuDNN's layout (:func:`cudnn_lstm_weights`).

To change the backend probe or :data:`GPU_SCAN_UNROLL`, patch ``seqjax.nn.recurrent.layers``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from seqjax.nn.recurrent import StackedRNN
    >>> stack = StackedRNN(8, num_layers=2, bidirectional=True)
    >>> x = jnp.ones((2, 5, 3)); params = stack.init(jax.random.PRNGKey(0), x)
    >>> y, carry = stack.apply(params, x, lengths=jnp.array([5, 2]), method="with_state")
    >>> y.shape, len(carry)
    ((2, 5, 16), 2)
"""

from seqjax.nn.recurrent._cudnn import cudnn_lstm_weights
from seqjax.nn.recurrent.layers import CELL_TYPES, RNN, Bidirectional, StackedRNN
from seqjax.nn.recurrent.layers import GPU_SCAN_UNROLL as GPU_SCAN_UNROLL
from seqjax.nn.recurrent.layers import IMPLEMENTATIONS as IMPLEMENTATIONS

__all__ = ["RNN", "Bidirectional", "StackedRNN", "CELL_TYPES", "cudnn_lstm_weights"]
