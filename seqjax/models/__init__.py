"""seqjax.models: complete models built from seqjax.nn."""

from seqjax.models._common import masked_pool, token_cross_entropy
from seqjax.models.bert import BERT_PRESETS, Bert, BertConfig, mlm_mask
from seqjax.models.encoder_decoder import TRANSFORMER_PRESETS, Transformer, TransformerConfig
from seqjax.models.gpt import TRANSFORMER_LM_PRESETS, TransformerLM, TransformerLMConfig
from seqjax.models.rnn import RNNClassifier, RNNLanguageModel, RNNTagger
from seqjax.models.seq2seq import Seq2Seq, reverse_sequences
from seqjax.models.vit import VIT_PRESETS, ViT, ViTConfig, num_patches, patchify, unpatchify

__all__ = [
    "BERT_PRESETS", "Bert", "BertConfig", "RNNClassifier", "RNNLanguageModel", "RNNTagger",
    "Seq2Seq", "TRANSFORMER_LM_PRESETS", "TRANSFORMER_PRESETS", "Transformer",
    "TransformerConfig", "TransformerLM", "TransformerLMConfig", "VIT_PRESETS", "ViT",
    "ViTConfig", "masked_pool", "mlm_mask", "num_patches", "patchify", "reverse_sequences",
    "token_cross_entropy", "unpatchify",
]
