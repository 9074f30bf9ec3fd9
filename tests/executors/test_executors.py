"""Executors: a registered smoke study gives the same verdict values on every executor; a run
that raises or whose process dies is recorded as ``failed`` and the other runs go on.

The reference is the in-process (``local``) execution of ``autoencoder-greedy-rank``'s smoke
preset (3 runs, float64, one intra-op thread). Each run is deterministic given its config on
one thread, so the process pool and Ray must reproduce the measured values exactly
(``rtol=atol=0``); a difference would mean an executor changed a run (config, seed, device or
thread count). Ray starts once for this module (``ray.init`` takes seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynascope import studies
from dynascope.executors import (
    ProcessExecutor,
    make_executor,
)
from dynascope.store import load_run

HERE = Path(__file__).parent
STUDY = "autoencoder-greedy-rank"


@pytest.fixture(scope="module")
def local_outcome(smoke_run):
    """The reference: the session's shared smoke run, in-process (``LocalExecutor``, the
    default executor of ``Study.run``)."""
    return smoke_run.outcome(STUDY)


def _measured(outcome) -> torch.Tensor:
    return torch.tensor([v.measured for v in outcome.claims], dtype=torch.float64)


def _assert_same_verdicts(outcome, reference) -> None:
    torch.testing.assert_close(
        _measured(outcome), _measured(reference), rtol=0, atol=0, equal_nan=True
    )
    assert [v.passed for v in outcome.claims] == [v.passed for v in reference.claims]
    assert [(r["name"], r["status"]) for r in outcome.runs] == [
        (r["name"], r["status"]) for r in reference.runs
    ]


def test_make_executor_refuses_bad_input():
    with pytest.raises(
        ValueError, match=r"^executor must be one of local, process, ray \(got 'dask'\)$"
    ):
        make_executor("dask")
    with pytest.raises(ValueError, match=r"^workers must be >= 1 \(got 0\)$"):
        make_executor("process", workers=0)
    with pytest.raises(ValueError, match="workers: only the process executor takes it"):
        make_executor("local", workers=2)
    with pytest.raises(ValueError, match="address: only the ray executor takes it"):
        make_executor("process", workers=2, address="localhost:6379")


@pytest.mark.slow
def test_process_executor_gives_the_local_verdicts(local_outcome, tmp_path):
    outcome = studies.get(STUDY).run(
        preset="smoke", out=tmp_path, executor=ProcessExecutor(workers=2)
    )
    _assert_same_verdicts(outcome, local_outcome)
    assert all(r["this_call"] == "started" for r in outcome.runs)


# other kinds of run than the reference's: float32 K-member ensembles (slingshot) and a custom
# ``Parts(step=...)`` with per-step probes (gradual-rank's toy and its ViT)
OTHER_KINDS = ("slingshot", "gradual-rank")


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHER_KINDS)
def test_process_executor_gives_the_local_values_for_other_kinds_of_run(name, smoke_run, tmp_path):
    study = studies.get(name)
    local = smoke_run.outcome(name)  # in-process, LocalExecutor
    pool = study.run(preset="smoke", out=tmp_path / "pool", executor=ProcessExecutor(workers=2))
    _assert_same_verdicts(pool, local)
    for row in local.runs:  # every logged value, bit for bit
        a = load_run(smoke_run(name) / "runs" / row["name"]).scalars
        b = load_run(tmp_path / "pool" / "runs" / row["name"]).scalars
        assert (
            a.sort_values(["step", "key"])
            .reset_index(drop=True)
            .equals(b.sort_values(["step", "key"]).reset_index(drop=True))
        ), row["name"]


def test_a_raising_run_and_a_dead_process_are_failed_and_the_others_finish(stub_study, tmp_path):
    study = stub_study.make_study(("ok", "die", "raise", "ok"))
    outcome = study.run(preset="smoke", out=tmp_path, executor=ProcessExecutor(workers=2))
    assert [r["status"] for r in outcome.runs] == ["finished", "failed", "failed", "finished"]
    errors = {
        name: load_run(tmp_path / "runs" / name).events.query("kind == 'error'")["detail"].tolist()
        for name in ("r1_die", "r2_raise")
    }
    assert errors == {
        "r1_die": ["WorkerDied: the run's process killed by SIGKILL"],
        "r2_raise": ["RuntimeError: stub failure"],
    }
    assert outcome.claims[1].measured == 2.0  # analyze saw both finished runs


def test_device_is_passed_to_runners_that_take_it(stub_study, tmp_path):
    study = stub_study.make_study(("ok",))
    study.run(preset="smoke", out=tmp_path / "cpu", device="auto")  # no CUDA here: cpu
    assert load_run(tmp_path / "cpu" / "runs" / "r0_ok").config["loop"]["device"] == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="^device: cuda is not available here"):
            study.run(preset="smoke", out=tmp_path / "cuda", device="cuda")
        assert not (tmp_path / "cuda").exists()  # refused before anything was written
    with pytest.raises(ValueError, match=r"^device must be one of auto, cpu, cuda \(got 'tpu'\)$"):
        study.run(preset="smoke", out=tmp_path / "tpu", device="tpu")


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}},  # workers import _stub_study
    )
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_local_gives_the_local_verdicts_and_records_failures(
    ray_local, local_outcome, stub_study, tmp_path
):
    outcome = studies.get(STUDY).run(
        preset="smoke", out=tmp_path / "ae", executor=make_executor("ray")
    )
    _assert_same_verdicts(outcome, local_outcome)
    assert ray_local.is_initialized()  # the executor joined the module's Ray, did not stop it

    study = stub_study.make_study(("ok", "raise", "die"))
    outcome = study.run(preset="smoke", out=tmp_path / "stub", executor=make_executor("ray"))
    assert [r["status"] for r in outcome.runs] == ["finished", "failed", "failed"]
    died = load_run(tmp_path / "stub" / "runs" / "r2_die").events.query("kind == 'error'")
    assert died["detail"].iloc[0].startswith(("WorkerCrashedError", "RayTaskError")), died
