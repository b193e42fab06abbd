"""seqjax.models: complete models built from seqjax.nn."""

from seqjax.models._common import masked_pool
from seqjax.models.ast import AST, AST_PRESETS, ASTConfig, patch_grid, spectrogram_patches
from seqjax.models.baselines import (
    BagOfWordsLM,
    NaiveBayes,
    NGramClassifier,
    NGramLM,
    bag_of_words,
)
from seqjax.models.bert import BERT_PRESETS, Bert, BertConfig, mlm_mask
from seqjax.models.captioning import ImageCaptioner
from seqjax.models.encoder_decoder import TRANSFORMER_PRESETS, Transformer, TransformerConfig
from seqjax.models.gpt import (
    TRANSFORMER_LM_PRESETS,
    TransformerLM,
    TransformerLMClassifier,
    TransformerLMConfig,
)
from seqjax.models.rnn import RNNClassifier, RNNLanguageModel, RNNTagger
from seqjax.models.seq2seq import (
    Seq2Seq,
    reverse_sequences,
    scheduled_sampling_epsilon,
    scheduled_sampling_inputs,
)
from seqjax.models.vit import VIT_PRESETS, ViT, ViTConfig, num_patches, patchify, unpatchify

__all__ = [
    "AST", "AST_PRESETS", "ASTConfig", "patch_grid", "spectrogram_patches",
    "BagOfWordsLM", "NGramClassifier", "NGramLM", "NaiveBayes", "bag_of_words",
    "scheduled_sampling_epsilon", "scheduled_sampling_inputs",
    "BERT_PRESETS", "Bert", "BertConfig", "ImageCaptioner", "RNNClassifier", "RNNLanguageModel",
    "RNNTagger",
    "Seq2Seq", "TRANSFORMER_LM_PRESETS", "TRANSFORMER_PRESETS", "Transformer",
    "TransformerConfig", "TransformerLM", "TransformerLMClassifier", "TransformerLMConfig",
    "VIT_PRESETS", "ViT",
    "ViTConfig", "Word2Vec", "Word2VecConfig", "masked_pool", "mlm_mask", "num_patches",
    "patchify", "reverse_sequences", "train_word2vec", "unpatchify",
]

# Imported on first use: word2vec trains with seqjax.train, and token_cross_entropy (one
# function, seqjax.train.losses.token_cross_entropy) is a loss, not a model.
_LAZY = {"Word2Vec": "seqjax.models.word2vec", "Word2VecConfig": "seqjax.models.word2vec",
         "train_word2vec": "seqjax.models.word2vec", "token_cross_entropy": "seqjax.train.losses"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqjax.models' has no attribute {name!r}")
