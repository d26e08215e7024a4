"""The sweep report's figures from plain CellResults (what report/ is given): the latency axis is log
and at the true values, every cell has its interval and every repeat its dot, the legend names store
and client, only plots the data supports are drawn, and the figures are written as PNG and PDF."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import stallscope
from stallscope.sweep.figures import CellResult, Cell, RunFigures
from stallscope.sweep.interval import t_interval

pytest.importorskip("matplotlib")


def run(repeat: int, ips: float, share: float, client: str) -> RunFigures:
    return RunFigures(repeat=repeat, run_dir=f"cells/x/repeat-{repeat}", images_per_second=ips,
                      step_time_ms=4000 / ips, input_wait_ms=share * 4000 / ips, compute_ms=(1 - share) * 4000 / ips,
                      input_share=share, verdict="highly", measured_steps=10, batch_size=4, slowest_stage="Map",
                      bottleneck="Map", final_loss=None, client=client, requests_per_image=None, bytes_per_image=None)


def cell_result(store: str, latency: str, ips: list[float], share: list[float], *, accelerator="emulated:500",
                client="TF gs://") -> CellResult:
    cell = Cell(format="files", store=store, latency=latency, pipeline="seed", accelerator=accelerator,
                learning_rate=1e-4)
    runs = tuple(run(i + 1, v, s, client) for i, (v, s) in enumerate(zip(ips, share)))
    return CellResult(cell=cell, repeats_asked=len(runs), runs=runs, images_per_second=sorted(ips)[len(ips) // 2],
                      images_per_second_interval=t_interval(ips, floor=0.0), step_time_ms=10.0, input_wait_ms=9.0,
                      compute_ms=1.0, input_share=sorted(share)[len(share) // 2],
                      input_share_interval=t_interval(share, floor=0.0, ceiling=1.0), verdict="highly",
                      bottleneck="Map", device_images_per_second=float(accelerator.split(":")[1]), final_loss=None,
                      client=client, requests_per_image=None, bytes_per_image=None)


SWEPT = [cell_result("local", "local", [480, 500, 520], [0.10, 0.12, 0.11], client="TF local files"),
         cell_result("gcs", "0ms", [300, 310, 320], [0.4, 0.42, 0.41]),
         cell_result("gcs", "10ms", [28, 30, 31], [0.9, 0.92, 0.91]),
         cell_result("gcs", "30ms", [11, 12, 12.5], [0.97, 0.96, 0.98])]


def test_latency_axis_is_log_at_the_true_values_with_local_disk_apart():
    from stallscope.report.drawing import pyplot
    from stallscope.report.sweep_plots import throughput_vs_latency

    drawn = throughput_vs_latency(SWEPT)
    ax = drawn.fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log", "500 and 11 images/s on one axis"
    ticks = dict(zip(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()]))
    assert ticks[10.0] == "10 ms" and ticks[30.0] == "30 ms"
    assert ticks[1.0] == "0 ms" and ticks[0.25] == "local\ndisk", ticks  # stand-ins below 10 ms, labelled
    assert "local disk is drawn at 0.25 ms" in drawn.caption and "a log axis has no 0" in drawn.caption
    pyplot().close(drawn.fig)


def test_every_cell_has_its_interval_and_every_repeat_a_dot():
    from matplotlib.container import ErrorbarContainer

    from stallscope.report.drawing import pyplot
    from stallscope.report.sweep_plots import throughput_vs_latency

    drawn = throughput_vs_latency(SWEPT)
    ax = drawn.fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == len(SWEPT)
    segments = sorted((seg[0][1], seg[1][1]) for bar in bars for seg in bar.lines[2][0].get_segments())
    assert segments[0] == pytest.approx((SWEPT[3].images_per_second_interval.low,
                                         SWEPT[3].images_per_second_interval.high))
    dots = sum(len(c.get_offsets()) for c in ax.collections if c.get_offsets().size and c not in
               [line for bar in bars for line in bar.lines[2]])
    assert dots == sum(r.repeats for r in SWEPT)
    legend = [t.get_text() for t in drawn.fig.axes[0].get_legend().get_texts()]
    assert legend == ["files / seed on gs:// via TF gs://", "files / seed on local disk via TF local files"], legend
    pyplot().close(drawn.fig)


def test_one_accelerator_speed_draws_no_speed_plot_and_two_draw_the_knee():
    from stallscope.report.sweep_plots import plots_supported

    assert plots_supported(SWEPT) == ["throughput_vs_latency", "input_share_vs_latency"]
    two = SWEPT + [cell_result("gcs", "10ms", [30, 31], [0.5, 0.52], accelerator="emulated:50")]
    assert plots_supported(two) == ["throughput_vs_latency", "input_share_vs_speed"]
    assert plots_supported([]) == []


def test_figures_are_written_as_png_and_pdf_beside_the_report(tmp_path):
    from stallscope.report.sweep import write_sweep_report

    page = write_sweep_report(tmp_path, SWEPT, repeats=3, steps=20, command="stallscope sweep ...", notes=[])
    for name in ("throughput_vs_latency", "input_share_vs_latency"):
        assert (tmp_path / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / "figures" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
    text = page.read_text(encoding="utf-8")
    assert "figures/throughput_vs_latency.pdf" in text
    interval = SWEPT[2].images_per_second_interval
    assert f"{interval.low:,.1f} to {interval.high:,.1f}" in text, "the table shows each cell's interval"


def test_the_report_renders_without_the_workload():
    """report/sweep.py renders what it is given: importing it loads no workload (nor TensorFlow)."""
    code = ("import sys, stallscope.report.sweep\n"
            "print(sorted(m for m in sys.modules if m.startswith(('stallscope.workload', 'tensorflow'))))")
    env = dict(os.environ, PYTHONPATH=str(Path(stallscope.__file__).parents[1]))
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]"


def formats_cell(fmt: str, store: str, latency: str, ips: list[float]) -> CellResult:
    result = cell_result(store, latency, ips, [0.5] * len(ips), client="TF local files" if store == "local" else "TF gs://")
    import dataclasses

    return dataclasses.replace(result, cell=dataclasses.replace(result.cell, format=fmt))


# The seeds' question on two stores: files and records, local disk and gs:// and s3:// at 10 and 30 ms
FORMATS = [formats_cell(fmt, store, latency, [v * k for k in (0.98, 1.0, 1.02)])
           for fmt, store, latency, v in (
               ("files", "local", "local", 500), ("records", "local", "local", 600),
               ("files", "gcs", "10ms", 30), ("records", "gcs", "10ms", 400),
               ("files", "gcs", "30ms", 11), ("records", "gcs", "30ms", 300),
               ("files", "s3", "10ms", 90), ("records", "s3", "10ms", 450))]


def test_a_panel_per_store_on_the_same_axes_with_local_disk_in_each():
    """16 series in one panel were told apart only by marker: a panel per store that adds latency, the
    same axes in each, local disk's cells the left point of every panel."""
    from stallscope.report.drawing import pyplot
    from stallscope.report.sweep_plots import throughput_vs_latency

    drawn = throughput_vs_latency(FORMATS)
    axes = [ax for ax in drawn.fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["gs://", "s3://"]
    assert axes[0].get_ylim() == axes[1].get_ylim() and axes[0].get_xlim() == axes[1].get_xlim()
    for ax, store in zip(axes, ("gs://", "s3://")):
        labels = {line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")}
        assert labels == {f"{f} / seed on {store} via TF gs://" for f in ("files", "records")} | {
            f"{f} / seed on local disk via TF local files" for f in ("files", "records")}, labels
    assert "a panel per store, on the same axes" in drawn.caption
    legend = [t.get_text() for t in drawn.fig.axes[-1].get_legend().get_texts()]
    assert len(legend) == 6 and len(set(legend)) == 6, "one legend of every panel's series"
    pyplot().close(drawn.fig)


def test_the_speedup_figure_sets_each_format_against_files_in_the_same_cell():
    """Records over files per store and latency, the ratio of geometric means with its Welch interval;
    drawn only where a sweep has files and another format."""
    from stallscope.report.drawing import pyplot
    from stallscope.report.sweep_plots import plots_supported, speedup_vs_latency, speedups

    found = {(s.over.cell.store, s.over.cell.latency): s for s in speedups(FORMATS)}
    assert set(found) == {("local", "local"), ("gcs", "10ms"), ("gcs", "30ms"), ("s3", "10ms")}
    gcs30 = found[("gcs", "30ms")]
    assert gcs30.ratio == pytest.approx(300 / 11) and gcs30.low < gcs30.ratio < gcs30.high
    assert gcs30.baseline.cell.format == "files" and gcs30.over.cell.format == "records"
    drawn = speedup_vs_latency(FORMATS)
    ax = drawn.fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert list(lines["records / seed over files on gs://"].get_ydata()) == pytest.approx([400 / 30, 300 / 11])
    assert "as fast as files" in lines and ax.get_yscale() == "log"
    assert "ratio of the two cells' geometric means" in drawn.caption
    pyplot().close(drawn.fig)
    assert "speedup_vs_latency" in plots_supported(FORMATS)
    assert "speedup_vs_latency" not in plots_supported(SWEPT), "files alone: nothing to set against"
