"""ESD of weight matrices and the power-law fit of its tail (``dynascope.probes.esd``).

Oracles and tolerances:
- alpha of Pareto samples of known exponent (inverse-CDF draws, x = x_min u^(-1/(alpha-1))):
  n = 2000 tail points at the known x_min, within 5 % (the MLE's standard error (alpha-1)/sqrt(n)
  is 1.7 % of alpha at alpha = 4, so 5 % is 3 standard errors; measured over seeds 0-29: at
  most 3.4 %, median 1.0 % at alpha = 4); with x_min chosen by KS, n = 3000 points, within 5 %
  (measured over seeds 0-29: at most 5.3 % at alpha = 4, median 1.0 %; seed 0: 0.3 %);
- a hand-built sample: a uniform body on [0.2, 0.95) and a power-law tail above x_min = 1, both
  at exact quantiles (no randomness): the KS choice must land on the tail's first point, alpha
  within 1 %, D = 1 / n_tail; random draws of a body and a tail: x_min within [0.95, 1.5];
- eigenvalues planted through W = U diag(s) V^T with s^2 / N drawn from a power law: the ESD
  equals the planted values (1e-9 relative) and alpha is within 4 standard errors;
- entries with a symmetric power-law tail of index mu = 1 (P(|W_ij| > x) = x^-mu): Martin &
  Mahoney's (2021) very-heavy-tailed class, alpha = 1 + mu / 2 as N -> infinity (the top
  eigenvalues are single squared entries); at N = 600, M = 300, within 10 % (finite size: the
  measured alpha: 1.394 at the test's seed 0, 1.40-1.44 over seeds 0-2 of a first draft);
- the ESD against the dense eigenvalues of X = W^T W / N (``numpy.linalg.eigvalsh``, float64,
  1e-9 of lambda_max), and against the model's own stored weights (GPT-2's fused c_attn,
  Llama's k_proj, a Conv2d kernel reshaped by hand).
"""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from dynascope.probes import esd_eigenvalues, esd_matrices, fit_power_law, weight_esd
from dynascope.probes.esd import ESD_COLUMNS

FAST = settings(max_examples=40, deadline=None)


def pareto(n: int, alpha: float, x_min: float, seed: int) -> np.ndarray:
    """n draws of the density (alpha - 1) / x_min (x / x_min)^-alpha, x >= x_min."""
    u = np.random.default_rng(seed).random(n)
    return x_min * (1.0 - u) ** (-1.0 / (alpha - 1.0))


def dense_esd(W: np.ndarray) -> np.ndarray:
    W = np.asarray(W, dtype=np.float64)
    if W.shape[0] < W.shape[1]:
        W = W.T
    return np.linalg.eigvalsh(W.T @ W / W.shape[0])


# -- the power-law fit ---------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1.5, 2.5, 4.0])
def test_mle_recovers_alpha_at_the_known_x_min(alpha):
    x = pareto(2000, alpha, x_min=0.3, seed=0)
    fit = fit_power_law(x, x_min=0.3)
    assert fit.n_tail == 2000 and fit.x_min == 0.3 and fit.reason == ""
    assert fit.alpha == pytest.approx(alpha, rel=0.05)
    by_hand = 1 + len(x) / np.log(x / 0.3).sum()  # Clauset et al. eq. (3.1)
    assert fit.alpha == pytest.approx(by_hand, rel=1e-12)
    assert fit.alpha_stderr == pytest.approx((by_hand - 1) / math.sqrt(2000), rel=1e-12)


@pytest.mark.parametrize("alpha", [1.5, 2.5, 4.0])
def test_ks_search_recovers_alpha_of_a_pure_power_law(alpha):
    # seed 0: relative errors 0.14 %, 0.25 %, 0.31 % for alpha 1.5, 2.5, 4 (2940 tail points)
    fit = fit_power_law(pareto(3000, alpha, x_min=1.0, seed=0))
    assert fit.n_tail >= 2000
    assert fit.alpha == pytest.approx(alpha, rel=0.05), fit
    assert fit.x_min >= 1.0  # a pure power law: no point lies below the true x_min


def test_ks_distance_by_hand_on_a_three_point_tail():
    # tail 1, 2, 4 at x_min = 1: alpha = 1 + 3 / ln 8; P(x) = 1 - x^(1 - alpha)
    fit = fit_power_law([1.0, 2.0, 4.0], min_tail=3, x_min=1.0)
    alpha = 1 + 3 / math.log(8)
    P = [1 - x ** (1 - alpha) for x in (1.0, 2.0, 4.0)]
    steps = [(0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1)]  # S just below and at each point
    D = max(max(abs(p - lo), abs(p - hi)) for p, (lo, hi) in zip(P, steps, strict=True))
    assert fit.alpha == pytest.approx(alpha, rel=1e-12)
    assert fit.ks_distance == pytest.approx(D, rel=1e-12)


def test_ks_chooses_the_start_of_a_hand_built_tail():
    # body: 2000 points at the quantiles of uniform[0.2, 0.95); tail: 3000 points at the
    # quantiles of a power law with alpha = 2.5 above 1 (no randomness). The KS choice must be
    # the first tail point, alpha within 1 %, and D = 1 / n (P(x_min) = 0, S jumps to 1 / n).
    body = 0.2 + 0.75 * (np.arange(2000) + 0.5) / 2000
    q = (np.arange(3000) + 0.5) / 3000
    tail = (1.0 - q) ** (-1.0 / 1.5)
    fit = fit_power_law(np.concatenate([body, tail]))
    assert fit.x_min == tail.min()
    assert fit.n_tail == 3000
    assert fit.alpha == pytest.approx(2.5, rel=0.01)
    assert fit.ks_distance == pytest.approx(1 / 3000, rel=1e-3)  # the jump of S at x_min


def test_ks_choice_on_a_random_body_and_tail():
    # random draws: uniform body on [0.5, 1) (3000), power-law tail above 1 (2000, alpha 2.5).
    # Over seeds 0-9 (tail seed + 100) the chosen x_min was measured in [0.994, 1.39] (a body
    # point just below 1 costs the fit little) and alpha within 3.1 %.
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0.5, 1.0, 3000), pareto(2000, 2.5, 1.0, seed=100)])
    fit = fit_power_law(x)
    assert 0.95 <= fit.x_min <= 1.5, fit
    assert fit.alpha == pytest.approx(2.5, rel=0.05), fit


def test_fit_edge_cases_and_bad_input():
    assert fit_power_law(np.arange(1.0, 6.0)).reason == "too few positive values (5 < min_tail=10)"
    flat = fit_power_law(np.ones(20))
    assert flat.reason == "all values equal: no tail to fit" and math.isnan(flat.alpha)
    with_zeros = fit_power_law(np.concatenate([np.zeros(50), pareto(200, 3.0, 1.0, 0)]))
    assert with_zeros == fit_power_law(pareto(200, 3.0, 1.0, 0))  # zeros are dropped
    with pytest.raises(ValueError, match=r"^x must be finite \(got NaN or inf\)$"):
        fit_power_law([1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match=r"^min_tail must be an integer >= 2 \(got 1\)$"):
        fit_power_law([1.0, 2.0], min_tail=1)
    with pytest.raises(ValueError, match=r"^x_min must be > 0 or None \(got 0.0\)$"):
        fit_power_law([1.0, 2.0], x_min=0.0)


# -- the ESD of a matrix ---------------------------------------------------------------------
def planted(N: int, M: int, eigenvalues: np.ndarray, seed: int) -> np.ndarray:
    """W = U diag(s) V^T with s = sqrt(N * eigenvalues): the ESD of W is ``eigenvalues``."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(N, M, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(M, M, generator=g, dtype=torch.float64))
    return ((U * torch.from_numpy(np.sqrt(N * eigenvalues))) @ V.T).numpy()


def test_planted_power_law_eigenvalues_are_recovered():
    eigenvalues = pareto(500, 3.0, x_min=0.5, seed=2)
    W = planted(700, 500, eigenvalues, seed=3)
    assert_close(esd_eigenvalues(W), np.sort(eigenvalues), rtol=1e-9, atol=0)
    row = weight_esd({"planted": W.T}).iloc[0]  # [500, 700]: the same spectrum
    assert row["shape"] == (500, 700) and row["n_eigenvalues"] == 500 and row["rank"] == 500
    assert abs(row["alpha"] - 3.0) < 4 * row["alpha_stderr"], row
    assert row["x_min"] >= 0.5 * (1 - 1e-9)


def test_heavy_tailed_entries_give_alpha_one_plus_mu_over_two():
    # symmetric entries with P(|w| > x) = x^-1 (mu = 1): alpha -> 1 + mu / 2 = 1.5
    rng = np.random.default_rng(0)
    W = rng.choice([-1.0, 1.0], (600, 300)) * (1.0 - rng.random((600, 300))) ** -1.0
    fit = fit_power_law(esd_eigenvalues(W))
    assert fit.alpha == pytest.approx(1.5, rel=0.10), fit


matrices = st.tuples(
    st.integers(1, 12), st.integers(1, 12), st.integers(0, 12), st.integers(0, 2**32 - 1)
)


@FAST
@given(matrices, st.integers(-60, 60))
def test_esd_matches_dense_and_is_scale_invariant(spec, power):
    N, M, rank, seed = spec
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((N, rank)) @ rng.standard_normal((rank, M))  # rank-deficient often
    expected = dense_esd(W)
    eigenvalues = esd_eigenvalues(W)
    assert eigenvalues.shape == (min(N, M),)
    assert_close(eigenvalues, expected, rtol=0, atol=1e-9 * max(expected.max(), 1e-300))
    row = weight_esd({"W": W}, min_tail=3).iloc[0]
    assert row["rank"] == np.linalg.matrix_rank(W)
    if row["reason"]:
        assert math.isnan(row["alpha"]) and row["n_tail"] == 0
    else:
        assert row["alpha"] > 1 and 0 <= row["ks_distance"] <= 1
        assert 3 <= row["n_tail"] <= row["rank"]
    scaled = weight_esd({"W": W * 2.0**power}, min_tail=3).iloc[0]  # exact: a power of two
    assert scaled["reason"] == row["reason"] and scaled["n_tail"] == row["n_tail"]
    for column in ("alpha", "ks_distance"):
        assert scaled[column] == pytest.approx(row[column], rel=1e-9, nan_ok=True)
    assert scaled["x_min"] == pytest.approx(row["x_min"] * 4.0**power, rel=1e-9, nan_ok=True)


@pytest.mark.parametrize(
    "W, reason",
    [
        (np.zeros((6, 4)), "zero matrix"),
        (np.ones((3, 5)), "too few positive values (1 < min_tail=10)"),  # rank 1
        (np.eye(12), "all values equal: no tail to fit"),  # orthogonal
        (np.full((12, 12), 1e200) * np.eye(12)[::-1], "eigenvalues overflow float64"),
    ],
    ids=["zero", "rank-1", "orthogonal", "overflow"],
)
def test_edge_cases_give_nan_and_a_reason(W, reason):
    row = weight_esd({"layer": W}).iloc[0]
    assert row["reason"] == reason and math.isnan(row["alpha"])


def test_huge_entries_fit_like_the_unscaled_matrix():
    W = np.random.default_rng(0).standard_normal((40, 30))
    small, huge = weight_esd({"W": W}).iloc[0], weight_esd({"W": W * 1e30}).iloc[0]
    assert huge["alpha"] == pytest.approx(small["alpha"], rel=1e-9)
    assert huge["lambda_max"] == pytest.approx(small["lambda_max"] * 1e60, rel=1e-9)


def test_bad_matrices_are_one_line_errors_naming_the_layer():
    W = torch.randn(4, 5)
    W[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"^blocks\.0\.W_in: W must be finite \(got NaN or inf\)$"):
        weight_esd({"W_E": torch.randn(3, 3), "blocks.0.W_in": W})
    with pytest.raises(ValueError, match=r"^b_O: a weight matrix needs 2 or more dims"):
        weight_esd({"b_O": torch.randn(5)})
    model = nn.Linear(3, 4)
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^weight: W must be finite"):
        weight_esd(model)
    with pytest.raises(ValueError, match=r"^min_tail must be an integer >= 2"):
        weight_esd(model, min_tail=0)


# -- the matrices of a model -----------------------------------------------------------------
def test_gpt2_matrices_are_its_stored_weights():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=15, n_head=3, vocab_size=11, n_positions=7)
    model = GPT2LMHeadModel(config)
    table = weight_esd(model)
    assert list(table.columns) == list(ESD_COLUMNS)
    names = list(table["name"])
    assert names[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]  # lm_head: tied
    assert names[2:8] == [
        "transformer.h.0.attn.W_Q",
        "transformer.h.0.attn.W_K",
        "transformer.h.0.attn.W_V",
        "transformer.h.0.attn.W_O",
        "transformer.h.0.mlp.c_fc.weight",
        "transformer.h.0.mlp.c_proj.weight",
    ]
    assert len(names) == 2 + 2 * 6
    attn = model.transformer.h[1].attn
    c_attn = attn.c_attn.weight.detach().numpy()  # Conv1D [d_model, 3 d_model]: Q | K | V
    matrices = esd_matrices(model)
    for k, field in enumerate(("W_Q", "W_K", "W_V")):
        stored = c_attn[:, 15 * k : 15 * (k + 1)]
        assert_close(matrices[f"transformer.h.1.attn.{field}"].numpy(), stored, rtol=0, atol=0)
        assert_close(esd_eigenvalues(stored), dense_esd(stored), rtol=1e-9, atol=1e-12)
    W_O = attn.c_proj.weight.detach().numpy()
    assert_close(matrices["transformer.h.1.attn.W_O"].numpy(), W_O, rtol=0, atol=0)
    row = table[table["name"] == "transformer.h.1.attn.W_O"].iloc[0]
    assert row["lambda_max"] == pytest.approx(dense_esd(W_O).max(), rel=1e-9)


def test_llama_grouped_kv_heads_count_once():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=1, hidden_size=20, num_attention_heads=4, num_key_value_heads=2,
        head_dim=6, intermediate_size=13, vocab_size=11, max_position_embeddings=7,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    matrices = esd_matrices(model)
    attention = model.model.layers[0].self_attn
    for field, proj in (("W_Q", attention.q_proj), ("W_K", attention.k_proj)):
        W = matrices[f"model.layers.0.self_attn.{field}"]
        assert_close(W, proj.weight.detach().T, rtol=0, atol=0)  # nn.Linear is [out, in]
    assert matrices["model.layers.0.self_attn.W_K"].shape == (20, 12)  # 2 K heads of 6


def test_conv_kernel_is_out_by_in_times_kernel():
    model = nn.Sequential(nn.Conv2d(3, 5, (2, 3)), nn.Flatten(), nn.Linear(8, 2))
    table = weight_esd(model, min_tail=3)
    assert list(table["name"]) == ["0.weight", "2.weight"]  # biases skipped
    assert table["shape"].iloc[0] == (5, 18)
    kernel = model[0].weight.detach().numpy().reshape(5, 18)
    assert table["lambda_max"].iloc[0] == pytest.approx(dense_esd(kernel).max(), rel=1e-9)


def test_dynascope_transformer_every_matrix_once():
    from dynascope.nn import Transformer

    model = Transformer(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7, d_mlp=20)
    table = weight_esd(model)
    for layer in (0, 1):
        for field in ("W_Q", "W_K", "W_V", "W_O"):
            row = table[table["name"] == f"blocks.{layer}.attn.{field}"].iloc[0]
            assert row["shape"] == (12, 12)  # n_heads d_head = d_model here
    parameters = {n for n, p in model.named_parameters() if p.ndim >= 2}
    assert set(table["name"]) == parameters  # dynascope stores W_Q ... under these names
    assert isinstance(table, pd.DataFrame) and table["name"].is_unique


def test_the_docs_page_esd_snippet_runs_as_written(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "inspect.md").read_text()
    section = text.split("## Heavy-tailed spectra", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "docs/inspect.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "transformer.h.0.attn.W_Q" in printed and "ks_distance" in printed
    assert (tmp_path / "esd.png").stat().st_size > 10_000
