"""``figure_problems``: hand-built figures with and without labels and legends, and the figures
this package draws itself (``dynascope inspect``, a run report, weight-decay-low-rank's
``a_singular_values.png``) held to it."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dynascope.report.figures import add_colorbar, figure_problems, new_figure  # noqa: E402


def test_unlabelled_axes_and_unexplained_colours_are_found():
    fig, (a, b) = new_figure(2)
    a.plot([0, 1], [0, 1])
    a.plot([0, 1], [1, 0])
    b.plot([0, 1], [0, 1], label="one")
    b.set(xlabel="step", ylabel="loss")
    b.legend()
    assert figure_problems(fig) == [
        "panel 0 (''): no x label",
        "panel 0 (''): no y label",
        "panel 0 (''): 2 colours and no legend",
    ]
    a.set(xlabel="x", ylabel="y")
    b.plot([0, 1], [0.5, 0.5], color="0.5", ls=":")  # a grey guide carries no category
    assert figure_problems(fig) == ["panel 0 (''): 2 colours and no legend"]
    a.lines[1].set_label("two")
    fig.legend(handles=[a.lines[1]])  # with b's legend, every colour of a is explained
    assert figure_problems(fig) == []
    plt.close(fig)


def test_shared_and_category_axes_count_as_labelled():
    fig, (a, b) = new_figure(2)
    b.sharey(a)
    a.plot([0, 1], [0, 1])
    b.plot([0, 1], [1, 0])
    a.set(xlabel="step", ylabel="loss")
    b.set(xlabel="step")  # y label on the shared axis of the left panel
    assert figure_problems(fig) == []
    c_fig, (c,) = new_figure()
    c.bar(["uniform", "decoupled"], [1.0, 2.0])
    c.bar([3, 4], [1.0, 2.0])
    c.set_xticks([0, 1, 3, 4], ["uniform", "decoupled", "a", "b"])  # names on fixed ticks
    c.set(ylabel="rank")
    assert figure_problems(c_fig) == []  # categories named on the ticks
    plt.close(fig)
    plt.close(c_fig)


def test_colour_bars_hidden_and_empty_panels_are_skipped():
    fig, (a, b, c) = new_figure(3)
    image = a.imshow(np.eye(3))
    a.set(xlabel="head", ylabel="layer")
    fig.colorbar(image, ax=a)  # its own axes: no labels required
    c.set_visible(False)
    assert figure_problems(fig) == []  # b is empty
    plt.close(fig)


def test_colour_bar_ticks_are_plain_values_not_an_offset():
    """Entropies 3.8770-3.8778 nats (a narrow range, as on a near-uniform attention): the default
    colour bar labels the ticks 0.0000-0.0008 under "+3.877"; add_colorbar labels them 3.8770,
    ..., 3.8778, with no offset text, and figure_problems tells the two apart."""
    values = np.linspace(3.8770, 3.8778, 6).reshape(2, 3)
    fig, (default, plain) = new_figure(2)
    for ax in (default, plain):
        ax.set(xlabel="head", ylabel="layer")
    fig.colorbar(default.imshow(values), ax=default, label="entropy")
    bar = add_colorbar(fig, plain.imshow(values), plain, "entropy (nats)")
    assert figure_problems(fig) == ["panel 2 (colour bar 'entropy'): ticks offset by '+3.877'"]
    fig.canvas.draw()
    assert bar.ax.yaxis.get_offset_text().get_text() == ""
    ticks = [(t.get_position()[1], t.get_text()) for t in bar.ax.get_yticklabels()]
    assert len(ticks) >= 3
    for position, label in ticks:  # each label reads as its own tick value, to 1e-4
        assert float(label) == pytest.approx(position, abs=1e-4) and 3.877 <= float(label) <= 3.8778
    plt.close(fig)


def test_inspect_colour_bars_have_no_offset_on_a_narrow_range(monkeypatch, tmp_path):
    from dynascope.report.inspect import inspect_figures

    found = _check_saved(monkeypatch)
    rows = [
        {"layer": layer, "module": f"L{layer}", "head_index": head,
         "qk_effective_rank": 2.0001 + head / 1e4,
         "ov_effective_rank": 2.0, "attention_entropy": 3.8770 + (3 * layer + head) / 1e4}
        for layer in range(2) for head in range(3)
    ]  # fmt: skip
    inspect_figures(pd.DataFrame(rows), tmp_path)
    assert found == {"heads.tmp.png": []}


def _check_saved(monkeypatch):
    found = {}
    savefig = Figure.savefig

    def checked(self, fname, *args, **kwargs):
        found[Path(fname).name] = figure_problems(self)
        return savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked)
    return found


def test_inspect_figures_have_no_problems(monkeypatch, tmp_path):
    from dynascope.report.inspect import inspect_figures

    found = _check_saved(monkeypatch)
    rows = []
    for step in (1, 10):
        for layer in range(2):
            for head in range(3):
                rows.append(
                    {"step": step, "layer": layer, "module": f"L{layer}", "head_index": head,
                     "qk_effective_rank": 1.0 + head, "ov_effective_rank": 2.0,
                     "attention_entropy": 0.5 * layer}
                )  # fmt: skip
    inspect_figures(pd.DataFrame(rows), tmp_path)
    assert found == {"heads.tmp.png": [], "over_steps.tmp.png": []}


def test_weight_decay_singular_values_figure_has_no_problems(monkeypatch, tmp_path):
    from dynascope.studies.weight_decay_low_rank.figures import toy_figures as _toy_figures

    found = _check_saved(monkeypatch)
    T, n, k = 6, 3, 5
    rng = np.random.default_rng(0)
    d = np.linspace(0.2, 1.0, k)
    lambdas = np.array([0.0, 0.4, 1.0])
    sigma = np.sort(rng.random((T, n, k)), axis=-1)[..., ::-1]
    lam_cat = np.repeat(lambdas, 2)
    sig_cat = np.sort(rng.random((6, k)), axis=-1)[:, ::-1]
    bal, gap, l2 = rng.random((T, n)), rng.random((T, n)), 1 + rng.random((T, n))
    _toy_figures(lambdas, bal, gap, l2, sigma, lam_cat, sig_cat, d, 0.5, 0.1, tmp_path)
    assert found == {"a_balance_gap.tmp.png": [], "a_singular_values.tmp.png": []}


def test_run_report_figures_have_no_problems(monkeypatch, tmp_path):
    from dynascope.report.run import report_run
    from dynascope.store import RunStore

    with RunStore(tmp_path / "run") as store:
        for step in (0, 1, 3, 7):
            store.log(step, {"train.loss": 2.0 / (step + 1), "val.loss": 2.5 / (step + 1)})
            store.log(step, {f"{p}.mean.effective_rank": 3.0 - step / 10 for p in ("qk", "ov")})
            store.log(step, {"qk.mean.rank_1e-2": 4.0, "attn.mean.entropy": 1.0})
    found = _check_saved(monkeypatch)
    report_run(tmp_path / "run")
    assert found == {"loss.tmp.png": [], "probes.tmp.png": []}


def test_note_below_axis_marks_only_points_under_the_lower_limit():
    """Hand-built panels: a point at -2 under ylim (-0.5, 1) gets the note; points at -0.5 (on
    the limit), NaN and -inf (not finite) do not."""
    from dynascope.report import note_below_axis

    fig, (below, on_limit) = new_figure(2)
    below.plot([0, 1, 2], [-2.0, 0.2, 0.5])
    on_limit.plot([0, 1, 2, 3], [-0.5, float("nan"), float("-inf"), 0.9])
    for ax in (below, on_limit):
        ax.set_ylim(-0.5, 1.0)
    assert note_below_axis(below, "step 0") is True
    assert [t.get_text() for t in below.texts] == ["step 0: below -0.5, off the axis"]
    assert note_below_axis(on_limit) is False
    assert len(on_limit.texts) == 0
    plt.close(fig)
