"""Metric keys: parse_key splits layer, head and metric; metric_path groups them with '/'.

Oracle: hand-written tables of dynascope's own keys (every family the probes emit), and the
round trip key = f"L{l}.H{h}.{metric}" -> (l, h, metric) for generated parts.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynascope.keys import KeyParts, metric_path, parse_key

_TABLE = [  # key, parse_key(key), metric_path(key)
    ("L0.H3.qk.effective_rank", (0, 3, "qk.effective_rank"), "attn/L0/H3/qk_effective_rank"),
    ("L12.H0.ov.rank_1e-2", (12, 0, "ov.rank_1e-2"), "attn/L12/H0/ov_rank_1e-2"),
    ("L1.H2.dqk.stable_rank", (1, 2, "dqk.stable_rank"), "attn/L1/H2/dqk_stable_rank"),
    ("L1.attn.mean.entropy", (1, None, "attn.mean.entropy"), "attn/L1/attn_mean_entropy"),
    ("L0.dov.std.stable_rank", (0, None, "dov.std.stable_rank"), "attn/L0/dov_std_stable_rank"),
    (
        "qk.mean.effective_rank",
        (None, None, "qk.mean.effective_rank"),
        "attn/qk_mean_effective_rank",
    ),
    ("attn.collapsed_heads", (None, None, "attn.collapsed_heads"), "attn/attn_collapsed_heads"),
    ("qk.singular_values", (None, None, "qk.singular_values"), "attn/qk_singular_values"),
    ("param_norm.L0", (0, None, "param_norm"), "param_norm/L0"),
    ("update_norm.relative.L1", (1, None, "update_norm.relative"), "update_norm/relative.L1"),
    ("norm.blocks.0.attn.W_Q", (None, None, "norm.blocks.0.attn.W_Q"), "norm/blocks.0.attn.W_Q"),
    ("train.loss", (None, None, "train.loss"), "train/loss"),
    ("sharpness.lambda_max", (None, None, "sharpness.lambda_max"), "sharpness/lambda_max"),
    ("H3.x", (None, None, "H3.x"), "H3/x"),  # a head needs a layer before it
    ("loss", (None, None, "loss"), "loss"),
]


@pytest.mark.parametrize(("key", "parts", "path"), _TABLE)
def test_table_of_dynascope_keys(key, parts, path):
    assert parse_key(key) == KeyParts(*parts)
    assert metric_path(key) == path


_component = st.from_regex(r"[a-z][a-z_0-9]{0,8}", fullmatch=True)


@given(
    layer=st.integers(0, 999),
    head=st.integers(0, 999),
    metric=st.lists(_component, min_size=1, max_size=4).map(".".join),
)
def test_layer_head_metric_round_trip(layer, head, metric):
    key = f"L{layer}.H{head}.{metric}"
    assert parse_key(key) == (layer, head, metric)
    assert metric_path(key) == f"attn/L{layer}/H{head}/{metric.replace('.', '_')}"


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_key_is_refused(bad):
    with pytest.raises(ValueError, match="key must be a non-empty string"):
        parse_key(bad)


def test_with_head_index_renames_the_old_head_column_with_a_warning():
    import warnings

    import pandas as pd

    from dynascope.keys import HEAD_COLUMN, with_head_index

    old = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "qk_effective_rank": [1.5, 2.0]})
    with pytest.warns(DeprecationWarning, match=r"^column 'head' is now 'head_index'"):
        renamed = with_head_index(old)
    assert list(renamed.columns) == ["layer", HEAD_COLUMN, "qk_effective_rank"]
    assert renamed[HEAD_COLUMN].tolist() == [0, 1] and "head" in old.columns  # a copy
    new = old.rename(columns={"head": "head_index"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert with_head_index(new) is new  # the current name: untouched, no warning
