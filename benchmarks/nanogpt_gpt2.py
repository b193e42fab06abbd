"""nanoGPT's own ``train.py`` against ``seqjax train gpt2 --preset cpu``, side by side on the
same GPT-2-BPE Tiny Shakespeare bins: val loss and time, 3 seeds a side.

Where ``nanogpt_loop`` re-implements nanoGPT's loop around a torch model, this runs
nanoGPT's unmodified scripts from a checkout of https://github.com/karpathy/nanoGPT
(``--nanogpt_dir DIR``: a folder holding ``train.py``, ``model.py``, ``configurator.py``,
``config/`` and ``data/shakespeare/prepare.py``; get one with
``git clone https://github.com/karpathy/nanoGPT``; without ``--nanogpt_dir`` the benchmark
uses ``$NANOGPT_DIR``, else clones one into its temporary folder unless ``--no_clone``).
Nothing of nanoGPT is kept in this repository: the scripts are copied into a temporary
folder at run time.

Data: nanoGPT's ``data/shakespeare/prepare.py`` itself, run in the temporary folder on the
corpus (``--data_path``; default ``shared/data/tinyshakespeare.txt`` in or beside the checkout)
as its ``input.txt``: a 90/10 split of the text, each part encoded with GPT-2's BPE
(``tiktoken.get_encoding("gpt2")``) to ``train.bin``/``val.bin`` (uint16; 301,966 and 36,059
tokens for the full corpus). Offline, ``get_encoding("gpt2")`` would download; the run
patches it to return the same encoding built from a local rank file (``--rank_file``;
default the ``gpt2.tiktoken`` that ``openai-whisper`` ships): GPT-2's encoding is tiktoken's
``r50k_base`` (same ranks, checked by SHA-256, same regex, ``<|endoftext|>`` = 50256). Both
sides train on these two files. When the CLI has it, ``seqjax prepare --tokenizer gpt2
--format nanogpt --split text --val_fraction 0.1`` is run on the same corpus and its bytes
compared with nanoGPT's (:func:`check_seqjax_prepare`; printed, the timing uses nanoGPT's).

The configuration (:class:`Setup`; defaults = seqjax's ``cpu`` preset, checked against it):
4 layers, 4 heads, d = 128, T = 64, batch 12, |V| = 50304 (nanoGPT's default without a
``meta.pkl``), no biases (``--bias=False``; seqjax ``--model.use_bias=false``), exact GELU
(nanoGPT's ``nn.GELU()``; seqjax ``--model.activation=gelu``), dropout 0, fp32, AdamW lr 1e-3
(β₂ = 0.99, weight decay 0.1 on matrices), 100 warm-up steps then cosine to 1e-4 at the last
step, clipping at 1.0, ``--steps`` (500) steps: 7,234,688 parameters on both sides (the
report prints both programs' counts).

Evaluation only at the end on both sides. nanoGPT (``--eval_interval=N``) evaluates at
iteration 0 and at N, each time the mean loss of ``eval_iters`` (200) random batches of the
train split and of the val split; seqjax evaluates once, after step N, on every window of
the val split in order (36,032 of its 36,059 tokens). nanoGPT's ``step N`` evaluation comes
before its iteration N, so it trains N + 1 steps; the val losses compared are both after N.

Seeds (``--seeds``, 0,1,2): seqjax ``--seed S``. ``train.py`` has no seed option (it calls
``torch.manual_seed(1337 + seed_offset)``, ``seed_offset`` = the DDP rank), so it runs as a
copy in the temporary folder whose one seed line reads ``torch.manual_seed(1337 +
seed_offset + S)`` — S = 0 is the unmodified script. The seed sets the initialisation and
the batches on both sides. Runs are sequential (never two at once), nanoGPT and seqjax
alternating per seed.

Figures, per run:

* ``wall s`` — the whole process, measured here around it: interpreter start, imports,
  data, model, compilation (seqjax), every training step, every evaluation, the final
  checkpoint, seqjax's summary files and plots.
* ``loop s`` — the training steps only, no evaluation: nanoGPT: N × the mean of its
  per-iteration ``time`` over iterations 1…N−1 (iteration 0's and N's times include an
  ``estimate_loss`` — N's also the checkpoint — and torch eager compiles nothing); seqjax:
  the ``time`` of step N in ``metrics.jsonl`` (``fit``'s meter: from before the first call,
  which compiles the step on the CPU, to step N's metrics on the host; the final evaluation
  comes after).
* ``ms/step`` — the steady step: nanoGPT: the mean ``time`` of iterations 1…N−1; seqjax:
  ``metrics.jsonl``'s time from the first call's record to step N over the steps between
  (the first call, with its compilation, left out).
* ``median`` — the median ms/step: of those iterations (nanoGPT), of the intervals between
  ``metrics.jsonl``'s records (seqjax: every 50 steps at the preset); less moved than the
  mean by other work on a shared machine.

Children: nanoGPT with ``OMP_NUM_THREADS`` = the cores; seqjax with ``JAX_PLATFORMS=cpu``,
``SEQJAX_COMPILE_CACHE=0`` (every run compiles: no program cached by an earlier run) and no
``XLA_FLAGS``. The report: per-run rows, mean ± sd per side, the ratios (nanoGPT ÷ seqjax,
> 1 = seqjax faster) and the val-loss difference, a row for ``benchmarks/README.md`` and the
exact commands; its last line is ``nanogpt_gpt2: wall ratio R×; ms/step ratio r×; val loss
seqjax − nanoGPT D``.

Run: ``python -m benchmarks nanogpt_gpt2 [--nanogpt_dir DIR] [--steps 500] [--seeds 0,1,2]
[--smoke]``.

On one GPU, ``--preset 124m`` runs GPT-2 124M instead (:data:`GPT2_124M`): nanoGPT's
``config/train_gpt2.py`` (``torch.compile``, bf16, 12 rows x 40 micro-steps of 1024 tokens,
no wandb) against ``seqjax train gpt2 --preset 124m`` with the same 480 rows per step
(``--micro_batch_size=12``), no biases and exact GELU on both sides, 100 steps (warm-up 20),
seed 0, on the same Tiny Shakespeare bins; the figure is the steady tokens/s of each (the
targets: seqjax ≥ 1.25x nanoGPT's and ≥ 500k tokens/s on one H100):
``python -m benchmarks nanogpt_gpt2 --preset 124m --nanogpt_dir DIR --timeout 400``.

``--smoke``: 1 layer, d = 16, T = 16, batch 8, 4 steps, 1 seed; it prints
``nanogpt_gpt2: skipped: REASON`` and exits 0 without a nanoGPT checkout or rank file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import runpy
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, nanogpt_loop

REPO_ROOT = Path(__file__).resolve().parent.parent
NANOGPT_URL = "https://github.com/karpathy/nanoGPT"
#: What a nanoGPT checkout must hold for this benchmark.
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py",
                 "data/shakespeare/prepare.py")
SEED_LINE = "torch.manual_seed(1337 + seed_offset)"
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "tinyshakespeare.txt"
EOT = "<|endoftext|>"

# nanoGPT's log lines (train.py).
EVAL_LINE = re.compile(r"^step (\d+): train loss (\S+), val loss (\S+)$", re.M)
ITER_LINE = re.compile(r"^iter (\d+): loss (\S+), time ([0-9.]+)ms", re.M)
PARAMS_LINE = re.compile(r"^num (?:non-)?decayed parameter tensors: \d+, with ([\d,]+) "
                         r"parameters$", re.M)


@dataclasses.dataclass(frozen=True)
class Setup:
    """One configuration, spelled for both programs (defaults: seqjax's ``cpu`` preset).

    ``eval_iters`` is nanoGPT's (random batches per split per evaluation); ``val_tokens``,
    ``log_every`` and ``steps_per_call`` are seqjax's (``None`` = the preset's).
    """

    num_layers: int = 4
    num_heads: int = 4
    embed_dim: int = 128
    block_size: int = 64
    batch_size: int = 12
    use_bias: bool = False
    activation: str = "gelu"
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    beta2: float = 0.99
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    vocab_size: int = 50304
    eval_iters: int = 200
    val_tokens: int | None = None
    log_every: int | None = None
    steps_per_call: int | None = None
    # the GPU comparison (--preset 124m): nanoGPT's config/train_gpt2.py on one device
    preset: str = "cpu"
    nanogpt_config: str = "config/train_shakespeare_char.py"
    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = False
    grad_accum: int = 1

    @property
    def rows(self) -> int:
        """Rows per optimiser step (seqjax's global ``batch_size``)."""
        return self.batch_size * self.grad_accum


DEFAULT = Setup()
#: GPT-2 124M as nanoGPT's ``config/train_gpt2.py`` trains it on one GPU (12 rows x 40
#: micro-steps of 1024 tokens = 491,520 tokens per step, bf16, ``torch.compile``), its
#: warm-up shortened so that a run of a few hundred steps decays; seqjax: ``--preset 124m``
#: with the same rows (``--micro_batch_size 12`` gives the 40 micro-steps).
GPT2_124M = Setup(num_layers=12, num_heads=12, embed_dim=768, block_size=1024, batch_size=12,
                  learning_rate=6e-4, min_lr=6e-5, warmup_steps=20, beta2=0.95,
                  eval_iters=20, val_tokens=491_520, log_every=10, steps_per_call=1,
                  preset="124m", nanogpt_config="config/train_gpt2.py", device="cuda",
                  dtype="bfloat16", compile=True, grad_accum=40)
SMOKE = Setup(num_layers=1, num_heads=2, embed_dim=16, block_size=16, batch_size=8,
              warmup_steps=2, eval_iters=2, val_tokens=256, log_every=1, steps_per_call=1)
SMOKE_STEPS = 4

#: Setup field -> the gpt2 recipe's option (``min_lr`` becomes ``min_lr_ratio``; the network's
#: options are the group ``--model.KEY``).
SEQJAX_KEYS = {"num_layers": "model.num_layers", "num_heads": "model.num_heads",
               "embed_dim": "model.embed_dim", "block_size": "block_size",
               "batch_size": "batch_size", "use_bias": "model.use_bias",
               "activation": "model.activation",
               "learning_rate": "learning_rate", "warmup_steps": "warmup_steps",
               "beta2": "beta2", "weight_decay": "weight_decay", "grad_clip": "clip_norm",
               "vocab_size": "vocab_size", "val_tokens": "val_tokens",
               "log_every": "log_every", "steps_per_call": "steps_per_call"}
#: What the comparison needs of the ``cpu`` preset, whatever the Setup.
SEQJAX_FIXED = {"model.dropout_rate": 0.0, "compute_dtype": "float32", "eval_every": 0,
                "micro_batch_size": None}


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One process: its side, seed, final val loss and times (the module docstring)."""

    side: str
    seed: int
    val_loss: float
    wall_s: float
    loop_s: float
    ms_per_step: float
    ms_median: float
    params: int
    load_before: str
    load_after: str


# ----------------------------------------------------------------------------- commands


def _flag(value: Any) -> str:
    """A value as nanoGPT's configurator reads it back (``literal_eval``, same type)."""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def nanogpt_command(setup: Setup, steps: int, *, python: str = sys.executable) -> list[str]:
    """nanoGPT's ``train.py`` at ``setup`` for ``steps`` iterations, evaluating only at 0 and
    ``steps``, logging every iteration, checkpoints to ``out`` (run in the copied folder)."""
    if steps <= setup.warmup_steps:
        raise ValueError(f"`steps` ({steps}) must exceed the warm-up ({setup.warmup_steps}): "
                         "nanoGPT's cosine decay asserts it.")
    if setup.activation != "gelu":
        raise ValueError(f"nanoGPT's MLP has the exact GELU only; got activation "
                         f"{setup.activation!r}")
    opts = {
        "dataset": "shakespeare", "device": setup.device, "compile": setup.compile,
        "dtype": setup.dtype,
        "block_size": setup.block_size, "batch_size": setup.batch_size,
        "n_layer": setup.num_layers, "n_head": setup.num_heads, "n_embd": setup.embed_dim,
        "dropout": 0.0, "bias": setup.use_bias, "max_iters": steps, "lr_decay_iters": steps,
        "warmup_iters": setup.warmup_steps, "learning_rate": float(setup.learning_rate),
        "min_lr": float(setup.min_lr), "beta2": float(setup.beta2),
        "weight_decay": float(setup.weight_decay), "grad_clip": float(setup.grad_clip),
        "eval_interval": steps, "eval_iters": setup.eval_iters, "log_interval": 1,
        "out_dir": "out",
    }
    if setup.grad_accum != 1:
        opts["gradient_accumulation_steps"] = setup.grad_accum
    if setup.nanogpt_config != DEFAULT.nanogpt_config:
        opts["wandb_log"] = False  # config/train_gpt2.py logs to wandb (a network service)
    return [python, "train.py", setup.nanogpt_config,
            *(f"--{k}={_flag(v)}" for k, v in opts.items())]


def seqjax_overrides(setup: Setup, preset: dict[str, Any]) -> dict[str, Any]:
    """The gpt2 options where ``setup`` differs from ``preset`` (the recipe's ``cpu``);
    raises when the ``cpu`` preset no longer fits the comparison (:data:`SEQJAX_FIXED`);
    another preset (``124m``) is set to it by options."""
    out: dict[str, Any] = {}
    fixed = dict(SEQJAX_FIXED)
    if setup.preset != "cpu":
        fixed.update(compute_dtype=setup.dtype, micro_batch_size=setup.batch_size)
    for key, want in fixed.items():
        if preset.get(key, want) != want:
            if setup.preset == "cpu":
                raise ValueError(f"seqjax's cpu preset has {key}={preset[key]!r}; this "
                                 f"benchmark needs {want!r}")
            out[key] = want
    for field, key in SEQJAX_KEYS.items():
        value = setup.rows if field == "batch_size" else getattr(setup, field)
        if value is not None and not _same(value, preset.get(key)):
            out[key] = value
    ratio = setup.min_lr / setup.learning_rate
    if not _same(ratio, preset.get("min_lr_ratio")):
        out["min_lr_ratio"] = ratio
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return b is not None and math.isclose(a, b, rel_tol=1e-9)
    return a == b


def seqjax_command(setup: Setup, data: str, steps: int, seed: int, workdir: str,
                   preset: dict[str, Any], *, python: str = sys.executable) -> list[str]:
    """``seqjax train gpt2 --preset P`` on ``data`` (as ``python -m seqjax.cli``)."""
    extra = [f"--{k}={v}" for k, v in seqjax_overrides(setup, preset).items()]
    return [python, "-m", "seqjax.cli", "train", "gpt2", "--preset", setup.preset, "--data_path",
            data,
            "--steps", str(steps), "--seed", str(seed), "--workdir", workdir,
            "--progress", "false", "--sample_tokens", "0", *extra]


def shown(cmd: Sequence[str]) -> str:
    """A command as a user types it: ``python`` for the interpreter, ``seqjax`` for
    ``python -m seqjax.cli``."""
    cmd = list(cmd)
    if cmd[1:3] == ["-m", "seqjax.cli"]:
        cmd = ["seqjax", *cmd[3:]]
    elif cmd and cmd[0] == sys.executable:
        cmd = ["python", *cmd[1:]]
    return shlex.join(cmd)


def seqjax_cpu_preset(name: str = "cpu") -> dict[str, Any]:
    """The gpt2 recipe's preset ``name`` over its config's defaults, flat: the network's
    options under their dotted keys (``model.num_layers``), as the presets spell them."""
    from seqjax.experiments import gpt2

    base: dict[str, Any] = {}
    for f in dataclasses.fields(gpt2.Config):
        if dataclasses.is_dataclass(f.default) and not isinstance(f.default, type):
            base.update({f"{f.name}.{g.name}": getattr(f.default, g.name)
                         for g in dataclasses.fields(f.default)})
        else:
            base[f.name] = f.default
    return {**base, **gpt2.PRESETS[name]}


# ----------------------------------------------------------------------------- parsing


def parse_nanogpt_log(text: str, steps: int) -> dict[str, Any]:
    """From ``train.py``'s output: the val (and train) loss of its ``step steps``
    evaluation, ``iter_ms`` = ``{iteration: time ms}`` of every logged iteration and
    ``params`` (the optimiser's decayed + non-decayed parameters: all of them)."""
    evals = {int(m[1]): (float(m[2]), float(m[3])) for m in EVAL_LINE.finditer(text)}
    if steps not in evals:
        raise ValueError(f"no 'step {steps}: train loss X, val loss Y' line in nanoGPT's "
                         f"output (evaluations at {sorted(evals)})")
    iter_ms = {int(m[1]): float(m[3]) for m in ITER_LINE.finditer(text)}
    params = sum(int(m[1].replace(",", "")) for m in PARAMS_LINE.finditer(text))
    return {"train_loss": evals[steps][0], "val_loss": evals[steps][1], "iter_ms": iter_ms,
            "params": params}


def nanogpt_step_ms(iter_ms: dict[int, float], steps: int) -> tuple[float, float]:
    """The mean and the median time of iterations 1…steps−1 in ms (0's and ``steps``'
    include an evaluation)."""
    inner = [iter_ms[i] for i in range(1, steps) if i in iter_ms]
    if len(inner) != steps - 1:
        raise ValueError(f"nanoGPT logged {len(inner)} of the iterations 1..{steps - 1}")
    return statistics.fmean(inner), statistics.median(inner)


def parse_seqjax_workdir(workdir: str | os.PathLike, steps: int) -> dict[str, Any]:
    """From the work dir of ``seqjax train gpt2``: ``val_loss``, ``params``,
    ``train_wall_s`` and ``wall_s`` (``gpt2.json``); ``loop_s`` = the ``time`` of step ``steps`` in
    ``metrics.jsonl``, ``ms_per_step`` = the time from its first record to that one
    over the steps between, and ``ms_median`` = the median over the intervals between
    consecutive records of their ms per step."""
    workdir = Path(workdir)
    summary = json.loads((workdir / "gpt2.json").read_text())
    if summary.get("val_loss") is None or summary.get("steps") != steps:
        raise ValueError(f"{workdir / 'gpt2.json'}: val_loss {summary.get('val_loss')}, "
                         f"steps {summary.get('steps')}; expected a val loss after {steps}")
    records = [json.loads(line) for line in
               (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in records if "time" in r and "step" in r]
    if not timed or timed[-1]["step"] != steps or timed[0]["step"] >= steps:
        raise ValueError(f"{workdir / 'metrics.jsonl'}: need timed records before and at "
                         f"step {steps}; got steps {[r['step'] for r in timed]}")
    first, last = timed[0], timed[-1]
    return {"val_loss": float(summary["val_loss"]), "train_wall_s": summary["train_wall_s"],
            "wall_s": summary["wall_s"], "loop_s": float(last["time"]),
            "params": int(summary.get("params") or 0),
            "ms_per_step": 1e3 * (last["time"] - first["time"]) / (steps - first["step"]),
            "ms_median": statistics.median(1e3 * (b["time"] - a["time"]) / (b["step"] - a["step"])
                                           for a, b in zip(timed, timed[1:]))}


# ----------------------------------------------------------------------------- set-up


def locate_nanogpt(path: str | None, *, clone_into: str | None) -> tuple[Path | None, str]:
    """A nanoGPT checkout and how it was found, or ``(None, why not)``. ``path`` (else
    ``$NANOGPT_DIR``) must hold :data:`NANOGPT_FILES`; with neither, ``git clone --depth 1``
    into ``clone_into`` (``None``: no clone)."""
    path = path or os.environ.get("NANOGPT_DIR") or None
    if path is None:
        if clone_into is None:
            return None, (f"no nanoGPT checkout: pass --nanogpt_dir DIR or set NANOGPT_DIR "
                          f"(git clone {NANOGPT_URL})")
        dest = Path(clone_into) / "nanoGPT"
        try:
            proc = subprocess.run(["git", "clone", "--quiet", "--depth", "1", NANOGPT_URL,
                                   str(dest)], capture_output=True, text=True, timeout=180,
                                  env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"git clone {NANOGPT_URL} failed ({err}); pass --nanogpt_dir DIR"
        if proc.returncode:
            return None, (f"git clone {NANOGPT_URL} failed: {proc.stderr.strip()[-300:]}; "
                          "pass --nanogpt_dir DIR")
        path = str(dest)
    folder = Path(path)
    missing = [f for f in NANOGPT_FILES if not (folder / f).is_file()]
    if missing:
        return None, f"{folder} is not a nanoGPT checkout: no {', '.join(missing)}"
    return folder, str(folder)


def describe_nanogpt(folder: Path) -> str:
    """The checkout's commit (when it is a git one) and its scripts' SHA-256 prefixes."""
    proc = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    commit = proc.stdout.strip() if proc.returncode == 0 else "not a git checkout"
    hashes = ", ".join(f"{name} {sha256(folder / name)[:12]}"
                       for name in ("train.py", "model.py"))
    return f"{folder} (commit {commit}; sha256 {hashes})"


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_rank_file() -> str | None:
    """GPT-2's ranks as shipped by ``openai-whisper``, if installed."""
    from seqjax.data.text_tokenizers import gpt2_rank_file

    return gpt2_rank_file()


def gpt2_encoding(rank_file: str) -> Any:
    """``tiktoken``'s GPT-2 encoding from a local rank file: ``r50k_base``'s ranks (checked
    by SHA-256), regex and ``<|endoftext|>`` = 50256, as ``tiktoken_ext.openai_public``
    defines them. Built from tiktoken's own definition, not seqjax's loader, so that the
    bins do not depend on the code :func:`check_seqjax_prepare` compares."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext import openai_public

    from seqjax.data.text_tokenizers import GPT2_RANKS_SHA256

    digest = sha256(rank_file)
    if digest != GPT2_RANKS_SHA256:
        raise ValueError(f"--rank_file {rank_file}: SHA-256 {digest}, expected "
                         f"{GPT2_RANKS_SHA256} (r50k_base, whisper's gpt2.tiktoken)")
    return tiktoken.Encoding(name="gpt2", pat_str=openai_public.r50k_pat_str,
                             mergeable_ranks=tiktoken.load.load_tiktoken_bpe(rank_file),
                             special_tokens={EOT: 50256}, explicit_n_vocab=50257)


@contextlib.contextmanager
def _offline_tiktoken(rank_file: str) -> Iterator[None]:
    """``tiktoken.get_encoding("gpt2")`` answered from ``rank_file``, and a stand-in
    ``requests`` module where it is not installed (prepare.py imports it to download an
    ``input.txt`` that is already there)."""
    import tiktoken

    encoding = gpt2_encoding(rank_file)
    original = tiktoken.get_encoding
    stub = None if "requests" in sys.modules else types.ModuleType("requests")
    tiktoken.get_encoding = lambda name: encoding if name == "gpt2" else original(name)
    try:
        if stub is not None:
            try:
                import requests  # noqa: F401
            except ImportError:
                sys.modules["requests"] = stub
        yield
    finally:
        tiktoken.get_encoding = original
        if stub is not None and sys.modules.get("requests") is stub:
            del sys.modules["requests"]


def prepare_run_folder(nanogpt: Path, corpus: Path, rank_file: str, folder: Path) -> Path:
    """Copy nanoGPT's scripts into ``folder``, run its ``data/shakespeare/prepare.py`` there
    on ``corpus``; returns the data folder (``train.bin``, ``val.bin``)."""
    for name in NANOGPT_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(nanogpt / name, folder / name)
    data = folder / "data" / "shakespeare"
    shutil.copyfile(corpus, data / "input.txt")
    with _offline_tiktoken(rank_file), contextlib.redirect_stdout(sys.stderr):
        runpy.run_path(str(data / "prepare.py"), run_name="__main__")
    if (data / "meta.pkl").exists():  # train.py would take its vocabulary from it
        raise RuntimeError(f"{data / 'meta.pkl'} exists; nanoGPT would not use |V| = 50304")
    return data


def seeded_train_py(folder: Path, seed: int) -> None:
    """``folder/train.py`` with its seed line ``torch.manual_seed(1337 + seed_offset)``
    made ``... + seed_offset + seed)`` (the original is kept as ``train.py.orig``)."""
    orig = folder / "train.py.orig"
    if not orig.exists():
        shutil.copyfile(folder / "train.py", orig)
    text = orig.read_text()
    if text.count(SEED_LINE) != 1:
        raise RuntimeError(f"nanoGPT's train.py has {text.count(SEED_LINE)} lines "
                           f"{SEED_LINE!r}; expected one (the seed is set there)")
    (folder / "train.py").write_text(
        text.replace(SEED_LINE, f"torch.manual_seed(1337 + seed_offset + {seed})"))


def check_seqjax_prepare(corpus: Path, rank_file: str, reference: Path, folder: Path
                         ) -> tuple[str, str]:
    """``seqjax prepare --tokenizer gpt2 --format nanogpt --split text --val_fraction 0.1``
    on ``corpus`` into ``folder``, its ``train.bin``/``val.bin`` compared by SHA-256 with
    nanoGPT's in ``reference``. Returns ``(status, text)``, status one of ``identical``,
    ``differs``, ``unavailable`` (the CLI has no ``prepare``) or ``failed``."""
    cmd = [sys.executable, "-m", "seqjax.cli", "prepare", "--tokenizer", "gpt2",
           "--rank_file", rank_file, "--format", "nanogpt", "--split", "text",
           "--val_fraction", "0.1", str(corpus), "--out", str(folder)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=seqjax_env())
    if proc.returncode and "invalid choice: 'prepare'" in proc.stderr:
        return "unavailable", "`seqjax prepare` is not in this checkout's CLI yet"
    if proc.returncode:
        return "failed", (f"`{shown(cmd)}` exited {proc.returncode}: "
                          f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    rows = []
    same = True
    for name in ("train.bin", "val.bin"):
        ours = folder / name
        theirs = sha256(reference / name)
        mine = sha256(ours) if ours.is_file() else "missing"
        same &= mine == theirs
        rows.append(f"{name} {mine[:16]} vs nanoGPT's {theirs[:16]}")
    status = "identical" if same else "differs"
    return status, f"`{shown(cmd)}`: {status} ({'; '.join(rows)})"


# ----------------------------------------------------------------------------- runs


def nanogpt_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def seqjax_env(device: str = "cpu") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": device, "SEQJAX_COMPILE_CACHE": "0"}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _run_logged(cmd: Sequence[str], cwd: Path, env: dict[str, str], log: Path,
                timeout: float | None) -> tuple[float, str]:
    """Run ``cmd`` to completion; its wall seconds and output (also in ``log``)."""
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.run(list(cmd), cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                              timeout=timeout)
        wall = time.perf_counter() - t0
    text = log.read_text()
    if proc.returncode:
        raise RuntimeError(f"`{shown(cmd)}` (in {cwd}) exited {proc.returncode}:\n"
                           f"{text[-3000:]}")
    return wall, text


def run_nanogpt(folder: Path, setup: Setup, steps: int, seed: int, threads: int,
                timeout: float | None) -> RunResult:
    """One ``train.py`` process in ``folder`` (its seed line set to ``seed``)."""
    seeded_train_py(folder, seed)
    shutil.rmtree(folder / "out", ignore_errors=True)
    load_before = _load()
    wall, text = _run_logged(nanogpt_command(setup, steps), folder, nanogpt_env(threads),
                             folder / f"nanogpt_seed{seed}.log", timeout)
    parsed = parse_nanogpt_log(text, steps)
    ms, median = nanogpt_step_ms(parsed["iter_ms"], steps)
    return RunResult("nanoGPT", seed, parsed["val_loss"], wall, steps * ms / 1e3, ms, median,
                     parsed["params"], load_before, _load())


def run_seqjax(folder: Path, data: Path, setup: Setup, steps: int, seed: int,
               preset: dict[str, Any], timeout: float | None) -> RunResult:
    """One ``seqjax train gpt2 --preset cpu`` process, its work dir in ``folder``."""
    workdir = folder / f"seqjax_seed{seed}"
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = seqjax_command(setup, str(data), steps, seed, str(workdir), preset)
    load_before = _load()
    wall, _ = _run_logged(cmd, folder, seqjax_env(setup.device),
                          folder / f"seqjax_seed{seed}.log", timeout)
    parsed = parse_seqjax_workdir(workdir, steps)
    return RunResult("seqjax", seed, parsed["val_loss"], wall, parsed["loop_s"],
                     parsed["ms_per_step"], parsed["ms_median"], parsed["params"], load_before,
                     _load())


# ----------------------------------------------------------------------------- report


def mean_sd(xs: Sequence[float], digits: int) -> str:
    """``"m ± sd"`` (sample sd) at ``digits`` decimals; ``"m"`` for one value."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """Means per side, the ratios nanoGPT ÷ seqjax (wall, ms/step) and the val-loss
    difference seqjax − nanoGPT."""
    side = {s: [r for r in results if r.side == s] for s in ("nanoGPT", "seqjax")}
    if not side["nanoGPT"] or not side["seqjax"]:
        raise ValueError("need runs of both sides")

    def mean(s: str, key: str) -> float:
        return statistics.fmean(getattr(r, key) for r in side[s])

    return {
        "wall_ratio": mean("nanoGPT", "wall_s") / mean("seqjax", "wall_s"),
        "step_ratio": mean("nanoGPT", "ms_per_step") / mean("seqjax", "ms_per_step"),
        "median_ratio": mean("nanoGPT", "ms_median") / mean("seqjax", "ms_median"),
        "val_diff": mean("seqjax", "val_loss") - mean("nanoGPT", "val_loss"),
        "sides": side,
    }


def report(results: Sequence[RunResult], setup: Setup, steps: int, tokens_note: str,
           prepare_note: str, commands: Sequence[str], nanogpt_note: str) -> str:
    """The markdown of the comparison (per run, per side, the README row, commands)."""
    s = summarize(results)
    per_run = harness.markdown_table(
        ["side", "seed", "val loss", "wall s", "loop s", "ms/step", "median",
         "load before → after"],
        [[r.side, r.seed, f"{r.val_loss:.4f}", f"{r.wall_s:.1f}", f"{r.loop_s:.1f}",
          f"{r.ms_per_step:.1f}", f"{r.ms_median:.1f}", f"{r.load_before} → {r.load_after}"]
         for r in results])
    tokens = setup.rows * setup.block_size
    per_side = harness.markdown_table(
        ["side", "runs", "val loss", "wall s", "loop s", "ms/step", "median",
         "tokens/s (ms/step)"],
        [[name, len(rs), mean_sd([r.val_loss for r in rs], 4),
          mean_sd([r.wall_s for r in rs], 1), mean_sd([r.loop_s for r in rs], 1),
          mean_sd([r.ms_per_step for r in rs], 1), mean_sd([r.ms_median for r in rs], 1),
          harness.format_rate(tokens * 1e3 / statistics.fmean(r.ms_per_step for r in rs))]
         for name, rs in s["sides"].items()])
    nano, ours = s["sides"]["nanoGPT"], s["sides"]["seqjax"]
    loads = [float(x.split()[0]) for r in results for x in (r.load_before, r.load_after)]
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    seeds = ",".join(str(r.seed) for r in ours)
    counts = {r.params for r in results}
    params = (f"{counts.pop():,} each side" if len(counts) == 1 else "nanoGPT " + ", ".join(
        f"{r.params:,}" for r in nano) + "; seqjax " + ", ".join(f"{r.params:,}" for r in ours)
        + " (DIFFERENT)")

    def cell(rs: list[RunResult]) -> str:
        return (f"{mean_sd([r.wall_s for r in rs], 1)} s wall, "
                f"{statistics.fmean(r.ms_per_step for r in rs):.0f} ms/step, "
                f"val {mean_sd([r.val_loss for r in rs], 3)}")

    row = (f"| GPT-2 BPE Tiny Shakespeare, {setup.num_layers}L/{setup.num_heads}H/"
           f"{setup.embed_dim}, T={setup.block_size}, B={setup.batch_size}, {steps} steps, "
           f"eval at the end, seeds {seeds} | {harness.machine_info()['cpu']}, {commit}, "
           f"load {min(loads):.1f}–{max(loads):.1f} | **{cell(ours)}** | {cell(nano)} "
           f"(`train.py`, torch eager) | **{s['wall_ratio']:.2f}×** wall, "
           f"{s['step_ratio']:.2f}× per step; val {s['val_diff']:+.3f} |")
    return "\n\n".join([
        f"### nanoGPT `train.py` vs `seqjax train gpt2 --preset {setup.preset}`: {steps} steps, "
        f"{len(ours)} seed(s) a side",
        f"nanoGPT: {nanogpt_note}",
        f"Data: {tokens_note}",
        f"seqjax prepare: {prepare_note}",
        "Per run (sequential, the sides alternating):\n\n" + per_run,
        "Per side (mean ± sd over seeds):\n\n" + per_side,
        f"Ratios nanoGPT ÷ seqjax (> 1: seqjax faster): wall **{s['wall_ratio']:.2f}×**, "
        f"ms/step **{s['step_ratio']:.2f}×** (median ms/step {s['median_ratio']:.2f}×). "
        "Val loss seqjax − nanoGPT: "
        f"{s['val_diff']:+.4f}.",
        "What the figures include: wall s = the whole process (start, imports, data, "
        "compilation, every step, every evaluation — nanoGPT's 2 × 2 × eval_iters "
        f"= {4 * setup.eval_iters} batches at iterations 0 and {steps}, seqjax's one pass "
        "over the val split — the final checkpoint, and nanoGPT's extra iteration "
        f"{steps}); loop s = training steps only (nanoGPT: {steps} × the mean `time` of "
        f"iterations 1…{steps - 1}, eager; seqjax: `time` of step {steps} in metrics.jsonl, "
        "its first call compiling the step, no evaluation); ms/step = the steady step "
        f"(nanoGPT: the mean of iterations 1…{steps - 1}; seqjax: metrics.jsonl's time from "
        f"its first record, the first call's, to step {steps}); median = the median "
        "ms/step (nanoGPT: of those iterations; seqjax: of the intervals between its "
        "logged records), less moved by other work on the machine. nanoGPT's val loss is "
        f"the mean of {setup.eval_iters} random val batches, seqjax's every val window in "
        "order. nanoGPT runs a copy of train.py with its seed line "
        f"`{SEED_LINE}` made `... + seed_offset + S)` (S = 0: unmodified). Model: "
        f"{'biases' if setup.use_bias else 'no biases'}, exact GELU, both sides; "
        f"parameters: {params}. seqjax runs with JAX_PLATFORMS={setup.device}, "
        "SEQJAX_COMPILE_CACHE=0, no XLA_FLAGS.",
        "Row for benchmarks/README.md (| config | hardware, commit, load | seqjax | nanoGPT "
        "| ratio |):\n\n" + row,
        "Commands (nanoGPT's from the copied folder; S = the seed):\n\n"
        + "\n".join(f"    {c}" for c in commands),
    ])


# ----------------------------------------------------------------------------- driver


def _skip(reason: str) -> int:
    print(f"nanogpt_gpt2: skipped: {reason}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench nanogpt_gpt2",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help=f"1 layer, d=16, T=16, B=8, {SMOKE_STEPS} steps, 1 seed; skipped "
                         "(exit 0) without nanoGPT or a rank file")
    ap.add_argument("--preset", choices=("cpu", "124m"), default="cpu",
                    help="cpu: the recipe's cpu preset on the CPU (default); 124m: GPT-2 124M "
                         "on one GPU, nanoGPT's config/train_gpt2.py (torch.compile, bf16) "
                         "against seqjax's --preset 124m, 100 steps, seed 0")
    ap.add_argument("--nanogpt_dir", default=None,
                    help=f"a nanoGPT checkout (git clone {NANOGPT_URL}); default "
                         "$NANOGPT_DIR, else a shallow clone into the temporary folder")
    ap.add_argument("--no_clone", action="store_true",
                    help="never clone nanoGPT (no checkout: exit 2, or skip with --smoke)")
    ap.add_argument("--data_path", default=None,
                    help="the Tiny Shakespeare text (default: shared/data/tinyshakespeare.txt "
                         "in or beside the checkout; --smoke falls back to the test fixture)")
    ap.add_argument("--rank_file", default=None,
                    help="GPT-2's ranks, a .tiktoken file (default: openai-whisper's "
                         "gpt2.tiktoken)")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"training steps a run (default 500; {SMOKE_STEPS} with --smoke)")
    ap.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; 0 with "
                                                  "--smoke)")
    ap.add_argument("--eval_iters", type=int, default=None,
                    help="nanoGPT's evaluation batches per split (default 200; 2 with --smoke)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="nanoGPT's OMP_NUM_THREADS (default: the cores; XLA uses them all)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds allowed to each process (default: none)")
    ap.add_argument("--keep", default=None,
                    help="run in this folder and keep it (logs, work dirs, bins); default: a "
                         "temporary folder, removed")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args(argv)

    gpu = args.preset == "124m"
    setup = SMOKE if args.smoke else GPT2_124M if gpu else DEFAULT
    if args.eval_iters is not None:
        setup = dataclasses.replace(setup, eval_iters=args.eval_iters)
    steps = args.steps if args.steps is not None else (
        SMOKE_STEPS if args.smoke else 100 if gpu else 500)
    try:
        seeds = [int(s) for s in (args.seeds or ("0" if args.smoke or gpu else "0,1,2"))
                 .split(",")]
    except ValueError:
        ap.error(f"--seeds: comma-separated integers; got {args.seeds!r}")
    if steps <= setup.warmup_steps:
        ap.error(f"--steps ({steps}) must exceed the warm-up ({setup.warmup_steps})")
    if not harness.torch_available():
        return _skip("torch is not installed") if args.smoke else _fail("torch is not installed")
    if gpu and not args.smoke:
        import torch

        if not torch.cuda.is_available():
            return _fail("--preset 124m needs a CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return (_skip if args.smoke else _fail)("tiktoken is not installed")

    corpus = Path(args.data_path) if args.data_path else nanogpt_loop.default_data_path()
    if corpus is None and args.smoke:
        corpus = FIXTURE
    if corpus is None or not corpus.is_file():
        ap.error(f"--data_path: no file {corpus or nanogpt_loop.DATA_NAME}")
    rank_file = args.rank_file or default_rank_file()
    if rank_file is None or not Path(rank_file).is_file():
        why = (f"no GPT-2 rank file ({rank_file or 'openai-whisper is not installed'}): "
               "pass --rank_file PATH/gpt2.tiktoken")
        return _skip(why) if args.smoke else _fail(why)
    preset = seqjax_cpu_preset(setup.preset)

    with contextlib.ExitStack() as stack:
        if args.keep:
            folder = Path(args.keep).resolve()
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="nanogpt_gpt2_")))
        nanogpt, found = locate_nanogpt(args.nanogpt_dir,
                                        clone_into=None if args.no_clone else str(folder))
        if nanogpt is None:
            return _skip(found) if args.smoke else _fail(found)
        nanogpt_note = describe_nanogpt(nanogpt)
        print(f"nanogpt_gpt2: nanoGPT {nanogpt_note}", flush=True)
        run_dir = folder / "nanogpt_run"
        data = prepare_run_folder(nanogpt, corpus, rank_file, run_dir)
        n_train, n_val = ((data / f).stat().st_size // 2 for f in ("train.bin", "val.bin"))
        tokens_note = (f"nanoGPT's data/shakespeare/prepare.py on {corpus} "
                       f"(GPT-2 BPE from {rank_file}): train.bin {n_train:,} tokens "
                       f"(sha256 {sha256(data / 'train.bin')[:16]}), val.bin {n_val:,} "
                       f"(sha256 {sha256(data / 'val.bin')[:16]})")
        print(f"nanogpt_gpt2: {tokens_note}", flush=True)
        status, prepare_note = check_seqjax_prepare(corpus, rank_file, data,
                                                    folder / "seqjax_prepare")
        print(f"nanogpt_gpt2: seqjax prepare: {prepare_note}", flush=True)

        results: list[RunResult] = []
        for seed in seeds:
            for side in ("nanoGPT", "seqjax"):
                if side == "nanoGPT":
                    res = run_nanogpt(run_dir, setup, steps, seed, args.threads, args.timeout)
                else:
                    res = run_seqjax(folder, data, setup, steps, seed, preset, args.timeout)
                results.append(res)
                print(f"nanogpt_gpt2: {side} seed {seed}: val {res.val_loss:.4f}, wall "
                      f"{res.wall_s:.1f} s, loop {res.loop_s:.1f} s "
                      f"({res.ms_per_step:.1f} ms/step), load {res.load_after}", flush=True)
        nano_cmd = shown(nanogpt_command(setup, steps))
        ours_cmd = shown(seqjax_command(setup, "NANOGPT_RUN_FOLDER/data/shakespeare", steps,
                                        0, "WORKDIR", preset)).replace("--seed 0", "--seed S")
        commands = [f"cd NANOGPT_RUN_FOLDER && OMP_NUM_THREADS={args.threads} {nano_cmd}",
                    f"JAX_PLATFORMS={setup.device} SEQJAX_COMPILE_CACHE=0 {ours_cmd}"]
        summary = report(results, setup, steps, tokens_note, prepare_note, commands,
                         nanogpt_note)
    harness.emit_report("nanogpt_gpt2", "nanogpt_gpt2", argv, summary, [], out=args.out)
    s = summarize(results)
    print(f"nanogpt_gpt2: wall ratio {s['wall_ratio']:.2f}×; ms/step ratio "
          f"{s['step_ratio']:.2f}×; val loss seqjax − nanoGPT {s['val_diff']:+.4f}")
    return 0


def _fail(reason: str) -> int:
    print(f"nanogpt_gpt2: {reason}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
