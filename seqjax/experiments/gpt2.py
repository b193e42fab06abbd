"""Pretrain a GPT-2 on token shards: from ``seqjax prepare``'s shards (or llm.c's, or
nanoGPT's ``train.bin``/``val.bin``) to a trained model, resumable on any number of hosts.

Data (``--data_path``): a shard folder, a ``manifest.json`` or a nanoGPT ``train.bin``
(:func:`seqjax.data.shards.open_tokens`: memory-mapped, every shard's header and ids checked
once when opened; a manifest whose tokenizer is not the run's is refused). Each step's
global batch is ``batch_size`` random windows of ``block_size + 1`` tokens drawn from
``(seed, step)`` alone over every training shard
(:class:`~seqjax.data.shard_windows.ShardWindows`; ``--align=document`` starts each at a
document); each process reads only its rows, so the step number alone resumes the stream,
on any number of processes.

Model: GPT-2 (:class:`~seqjax.models.gpt.TransformerLM`, learned positions, tied
embeddings, pre-norm blocks with biases and tanh-GELU by default), its residual projections at
``0.02/√(2L)``; the vocabulary padded to ``vocab_size`` (50304 = 50257 rounded up to a
multiple of 128, as nanoGPT and llm.c: the padded rows are never targets).

Presets:

* ``124m`` — GPT-2 124M (12 layers, 12 heads, d = 768, T = 1024) with llm.c's GPT-2
  (124M) schedule on FineWeb 10B: 524,288 tokens per step (512 rows; ``--micro_batch_size``
  rows per device per micro-step sets ``--grad_accum``), 18,865 steps, AdamW lr 6e-4
  (β = 0.9, 0.95; weight decay 0.1 on every matrix), 700 warm-up steps, cosine to 0,
  clipping at 1.0, bfloat16 compute, dropout 0 (as llm.c and nanoGPT pretrain; it also
  keeps attention on the fused cuDNN kernel). llm.c reaches val ≈ 3.27 and HellaSwag
  acc_norm ≈ 29.9% there.
* ``cpu`` — nanoGPT's README CPU shapes and its model's defaults (4 layers, 4 heads,
  d = 128, T = 64, batch 12, dropout 0, no biases, exact GELU; AdamW 1e-3, β₂ = 0.99,
  100 warm-up steps, cosine to 1e-4 over 500 steps) on GPT-2 BPE, a few minutes: what
  ``benchmarks/README.md`` runs side by side with nanoGPT's own ``train.py`` on the Tiny
  Shakespeare bins of its ``data/shakespeare/prepare.py``.
* ``smoke`` — seconds, for CI.
* ``modern`` — the modded-nanogpt optimisation track's model and optimiser at 124M: 12
  layers, d = 768, 6 heads of 128, T = 1024, rotary positions, QK-norm, ReLU², RMSNorm, no
  biases, zero-initialised residual projections, an untied head, logits soft-capped at 30;
  Muon (lr 0.05, momentum 0.95, Nesterov, 5 Newton–Schulz steps) on the hidden matrices,
  AdamW (β = 0.8, 0.95) on the embedding (lr 0.6), the head (0.008) and the vectors (0.04),
  no weight decay; 524,288 tokens per step, 3,250 steps, cosine decay without warm-up (the
  track's tuned Muon entry reaches val 3.28 on FineWeb in 3,250 steps with its own
  schedule; this preset is not measured here).
* ``modern_cpu`` — the same switches and optimiser at the ``cpu`` preset's width, depth,
  context, batch and steps (``benchmarks/README.md`` runs it beside nanoGPT's ``train.py``
  and the ``cpu`` preset, and ablates each switch); ``modern_smoke`` — seconds, for CI.

* ``char_lm`` — ``seqjax train char_lm`` (:mod:`seqjax.experiments.char_lm`): this recipe
  with nanoGPT's ``shakespeare_char`` data and configs as its defaults (Tiny Shakespeare's
  characters, ``--input device``, nanoGPT's estimate of the validation loss, an LSTM preset).

Beside the shards, a text file is a ``--data_path``: tokenised at the start with
``--tokenizer`` (``char``: its characters) into nanoGPT's layout in a temporary folder.
``--model.architecture lstm`` trains a stacked LSTM on the same windows; ``--input device``
draws the windows inside the jitted step from the training shard held on the devices
(:class:`~seqjax.data.device.DeviceLMWindows`); ``--eval_batches N`` evaluates nanoGPT's
estimate (N random batches) during training, and at the end on both splits.

The network is one group of options, ``--model.KEY`` (:class:`~seqjax.experiments._gpt.
ModelOptions`: ``--model.num_layers 12 --model.embed_dim 768``), handed whole to the model
builder. Every switch of the modern model is an option of its own, so a run can ablate one:
``--model.positions rope``, ``--model.qk_norm``, ``--model.activation relu_squared``,
``--model.norm_type rmsnorm``, ``--model.use_bias false``, ``--model.residual_init_std 0``,
``--model.tie_embeddings false``, ``--model.logit_softcap 30``, ``--optimizer muon``. The flat
spellings of before (``--num_layers``, ``--model lstm``) exit with status 2 naming the new one.

Evaluation, every ``eval_every`` steps and at the end: the validation loss on the first
``val_tokens`` tokens of the validation shards, in non-overlapping windows (llm.c's fixed
validation tokens); HellaSwag ``acc_norm`` (llm.c's completion scoring) from a local
``hellaswag_val.jsonl`` (``--hellaswag``) and any multiple-choice or cloze task from local
jsonl files (``--tasks arc_easy.jsonl,lambada.jsonl``, :mod:`seqjax.evals`), their items split
over the devices. Every file is read, encoded and checked before the first step. At the end,
a sample with the run's tokenizer, from ``--sample_prompt`` (default: the end-of-text
token). ``seqjax eval`` and ``seqjax generate --prompt ...`` read the work dir.

Run:  seqjax prepare --tokenizer gpt2 --format nanogpt --split text --val_fraction 0.1 \\
          shakespeare.txt --out data/shakespeare
      seqjax train gpt2 --preset cpu --data_path data/shakespeare --workdir workdirs/gpt2_cpu
      seqjax prepare --tokenizer char --format nanogpt --split text shakespeare.txt \\
          --out data/shakespeare_char        # nanoGPT's shakespeare_char, id for id
      seqjax train gpt2 --preset cpu --data_path data/shakespeare_char --tokenizer char \\
          --vocab_size 65 --sample_prompt=$'\\n'     # or --data_path shakespeare.txt
      seqjax train gpt2 --preset 124m --data_path fineweb10B/ --workdir workdirs/gpt2_124m
      seqjax generate --workdir workdirs/gpt2_cpu --prompt "ROMEO:"
"""

from __future__ import annotations

from typing import Any

from seqjax.experiments._gpt import (
    Config,
    ModelOptions,
    build,
    build_model,
    compile_sampler_ahead,
    evaluate,
    generate,
    grad_accum,
    load_tokens,
    model_config,
    optimizer,
    run,
    sample_prompt,
    summarize,
    text_tokenizer,
    validation_windows,
)

__all__ = [
    "Config",
    "build",
    "build_model",
    "compile_sampler_ahead",
    "evaluate",
    "generate",
    "grad_accum",
    "load_tokens",
    "model_config",
    "optimizer",
    "run",
    "sample_prompt",
    "summarize",
    "text_tokenizer",
    "validation_windows",
    "MODERN",
    "ModelOptions",
    "PRESETS",
]

_CPU: dict[str, Any] = {
    "model.num_layers": 4, "model.num_heads": 4, "model.embed_dim": 128, "block_size": 64,
    "batch_size": 12, "model.use_bias": False, "model.activation": "gelu",
    "micro_batch_size": None, "learning_rate": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 100,
    "beta2": 0.99, "compute_dtype": "float32", "steps": 500, "eval_every": 0,
    "val_tokens": 1_000_000, "log_every": 50, "checkpoint_every": 0, "steps_per_call": 10,
    "sample_tokens": 64,
}
_SMOKE: dict[str, Any] = {
    "model.num_layers": 1, "model.num_heads": 2, "model.embed_dim": 16, "block_size": 16,
    "batch_size": 8,
    "steps": 4, "warmup_steps": 2, "val_tokens": 256, "log_every": 2, "steps_per_call": 1,
    "sample_tokens": 8, "task_items": 4, "progress": False}
#: The modern GPT's switches and optimiser (the ``modern*`` presets).
MODERN: dict[str, Any] = {
    "model.positions": "rope", "model.qk_norm": True, "model.activation": "relu_squared",
    "model.norm_type": "rmsnorm", "model.use_bias": False, "model.residual_init_std": 0.0,
    "model.tie_embeddings": False, "model.logit_softcap": 30.0, "optimizer": "muon",
    "muon_learning_rate": 0.05, "momentum": 0.95, "ns_steps": 5, "learning_rate": 0.04,
    "embed_learning_rate": 0.6, "head_learning_rate": 0.008, "beta1": 0.8, "beta2": 0.95,
    "weight_decay": 0.0}
_MODERN_CPU: dict[str, Any] = {**_CPU, **MODERN}
PRESETS: dict[str, dict[str, Any]] = {
    "124m": {},
    "cpu": _CPU,
    "smoke": {**_CPU, **_SMOKE},
    "modern": {**MODERN, "model.num_heads": 6, "steps": 3250, "warmup_steps": 0,
               "min_lr_ratio": 0.0},
    "modern_cpu": _MODERN_CPU,
    "modern_smoke": {**_MODERN_CPU, **_SMOKE},
}


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()
