"""Test set-up, before JAX initialises:

* 8 fake CPU devices for the sharding tests;
* XLA's backend optimisation level 0: the suite is dominated by compile time
  (hundreds of tiny programs), which this roughly halves, while matmuls still go
  to the same optimised library kernels;
* float32 matmuls at full precision, so numpy references compare tightly.
"""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
