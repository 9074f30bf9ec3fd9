"""Instrument cost: monitoring overhead, factored vs dense spectra, attention-entropy capture.

Run by hand (not part of the test suite); each prints a ratio measured side by side in one run::

    python benchmarks/instruments.py overhead [--steps 300] [--repeats 3] [--threads 1]
    python benchmarks/instruments.py spectra  [--repeats 3] [--threads 1]
    python benchmarks/instruments.py entropy  [--repeats 20] [--threads 1]

Results and how to read them: docs/benchmarks.md (section "Instruments").

(a) ``overhead``: ``run_members(build_registry, config, tmpdir)`` of a 4-layer, d_model 256,
    8-head transformer (d_mlp 1024, byte-level LM on the stdlib corpus, n_ctx 64, batch 16,
    AdamW) for ``--steps`` steps with the default monitor (``qk_spectrum`` + ``ov_spectrum`` on
    a 30-point log schedule) against the same run with ``monitor.probes=[]``, both on
    ``--threads`` intra-op threads (``train.threads``) and timed whole (building the parts
    included, alike in both). Repeats are interleaved (with, without, with, ...); the ratio is
    median time with / median time without. Goal: <= 1.01. Because a busy machine
    swings whole runs by several percent, the script also times ``Monitor.step`` inside the runs
    with the monitor and reports 1 + (time in Monitor.step) / (rest of the run), which the
    noise of other processes hits far less.
(b) ``spectra``: singular values of W_QK = W_Q W_K^T for 12 layers x 12 heads, d_model 768,
    d_head 64 (GPT-2 small's shapes), float32, from the factors
    (:func:`dynascope.probes.qk_singular_values`: QR of each factor, SVD of a 64 x 64 core)
    against dense ``torch.linalg.svdvals(W_Q @ W_K^T)`` of the 144 768 x 768 products. Both
    results are checked to agree (top 64 singular values, rtol 1e-3 of the largest). Ratio:
    median dense time / median factored time. Goal: >= 30.
(c) ``entropy``: one forward of a 4-layer, d_model 256 transformer (batch 16, n_ctx 64) with
    ``capture_patterns`` and ``attention_entropy`` of every layer, against a plain forward (which
    takes fused SDPA). Ratio: median captured time / median plain time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

from dynascope.config import validate_config
from dynascope.train import SeedStreams, build_registry, run_members


def _header(threads: int) -> None:
    torch.set_num_threads(threads)
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, cpus {os.cpu_count()}, "
        f"load avg {os.getloadavg()[0]:.1f}"
    )


def overhead(steps: int, repeats: int) -> None:
    base = {
        "name": "bench",
        "model": {"n_layers": 4, "d_model": 256, "n_heads": 8, "d_mlp": 1024},
        "task": {"name": "char_lm", "n_ctx": 64, "max_bytes": 2_000_000},
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "train": {
            "steps": steps,
            "batch_size": 16,
            "log_every": 10,
            "eval_every": steps,
            "eval_batches": 2,
            "checkpoint_every": steps,
            "threads": torch.get_num_threads(),
        },
    }
    configs = {
        "with monitor": validate_config(base),  # default probes: qk_spectrum, ov_spectrum, log 30
        "without": validate_config(base, ["monitor.probes=[]"]),
    }
    from dynascope.monitor import Monitor

    monitor_seconds = [0.0]
    step = Monitor.step

    def timed_step(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return step(self, *args, **kwargs)
        finally:
            monitor_seconds[0] += time.perf_counter() - t0

    Monitor.step = timed_step
    times: dict[str, list[float]] = {k: [] for k in configs}
    inside: list[float] = []
    for r in range(repeats):
        for name, cfg in configs.items():
            with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp:
                monitor_seconds[0] = 0.0
                t0 = time.perf_counter()
                run_members(build_registry, cfg, tmp)
                times[name].append(time.perf_counter() - t0)
            if name == "with monitor":
                inside.append(1 + monitor_seconds[0] / (times[name][-1] - monitor_seconds[0]))
            print(f"  repeat {r + 1} {name}: {times[name][-1]:.2f} s "
                  f"(Monitor.step {monitor_seconds[0]:.3f} s)", flush=True)  # fmt: skip
    with_, without = (statistics.median(times[k]) for k in configs)
    cfg = configs["with monitor"]
    n_probe_steps = len(build_registry(cfg, SeedStreams(cfg.seed)).probe_schedule.steps)
    print(f"(a) {steps} steps, {n_probe_steps} probe steps: with {with_:.2f} s, "
          f"without {without:.2f} s (medians of {repeats})")  # fmt: skip
    print(f"(a) ratio with/without = {with_ / without:.4f}   (goal <= 1.01)")
    print(f"(a) ratio from the time inside Monitor.step = {statistics.median(inside):.4f} "
          f"(min {min(inside):.4f}, max {max(inside):.4f})")  # fmt: skip


def spectra(repeats: int) -> None:
    from dynascope.probes import factor_singular_values

    g = torch.Generator().manual_seed(0)
    n_layers, n_heads, d_model, d_head = 12, 12, 768, 64
    W_Q = torch.randn(n_layers, n_heads, d_model, d_head, generator=g) / d_model**0.5
    W_K = torch.randn(n_layers, n_heads, d_model, d_head, generator=g) / d_model**0.5

    def factored() -> torch.Tensor:
        return factor_singular_values(W_Q, W_K)

    def dense() -> torch.Tensor:
        return torch.linalg.svdvals(W_Q @ W_K.mT)[..., :d_head]

    s_f, s_d = factored(), dense()
    torch.testing.assert_close(s_f, s_d, rtol=0, atol=1e-3 * float(s_d.max()))
    t_f, t_d = [], []
    for _ in range(repeats):
        for fn, out in ((factored, t_f), (dense, t_d)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    f, d = statistics.median(t_f), statistics.median(t_d)
    print(f"(b) 12x12 heads, d_model 768, d_head 64: factored {f * 1e3:.1f} ms, "
          f"dense {d * 1e3:.0f} ms (medians of {repeats}); max |diff| "
          f"{float((s_f - s_d).abs().max()):.2e}")  # fmt: skip
    print(f"(b) ratio dense/factored = {d / f:.1f}   (goal >= 30)")


def entropy(repeats: int) -> None:
    from dynascope.adapters import capture_patterns
    from dynascope.nn import Transformer
    from dynascope.probes import attention_entropy

    torch.manual_seed(0)
    model = Transformer(
        n_layers=4, d_model=256, n_heads=8, d_mlp=1024, d_vocab=256, d_out=256, n_ctx=64
    ).eval()
    x = torch.randint(0, 256, (16, 64))
    causal = torch.ones(64, 64, dtype=torch.bool).tril()

    def plain() -> None:
        with torch.no_grad():
            model(x)

    def captured() -> None:
        with torch.no_grad(), capture_patterns(model) as patterns:
            model(x)
            for pattern in patterns.values():
                attention_entropy(pattern, causal)

    for fn in (plain, captured):
        fn()  # warm-up
    t_p, t_c = [], []
    for _ in range(repeats):
        for fn, out in ((plain, t_p), (captured, t_c)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    p, c = statistics.median(t_p), statistics.median(t_c)
    print(f"(c) forward batch 16 x 64 tokens, 4 layers x 8 heads: plain {p * 1e3:.1f} ms, "
          f"capture + entropy {c * 1e3:.1f} ms (medians of {repeats})")  # fmt: skip
    print(f"(c) ratio captured/plain = {c / p:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["overhead", "spectra", "entropy"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    _header(args.threads)
    if args.which == "overhead":
        overhead(args.steps, args.repeats or 3)
    elif args.which == "spectra":
        spectra(args.repeats or 3)
    else:
        entropy(args.repeats or 20)


if __name__ == "__main__":
    main()
