"""seqjax.interop: import weights from PyTorch / Hugging Face checkpoints (safetensors only),
and export a gpt2 run as a Hugging Face GPT-2 folder."""

from seqjax.interop.hf_bert import (
    HF_BERT_PRESETS,
    bert_config_from_hf,
    load_hf_bert,
    sentence_embeddings,
)
from seqjax.interop.hf_export import ExportWriteError, check_exportable, export_gpt2
from seqjax.interop.hf_gpt2 import (
    HF_GPT2_PRESETS,
    gpt2_config_from_hf,
    gpt2_config_to_hf,
    gpt2_params_to_hf,
    load_hf_gpt2,
)
from seqjax.interop.safetensors_io import Checkpoint, check_params_like, load_tensors, read_config
from seqjax.interop.torch_rnn import seqjax_to_torch_rnn, torch_rnn_to_seqjax

__all__ = ["Checkpoint", "ExportWriteError", "HF_BERT_PRESETS", "HF_GPT2_PRESETS",
           "bert_config_from_hf", "check_exportable", "check_params_like", "export_gpt2",
           "gpt2_config_from_hf", "gpt2_config_to_hf", "gpt2_params_to_hf", "load_hf_bert",
           "load_hf_gpt2", "load_tensors", "read_config", "sentence_embeddings",
           "seqjax_to_torch_rnn", "torch_rnn_to_seqjax"]
