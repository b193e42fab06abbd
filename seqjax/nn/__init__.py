"""seqjax.nn: cells, RNNs, attention, positions, norms, FFNs, transformers, linear-time layers."""

from seqjax.nn.attention import (
    SCORE_FUNCTIONS,
    Attention,
    KVCache,
    MultiHeadAttention,
    additive_score,
    concat_score,
    dot_product_attention,
    dot_product_attention_with_weights,
    dot_score,
    general_score,
    masked_softmax,
    scaled_dot_score,
    simple_self_attention,
    simple_self_attention_with_weights,
)
from seqjax.nn.cells import (
    ElmanCell,
    GRUCell,
    LayerWeights,
    LSTMCell,
    OutputFeedbackCell,
    RecurrentCell,
    SimpleGatedCell,
)
from seqjax.nn.conv import CausalConv1D
from seqjax.nn.dense import Dense, DenseGeneral
from seqjax.nn.embedding import Embed, embedding_lookup
from seqjax.nn.ffn import ACTIVATIONS, GLU, GLU_VARIANTS, MLP, get_activation, glu_hidden_dim
from seqjax.nn.linear_attention import (
    FEATURE_MAPS,
    LinearAttention,
    LinearAttentionCache,
    elu_plus_one,
    linear_attention,
    linear_attention_step,
    linear_attention_weights,
    linear_attention_with_state,
)
from seqjax.nn.lora import LORA_TARGETS, init_lora, lora_delta, merge_lora, unmerge_lora
from seqjax.nn.masks import (
    causal_mask,
    combine_masks,
    make_attention_mask,
    padding_mask,
    segment_mask,
    sliding_window_mask,
)
from seqjax.nn.norms import LayerNorm, RMSNorm, layer_norm, rms_norm
from seqjax.nn.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    one_hot_positions,
    rope_frequencies,
    sinusoidal_positions,
)
from seqjax.nn.recurrent import CELL_TYPES, RNN, Bidirectional, StackedRNN, cudnn_lstm_weights
from seqjax.nn.ssm import (
    CausalDepthwiseConv1d,
    MambaBlock,
    MambaCache,
    MinGRU,
    SelectiveSSM,
    discretize,
    linear_recurrence,
    selective_scan,
    selective_scan_with_state,
    selective_step,
)
from seqjax.nn.transformer import (
    REMAT_POLICIES,
    BlockConfig,
    DecoderLayerCache,
    TransformerBlock,
    TransformerDecoder,
    TransformerEncoder,
)
from seqjax.nn.vq import VectorQuantizer, kmeans_codebook, nearest_code, quantize, vq_losses

__all__ = [
    # recurrent
    "CELL_TYPES", "RNN", "Bidirectional", "ElmanCell", "GRUCell", "LSTMCell", "RecurrentCell",
    "OutputFeedbackCell", "SimpleGatedCell", "LayerWeights", "StackedRNN", "cudnn_lstm_weights",
    # dense, embedding and convolution
    "Dense", "DenseGeneral", "Embed", "embedding_lookup", "CausalConv1D",
    # attention and masks
    "SCORE_FUNCTIONS", "Attention", "KVCache", "MultiHeadAttention", "additive_score",
    "concat_score", "dot_product_attention", "dot_product_attention_with_weights", "dot_score",
    "general_score", "masked_softmax", "scaled_dot_score", "simple_self_attention",
    "simple_self_attention_with_weights", "causal_mask", "combine_masks",
    "make_attention_mask", "padding_mask", "segment_mask", "sliding_window_mask",
    # positions
    "LearnedPositionalEmbedding", "SinusoidalPositionalEmbedding", "alibi_bias", "alibi_slopes",
    "apply_rope", "one_hot_positions", "rope_frequencies", "sinusoidal_positions",
    # norms and feed-forward
    "LayerNorm", "RMSNorm", "layer_norm", "rms_norm", "ACTIVATIONS", "GLU", "GLU_VARIANTS", "MLP",
    "get_activation", "glu_hidden_dim",
    # transformer
    "REMAT_POLICIES", "BlockConfig", "DecoderLayerCache", "TransformerBlock", "TransformerDecoder",
    "TransformerEncoder",
    # LoRA adapters
    "LORA_TARGETS", "init_lora", "lora_delta", "merge_lora", "unmerge_lora",
    # linear-time layers
    "FEATURE_MAPS", "LinearAttention", "LinearAttentionCache", "elu_plus_one", "linear_attention",
    "linear_attention_step", "linear_attention_weights", "linear_attention_with_state",
    "CausalDepthwiseConv1d", "MambaBlock", "MambaCache", "MinGRU", "SelectiveSSM", "discretize",
    "linear_recurrence", "selective_scan", "selective_scan_with_state", "selective_step",
    # vector quantisation
    "VectorQuantizer", "kmeans_codebook", "nearest_code", "quantize", "vq_losses",
]
