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
from seqjax.models.bert import BERT_PRESETS, Bert, BertConfig, bert_block, mlm_mask
from seqjax.models.captioning import ImageCaptioner, ImageCaptionerConfig
from seqjax.models.encoder_decoder import (
    TRANSFORMER_PRESETS,
    Transformer,
    TransformerConfig,
    vaswani_block,
)
from seqjax.models.gpt import (
    TRANSFORMER_LM_PRESETS,
    TransformerLM,
    TransformerLMClassifier,
    TransformerLMConfig,
    gpt_block,
)
from seqjax.models.rnn import (
    RNNClassifier,
    RNNClassifierConfig,
    RNNConfig,
    RNNLanguageModel,
    RNNLMConfig,
    RNNTagger,
    RNNTaggerConfig,
)
from seqjax.models.seq2seq import (
    Seq2Seq,
    Seq2SeqConfig,
    reverse_sequences,
    scheduled_sampling_epsilon,
    scheduled_sampling_inputs,
)
from seqjax.models.vit import (
    VIT_PRESETS,
    ViT,
    ViTConfig,
    num_patches,
    patchify,
    unpatchify,
    vit_block,
)
from seqjax.models.word2vec import Word2Vec

__all__ = [
    "AST", "AST_PRESETS", "ASTConfig", "patch_grid", "spectrogram_patches",
    "BagOfWordsLM", "NGramClassifier", "NGramLM", "NaiveBayes", "bag_of_words",
    "scheduled_sampling_epsilon", "scheduled_sampling_inputs",
    "BERT_PRESETS", "Bert", "BertConfig", "ImageCaptioner", "ImageCaptionerConfig",
    "RNNClassifier", "RNNClassifierConfig", "RNNConfig", "RNNLanguageModel", "RNNLMConfig",
    "RNNTagger", "RNNTaggerConfig",
    "Seq2Seq", "Seq2SeqConfig", "TRANSFORMER_LM_PRESETS", "TRANSFORMER_PRESETS", "Transformer",
    "TransformerConfig", "TransformerLM", "TransformerLMClassifier", "TransformerLMConfig",
    "VIT_PRESETS", "ViT",
    "ViTConfig", "Word2Vec", "bert_block", "gpt_block", "vaswani_block", "vit_block",
    "masked_pool", "mlm_mask", "num_patches",
    "patchify", "reverse_sequences", "unpatchify",
]
