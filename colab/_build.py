"""Write the notebooks of ``colab/`` from the cell sources below (run: ``python colab/_build.py``).

The notebooks are generated so that they stay reviewable as Python and reproducible
byte for byte: cell ids are derived from the notebook name and the cell index, and
every notebook is written without outputs (``execution_count`` None).
``tests/test_notebooks.py`` checks that the committed ``.ipynb`` files equal what this
script writes, and executes each of them in SMOKE mode.

Every notebook starts with the same four cells: title and "Open in Colab" badge, the
install cell (skipped when ``import seqjax`` works), a note on accelerators, and the
set-up cell with the ``SMOKE`` switch (environment variable ``SEQJAX_SMOKE``) and the
TPU / GPU / CPU check.
"""

# The cell sources below are notebook code and Markdown (LaTeX) indented inside this
# script, so their lines run past the 100 columns of the Python around them.
# ruff: noqa: E501

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import nbformat

REPO_URL = "https://github.com/seqjax/seqjax"
BADGE_URL = "https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/{name}.ipynb"
BADGE_IMG = "https://colab.research.google.com/assets/colab-badge.svg"
HERE = Path(__file__).resolve().parent


def _src(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def md(text: str) -> tuple[str, str]:
    return ("markdown", _src(text))


def code(text: str) -> tuple[str, str]:
    return ("code", _src(text))


# ----------------------------------------------------------------------------- shared cells


def header(name: str, title: str, intro: str, *, extras: str = "") -> list[tuple[str, str]]:
    """Title + badge, install, accelerator note, SMOKE switch and device check."""
    badge = (f'<a href="{BADGE_URL.format(name=name)}" target="_parent">'
             f'<img src="{BADGE_IMG}" alt="Open In Colab"/></a>')
    spec = f"seqjax{extras} @ git+{REPO_URL}"
    return [
        md(f"# {title}\n\n{badge}\n\n" + _src(intro)),
        code(f'''
            # Install seqjax from its repository when it is not importable (a fresh Colab
            # runtime). Skipped in a checkout with `pip install -e .` and in CI. Should pip
            # upgrade jax here, restart the session (Runtime -> Restart session) once.
            import importlib.util
            import subprocess
            import sys

            if importlib.util.find_spec("seqjax") is None:
                subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                                "{spec}"], check=True)
        '''),
        md("""
            **Accelerators.** *Runtime → Change runtime type* picks a TPU, a GPU or the CPU;
            the same code runs on each. A Colab TPU runtime is a TPU VM (often one v5e chip,
            or v5e-8): JAX sees the TPU cores directly through `jax.devices()`, so the old
            `jax.tools.colab_tpu.setup_tpu()` of the retired TPU-Node runtime is neither
            needed nor available, and nothing here needs TensorFlow.

            **`SMOKE`** runs everything with tiny sizes, one or two training steps and
            offline data, in seconds: it is what CI executes. Set the environment variable
            `SEQJAX_SMOKE=1` (or flip the switch below) to try it; leave it off for the
            real run.
        """),
        code("""
            import os

            import jax

            SMOKE = os.environ.get("SEQJAX_SMOKE", "0").strip().lower() in ("1", "true", "yes")

            BACKEND = jax.default_backend()  # "tpu", "gpu" or "cpu"
            DEVICES = jax.devices()
            print(f"jax {jax.__version__} on {BACKEND}: {len(DEVICES)} x {DEVICES[0].device_kind}")
            print(f"SMOKE = {SMOKE}")
            if BACKEND == "cpu" and not SMOKE:
                print("No accelerator found: running on the CPU, slower, with smaller sizes where "
                      "it matters. Runtime -> Change runtime type -> TPU or GPU for the full run.")
        """),
    ]


# Data loader shared by the notebooks that use Tiny Shakespeare.
SHAKESPEARE_CELL = code('''
    from seqjax.data import tiny_shakespeare_text

    # The opening of Coriolanus: the text used when SMOKE runs without a local copy.
    TINY_TEXT = """First Citizen:
    Before we proceed any further, hear me speak.

    All:
    Speak, speak.

    First Citizen:
    You are all resolved rather to die than to famish?

    All:
    Resolved. resolved.

    First Citizen:
    First, you know Caius Marcius is chief enemy to the people.

    All:
    We know't, we know't.

    First Citizen:
    Let us kill him, and we'll have corn at our own price.
    Is't a verdict?
    """
    CHAR_RNN_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                    "data/tinyshakespeare/input.txt")


    def load_shakespeare() -> str:
        """Tiny Shakespeare: a local copy, else the Hugging Face hub, else char-rnn's file."""
        try:
            return tiny_shakespeare_text()  # $SEQJAX_DATA_DIR or ../shared/data
        except FileNotFoundError:
            pass
        if SMOKE:
            return TINY_TEXT
        try:
            return tiny_shakespeare_text(hub_name="karpathy/tiny_shakespeare")
        except Exception as err:  # noqa: BLE001 - any hub failure: fall back to the raw file
            print(f"hub unavailable ({type(err).__name__}); downloading {CHAR_RNN_URL}")
            import urllib.request

            with urllib.request.urlopen(CHAR_RNN_URL) as f:
                return f.read().decode("utf-8")
''')


# ----------------------------------------------------------------------------- 00 quickstart


def quickstart() -> list[tuple[str, str]]:
    return [
        *header("00_quickstart", "seqjax quickstart: a character-level GPT on Tiny Shakespeare", """
            Train a small GPT (`seqjax.models.gpt.TransformerLM`) on Tiny Shakespeare on every
            device of the runtime (all 8 TPU cores of a v2-8 or v5e-8, every GPU) with the
            library's `Parallel` layout, sharded train step and `fit` loop: a progress bar, a
            loss curve, samples, and a checkpoint that is saved, restored and resumed.
            The configuration is nanoGPT's `shakespeare_char` on a TPU or GPU and its CPU
            variant otherwise.
        """),
        md("## Data\n\nCharacters are the tokens: the 65 distinct characters of the text, "
           "split 90/10 into training and validation as nanoGPT does."),
        SHAKESPEARE_CELL,
        code("""
            import numpy as np

            from seqjax.data import CharTokenizer, SpecialTokens, split_text

            text = load_shakespeare()
            if SMOKE:
                text = text[:20_000]
            tok = CharTokenizer.from_text(text, SpecialTokens.none())
            ids = np.asarray(tok.encode(text), np.int32)
            train_ids, val_ids = split_text(ids, 0.9)
            print(f"{len(text):,} characters, vocabulary of {tok.vocab_size}: "
                  f"{''.join(tok.vocab)!r}")
            print(f"{len(train_ids):,} training / {len(val_ids):,} validation characters")
        """),
        md("""
            ## Model and configuration

            `TransformerLM` is a decoder-only, pre-norm transformer with learned positions
            and a tied output matrix (Bishop §12.3.1; J&M §9.8). The presets are nanoGPT's
            shapes; `BATCH` is the *global* batch (all devices together), rounded up to a
            multiple of the number of devices so that it splits evenly over them.
        """),
        code("""
            import dataclasses

            import jax.numpy as jnp

            from seqjax.models.gpt import TRANSFORMER_LM_PRESETS, TransformerLM, TransformerLMConfig
            from seqjax.utils import count_params

            if SMOKE:
                cfg = TransformerLMConfig(vocab_size=tok.vocab_size, num_layers=1, num_heads=2,
                                          embed_dim=16, max_len=16, use_bias=False)
                STEPS, BATCH, LR, WARMUP, EVAL_EVERY, EVAL_BATCHES = 2, 2, 1e-3, 1, 2, 1
            elif BACKEND == "cpu":  # nanoGPT's README CPU run: 4 layers, 128 wide, block 64
                cfg = TRANSFORMER_LM_PRESETS["nanogpt-cpu"].replace(vocab_size=tok.vocab_size)
                STEPS, BATCH, LR, WARMUP, EVAL_EVERY, EVAL_BATCHES = 1000, 12, 1e-3, 100, 200, 20
            else:  # nanoGPT's train_shakespeare_char: 6 layers, 384 wide, block 256
                cfg = TRANSFORMER_LM_PRESETS["nanogpt-shakespeare-char"].replace(
                    vocab_size=tok.vocab_size)
                STEPS, BATCH, LR, WARMUP, EVAL_EVERY, EVAL_BATCHES = 5000, 64, 1e-3, 100, 500, 50
            N_DEV = jax.device_count()
            BATCH = -(-BATCH // N_DEV) * N_DEV  # a multiple of the device count
            COMPUTE = jnp.bfloat16 if BACKEND in ("tpu", "gpu") else None  # mixed precision

            model = TransformerLM(cfg, dtype=COMPUTE)
            print(cfg)
            print(f"{STEPS} steps of {BATCH} x {cfg.max_len} characters, compute dtype {COMPUTE}")
        """),
        md("""
            ## Every device: `Parallel` and the sharded train step

            `Parallel.create()` lays the run over *all* the devices JAX sees (and every host
            of a multi-host job): a device `Mesh` with axes `("data", "fsdp", "model")`, here
            every device on `data` — data parallelism: each device gets a slice of the global
            batch, the parameters are replicated, and one `jax.jit` step averages the
            gradients over the devices. `MESH = "fsdp=8"` on a TPU v2-8 / v5e-8 shards the
            parameters and optimiser state too (ZeRO-3); nothing else changes.
            `par.create_state` builds the state directly in its sharded layout, and
            `par.train_step` / `par.eval_step` compile the steps for the mesh.
        """),
        code("""
            from seqjax.train import (
                OptimizerConfig,
                Parallel,
                flax_apply_fn,
                make_lm_eval,
                make_lm_loss,
                make_optimizer,
            )

            MESH = ""  # "" = every device on `data`; e.g. "fsdp=8" or "data=4,fsdp=2"
            par = Parallel.create(MESH)
            par.check_batch_size(BATCH)
            print(par)
            print(f"training on {par.num_devices} x {DEVICES[0].device_kind}:",
                  [str(d) for d in par.mesh.devices.flat])

            tx, schedule = make_optimizer(OptimizerConfig(
                "adamw", learning_rate=LR, schedule="warmup_cosine", warmup_steps=WARMUP,
                total_steps=STEPS, end_lr_ratio=0.1, b2=0.99, weight_decay=0.1, clip_norm=1.0))
            x0 = jnp.zeros((1, cfg.max_len), jnp.int32)
            state = par.create_state(lambda rng: model.init(rng, x0)["params"], tx,
                                     jax.random.PRNGKey(0))
            print(f"{count_params(state.params):,} parameters")

            apply_fn = flax_apply_fn(model)
            train_step = par.train_step(make_lm_loss(apply_fn), schedule=schedule,
                                        compute_dtype=COMPUTE)
            eval_step = par.eval_step(make_lm_eval(apply_fn), compute_dtype=COMPUTE)
        """),
        md("""
            ## Train with `fit`

            `fit` runs the steps with a progress bar (loss, tokens/s, ETA), evaluates every
            `eval_every` steps, and keeps orbax checkpoints in `WORKDIR/checkpoints`
            (with the model config and the tokenizer), and `run.json` records the devices
            and the mesh. Interrupting the cell saves a checkpoint and returns; running it
            again resumes from the newest checkpoint. Batches are random windows of the
            training text (nanoGPT's sampler): the iterator yields this process's rows of each
            global batch (all of them on a single-host runtime) and `fit(parallel=par)`
            splits them over the devices; the evaluation batches are whole global batches.
        """),
        code("""
            import json
            import tempfile

            from seqjax.data import LMWindowIterator
            from seqjax.train import FitConfig, fit

            WORKDIR = tempfile.mkdtemp(prefix="seqjax_quickstart_") if SMOKE else "workdirs/quickstart"

            train_data = LMWindowIterator(train_ids, par.local_batch_size(BATCH), cfg.max_len, seed=0,
                                          **par.iterator_shard())
            val_windows = LMWindowIterator(val_ids, BATCH, cfg.max_len, seed=1)
            eval_batches = [next(val_windows) for _ in range(EVAL_BATCHES)]

            result = fit(
                state, train_step, train_data,
                FitConfig(num_steps=STEPS, log_every=1 if SMOKE else 50, eval_every=EVAL_EVERY,
                          tensorboard=False, plot=False),
                parallel=par, workdir=WORKDIR, eval_step=eval_step, eval_data=eval_batches,
                model_config=dataclasses.asdict(cfg), tokenizer=tok.to_json(),
            )
            with open(os.path.join(WORKDIR, "run.json")) as f:
                print("run.json:", json.load(f))
            print(result.status, "at step", int(result.state.step), "| validation:",
                  {k: round(v, 4) for k, v in result.eval_metrics.items()})
        """),
        code("""
            %matplotlib inline
            import matplotlib.pyplot as plt

            from seqjax.train import read_metrics

            records = read_metrics(os.path.join(WORKDIR, "metrics.jsonl"))  # this run and earlier ones
            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train")
            evals = [r for r in records if "eval/loss" in r]
            ax.plot([r["step"] for r in evals], [r["eval/loss"] for r in evals], "o-",
                    label="validation")
            ax.set_xlabel("step")
            ax.set_ylabel("cross-entropy (nats / character)")
            ax.grid(alpha=0.3)
            ax.legend()
            plt.show()
        """),
        md("""
            ## Sample

            `seqjax.decoding.sample` runs the whole generation loop inside one `jax.jit`
            with a KV cache per layer: temperature 0.8 and the 20 most probable characters
            (Bishop (12.35)). With learned positions the model sees at most `max_len`
            characters, so it writes `max_len - 1` after the one-character prompt.
            `par.gather` copies the (possibly sharded) trained parameters to the host.
        """),
        code("""
            from seqjax.decoding import sample

            host_params = par.gather(result.state.params)  # numpy copies, on every process
            prompt = jnp.asarray([tok.encode("\\n")] * 3, jnp.int32)
            out = sample(model, host_params, prompt, key=jax.random.PRNGKey(1),
                         max_new_tokens=cfg.max_len - 1, temperature=0.8, top_k=20)
            for row in np.asarray(out.tokens):
                print(tok.decode(row))
                print("-" * 40)
        """),
        md("""
            ## Restore the checkpoint, and resume

            `restore_params` reads the parameters alone, for inference (here into the
            layout of `target`; without it, onto one device). The model config and the
            tokenizer were saved next to them. Calling `fit` again in the same work dir
            with more steps restores the full state (parameters, optimiser, RNG, data
            position) and continues where training stopped.
        """),
        code("""
            from seqjax.train import evaluate, load_meta, load_tokenizer, restore_params

            ckpt_dir = os.path.join(WORKDIR, "checkpoints")
            meta = load_meta(ckpt_dir)
            print("newest checkpoint: step", meta["step"], "| metrics:",
                  {k: round(v, 4) for k, v in meta["metrics"].items() if isinstance(v, float)})
            saved = load_tokenizer(ckpt_dir)
            tok2 = CharTokenizer(saved["vocab"], SpecialTokens(**saved["special_tokens"]))
            assert TransformerLMConfig(**meta["model_config"]) == cfg and tok2.vocab == tok.vocab

            params2 = restore_params(ckpt_dir, target=result.state.params)
            same = all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(params2),
                                                            jax.tree_util.tree_leaves(result.state.params)))
            print("restored parameters equal the trained ones:", same)
            print("validation loss of the restored parameters:",
                  round(evaluate(eval_step, params2, eval_batches,
                                 place_batch=par.place_global)["loss"], 4))
            assert same
        """),
        code("""
            MORE = 1 if SMOKE else 500
            fresh_data = LMWindowIterator(train_ids, par.local_batch_size(BATCH), cfg.max_len,
                                          seed=0, **par.iterator_shard())  # position: from the checkpoint
            resumed = fit(
                result.state, train_step, fresh_data,  # result.state is only the template
                FitConfig(num_steps=STEPS + MORE, log_every=1 if SMOKE else 50,
                          eval_every=EVAL_EVERY, tensorboard=False, plot=False),
                parallel=par, workdir=WORKDIR, eval_step=eval_step, eval_data=eval_batches,
                model_config=dataclasses.asdict(cfg), tokenizer=tok.to_json(),
            )
            print(f"resumed from step {resumed.start_step}, now at step {int(resumed.state.step)}")
            assert resumed.start_step >= STEPS  # (more than STEPS when the notebook is run again)
        """),
        md("""
            ## Next

            * `01_rnns_from_the_equations`: the recurrent cells, BPTT and vanishing gradients.
            * `03_transformers`: the GPT built from its blocks, the KV cache and sampling.
            * The same run from a terminal: `python -m seqjax.experiments.char_lm` (and `--preset gpu`).
        """),
    ]


# ----------------------------------------------------------------------------- 01 RNNs


def rnns() -> list[tuple[str, str]]:
    return [
        *header("01_rnns_from_the_equations", "Recurrent networks from the equations", """
            The Elman, LSTM and GRU cells of `seqjax.nn` checked line by line against the
            textbook equations written in NumPy (MEDL §7.2–7.3, with its column-vector
            notation); back-propagation through time done by hand and compared with
            `jax.grad`; and the vanishing / exploding gradient of MEDL (7.11)–(7.12).
        """),
        code("""
            import numpy as np
            import jax.numpy as jnp
            from flax import linen as nn

            from seqjax.nn import RNN, ElmanCell, GRUCell, LSTMCell
            from seqjax.utils import count_params

            # TPUs multiply float32 matrices in bfloat16 passes unless told otherwise; the
            # comparisons with NumPy below want full float32 precision.
            jax.config.update("jax_default_matmul_precision", "highest")

            B, T, P, H = (2, 5, 3, 4) if SMOKE else (4, 12, 6, 8)
            x_BxTxP = np.random.default_rng(0).normal(size=(B, T, P)).astype(np.float32)


            def run_layer(cell, x):
                \"\"\"Initialise ``RNN(cell)`` and run it over ``x``: ``(cell params, y_BxTxH)``.\"\"\"
                rnn = RNN(cell)

                @jax.jit
                def init_and_apply(key, x):
                    variables = rnn.init(key, x)
                    return variables["params"]["cell"], rnn.apply(variables, x)

                params, y = init_and_apply(jax.random.PRNGKey(0), x)
                return jax.tree_util.tree_map(np.asarray, params), np.asarray(y)


            def sig(a):
                return 1.0 / (1.0 + np.exp(-a))
        """),
        md("""
            ## The Elman cell, MEDL (7.2)

            $$h^{\\langle t\\rangle}=S_h\\big(W_{hh}h^{\\langle t-1\\rangle}+W_{hx}x^{\\langle t\\rangle}+b_h\\big)$$

            The book writes column vectors and `W x`; Flax layers compute `x @ kernel`, so the
            book's matrices are the transposed kernels: `W_hx = input/kernel.T`,
            `W_hh = recurrent_kernel.T`. `RNN` computes `x W_hxᵀ + b` for all time steps in
            one matmul and scans only the recurrent part.
        """),
        code("""
            def elman_np(p, x_TxP):
                W_hx, b_h, W_hh = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
                h = np.zeros(W_hh.shape[0])
                out = []
                for x in x_TxP:                        # t = 1..T
                    h = np.tanh(W_hh @ h + W_hx @ x + b_h)
                    out.append(h)
                return np.stack(out)


            p, y = run_layer(ElmanCell(H), x_BxTxP)
            err = max(np.abs(elman_np(p, x_BxTxP[b]) - y[b]).max() for b in range(B))
            print(f"Elman: max |seqjax - numpy| = {err:.2e}")
            assert err < 1e-5
        """),
        md("""
            ## LSTM, MEDL (7.16)–(7.17)

            $$g_\\star=\\sigma(W_{\\star h}h^{\\langle t-1\\rangle}+W_{\\star x}x^{\\langle t\\rangle}+b_\\star),\\quad
            c^{\\langle t\\rangle}=g_f\\odot c^{\\langle t-1\\rangle}+g_i\\odot\\tanh(W_{\\tilde ch}h^{\\langle t-1\\rangle}+W_{\\tilde cx}x^{\\langle t\\rangle}+b_{\\tilde c}),\\quad
            h^{\\langle t\\rangle}=g_o\\odot\\tanh(c^{\\langle t\\rangle})$$

            The four gates are stacked in one kernel in PyTorch's order `i, f, c̃, o`. MEDL
            notes that the memory moves by at most 1 per step,
            $|c^{\\langle t\\rangle}-g_f\\odot c^{\\langle t-1\\rangle}|\\le 1$: checked too.
        """),
        code("""
            def lstm_np(p, x_TxP):
                W_x, b, W_h = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
                (W_ix, W_fx, W_cx, W_ox), (W_ih, W_fh, W_ch, W_oh) = np.split(W_x, 4), np.split(W_h, 4)
                b_i, b_f, b_c, b_o = np.split(b, 4)
                c = h = np.zeros(W_h.shape[1])
                out = []
                for x in x_TxP:
                    g_i = sig(W_ih @ h + W_ix @ x + b_i)
                    g_f = sig(W_fh @ h + W_fx @ x + b_f)
                    g_o = sig(W_oh @ h + W_ox @ x + b_o)
                    c_tilde = np.tanh(W_ch @ h + W_cx @ x + b_c)
                    c_new = g_f * c + g_i * c_tilde
                    assert np.all(np.abs(c_new - g_f * c) <= 1.0)  # MEDL: memory moves by <= 1
                    c, h = c_new, g_o * np.tanh(c_new)
                    out.append(h)
                return np.stack(out)


            p, y = run_layer(LSTMCell(H, forget_bias=1.0), x_BxTxP)
            err = max(np.abs(lstm_np(p, x_BxTxP[b]) - y[b]).max() for b in range(B))
            print(f"LSTM: max |seqjax - numpy| = {err:.2e}; parameters {count_params(p)} "
                  f"= 4H² + 4HP + 4H = {4 * H * H + 4 * H * P + 4 * H}")
            assert err < 1e-5
        """),
        md("""
            ## GRU, MEDL (7.18)–(7.19): the reset gate before the matmul

            $$h^{\\langle t\\rangle}=(1-g_u)\\odot h^{\\langle t-1\\rangle}+g_u\\odot\\tanh\\big(W_{\\tilde hh}(g_r\\odot h^{\\langle t-1\\rangle})+W_{\\tilde hx}x^{\\langle t\\rangle}+b_{\\tilde h}\\big)$$

            `GRUCell(reset_after=False)` is MEDL's GRU. Its `z` is PyTorch's and Flax's *keep*
            gate, the complement of MEDL's update gate: $g_u = 1 - z$. The default
            `reset_after=True` (PyTorch, cuDNN) applies the reset gate after the matmul,
            $r\\odot(W_{nh}h + b_{hn})$: it is checked below as well.
        """),
        code("""
            def gru_np(p, x_TxP, reset_after):
                W_x, b, W_h = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
                (W_rx, W_zx, W_nx), (W_rh, W_zh, W_nh), (b_r, b_z, b_n) = (
                    np.split(W_x, 3), np.split(W_h, 3), np.split(b, 3))
                h = np.zeros(W_h.shape[1])
                out = []
                for x in x_TxP:
                    g_r = sig(W_rh @ h + W_rx @ x + b_r)
                    g_u = 1.0 - sig(W_zh @ h + W_zx @ x + b_z)  # MEDL's update gate = 1 - z
                    if reset_after:
                        h_tilde = np.tanh(W_nx @ x + b_n + g_r * (W_nh @ h + p["recurrent_bias_n"]))
                    else:
                        h_tilde = np.tanh(W_nh @ (g_r * h) + W_nx @ x + b_n)
                    h = (1.0 - g_u) * h + g_u * h_tilde
                    out.append(h)
                return np.stack(out)


            for reset_after in (False, True):
                p, y = run_layer(GRUCell(H, reset_after=reset_after), x_BxTxP)
                err = max(np.abs(gru_np(p, x_BxTxP[b], reset_after) - y[b]).max() for b in range(B))
                print(f"GRU reset_after={reset_after}: max |seqjax - numpy| = {err:.2e}")
                assert err < 1e-5
        """),
        md("""
            ## MEDL's toy example and back-propagation through time

            MEDL §7.2's "simple concrete toy example": the eight-word lexicon in alphabetical
            order, one-hot inputs, an Elman RNN with $m = 20$ sigmoid units and a softmax
            output, trained to predict the next word of *"the mathematical engineering of deep
            learning"*: $8\\cdot20 + 20\\cdot20 + 20 + 20\\cdot8 + 8 = 748$ parameters.
        """),
        code("""
            import optax

            LEXICON = sorted("deep engineering learning machine mathematical of statistics the".split())
            sentence = "the mathematical engineering of deep learning".split()
            ids = [LEXICON.index(w) for w in sentence]
            x_1xTxV = jax.nn.one_hot(jnp.asarray([ids[:-1]]), len(LEXICON))  # x<t> = e_i
            y_1xT = jnp.asarray([ids[1:]])                                      # y<t> = x<t+1>


            class ToyRNN(nn.Module):
                \"\"\"MEDL (7.2): sigmoid Elman cell, softmax read-out.\"\"\"

                hidden: int = 20

                @nn.compact
                def __call__(self, x_BxTxV):
                    # parent=None: the cell belongs to the RNN (parameters rnn/cell/...).
                    cell = ElmanCell(self.hidden, activation=nn.sigmoid, parent=None)
                    h_BxTxH = RNN(cell, name="rnn")(x_BxTxV)
                    return nn.Dense(x_BxTxV.shape[-1], name="out")(h_BxTxH)


            toy = ToyRNN()
            params = jax.jit(toy.init)(jax.random.PRNGKey(0), x_1xTxV)["params"]
            print("parameters:", count_params(params))
            assert count_params(params) == 748


            def loss_fn(params):  # MEDL (7.4)-(7.5): cross-entropy averaged over time
                logits = toy.apply({"params": params}, x_1xTxV)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y_1xT).mean()


            tx = optax.adam(0.05)


            @jax.jit
            def train_step(params, opt_state):
                loss, grads = jax.value_and_grad(loss_fn)(params)  # BPTT = autodiff through the scan
                updates, opt_state = tx.update(grads, opt_state)
                return optax.apply_updates(params, updates), opt_state, loss


            opt_state = tx.init(params)
            for step in range(2 if SMOKE else 200):
                params, opt_state, loss = train_step(params, opt_state)
            pred = np.argmax(jax.jit(toy.apply)({"params": params}, x_1xTxV), -1)[0]
            print(f"loss {float(loss):.4f}; predicted next words:", [LEXICON[i] for i in pred])
            if not SMOKE:
                assert [LEXICON[i] for i in pred] == sentence[1:]
        """),
        md("""
            **BPTT by hand.** With $a^{\\langle t\\rangle} = W_{hh}h^{\\langle t-1\\rangle}+W_{hx}x^{\\langle t\\rangle}+b_h$,
            $\\hat y^{\\langle t\\rangle}=\\mathrm{softmax}(W_{yh}h^{\\langle t\\rangle}+b_y)$ and the
            time-averaged loss, the adjoint $\\zeta^{\\langle t\\rangle}=\\partial C/\\partial h^{\\langle t\\rangle}$ runs
            backwards in time (MEDL (7.6), (7.11)):

            $$\\zeta^{\\langle t\\rangle} = W_{yh}^\\top \\tfrac1T(\\hat y^{\\langle t\\rangle}-y^{\\langle t\\rangle})
            + W_{hh}^\\top\\big(\\sigma'(a^{\\langle t+1\\rangle})\\odot\\zeta^{\\langle t+1\\rangle}\\big),$$

            and each weight's gradient sums its local contributions over time (MEDL (7.9)–(7.10)),
            e.g. $g_{W_{hh}}=\\sum_t \\big(\\sigma'(a^{\\langle t\\rangle})\\odot\\zeta^{\\langle t\\rangle}\\big)\\,h^{\\langle t-1\\rangle\\top}$.
            `jax.grad` through `lax.scan` computes exactly this.
        """),
        code("""
            def bptt_np(params, x_TxV, y_T):
                c, o = params["rnn"]["cell"], params["out"]
                W_hx, b_h, W_hh = (np.asarray(c["input"]["kernel"]).T, np.asarray(c["input"]["bias"]),
                                   np.asarray(c["recurrent_kernel"]).T)
                W_yh, b_y = np.asarray(o["kernel"]).T, np.asarray(o["bias"])
                steps = len(x_TxV)
                hs, as_, dz = [np.zeros(W_hh.shape[0])], [], []
                for t in range(steps):                                  # forward
                    as_.append(W_hh @ hs[-1] + W_hx @ x_TxV[t] + b_h)
                    hs.append(sig(as_[-1]))
                    z = W_yh @ hs[-1] + b_y
                    y_hat = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
                    dz.append((y_hat - np.eye(len(b_y))[y_T[t]]) / steps)
                g = {k: 0.0 for k in ("W_hx", "b_h", "W_hh", "W_yh", "b_y")}
                zeta_next = np.zeros(W_hh.shape[0])
                for t in reversed(range(steps)):                        # backward in time
                    zeta = W_yh.T @ dz[t] + zeta_next                    # dC/dh<t>
                    delta = hs[t + 1] * (1 - hs[t + 1]) * zeta            # sigma'(a<t>) * zeta
                    g["W_hh"] = g["W_hh"] + np.outer(delta, hs[t])
                    g["W_hx"] = g["W_hx"] + np.outer(delta, x_TxV[t])
                    g["b_h"] = g["b_h"] + delta
                    g["W_yh"] = g["W_yh"] + np.outer(dz[t], hs[t + 1])
                    g["b_y"] = g["b_y"] + dz[t]
                    zeta_next = W_hh.T @ delta                           # (7.11)
                return g


            g_hand = bptt_np(params, np.asarray(x_1xTxV[0]), np.asarray(y_1xT[0]))
            g_jax = jax.jit(jax.grad(loss_fn))(params)
            pairs = {"W_hh": g_jax["rnn"]["cell"]["recurrent_kernel"].T,
                     "W_hx": g_jax["rnn"]["cell"]["input"]["kernel"].T,
                     "b_h": g_jax["rnn"]["cell"]["input"]["bias"],
                     "W_yh": g_jax["out"]["kernel"].T, "b_y": g_jax["out"]["bias"]}
            for k, v in pairs.items():
                err = np.abs(np.asarray(v) - g_hand[k]).max()
                print(f"dC/d{k}: max |jax.grad - BPTT by hand| = {err:.1e}")
                assert err < 1e-5
        """),
        md("""
            ## Vanishing and exploding gradients

            With the identity activation and no input, (7.11) becomes
            $\\zeta^{\\langle t\\rangle}=(W_{hh}^\\top)^{T-t}\\zeta^{\\langle T\\rangle}$ (MEDL (7.12)): the
            adjoint shrinks or grows like $\\rho^{T-t}$ with $\\rho$ the spectral radius of
            $W_{hh}$. Below, $W_{hh}=\\rho Q$ with $Q$ orthogonal, the loss is a random linear
            read-out of $h^{\\langle T\\rangle}$, and $\\|\\zeta^{\\langle t\\rangle}\\|$ is measured by
            autodiff as the gradient with respect to a zero perturbation added to
            $h^{\\langle t\\rangle}$ — for the linear RNN, a tanh RNN and an LSTM at
            initialisation (forget-gate bias 1).
        """),
        code("""
            STEPS_BACK = 20 if SMOKE else 100
            HID, BATCH = 16, 8
            xs = np.random.default_rng(1).normal(size=(BATCH, STEPS_BACK, HID)).astype(np.float32)
            readout = jax.random.normal(jax.random.PRNGKey(2), (HID,))


            def h_of(carry):
                return carry[1] if isinstance(carry, tuple) else carry  # LSTM carry is (c, h)


            def adjoint_norms(cell, params, x_BxTxP):
                \"\"\"||dL/dh<t>|| for t = 1..T (mean over the batch), L = readout . h<T>.\"\"\"
                carry0 = cell.initialize_carry(jax.random.PRNGKey(0), x_BxTxP[:, 0].shape)

                def loss(deltas_TxBxH):
                    def step(carry, inputs):
                        x_BxP, d_BxH = inputs
                        carry, _ = cell.apply(params, carry, x_BxP)
                        if isinstance(carry, tuple):
                            return (carry[0], carry[1] + d_BxH), None
                        return carry + d_BxH, None

                    carry, _ = jax.lax.scan(step, carry0, (jnp.swapaxes(x_BxTxP, 0, 1), deltas_TxBxH))
                    return jnp.sum(h_of(carry) @ readout)

                zeros = jnp.zeros((x_BxTxP.shape[1], x_BxTxP.shape[0], HID))
                return jnp.linalg.norm(jax.grad(loss)(zeros), axis=-1).mean(axis=1)


            def init_cell(cell, x_BxP):
                return jax.jit(cell.init)(jax.random.PRNGKey(4), cell.initialize_carry(None, x_BxP.shape),
                                          x_BxP)


            Q = np.linalg.qr(np.random.default_rng(3).normal(size=(HID, HID)))[0]  # orthogonal
            curves = {}
            for name, cell, x in (("linear", ElmanCell(HID, activation=lambda a: a), 0 * xs),
                                  ("tanh", ElmanCell(HID), xs)):
                params0 = init_cell(cell, x[:, 0])
                norms = jax.jit(lambda p, x, cell=cell: adjoint_norms(cell, p, x))
                for rho in (0.8, 1.0, 1.2):  # W_hh = rho Q: spectral radius rho
                    p = {"params": {**params0["params"], "recurrent_kernel": rho * Q}}
                    curves[f"{name}, rho = {rho}"] = np.asarray(norms(p, x))
            lstm = LSTMCell(HID, forget_bias=1.0)
            lstm_norms = jax.jit(lambda p, x: adjoint_norms(lstm, p, x))
            p_lstm = init_cell(lstm, xs[:, 0])
            curves["LSTM, forget bias 1"] = np.asarray(lstm_norms(p_lstm, xs))
            bias = p_lstm["params"]["input"]["bias"]  # gate blocks i, f, c~, o
            p_lstm3 = {"params": {**p_lstm["params"], "input": {
                **p_lstm["params"]["input"], "bias": bias.at[HID:2 * HID].add(2.0)}}}
            curves["LSTM, forget bias 3"] = np.asarray(lstm_norms(p_lstm3, xs))

            # MEDL (7.12): the linear RNN's adjoint is exactly rho^(T-t) ||zeta<T>||.
            lin = curves["linear, rho = 1.2"]
            expected = lin[-1] * 1.2 ** np.arange(STEPS_BACK)[::-1]
            print("linear RNN follows rho^(T-t):", np.allclose(lin, expected, rtol=1e-3))
            assert np.allclose(lin, expected, rtol=1e-3)
        """),
        code("""
            %matplotlib inline
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 4))
            distance = np.arange(STEPS_BACK)[::-1]  # T - t
            for label, norms in curves.items():
                ax.plot(distance, norms / norms[-1], label=label,
                        ls="--" if label.startswith("linear") else "-")
            ax.set_yscale("log")
            ax.set_ylim(bottom=1e-20)
            ax.set_xlabel("T - t (steps back in time)")
            ax.set_ylabel("||dL/dh<t>|| / ||dL/dh<T>||")
            ax.set_title("Vanishing and exploding gradients (MEDL (7.11)-(7.12))")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            plt.show()
        """),
        md("""
            The linear RNN follows $\\rho^{T-t}$ exactly. The tanh RNN vanishes even at
            $\\rho \\ge 1$: $\\tanh' < 1$ shrinks the adjoint at every step. An LSTM at
            initialisation is no exception — along its memory $c$ the adjoint is multiplied by
            the forget gate, about $\\sigma(1) \\approx 0.73$ per step with a forget-gate bias
            of 1 — but a bias of 3 ($\\sigma(3) \\approx 0.95$) keeps it orders of magnitude
            longer, and training learns to hold $g_f \\approx 1$ where the task needs memory.
            Gradient clipping (`OptimizerConfig(clip_norm=1.0)`) tames the exploding side;
            `python -m seqjax.experiments.gradients` trains all three cells on the adding problem.
        """),
    ]


# ----------------------------------------------------------------------------- 02 seq2seq


def seq2seq() -> list[tuple[str, str]]:
    return [
        *header("02_seq2seq_attention", "Sequence to sequence, with and without attention", """
            English number names to French ("ninety-seven" → "quatre-vingt-dix-sept") with
            the RNN encoder–decoder `seqjax.models.seq2seq.Seq2Seq`: once with the fixed
            context vector of Sutskever et al. (MEDL Fig. 7.9(a)) and once with Bahdanau's
            additive attention (MEDL (7.20)–(7.22), Fig. 7.10). French counts in twenties
            from 60 to 99, so the model has to learn a real alignment; the attention
            heatmaps show it (MEDL Fig. 7.11).
        """, extras="[data]"),
        md("## Data\n\n`number_names` writes the numbers with `num2words`; words, hyphens and "
           "commas are the tokens. A seeded fifth of the numbers is held out."),
        code("""
            import numpy as np
            import jax.numpy as jnp

            from seqjax.data import SpecialTokens, WordTokenizer, number_names

            MAX_NUMBER = 64 if SMOKE else 1000
            ds = number_names(range(MAX_NUMBER))
            numbers, english, french = list(ds["number"]), list(ds["src"]), list(ds["tgt"])

            SPECIALS = SpecialTokens(mask=None, sep=None, cls=None)  # <pad> <unk> <bos> <eos>
            src_tok = WordTokenizer.from_texts(english, special_tokens=SPECIALS)
            tgt_tok = WordTokenizer.from_texts(french, special_tokens=SPECIALS)
            PAD, BOS, EOS = tgt_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id
            SRC_LEN = max(len(src_tok.encode(s)) for s in english)
            TGT_LEN = max(len(tgt_tok.encode(t)) for t in french) + 1  # + <eos>


            def encode(rows):
                \"\"\"Fixed-shape arrays for teacher forcing: tgt_in = <bos> y, tgt_out = y <eos>.\"\"\"
                n = len(rows)
                out = {"src": np.full((n, SRC_LEN), PAD, np.int32), "src_lengths": np.zeros(n, np.int32),
                       "tgt_in": np.full((n, TGT_LEN), PAD, np.int32),
                       "tgt_out": np.full((n, TGT_LEN), PAD, np.int32),
                       "mask": np.zeros((n, TGT_LEN), bool)}
                for i, r in enumerate(rows):
                    s, t = src_tok.encode(english[r]), tgt_tok.encode(french[r])
                    out["src"][i, :len(s)], out["src_lengths"][i] = s, len(s)
                    out["tgt_in"][i, :len(t) + 1] = [BOS, *t]
                    out["tgt_out"][i, :len(t) + 1] = [*t, EOS]
                    out["mask"][i, :len(t) + 1] = True
                return out


            order = np.random.default_rng(0).permutation(MAX_NUMBER)
            test_rows, train_rows = np.sort(order[:MAX_NUMBER // 5]), np.sort(order[MAX_NUMBER // 5:])
            train, test = encode(train_rows), encode(test_rows)
            print(f"{len(train_rows)} training and {len(test_rows)} held-out numbers; vocabularies "
                  f"{src_tok.vocab_size} (en) and {tgt_tok.vocab_size} (fr)")
            print(english[97 % MAX_NUMBER], "->", tgt_tok.split(french[97 % MAX_NUMBER]))
        """),
        md("""
            ## Two models

            Both read the source with a GRU and write the target with a GRU decoder trained by
            teacher forcing (MEDL §7.4). Without attention the encoder's last state $z^*$ is
            all the decoder gets; with attention every decoder step builds its own context
            $u^{\\langle t\\rangle}=\\sum_\\tau\\alpha^{\\langle t\\rangle}_\\tau v^{\\langle\\tau\\rangle}$ from the
            (bidirectional) encoder outputs, with additive scores
            $\\alpha^{\\langle t\\rangle}=\\mathrm{softmax}_\\tau\\, w^\\top\\tanh(W_a s^{\\langle t-1\\rangle}+W_b v^{\\langle\\tau\\rangle})$.
        """),
        code("""
            from seqjax.models.seq2seq import Seq2Seq
            from seqjax.utils import count_params

            EMBED, HIDDEN = (8, 8) if SMOKE else (32, 64)
            STEPS, BATCH, LR = (2, 16, 5e-3) if SMOKE else (2000, 64, 5e-3)  # BATCH: the global batch
            common = dict(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size,
                          embed_dim=EMBED, hidden_size=HIDDEN, cell_type="gru")
            models = {
                "no attention": Seq2Seq(**common, context="initial_state"),
                "attention": Seq2Seq(**common, context="attention", attention="bahdanau",
                                     bidirectional_encoder=True),
            }
        """),
        md("## Train\n\nThe same `Parallel` layout, sharded train step and `fit` loop as the "
           "quickstart, on every device of the runtime (each device takes a slice of the "
           "global batch), here without a work dir (nothing is written). `par.gather` brings "
           "the trained parameters back to the host for decoding."),
        code("""
            from seqjax.data import ArrayIterator
            from seqjax.train import (FitConfig, OptimizerConfig, Parallel, TrainState, fit,
                                      make_optimizer, masked_cross_entropy, token_accuracy)

            par = Parallel.create()  # every device on `data`
            BATCH = -(-BATCH // par.batch_shards) * par.batch_shards  # a multiple of the devices
            print(par)
            print(f"training on {par.num_devices} x {DEVICES[0].device_kind}, global batch {BATCH}")


            def make_loss(model):
                def loss_fn(params, batch, rng):
                    logits = model.apply({"params": params}, batch["src"], batch["tgt_in"],
                                         batch["src_lengths"])
                    loss = masked_cross_entropy(logits, batch["tgt_out"], batch["mask"])
                    return loss, {"accuracy": token_accuracy(logits, batch["tgt_out"], batch["mask"]),
                                  "tokens": jnp.sum(batch["mask"])}
                return loss_fn


            trained, histories = {}, {}
            for name, model in models.items():
                params = jax.jit(model.init)(jax.random.PRNGKey(0), train["src"][:1],
                                             train["tgt_in"][:1])["params"]
                tx, schedule = make_optimizer(OptimizerConfig(
                    "adam", learning_rate=LR, schedule="warmup_cosine", warmup_steps=1 if SMOKE else 100,
                    total_steps=STEPS, clip_norm=1.0))
                print(f"{name}: {count_params(params):,} parameters")
                state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(1)))
                result = fit(state, par.train_step(make_loss(model), schedule=schedule),
                             ArrayIterator(train, par.local_batch_size(BATCH), seed=0,
                                           **par.iterator_shard()),
                             FitConfig(num_steps=STEPS, log_every=1 if SMOKE else 50,
                                       tensorboard=False, plot=False),
                             parallel=par)
                trained[name], histories[name] = par.gather(result.state.params), result.history
        """),
        code("""
            %matplotlib inline
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 3.5))
            for name, hist in histories.items():
                ax.plot([r["step"] for r in hist], [r["loss"] for r in hist], label=name)
            ax.set_xlabel("step")
            ax.set_ylabel("cross-entropy per target token")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend()
            plt.show()
        """),
        md("""
            ## Translate the held-out numbers

            Greedy decoding (`seqjax.decoding.greedy_search`, one compiled loop): the source is
            passed to the model's `init_decode_state` through `inputs`, the prompt is `<bos>`,
            and generation stops at `<eos>`. A translation counts when the whole French
            name is right.
        """),
        code("""
            from seqjax.decoding import greedy_search

            SHOW = [n for n in (97, 71, 80, 21) if n < MAX_NUMBER][:3]  # for the heatmaps below
            eval_rows = np.concatenate([test_rows, SHOW])  # one batch, one compiled loop per model
            evaluation = encode(eval_rows)


            def detok(ids):
                ids = list(ids)
                ids = ids[:ids.index(EOS)] if EOS in ids else ids
                return tgt_tok.decode(ids, skip_special=True).replace(" - ", "-").replace(" ,", ",")


            decoded, translations = {}, {}
            for name, model in models.items():
                out = greedy_search(model, trained[name], jnp.full((len(eval_rows), 1), BOS, jnp.int32),
                                    max_new_tokens=TGT_LEN, eos_id=EOS, pad_id=PAD,
                                    inputs={"src": evaluation["src"],
                                            "src_lengths": evaluation["src_lengths"]})
                decoded[name] = np.asarray(out.tokens)
                translations[name] = [detok(row) for row in decoded[name][:len(test_rows)]]
                exact = np.mean([t == french[r] for t, r in zip(translations[name], test_rows)])
                print(f"{name:>12}: exact match on held-out numbers {100 * exact:.1f}%")
            for i in range(min(6, len(test_rows))):
                r = test_rows[i]
                print(f"{numbers[r]:>4} {english[r]!r:28} -> " +
                      " | ".join(f"{name}: {translations[name][i]!r}" for name in models))
            wrong = [numbers[r] for t, r in zip(translations["attention"], test_rows) if t != french[r]]
            print(f"\\nheld-out numbers the attention model gets wrong ({len(wrong)}):", wrong[:20])
        """),
        md("""
            ## Where the decoder looks

            Teacher-forcing the attention model on its own translation with
            `return_attention=True` gives $\\alpha^{\\langle t\\rangle}$ for every output word
            (rows) over the source words (columns); each row sums to 1. For 97 the French
            words "quatre", "vingt" and "dix" should look at "ninety" and "sept" at "seven".
        """),
        code("""
            att_model, att_params = models["attention"], trained["attention"]
            rows = encode(SHOW)
            generated = decoded["attention"][len(test_rows):]
            tgt_in = np.full((len(SHOW), TGT_LEN), PAD, np.int32)
            tgt_in[:, 0] = BOS
            tgt_in[:, 1:] = generated[:, :TGT_LEN - 1]
            _, alpha = jax.jit(lambda p, s, t, n: att_model.apply({"params": p}, s, t, n,
                                                                    return_attention=True))(
                att_params, rows["src"], tgt_in, rows["src_lengths"])
            alpha = np.asarray(alpha)
            assert np.allclose(alpha.sum(-1), 1.0, atol=1e-5)  # softmax rows

            fig, axes = plt.subplots(1, len(SHOW), figsize=(4.2 * len(SHOW), 3.8), squeeze=False)
            for ax, n, a, gen in zip(axes[0], SHOW, alpha, generated):
                src_words = src_tok.split(english[n])
                gen = list(gen)
                n_out = gen.index(EOS) + 1 if EOS in gen else len(gen)
                out_words = [tgt_tok.id_to_token(int(i)) for i in gen[:n_out]]
                ax.imshow(a[:n_out, :len(src_words)], cmap="Greys", vmin=0, vmax=1, aspect="auto")
                ax.set_xticks(range(len(src_words)), src_words, rotation=45, ha="right")
                ax.set_yticks(range(n_out), out_words)
                ax.set_title(f"{n}: {english[n]}", fontsize=9)
                print(f"{n}: " + ", ".join(f"{w} <- {src_words[j]}" for w, j in
                                           zip(out_words, a[:n_out, :len(src_words)].argmax(-1))))
            fig.tight_layout()
            plt.show()
        """),
        md("""
            Without attention the whole source has to squeeze through one vector; the
            attention model's errors concentrate where French reorders or regroups
            (70–99). More: `python -m seqjax.experiments.numbers` (0–9999, the transformer too), and
            `seqjax.data.english_french()` for the Tatoeba sentence pairs
            (`python -m seqjax.experiments.translation`).
        """),
    ]


# ----------------------------------------------------------------------------- 03 transformers


def transformers() -> list[tuple[str, str]]:
    return [
        *header("03_transformers", "Transformers: a GPT from its blocks, the KV cache, sampling", """
            A decoder-only transformer assembled from `seqjax.nn` blocks and checked against
            the library's `TransformerLM`; a short training run on Tiny Shakespeare; cached
            decoding checked against the full causal pass; and the sampling strategies of
            Bishop §12.3.2 side by side: greedy, temperature, top-k, nucleus and beam search.
        """),
        SHAKESPEARE_CELL,
        code("""
            import numpy as np
            import jax.numpy as jnp
            from flax import linen as nn

            from seqjax.data import CharTokenizer, SpecialTokens, split_text

            jax.config.update("jax_default_matmul_precision", "highest")  # exact comparisons on TPU

            text = load_shakespeare()
            if SMOKE:
                text = text[:20_000]
            tok = CharTokenizer.from_text(text, SpecialTokens.none())
            train_ids, val_ids = split_text(np.asarray(tok.encode(text), np.int32), 0.9)
            print(f"{len(text):,} characters, vocabulary of {tok.vocab_size}")
        """),
        md("""
            ## A GPT from blocks

            Bishop §12.3.1 and J&M §9.8: token embeddings plus learned positions, a stack of
            causal pre-norm blocks
            $Z = X + \\mathrm{MHA}(\\mathrm{LN}(X))$, $\\tilde X = Z + \\mathrm{MLP}(\\mathrm{LN}(Z))$
            (Bishop (12.21), (12.23)), a final LayerNorm and the tied output matrix $E^\\top$.
            `TransformerBlock`'s parameter tree is the one `TransformerLM` keeps under
            `decoder/layers_i`, so the weights carry over and the logits must agree.
        """),
        code("""
            from seqjax.models.gpt import TransformerLM, TransformerLMConfig
            from seqjax.nn import LayerNorm, LearnedPositionalEmbedding, TransformerBlock
            from seqjax.utils import count_params


            class BlockGPT(nn.Module):
                vocab_size: int
                num_layers: int
                num_heads: int
                embed_dim: int
                max_len: int

                @nn.compact
                def __call__(self, tokens_BxT):
                    init = nn.initializers.normal(stddev=0.02)
                    embed = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=init,
                                     name="token_embed")
                    x_BxTxD = LearnedPositionalEmbedding(self.max_len, name="pos_embed")(
                        embed(tokens_BxT))                       # E[x_n] + P_n
                    for i in range(self.num_layers):
                        x_BxTxD = TransformerBlock(num_heads=self.num_heads, causal=True, norm="pre",
                                                   name=f"block_{i}")(x_BxTxD)
                    return embed.attend(LayerNorm(name="final_norm")(x_BxTxD))  # logits = h E^T


            if SMOKE:
                L, H, D, BLOCK = 1, 2, 16, 16
            else:
                L, H, D, BLOCK = 4, 4, 128, 64
            gpt = BlockGPT(tok.vocab_size, L, H, D, BLOCK)
            lm = TransformerLM(TransformerLMConfig(vocab_size=tok.vocab_size, num_layers=L, num_heads=H,
                                                   embed_dim=D, max_len=BLOCK))
            x = jnp.asarray([train_ids[:BLOCK]])
            p_blocks = jax.jit(gpt.init)(jax.random.PRNGKey(0), x)["params"]
            p_lm = {"token_embed": p_blocks["token_embed"], "pos_embed": p_blocks["pos_embed"],
                    "decoder": {**{f"layers_{i}": p_blocks[f"block_{i}"] for i in range(L)},
                                "final_norm": p_blocks["final_norm"]}}
            logits_blocks, logits_lm = jax.jit(lambda pb, pl: (gpt.apply({"params": pb}, x),
                                                               lm.apply({"params": pl}, x)))(p_blocks, p_lm)
            print(f"{count_params(p_blocks):,} parameters; max |BlockGPT - TransformerLM| = "
                  f"{float(jnp.abs(logits_blocks - logits_lm).max()):.2e}")
            assert jnp.allclose(logits_blocks, logits_lm, atol=1e-5)
        """),
        md("""
            ## A short training run

            `TransformerLM` with the block weights above, trained on every device of the
            runtime: `Parallel.create()` puts all devices on the `data` axis of a mesh,
            `par.train_step` compiles one sharded step (loss, gradient, AdamW update, the
            gradients averaged over the devices), and `fit` feeds it random windows of the
            text, a slice of each global batch per device. Training is teacher-forced and
            parallel over positions: the causal mask stops position $n$ from seeing
            positions after it (MEDL (7.27)). `par.gather` copies the trained parameters
            to the host for the decoding below.
        """),
        code("""
            from seqjax.data import LMWindowIterator
            from seqjax.train import (FitConfig, OptimizerConfig, Parallel, TrainState, fit,
                                      flax_apply_fn, make_lm_loss, make_optimizer)

            par = Parallel.create()  # every device on `data`
            STEPS = 2 if SMOKE else (3000 if BACKEND != "cpu" else 1000)
            BATCH = 8 if SMOKE else 32  # the global batch: a multiple of the device count
            BATCH = -(-BATCH // par.batch_shards) * par.batch_shards
            print(par)
            print(f"training on {par.num_devices} x {DEVICES[0].device_kind}, global batch {BATCH}")
            tx, _ = make_optimizer(OptimizerConfig("adamw", learning_rate=1e-3, weight_decay=0.1,
                                                   clip_norm=1.0))
            state = par.shard_state(TrainState.create(p_lm, tx, jax.random.PRNGKey(1)))
            train_step = par.train_step(make_lm_loss(flax_apply_fn(lm)))
            batches = LMWindowIterator(train_ids, par.local_batch_size(BATCH), BLOCK, seed=0,
                                       **par.iterator_shard())
            result = fit(state, train_step, batches,
                         FitConfig(num_steps=STEPS, log_every=250, tensorboard=False, plot=False),
                         parallel=par)
            for r in result.history:  # logged: the first step, every 250th and the last
                print(f"step {r['step']}: loss {r['loss']:.3f}")
            params = par.gather(result.state.params)
        """),
        md("""
            ## KV cache == full causal pass

            Generating token $n$ needs the keys and values of tokens $1..n-1$; a KV cache keeps
            them, so each step attends over the cache instead of recomputing the whole prefix
            ($O(n)$ instead of $O(n^2)$ per token, Bishop §12.3.1). `TransformerLM`'s
            `init_decode_state` / `decode_step` feed one token at a time; their logits must
            equal the full forward pass at every position.
        """),
        code("""
            forward = jax.jit(lambda p, tokens: lm.apply({"params": p}, tokens))
            seq = jnp.asarray([val_ids[:BLOCK]])
            full_logits = forward(params, seq)[0]

            decode_step = jax.jit(lm.decode_step)
            cache = lm.init_decode_state(params, seq[:, :1], max_len=BLOCK)  # empty caches
            step_logits = []
            for t in range(BLOCK):
                logits, cache = decode_step(params, cache, seq[:, t])
                step_logits.append(logits[0])
            err = float(jnp.abs(jnp.stack(step_logits) - full_logits).max())
            print(f"max |cached step - full pass| over {BLOCK} positions: {err:.2e}")
            assert err < 1e-4
        """),
        md("""
            The whole generation loop runs inside one `jax.jit` (`seqjax.decoding`). Greedy
            search with the cache and with `recompute_decoder` (the full pass over the
            growing prefix at every step, the reference) must produce the same text.
        """),
        code("""
            import time

            from seqjax.decoding import greedy_search, recompute_decoder


            def lm_logits(p, tokens_BxT):  # a module-level function: hashable for jit caching
                return lm.apply({"params": p}, tokens_BxT)


            prompt = jnp.asarray([val_ids[-8:]])  # the last 8 characters of the text
            new = BLOCK - prompt.shape[1]
            timings = {}
            for name, decoder in (("KV cache", lm), ("recompute", recompute_decoder(lm_logits))):
                greedy_search(decoder, params, prompt, max_new_tokens=new)  # compile
                start = time.perf_counter()
                out = greedy_search(decoder, params, prompt, max_new_tokens=new)
                out.tokens.block_until_ready()
                timings[name] = (time.perf_counter() - start, np.asarray(out.tokens[0]))
                print(f"{name:>10}: {1e3 * timings[name][0]:7.1f} ms  {tok.decode(timings[name][1])!r}")
            assert (timings["KV cache"][1] == timings["recompute"][1]).all()
        """),
        md("""
            ## Sampling strategies

            Temperature rescales the logits, $p_k\\propto\\exp(a_k/T)$ (Bishop (12.35)); top-k
            keeps the $k$ most probable tokens; top-p (nucleus) keeps the smallest set whose
            probability reaches $p$. `process_logits` applies them; here is what they do to
            the next-character distribution at the end of the validation window above.
        """),
        code("""
            %matplotlib inline
            import matplotlib.pyplot as plt

            from seqjax.decoding import process_logits

            print(f"...{tok.decode(seq[0, -24:])!r} -> ?")
            next_logits = full_logits[-1:]
            settings = {"T = 1": dict(), "T = 0.5": dict(temperature=0.5), "T = 1.5": dict(temperature=1.5),
                        "top-k = 5": dict(top_k=5), "top-p = 0.9": dict(top_p=0.9)}
            base = np.asarray(jax.nn.softmax(next_logits[0]))
            shown = np.argsort(base)[::-1][:12]
            fig, ax = plt.subplots(figsize=(9, 3.2))
            width = 0.8 / len(settings)
            for j, (label, kw) in enumerate(settings.items()):
                probs = np.asarray(jax.nn.softmax(process_logits(next_logits, **kw)[0]))
                ax.bar(np.arange(len(shown)) + j * width, probs[shown], width, label=label)
            ax.set_xticks(np.arange(len(shown)) + 0.4, [repr(tok.vocab[i])[1:-1] for i in shown])
            ax.set_ylabel("probability of the next character")
            ax.legend(fontsize=8)
            plt.show()
        """),
        md("""
            And the texts they write from the same prompt (one compiled loop per strategy;
            the same PRNG key gives the same text). Greedy and beam search are deterministic;
            beam search keeps the 4 most probable prefixes by total log-probability
            (Bishop (12.34)).
        """),
        code("""
            from seqjax.decoding import beam_search, sample

            key = jax.random.PRNGKey(0)  # prompt and length as for the greedy check above
            strategies = {
                "greedy": lambda: greedy_search(lm, params, prompt, max_new_tokens=new).tokens[0],
                "T = 0.5": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                                          temperature=0.5).tokens[0],
                "T = 1.0": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new).tokens[0],
                "T = 1.5": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                                          temperature=1.5).tokens[0],
                "top-k = 10": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                                             top_k=10).tokens[0],
                "top-p = 0.9": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                                              top_p=0.9).tokens[0],
                "beam, K = 4": lambda: beam_search(lm, params, prompt, beam_size=4,
                                                   max_new_tokens=new).tokens[0, 0],
            }
            for name, run in strategies.items():
                print(f"--- {name}\\n{tok.decode(prompt[0])}{tok.decode(np.asarray(run()))}")
        """),
        md("""
            Low temperature and beam search repeat themselves; high temperature invents
            words; top-k and top-p cut the implausible tail while keeping variety. More in
            `python -m seqjax.experiments.sampling`.
        """),
    ]


# ----------------------------------------------------------------------------- 04 BERT and ViT


def bert_vit() -> list[tuple[str, str]]:
    return [
        *header("04_bert_and_vit", "Encoders: BERT's masked-language-model pre-training and a ViT",
                """
            Two bidirectional transformer encoders (Bishop §12.3.3 and §12.4.1). A small
            character-level BERT (`seqjax.models.bert.Bert`) pre-trained on Tiny Shakespeare
            with the masked-language-model objective fills in hidden characters; a vision
            transformer (`seqjax.models.vit.ViT`) reads scikit-learn's 8×8 handwritten digits
            as sequences of patches.
        """, extras="[data]"),
        md("""
            ## Masked-language-model pre-training

            BERT sees the whole sequence at once (no causal mask) and is trained to recover
            corrupted tokens: 15% of the positions are selected; a selected token becomes
            `<mask>` 80% of the time, a random token 10% of the time, and stays 10% of the time
            (`mlm_mask`, Bishop §12.3.3). The loss is taken at the selected positions only.
            Here the tokens are characters and a sequence is `<cls>` followed by a window of
            the text.
        """),
        SHAKESPEARE_CELL,
        code("""
            import numpy as np
            import jax.numpy as jnp

            from seqjax.data import CharTokenizer, LMWindowIterator, SpecialTokens, split_text
            from seqjax.models.bert import Bert, BertConfig, mlm_mask
            from seqjax.train import (FitConfig, OptimizerConfig, Parallel, TrainState, fit,
                                      make_optimizer, masked_cross_entropy, token_accuracy)
            from seqjax.utils import count_params

            # Both models train on every device: all of them on the `data` axis of a mesh,
            # each taking a slice of every global batch (a multiple of the device count).
            par = Parallel.create()
            print(par)
            print(f"training on {par.num_devices} x {DEVICES[0].device_kind}")


            def global_batch(n):
                \"\"\"``n`` rounded up to a multiple of the devices the batch is split over.\"\"\"
                return -(-n // par.batch_shards) * par.batch_shards


            text = load_shakespeare()
            if SMOKE:
                text = text[:20_000]
            tok = CharTokenizer.from_text(text, SpecialTokens(bos=None, eos=None, sep=None))
            CLS, MASK = tok.cls_id, tok.mask_id
            train_ids, val_ids = split_text(np.asarray(tok.encode(text), np.int32), 0.9)

            if SMOKE:
                WINDOW, STEPS, BATCH = 16, 2, 8
                bert_cfg = BertConfig(vocab_size=tok.vocab_size, num_layers=1, num_heads=2, embed_dim=16,
                                      mlp_dim=32, max_len=WINDOW + 1, type_vocab_size=0, pooler=False)
            else:
                WINDOW, STEPS, BATCH = 64, 3000 if BACKEND != "cpu" else 1000, 64
                bert_cfg = BertConfig(vocab_size=tok.vocab_size, num_layers=4, num_heads=4, embed_dim=128,
                                      mlp_dim=512, max_len=WINDOW + 1, type_vocab_size=0, pooler=False,
                                      dropout_rate=0.1)
            BATCH = global_batch(BATCH)
            bert = Bert(bert_cfg)


            def with_cls(batch):
                \"\"\"``<cls>`` + a window of characters (the window iterator's inputs).\"\"\"
                x = batch["inputs"]
                return {"tokens": np.concatenate([np.full((len(x), 1), CLS, x.dtype), x], axis=1)}


            def corrupt(key, tokens):
                return mlm_mask(key, tokens, vocab_size=tok.vocab_size, mask_id=MASK,
                                maskable_BxT=tokens != CLS)


            def mlm_loss(params, batch, rng):
                mask_key, drop_key = jax.random.split(rng)
                inputs, selected = corrupt(mask_key, batch["tokens"])
                logits = bert.apply({"params": params}, inputs, deterministic=False,
                                    rngs={"dropout": drop_key})["mlm_logits"]
                loss = masked_cross_entropy(logits, batch["tokens"], selected)
                return loss, {"accuracy": token_accuracy(logits, batch["tokens"], selected),
                              "tokens": jnp.sum(selected)}
        """),
        code("""
            example = with_cls(next(LMWindowIterator(train_ids, BATCH, WINDOW, seed=0)))
            params = jax.jit(bert.init)(jax.random.PRNGKey(0), example["tokens"])["params"]
            print(f"BERT: {count_params(params):,} parameters")
            tx, schedule = make_optimizer(OptimizerConfig(
                "adamw", learning_rate=1e-3, schedule="warmup_cosine", warmup_steps=1 if SMOKE else 200,
                total_steps=STEPS, weight_decay=0.01, clip_norm=1.0))
            state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(1)))
            data = map(with_cls, LMWindowIterator(train_ids, par.local_batch_size(BATCH), WINDOW,
                                                  seed=1, **par.iterator_shard()))
            bert_run = fit(state, par.train_step(mlm_loss, schedule=schedule), data,
                           FitConfig(num_steps=STEPS, log_every=1 if SMOKE else 100,
                                     tensorboard=False, plot=False),
                           parallel=par)
            bert_params = par.gather(bert_run.state.params)  # host copies for what follows
        """),
        md("""
            **Fill in the blanks.** Validation windows with every character selected by the
            corruption replaced by `<mask>`; the model's guesses at those positions, against
            always guessing the most frequent character.
        """),
        code("""
            @jax.jit
            def fill_in(params, tokens, key):
                inputs, selected = mlm_mask(key, tokens, vocab_size=tok.vocab_size, mask_id=MASK,
                                            maskable_BxT=tokens != CLS, mask_rate=1.0, random_rate=0.0)
                logits = bert.apply({"params": params}, inputs)["mlm_logits"]
                return inputs, selected, jnp.argmax(logits, -1)


            val = with_cls(next(LMWindowIterator(val_ids, BATCH, WINDOW, seed=2)))["tokens"]
            inputs, selected, guess = map(np.asarray, fill_in(bert_params, val,
                                                              jax.random.PRNGKey(3)))
            frequent = np.bincount(train_ids, minlength=tok.vocab_size).argmax()
            acc = (guess == val)[selected].mean() if selected.any() else float("nan")
            base = (val == frequent)[selected].mean() if selected.any() else float("nan")
            print(f"masked characters recovered: {100 * acc:.1f}% (most frequent character: "
                  f"{100 * base:.1f}%)\\n")
            show = lambda ids: "".join("_" if i == MASK else tok.vocab[i] for i in ids[1:])
            for row in range(min(3, BATCH)):
                print("masked :", repr(show(inputs[row])))
                print("guessed:", repr(show(np.where(selected[row], guess[row], val[row]))))
                print("truth  :", repr(show(val[row])), "\\n")
        """),
        md("""
            ## A vision transformer on handwritten digits

            An image $x\\in\\mathbb R^{H\\times W\\times C}$ becomes $N = HW/P^2$ flattened
            $P\\times P$ patches, each linearly embedded; a learned `<class>` token is
            prepended, learned positions are added, and the class token's final state is
            classified (Bishop §12.4.1, Fig. 12.22). The digits are 8×8, so 2×2 patches give
            a sequence of 16 tokens.
        """),
        code("""
            %matplotlib inline
            import matplotlib.pyplot as plt

            from seqjax.data import digits
            from seqjax.models.vit import ViT, ViTConfig, patchify

            d = digits("images")  # float32[1797, 8, 8, 1] in [0, 1], labels int32[1797]
            order = np.random.default_rng(0).permutation(len(d["labels"]))
            n_test = len(order) // 5
            test = {k: v[order[:n_test]] for k, v in d.items()}
            train = {k: v[order[n_test:]] for k, v in d.items()}
            PATCH = 2
            patches = np.asarray(patchify(train["inputs"][:1], PATCH))[0]  # [16, 4]

            fig, axes = plt.subplots(1, 2, figsize=(6, 2.6), gridspec_kw={"width_ratios": [1, 2]})
            axes[0].imshow(train["inputs"][0, :, :, 0], cmap="Greys")
            axes[0].set_title(f"label {train['labels'][0]}")
            for k in range(0, 8, PATCH):
                axes[0].axhline(k - 0.5, color="tab:red", lw=0.8)
                axes[0].axvline(k - 0.5, color="tab:red", lw=0.8)
            axes[1].imshow(patches.T, cmap="Greys", aspect="auto")
            axes[1].set_title(f"{len(patches)} patch tokens of {PATCH}x{PATCH} pixels")
            axes[1].set_xlabel("token")
            plt.show()
        """),
        code("""
            from seqjax.data import ArrayIterator

            if SMOKE:
                vit_cfg = ViTConfig(image_size=8, patch_size=PATCH, channels=1, num_classes=10,
                                    num_layers=1, num_heads=2, embed_dim=16, mlp_dim=32)
                VIT_STEPS, VIT_BATCH = 2, 16
            else:
                vit_cfg = ViTConfig(image_size=8, patch_size=PATCH, channels=1, num_classes=10,
                                    num_layers=4, num_heads=4, embed_dim=64, mlp_dim=128,
                                    dropout_rate=0.1)
                VIT_STEPS, VIT_BATCH = 1500, 64
            VIT_BATCH = global_batch(VIT_BATCH)
            vit = ViT(vit_cfg)
            vit_params = jax.jit(vit.init)(jax.random.PRNGKey(0), train["inputs"][:1])["params"]
            print(f"ViT: {count_params(vit_params):,} parameters")


            def vit_loss(params, batch, rng):
                logits = vit.apply({"params": params}, batch["inputs"], deterministic=False,
                                   rngs={"dropout": rng})
                loss = masked_cross_entropy(logits, batch["labels"])
                return loss, {"accuracy": token_accuracy(logits, batch["labels"])}


            tx, schedule = make_optimizer(OptimizerConfig(
                "adamw", learning_rate=1e-3, schedule="warmup_cosine", warmup_steps=1 if SMOKE else 100,
                total_steps=VIT_STEPS, weight_decay=0.05, clip_norm=1.0))
            vit_state = par.shard_state(TrainState.create(vit_params, tx, jax.random.PRNGKey(1)))
            vit_run = fit(vit_state, par.train_step(vit_loss, schedule=schedule),
                          ArrayIterator(train, par.local_batch_size(VIT_BATCH), seed=0,
                                        **par.iterator_shard()),
                          FitConfig(num_steps=VIT_STEPS, log_every=1 if SMOKE else 100,
                                    tensorboard=False, plot=False),
                          parallel=par)

            predict = jax.jit(lambda p, x: jnp.argmax(vit.apply({"params": p}, x), -1))
            pred = np.asarray(predict(par.gather(vit_run.state.params), test["inputs"]))
            print(f"test accuracy: {100 * np.mean(pred == test['labels']):.1f}% on {n_test} digits")
        """),
        code("""
            fig, axes = plt.subplots(2, 8, figsize=(9, 2.8))
            for ax, img, y, p in zip(axes.flat, test["inputs"], test["labels"], pred):
                ax.imshow(img[:, :, 0], cmap="Greys")
                ax.set_title(f"{p}" + ("" if p == y else f" ({y})"), color="k" if p == y else "tab:red",
                             fontsize=9)
                ax.axis("off")
            fig.suptitle("ViT predictions on held-out digits (truth in brackets when wrong)", fontsize=9)
            plt.show()

            fig, ax = plt.subplots(figsize=(6, 3))
            for label, run in (("BERT (MLM)", bert_run), ("ViT", vit_run)):
                ax.plot([r["step"] for r in run.history], [r["loss"] for r in run.history], label=label)
            ax.set_xlabel("step")
            ax.set_ylabel("training loss")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend()
            plt.show()
        """),
        md("""
            Next: fine-tune the pre-trained encoder for classification (`BertConfig(num_classes=...)`
            uses the `<cls>` state), or load real BERT weights with `seqjax.interop`.
            `python -m seqjax.experiments.bert_mlm` and `python -m seqjax.experiments.digits` are the
            scripted versions.
        """),
    ]


# ----------------------------------------------------------------------------- 05 linear time


def linear_time() -> list[tuple[str, str]]:
    return [
        *header("05_linear_attention_and_ssm",
                "Linear-time sequence layers: linear attention and selective state spaces", """
            Softmax attention costs $O(T^2)$ in the sequence length. Linear attention
            (Katharopoulos et al. 2020) and selective state-space models (Mamba, Gu & Dao
            2023) cost $O(T)$ and can be computed two ways: in parallel for training, or as a
            recurrence for generation. This notebook checks that the forms agree
            (`seqjax.nn.linear_attention`, `seqjax.nn.ssm`) and measures the cost curves.
        """),
        code("""
            from functools import partial

            import numpy as np
            import jax.numpy as jnp

            from seqjax.nn import (dot_product_attention, linear_attention, linear_attention_step,
                                   linear_attention_weights, linear_recurrence, selective_scan,
                                   selective_step)

            jax.config.update("jax_default_matmul_precision", "highest")  # exact comparisons on TPU

            B, T, H, D = (1, 16, 2, 8) if SMOKE else (2, 256, 4, 32)
            CHUNK = 8 if SMOKE else 64
            rng = np.random.default_rng(0)
            q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(3))

            # One compiled function per form, reused for the cost curves at the end.
            causal_linear = {impl: jax.jit(partial(linear_attention, is_causal=True, implementation=impl,
                                                   chunk_size=CHUNK))
                             for impl in ("parallel", "chunked", "recurrent")}
            softmax_attention = jax.jit(partial(dot_product_attention, is_causal=True))
        """),
        md("""
            ## Linear attention: the quadratic form, three linear ones, and an RNN

            With a positive feature map $\\phi(x)=\\mathrm{elu}(x)+1$ instead of $\\exp(q^\\top k)$,
            causal attention is

            $$y_i=\\frac{\\sum_{j\\le i}\\phi(q_i)^\\top\\phi(k_j)\\,v_j}{\\sum_{j\\le i}\\phi(q_i)^\\top\\phi(k_j)}
            =\\frac{\\phi(q_i)^\\top S_i}{\\phi(q_i)^\\top z_i},\\qquad
            S_i=S_{i-1}+\\phi(k_i)v_i^\\top,\\quad z_i=z_{i-1}+\\phi(k_i).$$

            The left side is the $T\\times T$ attention matrix (written below in NumPy); the
            right side is an RNN whose state is a $D\\times D$ matrix. `implementation=`
            `"parallel"` (prefix sums), `"chunked"` (quadratic inside chunks, recurrent across
            them) and `"recurrent"` (`lax.scan`) compute the same thing; so does feeding one
            token at a time to `linear_attention_step`, which is how generation works.
        """),
        code("""
            def phi(x):
                return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0)))  # elu(x) + 1


            def quadratic_np(q, k, v):
                pq, pk = phi(np.asarray(q, np.float64)), phi(np.asarray(k, np.float64))
                a_BxHxTxT = np.einsum("bqhd,bkhd->bhqk", pq, pk) * np.tril(np.ones((T, T)))
                a_BxHxTxT /= a_BxHxTxT.sum(-1, keepdims=True) + 1e-6
                return np.einsum("bhqk,bkhe->bqhe", a_BxHxTxT, np.asarray(v, np.float64))


            reference = quadratic_np(q, k, v)
            for impl, fn in causal_linear.items():
                print(f"{impl:>9}: max |y - quadratic form| = {np.abs(fn(q, k, v) - reference).max():.1e}")
                assert np.allclose(fn(q, k, v), reference, atol=1e-4)

            step = jax.jit(linear_attention_step)
            state = (jnp.zeros((B, H, D, D)), jnp.zeros((B, H, D)))  # (S, z)
            ys = []
            for t in range(T):
                state, y_t = step(state, q[:, t], k[:, t], v[:, t])
                ys.append(y_t)
            err = np.abs(np.stack(ys, axis=1) - reference).max()
            print(f"one token at a time: max |y - quadratic form| = {err:.1e}")
            assert err < 1e-4
        """),
        code("""
            %matplotlib inline
            import matplotlib.pyplot as plt

            _, softmax_w = jax.jit(partial(dot_product_attention, is_causal=True, return_weights=True))(
                q, k, v)
            linear_w = jax.jit(partial(linear_attention_weights, is_causal=True))(q, k)
            fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
            for ax, w, title in ((axes[0], softmax_w, "softmax: exp(q.k / sqrt(d))"),
                                 (axes[1], linear_w, "linear: phi(q).phi(k)")):
                im = ax.imshow(np.asarray(w[0, 0]), cmap="viridis")
                ax.set_title(title, fontsize=9)
                ax.set_xlabel("key j")
                ax.set_ylabel("query i")
                fig.colorbar(im, ax=ax, fraction=0.046)
            fig.suptitle("causal attention weights of head 0 (rows sum to 1)", fontsize=9)
            plt.show()
        """),
        md("""
            Linear attention's weights are flatter: the kernel $\\phi(q)^\\top\\phi(k)$ is less
            peaked than the exponential, which is the price of linear cost.

            ## Selective state spaces: an associative scan and a loop

            A diagonal state-space layer keeps, per channel $e$, a state $h_t\\in\\mathbb R^N$:
            $h_t=\\bar A_t\\odot h_{t-1}+\\bar B_t x_t$, $y_t=C_t h_t + D x_t$, with the zero-order
            hold $\\bar A_t=\\exp(\\Delta_t A)$, $\\bar B_t\\approx\\Delta_t B_t$. Mamba makes
            $\\Delta_t, B_t, C_t$ functions of the input (selection). The recurrence is linear
            in $h$, so the pairs $(a, b)$ compose associatively,
            $(a_1,b_1)\\circ(a_2,b_2)=(a_1a_2,\\;a_2b_1+b_2)$, and `jax.lax.associative_scan`
            evaluates all $T$ states in $O(\\log T)$ depth.
        """),
        code("""
            E, N = (8, 4) if SMOKE else (64, 16)
            x = jnp.asarray(rng.normal(size=(B, T, E)), jnp.float32)
            delta = jax.nn.softplus(jnp.asarray(rng.normal(size=(B, T, E)) - 2.0, jnp.float32))
            A = -jnp.exp(jnp.asarray(rng.normal(size=(E, N)) * 0.5, jnp.float32))  # negative: stable
            Bt, Ct = (jnp.asarray(rng.normal(size=(B, T, N)), jnp.float32) for _ in range(2))
            Dskip = jnp.ones((E,), jnp.float32)

            ssm = {impl: jax.jit(partial(selective_scan, impl=impl))
                   for impl in ("associative", "sequential")}
            y_assoc, y_seq = (ssm[impl](x, delta, A, Bt, Ct, Dskip) for impl in ssm)


            def ssm_np(x, delta, A, Bt, Ct, Dskip):  # the recurrence, one step at a time
                x, delta, A, Bt, Ct = (np.asarray(a, np.float64) for a in (x, delta, A, Bt, Ct))
                h = np.zeros((B, E, N))
                ys = []
                for t in range(T):
                    a_bar = np.exp(delta[:, t, :, None] * A)             # exp(dt A)
                    b_bar = delta[:, t, :, None] * Bt[:, t, None, :]     # dt B
                    h = a_bar * h + b_bar * x[:, t, :, None]
                    ys.append(np.einsum("ben,bn->be", h, Ct[:, t]) + np.asarray(Dskip) * x[:, t])
                return np.stack(ys, axis=1)


            reference = ssm_np(x, delta, A, Bt, Ct, Dskip)
            for name, y in (("associative scan", y_assoc), ("sequential scan", y_seq)):
                print(f"{name:>16}: max |y - numpy recurrence| = {np.abs(y - reference).max():.1e}")
                assert np.allclose(y, reference, atol=1e-4)

            step = jax.jit(selective_step)
            h = jnp.zeros((B, E, N))
            ys = []
            for t in range(T):
                h, y_t = step(h, x[:, t], delta[:, t], A, Bt[:, t], Ct[:, t], Dskip)
                ys.append(y_t)
            err = np.abs(np.stack(ys, axis=1) - reference).max()
            print(f"one token at a time: max |y - numpy recurrence| = {err:.1e}")
            assert err < 1e-4
            # The same operator on its own: h_t = a_t h_{t-1} + b_t.
            print(linear_recurrence(jnp.full((1, 4, 1), 0.5), jnp.ones((1, 4, 1)))[0, :, 0])
        """),
        md("""
            `SelectiveSSM` and `MambaBlock` wrap this scan with the learned projections
            (`scan_impl="associative"` or `"sequential"`; `.step` / `init_cache` for
            generation), and `TransformerBlock(attention=LinearAttention)` swaps the
            attention of a transformer block.

            ## Cost curves

            Time per call against the sequence length $T$ (one batch, forward only, after
            compilation): softmax attention grows like $T^2$, the others like $T$. On a TPU or
            GPU the parallel forms win at short lengths (the hardware is idle otherwise); the
            sequential scan pays one loop step per token.
        """),
        code("""
            import time

            LENGTHS = [16, 32] if SMOKE else [256, 512, 1024, 2048, 4096] + (
                [8192] if BACKEND != "cpu" else [])


            def seconds(fn, *args, repeats=3):
                jax.block_until_ready(fn(*args))  # compile
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    jax.block_until_ready(fn(*args))
                    best = min(best, time.perf_counter() - start)
                return best


            costs = {name: [] for name in ("softmax attention", "linear attention (chunked)",
                                           "linear attention (recurrent)", "SSM (associative)",
                                           "SSM (sequential)")}
            for n in LENGTHS:
                qn, kn, vn = (jnp.asarray(rng.normal(size=(1, n, H, D)), jnp.float32) for _ in range(3))
                xn, dn = jnp.ones((1, n, E)), jnp.full((1, n, E), 0.1)
                bn = cn = jnp.ones((1, n, N)) / N
                costs["softmax attention"].append(seconds(softmax_attention, qn, kn, vn))
                costs["linear attention (chunked)"].append(seconds(causal_linear["chunked"], qn, kn, vn))
                costs["linear attention (recurrent)"].append(
                    seconds(causal_linear["recurrent"], qn, kn, vn))
                costs["SSM (associative)"].append(seconds(ssm["associative"], xn, dn, A, bn, cn))
                costs["SSM (sequential)"].append(seconds(ssm["sequential"], xn, dn, A, bn, cn))

            fig, ax = plt.subplots(figsize=(6.5, 4))
            for name, ts in costs.items():
                ax.plot(LENGTHS, np.asarray(ts) * 1e3, "o-", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel("ms per call")
            ax.set_title(f"forward cost on {BACKEND} ({DEVICES[0].device_kind})", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
            plt.show()
            print("ms per call:  T = " + "  ".join(f"{n:>7}" for n in LENGTHS))
            for name, ts in costs.items():
                print(f"{name:>28}: " + "  ".join(f"{1e3 * t:7.2f}" for t in ts))
        """),
    ]


NOTEBOOKS = {
    "00_quickstart": quickstart,
    "01_rnns_from_the_equations": rnns,
    "02_seq2seq_attention": seq2seq,
    "03_transformers": transformers,
    "04_bert_and_vit": bert_vit,
    "05_linear_attention_and_ssm": linear_time,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (no outputs, deterministic cell ids)."""
    nb = nbformat.v4.new_notebook()
    nb.nbformat, nb.nbformat_minor = 4, 5  # pinned: the files must not change with nbformat
    nb.metadata = {
        "accelerator": "TPU",
        "colab": {"provenance": [], "name": f"{name}.ipynb"},
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    cells = []
    for i, (kind, source) in enumerate(NOTEBOOKS[name]()):
        cell_id = f"{name[:2]}-{i:02d}"
        if kind == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(source, id=cell_id))
        else:
            cells.append(nbformat.v4.new_code_cell(source, id=cell_id))
    nb.cells = cells
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    """The file contents of ``name.ipynb``."""
    return json.dumps(build(name), indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> None:
    names = (argv if argv is not None else sys.argv[1:]) or list(NOTEBOOKS)
    for name in names:
        path = HERE / f"{name}.ipynb"
        path.write_text(render(name), encoding="utf-8")
        print("wrote", path)


if __name__ == "__main__":
    main()
