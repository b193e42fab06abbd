# Cells that open every notebook, after its title: written into each one by
# colab/build.py ("{requirement}" is the pip requirement: seqjax with the extras
# the notebook needs). Not a notebook itself.

# %%
# Install seqjax from its repository when it is not importable (a fresh Colab
# runtime). Skipped in a checkout with `pip install -e .` and in CI. Should pip
# upgrade jax here, restart the session (Runtime -> Restart session) once.
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("seqjax") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "{requirement}"], check=True)

# %% [markdown]
# **Accelerators.** *Runtime → Change runtime type* picks a TPU, a GPU or the CPU;
# the same code runs on each. A Colab TPU runtime is a TPU VM (often one v5e chip,
# or v5e-8): JAX sees the TPU cores directly through `jax.devices()`, so the old
# `jax.tools.colab_tpu.setup_tpu()` of the retired TPU-Node runtime is neither
# needed nor available, and nothing here needs TensorFlow.
#
# **`SMOKE`** runs everything with tiny sizes, one or two training steps and
# offline data, in seconds: it is what CI executes. Set the environment variable
# `SEQJAX_SMOKE=1` (or call `notebook_setup(smoke=True)` below) to try it; leave it
# off for the real run.
