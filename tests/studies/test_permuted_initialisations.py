"""Study permuted-initialisations: presets, config errors, the verdict contract, smoke end to
end on the engine (one ensemble per gated architecture), resume after a crash."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from dynascope import load_run, studies
from dynascope.probes import permutation as perm
from dynascope.studies.permuted_initialisations import STUDY, PermutedInitRun, build_runs
from dynascope.studies.permuted_initialisations.analysis import _verdicts
from dynascope.studies.permuted_initialisations.protocol import (
    P1_MIN_ACCURACY,
    P2_MAX_ACCURACY,
    P3_MAX_RATIO,
    PROTOCOL,
)
from dynascope.studies.permuted_initialisations.runs import (
    MatchingProbe,
    NetGroup,
    build_permuted_inits,
)
from dynascope.train import Loop, SeedStreams, run_members


def test_presets_validate_and_fast_matches_s7():
    assert studies.get("permuted-initialisations") is STUDY
    specs = {s.name: s for s in build_runs(STUDY.preset("fast"))}
    pairs = [s for s in specs.values() if s.config.group == "pairs"]
    assert sorted({tuple(s.config.hidden) for s in pairs}) == [(512, 512), (1024,)]
    assert len(pairs) == 10 and len({(tuple(s.config.hidden), s.config.seed) for s in pairs}) == 10
    assert PROTOCOL.seeds["fast"] == STUDY.preset("fast").n_pairs == 5
    assert all(s.config.match_steps == [10, 50, 100] and s.config.loop.steps == 130 for s in pairs)
    # an architecture's seed pairs train as one ensemble; so do the transformer pairs
    assert {s.group for s in pairs} == {"pair_mlp_1024", "pair_mlp_512x512"}
    assert [s.group for s in specs.values() if s.name.startswith("transformer")] == [
        "transformer"
    ] * 3
    widths = sorted(s.config.hidden[0] for s in specs.values() if s.config.group == "width")
    assert widths == [32, 128, 512, 2048]
    assert specs["nway_mlp_1024"].config.n_nets == 10
    assert specs["cnn_32-32-avg-64-64_adamw0.001_p0"].config.arch == "32-32-avg-64-64"
    paper = build_runs(STUDY.preset("paper"))
    assert {c.config.optimizer for c in paper if c.config.group == "cnn"} == {"adamw", "sgd"}
    assert max(c.config.hidden[0] for c in paper if c.config.group == "width") == 8192
    shifted = {s.config.seed for s in build_runs(STUDY.preset("fast"), seed=1000)}
    assert shifted.isdisjoint({s.config.seed for s in specs.values()})


def test_config_errors_name_the_field():
    loop = Loop(steps=10)
    with pytest.raises(ValidationError, match=r"match_steps must lie in \[0, loop.steps=10\]"):
        PermutedInitRun(match_steps=[20], loop=loop)
    with pytest.raises(ValidationError, match="token 'pool'"):
        PermutedInitRun(model="cnn", arch="8-pool", loop=loop)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        PermutedInitRun(widht=3, loop=loop)
    with pytest.raises(ValidationError, match="Input should be 'adamw' or 'sgd'"):
        PermutedInitRun(optimizer="adam", loop=loop)


def _row(seed, init_perm, init_vanilla, init_random, bar_perm, bar_vanilla, bar_random, acc=0.95):
    return {
        "seed": seed,
        "status": "finished",
        "init_avg.activation.accuracy": init_perm,
        "init_avg.vanilla.accuracy": init_vanilla,
        "init_avg.random.accuracy": init_random,
        "init_avg.weight.accuracy": 0.1,
        "midpoint.activation.accuracy": 0.9,
        "midpoint.vanilla.accuracy": 0.8,
        "barrier.activation.loss": bar_perm,
        "barrier.vanilla.loss": bar_vanilla,
        "barrier.random.loss": bar_random,
        "net0.init.accuracy": 0.1,
        "net0.test.accuracy": acc,
        "net1.test.accuracy": acc,
    }


LABEL = "MLP 64-1024-10"


def test_verdicts_judge_per_seed_pair_with_controls_and_can_fail():
    rows = [
        _row(0, 0.5, 0.1, 0.1, 0.1, 0.5, 0.6),
        _row(1, 0.45, 0.12, 0.11, 0.2, 0.4, 0.4),
        _row(2, 0.55, 0.13, 0.1, 0.15, 0.5, 0.5),
        _row(3, 0.5, 0.1, 0.12, 0.1, 0.5, 0.55),
        _row(4, 0.48, 0.09, 0.09, 0.12, 0.45, 0.5),
    ]
    p1, p2, p3 = _verdicts(LABEL, rows)
    assert p1.claim_id == f"p1 ({LABEL})" and p1.threshold == P1_MIN_ACCURACY
    assert p1.status == "held" and p1.measured == pytest.approx(0.496)
    assert p1.per_seed == (0.5, 0.45, 0.55, 0.5, 0.48) and p1.n_seeds == 5
    assert p1.interval[0] > P1_MIN_ACCURACY  # the 95 % interval lies above the bar
    # the control is the ablation (a random π on the same pairs), judged by the same rule
    assert p1.control.kind == "ablation" and p1.control.status == "not held"
    assert p1.control.per_seed == {0: 0.1, 1: 0.11, 2: 0.1, 3: 0.12, 4: 0.09}
    assert p2.status == "held" and p2.threshold == P2_MAX_ACCURACY
    assert p2.control.status == "not held"  # the matched average is not near chance
    assert p3.status == "held" and p3.threshold == P3_MAX_RATIO
    assert p3.per_seed == pytest.approx((0.2, 0.5, 0.3, 0.2, 0.12 / 0.45))
    assert p3.control.per_seed == pytest.approx({0: 1.2, 1: 1.0, 2: 1.0, 3: 1.1, 4: 0.5 / 0.45})
    assert PROTOCOL.check([p1, p2, p3])  # thresholds, directions, statistic as registered
    # three seeds: fewer than 5, inconclusive whatever the values
    assert {v.status for v in _verdicts(LABEL, rows[:3])} == {"inconclusive"}
    # the random permutation does as well as the matched one: the control holds, inconclusive
    same = [_row(s, 0.5, 0.1, 0.5, 0.1, 0.5, 0.1) for s in range(5)]
    p1, _, p3 = _verdicts(LABEL, same)
    assert p1.control.status == "held" and p1.status == "inconclusive"
    assert p3.status == "inconclusive"
    # informative runs where the claims fail
    bad = [_row(s, 0.2 + 0.01 * s, 0.3, 0.1, 0.5, 0.5, 0.5) for s in range(5)]
    assert [v.status for v in _verdicts(LABEL, bad)] == ["not held"] * 3
    # an end point that did not train: the precondition fails, every claim inconclusive
    untrained = [_row(s, 0.5, 0.1, 0.1, 0.1, 0.5, 0.6, acc=0.5) for s in range(5)]
    assert [v.status for v in _verdicts(LABEL, untrained)] == ["inconclusive"] * 3
    # no vanilla barrier: p3's ratio is undefined (NaN) and its precondition fails
    flat = [_row(s, 0.5, 0.1, 0.1, 0.0, 0.0, 0.0) for s in range(5)]
    p3 = _verdicts(LABEL, flat)[2]
    assert p3.status == "inconclusive" and all(math.isnan(v) for v in p3.per_seed)


def test_protocol_covers_every_gated_architecture_of_every_preset():
    ids = {c.id for c in PROTOCOL.claims}
    for preset in ("smoke", "fast", "paper"):
        for hidden in STUDY.preset(preset).pair_hidden:
            label = "MLP " + "-".join(map(str, [64, *hidden, 10]))
            assert {f"p{k} ({label})" for k in (1, 2, 3)} <= ids
    assert all(c.kind == "finding" and c.control for c in PROTOCOL.claims)
    assert PROTOCOL.amendments and len(PROTOCOL.sha256) == 64


TINY = PermutedInitRun(hidden=[16], n_train=60, batch_size=10, loop=Loop(steps=3, log_every=1))


def test_the_group_trains_each_net_as_if_alone():
    """Oracle: the summed loss's gradient for net i is net i's own gradient, so one AdamW step
    of the group equals a step of net i alone on its batch (same float32 arithmetic)."""
    parts = build_permuted_inits(TINY, SeedStreams(3))
    group: NetGroup = parts.model
    copies = [perm.load_params(net, perm.layer_params(net)) for net in group.nets]
    batch = parts.data(torch.Generator().manual_seed(0))
    opt = parts.optimizer(group)
    loss, metrics = parts.loss(group, batch)
    loss.backward()
    opt.step()
    for i, net in enumerate(copies):
        opt_i = torch.optim.AdamW(net.parameters(), lr=TINY.lr, weight_decay=TINY.weight_decay)
        loss_i = torch.nn.functional.cross_entropy(net(batch["x"][i]), batch["y"][i])
        torch.testing.assert_close(loss_i, metrics[f"net{i}.loss"], rtol=0, atol=0)
        loss_i.backward()
        opt_i.step()
        for (w, _), (w_group, _) in zip(
            perm.layer_params(net), perm.layer_params(group.nets[i]), strict=True
        ):
            torch.testing.assert_close(w, w_group, rtol=0, atol=0)


def test_a_crashed_run_resumes_to_the_same_metrics(tmp_path):
    """A crash inside the probe at step 2 (after the step-1 checkpoint): the rerun resumes and
    its stored rows equal an uninterrupted run's, bit for bit (the inits come back from the
    checkpointed probe state)."""
    config = TINY.model_copy(
        update={"match_steps": [1, 2], "loop": Loop(steps=3, log_every=1, checkpoint_every=1)}
    )
    run_members(build_permuted_inits, config, tmp_path / "full")
    original = MatchingProbe.__call__

    def crashing(self, model, ctx):
        if ctx.step == 2:
            raise RuntimeError("crash at step 2")
        return original(self, model, ctx)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MatchingProbe, "__call__", crashing)
        with pytest.raises(RuntimeError, match="crash at step 2"):
            run_members(build_permuted_inits, config, tmp_path / "cut")
    assert load_run(tmp_path / "cut").status != "finished"
    result = run_members(build_permuted_inits, config, tmp_path / "cut", resume=True)
    assert result.status == "finished"
    full, cut = (load_run(tmp_path / d) for d in ("full", "cut"))
    columns = ["step", "key", "value"]
    frames = [
        r.scalars.sort_values(["step", "key"])[columns].reset_index(drop=True) for r in (full, cut)
    ]
    pd.testing.assert_frame_equal(*frames)
    assert (
        full.tensors("path.activation.loss")[1][-1].tolist()
        == cut.tensors("path.activation.loss")[1][-1].tolist()
    )


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(" ")[0] for c in data["claims"]] == ["p1", "p2", "p3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(data["runs"]) == 7
    for claim in data["claims"]:
        assert claim["status"] in ("held", "not held", "inconclusive")
        assert len(claim["per_seed"]) == 3 and claim["control"]["per_seed"] is not None
    # two updates train nothing: the precondition fails and every claim is inconclusive
    assert {c["status"] for c in data["claims"]} == {"inconclusive"}
    # every control is the ablation on the same runs, measured on 3 seeds: inconclusive too
    assert all(c["control"]["kind"] == "ablation" for c in data["claims"])
    assert data["claims"][0]["control"]["status"] == "inconclusive"
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    # S7's smoke oracles, measured on every run's net 0: a random permutation changes no
    # output (float32 rounding), matching recovers it by weights exactly and by activations on
    # every live unit, the barrier of a net with itself is 0
    for row in next(v for k, v in data["tables"].items() if k.startswith("self-checks")):
        assert row["max |f(x) − f_perm(x)|"] < 1e-5
        assert row["self-match recovered (weight)"] == 1.0
        assert row["self-match recovered (activation)"] >= 1.0 - row["dead units"]
        assert abs(row["self barrier (nats)"]) < 1e-6
    assert len(list((out / "figures").glob("*.png"))) == 3
    assert outcome.status == "inconclusive"
