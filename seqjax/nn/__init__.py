"""seqjax.nn: building blocks (cells, recurrent layers, attention, transformer blocks, ...)."""

from seqjax.nn.cells import ElmanCell, GRUCell, LSTMCell, RecurrentCell
from seqjax.nn.recurrent import CELL_TYPES, RNN, Bidirectional, StackedRNN

__all__ = [
    "CELL_TYPES",
    "RNN",
    "Bidirectional",
    "ElmanCell",
    "GRUCell",
    "LSTMCell",
    "RecurrentCell",
    "StackedRNN",
]
