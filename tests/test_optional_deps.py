"""The core install (no extras) imports, trains and checkpoints; each optional package that is
missing gives an error naming the extra (issue #18.5: datasets, tokenizers, matplotlib and
tensorboardX are extras)."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import sys
    for name in ("datasets", "tokenizers", "matplotlib", "tensorboardX"):
        sys.modules[name] = None  # import raises ModuleNotFoundError, as if not installed
    import os, tempfile
    import jax, jax.numpy as jnp, numpy as np, optax
    import seqjax, seqjax.cli, seqjax.data, seqjax.interop, seqjax.models, seqjax.train
    from seqjax.data import ArrayIterator, CharTokenizer, load_parallel, train_bpe
    from seqjax.train import FitConfig, create_train_state, fit, make_train_step

    tok = CharTokenizer.from_text("abc")
    assert tok.decode(tok.encode("cab")) == "cab"

    def loss_fn(params, batch, rng):
        return jnp.mean((params["w"] * batch["x"] - 1.0) ** 2), {}

    def run(workdir, **kw):
        state, _ = create_train_state(lambda r: {"w": jnp.zeros(())}, optax.sgd(0.1),
                                      jax.random.PRNGKey(0))
        cfg = FitConfig(steps=2, log_every=1, progress=False, handle_signals=False,
                        async_checkpointing=False, **kw)
        data = ArrayIterator({"x": np.ones((4,), np.float32)}, 2)
        return fit(state, make_train_step(loss_fn), data, cfg, workdir=workdir)

    def expect(call, extra):
        try:
            call()
        except ModuleNotFoundError as err:
            assert f'pip install "seqjax[{extra}]"' in str(err), str(err)
        else:
            raise AssertionError(f"no error; expected one naming seqjax[{extra}]")

    root = tempfile.mkdtemp()
    done = run(os.path.join(root, "default"))  # defaults: TensorBoard and plots when installed
    assert done.status == "completed"
    written = sorted(os.listdir(os.path.join(root, "default")))
    assert "checkpoints" in written and "metrics.jsonl" in written, written
    assert "tensorboard" not in written and "loss.png" not in written, written
    expect(lambda: run(os.path.join(root, "tb"), tensorboard=True), "tensorboard")
    expect(lambda: run(os.path.join(root, "plot"), plot=True), "plot")
    path = os.path.join(root, "t.txt")
    open(path, "w").write("Go.\tVa !")
    expect(lambda: load_parallel(path), "hf")
    expect(lambda: train_bpe(["to be"], vocab_size=40), "hf")
    print("ok")
''')


def test_core_works_without_the_extras_and_names_them_when_needed():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    # what the default left out is said (once per fit), with the extra that adds it
    assert 'TensorBoard events not written: tensorboardX is not installed (pip install ' \
        '"seqjax[tensorboard]")' in out.stderr
    assert 'loss.png and perplexity.png not written: matplotlib is not installed' in out.stderr
