r"""Transformer parameter counts against MEDL's 63,046,144 and Vaswani et al.'s 65M.

MEDL §7.5 counts the base transformer (p = 512, N₁ = 2048, H = 8, m = m_v = 64, N = 6,
d_V ≈ 37,000) with bias-free attention heads, (7.32):

.. math::  \text{encoder block} = 4p + 2N_1p + N_1 + p + H(2mp + 2m_vp) = 3{,}150{,}336

and ``+ H(2mp + 2m_vp) + 2p`` for a decoder block (4,199,936), then adds a shared
embedding ``d_V × p`` and an output layer it prints as ``d_V × p + p`` for a total of
63,046,144. Vaswani et al. (2017) Table 3 lists "65M" for the base model. Here every
count is measured: the model presets are initialised abstractly (``jax.eval_shape``, no
memory) and their parameter trees counted with :func:`seqjax.utils.count_params`, per
component; (7.32) is also evaluated as a formula. Other presets are listed beside the
numbers their papers or reference code print.

Run:  python -m seqjax.experiments.param_counts --results_dir seqjax/experiments/results
      python -m seqjax.experiments.param_counts --smoke --workdir /tmp/pc
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from seqjax.experiments._config import PosInt
from seqjax.experiments._kit import Task, command_line, load_average, train
from seqjax.experiments.reports.param_counts import MEDL_TOTAL, VASWANI_BASE, report
from seqjax.models.bert import Bert
from seqjax.models.encoder_decoder import TRANSFORMER_PRESETS, Transformer
from seqjax.models.gpt import TransformerLM
from seqjax.models.vit import ViT
from seqjax.utils import count_params


@dataclass(frozen=True)
class Config:
    """The options of ``seqjax train param_counts`` (counting only; nothing is trained).

    Attributes:
        presets: the model presets counted beside their published numbers (names from
            ``TRANSFORMER_PRESETS``, ``TRANSFORMER_LM_PRESETS``, ``BERT_PRESETS`` and
            ``VIT_PRESETS``; comma-separated).
        vocab_size: ``d_V``, the shared vocabulary of the ``vaswani-base`` breakdown (the
            other presets keep their own).
        seed: unused (the parameters are initialised abstractly, with a fixed key).
        workdir: the report (``param_counts.md``) and the summary (``param_counts.json``);
            unset = none written.
        results_dir: also write the report here; unset = nowhere else.
    """

    presets: tuple[str, ...] = ("vaswani-big", "nanogpt-cpu", "nanogpt-shakespeare-char",
                                "gpt2-small", "bert-base", "bert-large", "vit-base-16")
    vocab_size: PosInt = 37000
    seed: int = 0
    workdir: str | None = "workdirs/param_counts"
    results_dir: str | None = None

    def __post_init__(self) -> None:  # at the door, before the work dir is written
        known = preset_names()
        for name in self.presets:
            if name not in known:
                raise ValueError(f"--presets: unknown preset {name!r}; choose from "
                                 f"{', '.join(known)}.")


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"presets": ("nanogpt-cpu",)},
}


def medl_formula(p: int = 512, n1: int = 2048, heads: int = 8, m: int = 64,
                 m_v: int = 64) -> dict[str, int]:
    """MEDL (7.32) and the decoder-block count after it, evaluated."""
    enc = 4 * p + 2 * n1 * p + n1 + p + heads * (2 * m * p + 2 * m_v * p)
    dec = enc + heads * (2 * m * p + 2 * m_v * p) + 2 * p
    return {"encoder_block": enc, "decoder_block": dec}


def abstract_params(model: Any, *inputs: Any) -> Any:
    """The parameter tree's shapes, without allocating it (``jax.eval_shape``)."""
    return jax.eval_shape(lambda k, *xs: model.init(k, *xs), jax.random.PRNGKey(0),
                          *inputs)["params"]


def _tokens(n: int = 8) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((1, n), jnp.int32)


def transformer_breakdown(attention_use_bias: bool, vocab: int) -> dict[str, int]:
    """Per-component counts of ``Transformer.from_preset("vaswani-base")``."""
    block = TRANSFORMER_PRESETS["vaswani-base"].block.replace(
        attention_use_bias=attention_use_bias)
    model = Transformer.from_preset("vaswani-base", block=block, src_vocab_size=vocab)
    p = abstract_params(model, _tokens(), _tokens())
    enc, dec = p["encoder"], p["decoder"]
    out = {
        "encoder block": count_params(enc["layers_0"]),
        "decoder block": count_params(dec["layers_0"]),
        "6 encoder blocks": count_params(enc),
        "6 decoder blocks": count_params(dec),
        "shared embedding (d_V × p)": count_params(p["shared_embed"]),
        "output bias (d_V)": count_params(p.get("output_bias", {})),
        "total": count_params(p),
    }
    return out


def preset_names() -> list[str]:
    """Every model preset :func:`preset_count` counts."""
    from seqjax.models.bert import BERT_PRESETS
    from seqjax.models.gpt import TRANSFORMER_LM_PRESETS
    from seqjax.models.vit import VIT_PRESETS

    return [*TRANSFORMER_PRESETS, *TRANSFORMER_LM_PRESETS, *BERT_PRESETS, *VIT_PRESETS]


def preset_count(name: str) -> tuple[int, int]:
    """``(total, position-embedding parameters)`` of a named preset."""
    from seqjax.models.bert import BERT_PRESETS
    from seqjax.models.gpt import TRANSFORMER_LM_PRESETS
    from seqjax.models.vit import VIT_PRESETS

    if name in TRANSFORMER_PRESETS:
        p = abstract_params(Transformer.from_preset(name), _tokens(), _tokens())
    elif name in TRANSFORMER_LM_PRESETS:
        p = abstract_params(TransformerLM.from_preset(name), _tokens())
    elif name in BERT_PRESETS:
        p = abstract_params(Bert.from_preset(name), _tokens())
    elif name in VIT_PRESETS:
        cfg = VIT_PRESETS[name]
        size = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
        p = abstract_params(ViT.from_preset(name),
                            jax.ShapeDtypeStruct((1, size, size, cfg.channels), jnp.float32))
    else:
        raise ValueError(f"unknown preset {name!r}.")
    pos = count_params(p.get("pos_embed", {}))
    return count_params(p), pos


def count(cfg: Config, started: float) -> dict:
    """(7.32) as a formula, the base transformer's measured breakdown (MEDL's convention
    and with attention biases) and every preset's total; printed."""
    formula = medl_formula()
    medl = transformer_breakdown(False, cfg.vocab_size)
    vaswani = transformer_breakdown(True, cfg.vocab_size)
    presets = {}
    for name in cfg.presets:
        total, pos = preset_count(name)
        presets[name] = {"total": total, "position_embeddings": pos}
        print(f"{name:26s} {total:>13,}  (without learned positions {total - pos:,})")
    wall = time.perf_counter() - started
    print(f"vaswani-base, MEDL convention: {medl['total']:,} (MEDL prints {MEDL_TOTAL:,}); "
          f"with attention biases: {vaswani['total']:,} (Vaswani: {VASWANI_BASE})")
    return {"formula": formula, "medl": medl, "vaswani": vaswani, "presets": presets,
            "wall_s": wall}


def build(cfg: Config) -> Task:
    """The counts train nothing: a task with no runs whose ``summarize`` hook counts
    (:func:`count`) and whose ``report`` is the markdown."""
    load, started = load_average(), time.perf_counter()
    return Task("param_counts", [], started=started,
                summarize=lambda _: {**count(cfg, started), "load_average": load},
                report=lambda s: report(cfg, s, command_line("param_counts", cfg)))


def run(cfg: Config) -> dict:
    """Count the parameters; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()
