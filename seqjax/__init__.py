"""seqjax: sequence models in JAX/Flax, faithful to the textbooks and fast."""

__version__ = "0.1.0"

from seqjax import decoding, models, nn  # noqa: E402
from seqjax._traced_checks import checked  # noqa: E402
from seqjax.compile_cache import enable_compile_cache  # noqa: E402
from seqjax.decoding import (  # noqa: E402
    BeamSearchOutput,
    Decodable,
    DecodeOutput,
    FunctionalDecoder,
    beam_search,
    generate,
    greedy_search,
    process_logits,
    recompute_decoder,
    sample,
)
from seqjax.utils import count_params  # noqa: E402

__all__ = [
    "BeamSearchOutput", "Decodable", "DecodeOutput", "FunctionalDecoder", "__version__",
    "beam_search", "checked", "count_params", "decoding", "enable_compile_cache", "generate",
    "greedy_search", "models", "nn", "process_logits", "recompute_decoder", "sample",
]
