"""Figures drawn from the real H200 records: every T of a sweep shown, nothing cut off."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from audit.render import figures  # noqa: E402
from audit.render.build import build_report  # noqa: E402
from audit.render.data import representative_slice  # noqa: E402
from audit.render.plotting import overflowing_artists  # noqa: E402
from tests.helpers import h200_run  # noqa: E402

H200_FOLDERS = ("full", "gc", "stab", "comp")


def _build_checked(run_dir: Path, monkeypatch) -> dict[str, tuple[list[str], list]]:
    """build_report with every figure checked before it is saved: {file: (overflows, axes x data)}."""
    seen: dict[str, tuple[list[str], list]] = {}
    save = figures.save_figure

    def checked(fig, path):
        xs = [sorted({float(x) for line in ax.lines for x in line.get_xdata()}) for ax in fig.axes]
        seen[Path(path).name] = (overflowing_artists(fig), xs)
        save(fig, path)

    monkeypatch.setattr(figures, "save_figure", checked)   # every PNG is saved there ...
    monkeypatch.setattr(figures, "FIGURE_PROCESSES", 1)    # ... by this process, where `seen` is
    build_report(run_dir)
    return seen


@pytest.fixture(scope="module")
def h200_built(tmp_path_factory):
    """The checked build of a stored H200 run, once per module: (run folder, what _build_checked saw)."""
    built: dict[str, tuple[Path, dict]] = {}

    def get(name: str) -> tuple[Path, dict]:
        if name not in built:
            run_dir = h200_run(name, tmp_path_factory.mktemp(name))
            with pytest.MonkeyPatch.context() as monkeypatch:
                built[name] = (run_dir, _build_checked(run_dir, monkeypatch))
        return built[name]
    return get


@pytest.mark.parametrize("name", H200_FOLDERS)
def test_no_figure_reaches_outside_its_canvas(name, h200_built):
    _, seen = h200_built(name)
    assert seen, "no figure drawn"
    assert {f: over for f, (over, _) in seen.items() if over} == {}


def test_latency_shows_every_seq_len_of_a_constant_token_sweep(h200_built):
    """The gpu preset sweeps T 512-16384 at 16384 tokens per cell (B = 16384 / T)."""
    run_dir, seen = h200_built("full")
    for figure in ("latency_fwd.png", "latency_fwd_bwd.png"):
        _, xs = seen[figure]
        assert xs and all(x == [512.0, 2048.0, 8192.0, 16384.0] for x in xs if x), (figure, xs)
    text = (run_dir / "index.md").read_text()
    assert "16384 tokens (B·T)" in text


def test_fixed_batch_sweeps_keep_the_batch():
    import pandas as pd

    rows = pd.DataFrame({"device": "cpu", "batch": [1, 1, 1, 4], "heads": 2, "causal": False,
                         "scenario": "normal", "seq_len": [128, 512, 2048, 128]})
    chosen, label = representative_slice(rows)
    assert list(chosen["seq_len"]) == [128, 512, 2048]
    assert "B1" in label


def test_a_line_figure_needs_two_sequence_lengths():
    """One length gives dots, not lines (the speed tables hold those numbers): no figure; two give one."""
    import pandas as pd

    from audit.render.plotting import line_panels
    rows = pd.DataFrame({"variant": ["eager", "sdpa"], "seq_len": [128, 128], "fwd_ms": [1.0, 0.5]})
    assert line_panels(rows, y="fwd_ms", ylabel="ms", title="t", colors={}) is None
    two = pd.concat([rows, rows.assign(seq_len=256, fwd_ms=[4.0, 2.0])])
    fig = line_panels(two, y="fwd_ms", ylabel="ms", title="t", colors={})
    assert fig is not None and [len(line.get_xdata()) for line in fig.axes[0].lines] == [2, 2]
    plt.close(fig)


def test_overflow_check_catches_a_cut_off_title_and_legend():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [1, 2], label="a label far too long to fit in a three-inch figure, in one line")
    fig.suptitle("a title far too long to fit in a three-inch-wide figure, drawn cut off at both ends")
    fig.legend(loc="lower center", ncol=1)
    problems = overflowing_artists(fig)
    plt.close(fig)
    assert any("title far too long" in p for p in problems)
    assert any(p.startswith("Legend") for p in problems)


def test_overflow_check_passes_a_figure_that_fits():
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.plot([1, 2], [1, 2], label="short")
    ax.set_title("fits")
    fig.legend(loc="outside lower center")
    assert overflowing_artists(fig) == []
    plt.close(fig)


def test_no_figure_of_a_cpu_run_reaches_outside_its_canvas(tmp_path, monkeypatch):
    from tests.test_report import _write_run

    seen = _build_checked(_write_run(tmp_path), monkeypatch)
    assert len(seen) >= 6
    assert {f: over for f, (over, _) in seen.items() if over} == {}


def test_the_saturation_figure_of_a_run_of_every_scenario_draws_lines_only(tmp_path):
    """The stored cpu-preset run of 2026-12-05: its stability cells measure 25 scenarios at one head dim,
    each a dot and a legend entry per dtype (57), whose legend collapsed the axes. Lines need two head
    dims: normal's (32, 64, 128) in its three dtypes."""
    import warnings

    from audit.core.records import load
    from tests.helpers import cpu_run
    frame = load(cpu_run("2026-12-05/cpu", tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # "constrained_layout not applied ...": an error here
        fig, _ = figures._draw_saturation(frame, figures.variant_colors(frame["variant"].astype(str)))
        fig.canvas.draw()
    assert sorted(line.get_label() for line in fig.axes[0].lines) == ["normal bf16", "normal fp16", "normal fp32"]
    assert overflowing_artists(fig) == []
    plt.close(fig)
    one_head_dim = frame[frame["scenario"] != "normal"]
    assert figures._draw_saturation(one_head_dim, {}) is None


def test_many_variants_get_a_row_of_bars_each_at_a_fixed_width():
    """The cpu preset's 50 variants (controls included) drew a 55-inch-wide strip of bars; above
    HORIZONTAL_BARS_FROM variants the bars lie in rows, the figure 10 inches wide, every label inside."""
    import pandas as pd

    from audit.render.plotting import HORIZONTAL_BARS_FROM, grouped_bars
    for n in (HORIZONTAL_BARS_FROM, HORIZONTAL_BARS_FROM + 1, 50):
        table = pd.DataFrame({"fp32": [10.0 ** (i % 6) for i in range(n)], "bf16": [float(i) for i in range(n)]},
                             index=[f"broken.variant_with_a_long_name_{i}" for i in range(n)])
        fig = grouped_bars(table, ylabel="count", title="t", yscale="symlog", label_counts=True)
        width, height = fig.get_size_inches()
        horizontal = n > HORIZONTAL_BARS_FROM
        assert (width == 10.0 and height > 6) if horizontal else width == 1.1 * n + 2, (n, width, height)
        labels = [t.get_text() for t in (fig.axes[0].get_yticklabels() if horizontal else fig.axes[0].get_xticklabels())]
        assert labels == list(table.index)
        assert overflowing_artists(fig) == []
        plt.close(fig)


def test_memory_and_throughput_show_the_largest_head_dim_measured_at_two_lengths(tmp_path):
    """The stored cpu-preset run of 2026-12-05: its d_k sweep (72, 96, 192) runs at T 128 alone, so the
    largest head dim, 192, has one length (a figure of dots, and since lines need two, none); 128 has three."""
    import pandas as pd

    from audit.core.records import load
    from tests.helpers import cpu_run
    frame = load(cpu_run("2026-12-05/cpu", tmp_path))
    colors = figures.variant_colors(frame["variant"].astype(str))
    for draw in (figures._draw_memory, figures._draw_throughput):
        fig, caption = draw(frame, colors)
        assert "d_k=128" in caption and max(len(line.get_xdata()) for line in fig.axes[0].lines) == 3, caption
        plt.close(fig)
    one_length = pd.DataFrame({"d_k": [64, 192], "seq_len": [128, 128]})
    assert figures._line_d_k(one_length) == 192                       # none at two lengths: the largest
