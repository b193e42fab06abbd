"""What the Hugging Face loaders (:mod:`~seqjax.interop.hf_gpt2`, :mod:`~seqjax.interop.hf_bert`)
share: ``config.json`` fields and the checkpoint -> checked model flow of :func:`load`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.interop.safetensors_io import Checkpoint, check_params_like, read_config

#: transformers' ``ACT2FN`` name -> seqjax activation (:data:`seqjax.nn.ffn.ACTIVATIONS`).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "relu": "relu", "relu2": "relu_squared", "silu": "silu",
               "swish": "silu", "tanh": "tanh"}


def activation(hf: dict, field: str, default: str) -> str:
    name = hf.get(field, default)
    if name not in ACTIVATIONS:
        raise ValueError(f"config `{field}` must be one of {sorted(ACTIVATIONS)}; got {name!r}.")
    return ACTIVATIONS[name]


def int_fields(hf: dict, model_type: str, family: str, *fields: str) -> list[int]:
    """``int(hf[f])`` of the required ``fields`` of a ``model_type`` config, the first two the
    width and the number of heads that must divide it; another ``model_type``, a missing field or
    an indivisible width is a ``ValueError``."""
    got = hf.get("model_type", model_type)
    if got != model_type:
        raise ValueError(f"config `model_type` must be {model_type!r}; got {got!r}.")
    for field in fields:
        if field not in hf:
            raise ValueError(f"{family} config.json is missing the field {field!r}.")
    d, heads, *rest = (int(hf[f]) for f in fields)
    if d % heads:
        raise ValueError(f"config `{fields[0]}` {d} must be divisible by `{fields[1]}` {heads}.")
    return [d, heads, *rest]


def stack_layers(layers: dict[str, Any], scan: bool) -> dict[str, Any]:
    """``{"layers_i": tree}``, or with ``scan`` one ``{"layers": tree}`` of leaves ``[L, ...]``."""
    if not scan:
        return layers
    return {"layers": jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers.values())}


def param_shapes(model: Any) -> Any:
    """The parameter shapes of a token model (``jax.eval_shape``: nothing computed)."""
    init = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    return init["params"]


def load(path: Any, preset: Any, overrides: dict[str, Any],
         convert: Callable[[Checkpoint, Any], tuple[dict, Any]], *, presets: dict[str, Any],
         config_cls: type, from_hf: Callable[[dict], Any], model_cls: Callable[..., Any],
         what: str, dtype: Any, param_dtype: Any, adjust: Callable[[Any], Any] = lambda c: c,
         ) -> tuple[Any, dict, Path]:
    """``(model, {"params": ...}, directory)``: the config is ``preset`` (a ``config_cls``, or a
    name in ``presets``; ``org/name`` is looked up by ``name``) or ``from_hf(config.json)``, then
    ``adjust`` and ``overrides``; ``convert`` claims the tensors, giving the parameters (checked
    against ``model_cls``) and the final config."""
    ckpt = Checkpoint.open(path)
    kind = config_cls.__name__
    if isinstance(preset, config_cls):
        cfg = preset
    elif preset is not None:
        key = preset if preset in presets else str(preset).rsplit("/", 1)[-1]
        if key not in presets:
            raise ValueError(f"`preset` must be a {kind} or one of {sorted(presets)}; "
                             f"got {preset!r}.")
        cfg = presets[key]
    else:
        hf = read_config(ckpt.directory)
        if hf is None:
            raise FileNotFoundError(f"no config.json in {str(ckpt.directory)!r}; pass `preset` "
                                    f"(one of {sorted(presets)} or a {kind}).")
        cfg = from_hf(hf)
    cfg = adjust(cfg).replace(**overrides)
    params, cfg = convert(ckpt, cfg)
    model = model_cls(cfg, dtype=dtype, param_dtype=param_dtype)
    check_params_like(params, param_shapes(model), what)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, param_dtype), params)
    return model, {"params": params}, ckpt.directory
