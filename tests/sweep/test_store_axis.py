"""`stallscope sweep` with a store axis: local disk and the storage emulator's s3:// at 0 ms, 2 cells x
2 repeats of real `stallscope train` processes (a slow emulated device, so local disk keeps up). Checks
that each cell reads the store it names, the per-run and per-cell tables with their units and 95%
intervals, and the bottleneck of an input-bound run whose profiled steps were not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stallscope.cli.main import main
from stallscope.sweep.interval import BOTH_METHODS, log_interval
from stallscope.sweep.table import interval_text

from .helpers import TINY_KNOBS, csv_rows, summary_rows

STEPS = 6


@pytest.fixture(scope="module")
def swept(tiny_tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("store-axis") / "sweep"
    code = main(["sweep", "--data", str(tiny_tree), "--out", str(out), "--format", "files", "--store", "local,s3",
                 "--latency", "0ms", "--pipeline", "seed", "--accelerator", "emulated:50", "--steps", str(STEPS),
                 "--warmup-steps", "1", "--repeats", "2", *TINY_KNOBS])
    assert code == 0
    return out


def test_each_cell_reads_the_store_it_names_and_counts_its_requests(swept):
    runs = csv_rows(swept)
    assert sorted((r["store"], r["repeat"]) for r in runs) == [("local", "1"), ("local", "2"), ("s3", "1"),
                                                               ("s3", "2")]
    for row in runs:
        run_dir = swept / row["run_dir"]
        source = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["source"]
        storage = json.loads((run_dir / "storage.json").read_text(encoding="utf-8"))
        assert storage["store"] == row["store"]
        if row["store"] == "s3":
            assert source["path"].startswith("s3://") and storage["served"]["requests"] > 0
            # per image read (the bytes served over the data set's bytes per image), however far reads ran
            # ahead of the images trained: one GET a file, and a listing or two
            read = storage["served"]["bytes"] / (source["bytes"] / source["examples"])
            assert float(row["requests_per_image"]) == pytest.approx(storage["served"]["requests"] / read)
            assert float(row["images_read_per_trained"]) == pytest.approx(read / (STEPS * 4))
            assert 0.9 <= float(row["requests_per_image"]) <= 1.5
            assert row["latency_ms"] == "0.0" and row["client"]
        else:
            assert not source["path"].startswith(("s3://", "gs://")) and storage["served"] is None
            assert row["latency_ms"] == row["requests_per_image"] == ""


def test_results_csv_has_one_row_per_run_with_units_in_its_columns(swept):
    from stallscope.workload import rundir
    from stallscope.workload.timing import summarize_steps

    runs = csv_rows(swept)
    assert {"images_per_second", "step_time_ms", "input_share_pct", "latency_ms", "bytes_per_image"} <= set(runs[0])
    assert "input_share" not in runs[0], "one convention: a percentage"
    for row in runs:
        kept = [s for s in rundir.read_steps(swept / row["run_dir"]) if s.step <= STEPS - 2]
        stats = summarize_steps(kept)
        assert float(row["images_per_second"]) == pytest.approx(stats.images_per_second)
        assert float(row["input_share_pct"]) == pytest.approx(stats.input_share * 100)


def test_summary_has_the_median_a_95_percent_interval_and_a_rerun_interval_per_cell(swept):
    """Two cells are too few to pool their spreads: each interval is the cell's own, on the log scale."""
    runs = csv_rows(swept)
    cells = summary_rows(swept)
    assert len(cells) == 2
    markdown = (swept / "results.md").read_text(encoding="utf-8")
    assert BOTH_METHODS in markdown
    for cell in cells:
        mine = [float(r["images_per_second"]) for r in runs if r["cell"] == cell["cell"]]
        interval, rerun = log_interval(mine), log_interval(mine, rerun_repeats=2)
        assert cell["repeats"] == "2" and cell["interval_method"] == BOTH_METHODS
        assert float(cell["images_per_second_median"]) == pytest.approx(sum(mine) / 2)
        assert float(cell["images_per_second_mean"]) == pytest.approx(sum(mine) / 2)
        assert float(cell["images_per_second_geometric_mean"]) == pytest.approx((mine[0] * mine[1]) ** 0.5)
        assert float(cell["images_per_second_ci95_low"]) == pytest.approx(interval.low)
        assert float(cell["images_per_second_ci95_high"]) == pytest.approx(interval.high)
        assert float(cell["images_per_second_rerun95_low"]) == pytest.approx(rerun.low) and rerun.low < interval.low
        assert float(cell["images_per_second_rerun95_high"]) == pytest.approx(rerun.high) and rerun.high > interval.high
        assert 0.0 <= float(cell["input_share_pct_ci95_low"]) <= float(cell["input_share_pct_median"]) \
            <= float(cell["input_share_pct_ci95_high"]) <= 100.0
        assert f"| {interval_text(interval, 2)} | {interval_text(rerun, 2)} |" in markdown
    assert (swept / "figures" / "throughput_vs_latency.pdf").exists()


def test_an_input_bound_run_names_its_bottleneck_though_its_profiled_steps_kept_up(swept, tmp_path):
    """The profile's window (the last steps) can find the input keeping up while the measured steps wait
    for it (a prefetch buffer filled by then): the bottleneck went by the profile's verdict, and a
    highly input-bound cell read '-'. Here: a run whose profiled steps did not wait, its measured steps
    made to wait 90% of each step."""
    from stallscope.analysis.analyze import analyze_run
    from stallscope.sweep.results import run_figures

    local = next(r for r in csv_rows(swept) if r["store"] == "local")
    run_dir = tmp_path / "run"
    shutil.copytree(swept / local["run_dir"], run_dir)
    profiled = analyze_run(run_dir, with_xprof=False)
    assert profiled.bottleneck is None and profiled.slowest_stage, "the profiled steps kept up"
    steps = (run_dir / "steps.csv").read_text(encoding="utf-8").splitlines()
    header = steps[0].split(",")
    wait, step_ms, compute = header.index("input_wait_ms"), header.index("step_ms"), header.index("compute_ms")
    waited = [steps[0]]
    for line in steps[1:]:
        fields = line.split(",")
        fields[wait] = repr(9 * float(fields[compute]))
        fields[step_ms] = repr(10 * float(fields[compute]))
        waited.append(",".join(fields))
    (run_dir / "steps.csv").write_text("\n".join(waited) + "\n", encoding="utf-8")
    figures = run_figures(run_dir, {"steps": STEPS, "profile_last": 2})
    assert figures.verdict == "highly" and figures.input_share == pytest.approx(0.9)
    assert figures.bottleneck == profiled.slowest_stage
