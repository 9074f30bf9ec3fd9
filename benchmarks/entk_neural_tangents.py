"""neural-tangents side of ``benchmarks/entk.py nt`` (run by that script, in its own venv).

Usage (by hand: ``python benchmarks/entk.py nt`` starts it)::

    /work/venv-nt/bin/python benchmarks/entk_neural_tangents.py WEIGHTS.npz REPEATS

Reads the MLP's weights and inputs that ``entk.py`` saved from torch (``layers.i.weight``
``[fan_in, fan_out]``, NTK parametrization: ``z = h @ W / sqrt(fan_in)``; ``x`` ``[N, d_in]``),
builds the same function in jax, and times ``nt.empirical_ntk_fn`` for ``implementation`` 1
(Jacobian contraction), 2 (NTK-vector products) and 3 (structured derivatives), full kernel
(``trace_axes=()``) and trace (``trace_axes=(-1,)``; neural-tangents *averages* over the
outputs, so the kernel is multiplied by d_out here to match dynascope's sum). Prints one JSON
line: median wall and process-CPU seconds per (implementation, mode) after a compile call, and
saves the kernels to ``WEIGHTS.nt.npz`` for the value check.

Environment: ``NT_IMPLEMENTATIONS`` (default ``1,2,3``) picks the implementations; one XLA
thread (``--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``), set before jax is imported.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import neural_tangents as nt  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    path, repeats = sys.argv[1], int(sys.argv[2])
    data = np.load(path)
    n_layers = sum(1 for k in data.files if k.startswith("layers."))
    params = [jnp.asarray(data[f"layers.{i}.weight"]) for i in range(n_layers)]
    x = jnp.asarray(data["x"])

    def apply_fn(params, x):
        h = x
        for i, W in enumerate(params):
            h = (h @ W) / np.sqrt(W.shape[0])
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return h

    d_out = params[-1].shape[1]
    times, kernels = {}, {}
    for impl in [int(i) for i in os.environ.get("NT_IMPLEMENTATIONS", "1,2,3").split(",")]:
        for mode, axes in (("full", ()), ("trace", (-1,))):
            fn = jax.jit(
                nt.empirical_ntk_fn(apply_fn, trace_axes=axes, vmap_axes=0, implementation=impl)
            )
            K = fn(x, None, params).block_until_ready()  # compile
            walls, cpus = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                K = fn(x, None, params).block_until_ready()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
            times[f"{impl}/{mode}"] = statistics.median(walls)
            times[f"{impl}/{mode}/cpu"] = statistics.median(cpus)
            kernels[f"{impl}_{mode}"] = np.asarray(K) * (d_out if mode == "trace" else 1)
    np.savez(path.replace(".npz", ".nt.npz"), **kernels)
    print(json.dumps({"jax": jax.__version__, "neural_tangents": nt.__version__, "times": times}))


if __name__ == "__main__":
    main()
