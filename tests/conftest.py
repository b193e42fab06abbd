"""Test set-up, before JAX initialises:

* 8 fake CPU devices for the sharding tests;
* XLA's backend optimisation level 0: the suite is dominated by compile time
  (hundreds of tiny programs), which this roughly halves, while matmuls still go
  to the same optimised library kernels;
* float32 matmuls at full precision, so numpy references compare tightly;
* ``SEQJAX_DATA_DIR`` = ``../shared/data`` when it exists (no test downloads a corpus).
"""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The corpora come from ../shared/data (tests never download): SEQJAX_DATA_DIR is the
# resolver's second place, before the user cache and the network.
_shared = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "shared", "data")
if "SEQJAX_DATA_DIR" not in os.environ and os.path.isdir(_shared):
    os.environ["SEQJAX_DATA_DIR"] = _shared

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
