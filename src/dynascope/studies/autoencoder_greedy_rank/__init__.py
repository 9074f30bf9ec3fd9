"""Study ``autoencoder-greedy-rank`` (S15): a linear stack at an autoencoder's bottleneck learns
the latent code greedily, one rank at a time (notes: docs/studies/autoencoder-greedy-rank.md)."""

from .analysis import analyze, measure_run, verdicts_from_runs
from .runs import AutoencoderRun, build_autoencoder, reconstruction_loss, step_size
from .study import STUDY, AutoencoderGreedyRankPreset, build_runs

__all__ = [
    "STUDY",
    "AutoencoderGreedyRankPreset",
    "AutoencoderRun",
    "analyze",
    "build_autoencoder",
    "build_runs",
    "measure_run",
    "reconstruction_loss",
    "step_size",
    "verdicts_from_runs",
]
