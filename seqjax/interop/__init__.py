"""seqjax.interop: import weights from PyTorch / Hugging Face checkpoints (safetensors only)."""

from seqjax.interop.torch_rnn import seqjax_to_torch_rnn, torch_rnn_to_seqjax

__all__ = ["seqjax_to_torch_rnn", "torch_rnn_to_seqjax"]
