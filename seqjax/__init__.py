"""seqjax: sequence models in JAX/Flax, faithful to the textbooks and fast."""

__version__ = "0.1.0"

from seqjax import nn  # noqa: E402
from seqjax.utils import count_params  # noqa: E402

__all__ = ["__version__", "count_params", "nn"]
