"""sRAVEN part of ``hyla-fuzzy-logic`` (paper preset): run config, ``build`` and claim s4-sraven.

Glossary: K features per panel, F values per feature, sequence 9K tokens (8 context panels + K
zero query tokens), targets the answer panel's K values (:mod:`dynascope.tasks.sraven`). Model:
:class:`~dynascope.nn.SequenceTransformer` with ``d_in = d_out = F``, cross-entropy on the last
K positions; ``acc`` = all K features right, ``acc_per_feature`` = mean over features.

Claim s4-sraven (SYSTEMS.md S4: "HYLA OOD acc > linear and softmax"; Table A1: 69.13 vs 56.30
and 56.56 at 4 layers and 20M instances): per seed, OOD acc(HYLA) − max(OOD acc(linear),
OOD acc(softmax)) >= 0 (an ordering, no margin). Precondition: every run finished with
training accuracy >= 0.5, per run (the claim is about generalization of fitted models).
Control: the same margin with linear in HYLA's place (linear − max(HYLA, softmax)), which
must fail for the ordering to be specific to HYLA. Threshold, statistic and bars:
:mod:`~dynascope.studies.hyla_fuzzy_logic.protocol`.

References:
    Schug et al. (2025), "Attention as a Hypernetwork", arXiv 2406.05816, sec. 4.2, Table A1;
    reference ``hyla/loss.py`` (``SymbolicRavenLoss``), ``configs/raven.py``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies._sequence_training import adamw_matrices
from dynascope.studies.hyla_fuzzy_logic.protocol import PROTOCOL, SRAVEN_FIT
from dynascope.studies.hyla_fuzzy_logic.runs import ModelSizes, sequence_transformer
from dynascope.studies.verdict import Precondition, Verdict
from dynascope.tasks.sraven import SymbolicRaven
from dynascope.train import Parts, SeedStreams

__all__ = ["SRAVEN_FIT", "SRavenRunConfig", "analyze_sraven", "build_sraven"]

SRAVEN_EVAL_SPLITS = ("train", "ood")


class SRavenRunConfig(ModelSizes):
    """One sRAVEN run (paper sizes: Table A1, reference ``configs/raven.py``)."""

    n_features: int = Field(4, ge=1, description="K")
    n_values: int = Field(8, ge=3, description="F")
    frac_ood: float = Field(0.25, ge=0, lt=1)
    split_seed: int = Field(0, ge=0)
    d_model: int = Field(128, ge=1)
    n_layers: int = Field(4, ge=1)
    n_heads: int = Field(16, ge=1)
    d_head: int = Field(4, ge=1)
    d_mlp: int = Field(256, ge=1)
    relative_position_buckets: int | None = Field(
        None, ge=2, description="T5 buckets = max distance; None: the sequence length 9K"
    )
    eval_sequences: int = Field(8192, ge=1)


def build_sraven(config: SRavenRunConfig, streams: SeedStreams) -> Parts:
    """Model, training batches, evaluation (``{train,ood}.acc[_per_feature]``) of one run."""
    task = SymbolicRaven(
        config.n_features, config.n_values, frac_ood=config.frac_ood, split_seed=config.split_seed
    )
    sizes = config
    if config.relative_position_buckets is None:
        sizes = config.model_copy(update={"relative_position_buckets": task.seq_len})
    model = sequence_transformer(sizes, config.n_values, config.n_values)
    gen = streams.generator("eval")
    evals = {s: task.sample(s, config.eval_sequences, gen) for s in SRAVEN_EVAL_SPLITS}
    k, f = config.n_features, config.n_values

    def data(g: torch.Generator) -> dict[str, torch.Tensor]:
        return task.sample("train", config.batch_size, g)

    def loss(m: torch.nn.Module, batch: dict) -> torch.Tensor:
        logits = m(batch["x"])[:, -k:]  # [batch, K, F]
        return F.cross_entropy(logits.reshape(-1, f), batch["y"].reshape(-1))

    def evaluate(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        dev = next(m.parameters()).device
        out = {}
        for split, b in evals.items():
            right = m(b["x"].to(dev))[:, -k:].argmax(-1) == b["y"].to(dev)  # [batch, K]
            out[f"{split}.acc"] = right.all(-1).float().mean()
            out[f"{split}.acc_per_feature"] = right.float().mean()
        return out

    return Parts(model=model, data=data, loss=loss, optimizer=adamw_matrices(config),
                 evaluate=evaluate)  # fmt: skip


def analyze_sraven(runs: dict[str, Run]) -> tuple[Verdict | None, list[dict]]:
    """Claim s4-sraven over seeds (module docstring), or ``None`` without sRAVEN runs."""
    rows = []
    for name, run in sorted(runs.items()):
        row = {"run": name, "attention": run.config["attention"], "status": run.status}
        row["seed"] = run.config["seed"]
        for key in ("train.acc", "ood.acc", "ood.acc_per_feature"):
            row[key] = last_or_nan(run, key)
        rows.append(row)
    if not rows:
        return None, rows
    by = {(r["attention"], r["run"].rsplit("_s", 1)[1]): r for r in rows}
    index = sorted({i for _, i in by}, key=int)

    def acc(kind: str, i: str) -> float:
        r = by.get((kind, i))
        return r["ood.acc"] if r is not None else float("nan")

    def margin(first: str, others: tuple[str, str]) -> dict[int, float]:
        """HYLA's run seed (the replicate's seed) -> margin; NaN where a run is missing."""
        seed = {i: by[("hyla", i)]["seed"] if ("hyla", i) in by else int(i) for i in index}
        return {int(seed[i]): acc(first, i) - max(acc(o, i) for o in others) for i in index}

    fits = {
        kind: float(np.mean([r["train.acc"] for r in rows if r["attention"] == kind] or [math.nan]))
        for kind in ("hyla", "linear", "softmax")
    }
    per_run = [r["train.acc"] if r["status"] == "finished" else math.nan for r in rows]
    worst = min(per_run) if all(math.isfinite(v) for v in per_run) else math.nan
    kinds = {r["attention"] for r in rows}
    verdict = PROTOCOL.claim("s4-sraven").judge(
        margin("hyla", ("linear", "softmax")),
        precondition=Precondition(
            f"every sRAVEN run (HYLA, linear, softmax) finished with train acc >= {SRAVEN_FIT}, "
            "per run (measured: the worst run; NaN: a run unfinished or missing)",
            met=bool(kinds >= {"hyla", "linear", "softmax"} and worst >= SRAVEN_FIT),
            measured=worst,
        ),
        control=margin("linear", ("hyla", "softmax")),
        detail="train acc (seed mean) "
        + ", ".join(f"{k} {v:.3f}" for k, v in fits.items())
        + " (paper OOD acc: HYLA 0.691, linear 0.563, softmax 0.566)",
    )
    return verdict, rows
