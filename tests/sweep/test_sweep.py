"""`stallscope sweep` on tiny data: a 2x2 grid (format x store: local disk and the storage emulator's
gs:// at 0 ms, spelled as before the store axis: --latency local,0ms), one repeat, a few steps, each run a
real `stallscope train` process. Checks the tables, resuming, refusals, HParams and the HTML report."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import shutil
import subprocess
from pathlib import Path

import pytest

import stallscope

from .helpers import TINY_KNOBS, csv_rows, run_cli, summary_rows

STEPS = 6


def sweep_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "--data", str(data), "--out", str(out), "--format", "files,records", "--latency", "local,0ms", "--pipeline", "seed",
            "--accelerator", "emulated:4000", "--steps", str(STEPS), "--warmup-steps", "1", "--repeats", "1",
            *TINY_KNOBS, *extra]


@pytest.fixture(scope="module")
def data(tiny_tree) -> Path:
    return tiny_tree  # read only: the sweep writes into its own folder


@pytest.fixture(scope="module")
def swept(data, tmp_path_factory) -> Path:
    """The 2x2 grid, run once for the module (the cells are real train processes, the 0 ms ones reading
    gs:// from an emulated store started for each run)."""
    out = tmp_path_factory.mktemp("sweeps") / "grid"
    assert run_cli(sweep_args(data, out)) == 0
    return out


def test_grid_writes_one_row_per_cell_with_medians(swept):
    rows = summary_rows(swept)
    assert sorted((r["format"], r["store"], r["latency_ms"]) for r in rows) == [
        ("files", "gcs", "0.0"), ("files", "local", ""), ("records", "gcs", "0.0"), ("records", "local", "")]
    for row in rows:
        assert row["complete"] == "True" and row["repeats"] == "1"
        assert float(row["images_per_second_median"]) > 0 and float(row["step_time_ms_median"]) > 0
        assert 0.0 <= float(row["input_share_pct_median"]) <= 100.0
        assert row["verdict"] in ("highly", "moderately", "not")
        assert row["bottleneck"], "the seed pipeline feeding a 1 ms step: its profiled last steps name a stage"
        assert float(row["device_images_per_second"]) == 4000.0
        run_dir = swept / row["run_dirs"]
        assert (run_dir / "summary.json").exists() and (run_dir / "steps.csv").exists()
        source = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["source"]
        storage = json.loads((run_dir / "storage.json").read_text(encoding="utf-8"))
        if row["store"] == "local":
            assert not source["path"].startswith("gs://") and storage["served"] is None
            assert row["requests_per_image_median"] == ""
        else:
            assert source["path"].startswith("gs://") and "gs://" in source["reader"], source
            assert storage["store"] == "gcs" and storage["served"]["requests"] > 0
            assert float(row["requests_per_image_median"]) > 0
            assert row["client"].startswith("TF gs://")
    remote = {r["format"]: float(r["requests_per_image_median"]) for r in rows if r["store"] == "gcs"}
    assert remote["records"] < remote["files"] / 2, "a shard serves many images per request"
    markdown = (swept / "results.md").read_text(encoding="utf-8").splitlines()
    assert len([line for line in markdown if line.startswith("| files") or line.startswith("| records")]) == 4
    assert (swept / "records" / "manifest.json").exists(), "records converted once into the sweep folder"


def test_one_repeat_says_no_interval(swept):
    """An interval needs two repeats: the summary's fields stay empty and say why, the table says so."""
    for row in summary_rows(swept):
        assert row["interval_method"] == "no interval (one repeat)"
        assert row["images_per_second_ci95_low"] == row["images_per_second_ci95_high"] == ""
    markdown = (swept / "results.md").read_text(encoding="utf-8")
    assert markdown.count("| no interval |") == 4


def test_run_figures_leave_out_warmup_and_profiled_steps(swept):
    from stallscope.sweep.results import run_figures
    from stallscope.workload import rundir

    row = csv_rows(swept)[0]
    run_dir = swept / row["run_dir"]
    shared = {"steps": STEPS, "profile_last": 2}
    figures = run_figures(run_dir, shared)
    assert figures.measured_steps == STEPS - 1 - 2
    steps = [s for s in rundir.read_steps(run_dir) if not s.warmup and s.step <= STEPS - 2]
    expected = sum(s.images for s in steps) / (sum(s.step_ms for s in steps) / 1000.0)
    assert figures.images_per_second == pytest.approx(expected)
    assert float(row["images_per_second"]) == pytest.approx(expected)
    assert figures.request_ms_median is None and row["request_ms_median"] == ""  # TF's gs:// counts nothing


def test_a_runs_request_times_come_from_what_stallscopes_reader_counted(swept, tmp_path):
    """A run read by stallscope's reader has store_requests in its summary: the cell's request times are
    the medians over its repeats, and the tables show them."""
    from stallscope.sweep.grid import Axes, Grid
    from stallscope.sweep.results import cell_result, load_grid_dict, run_figures
    from stallscope.sweep.table import markdown_cells

    row = csv_rows(swept)[0]
    run_dir = tmp_path / "run"
    shutil.copytree(swept / row["run_dir"], run_dir)
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    summary["store_requests"] = {"requests": 96, "bytes": 7_200_000, "median_ms": 10.6, "p90_ms": 12.4}
    (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    figures = run_figures(run_dir, {"steps": STEPS, "profile_last": 2})
    assert (figures.request_ms_median, figures.request_ms_p90) == (10.6, 12.4)
    saved = load_grid_dict(swept)
    grid = Grid(axes=Axes(**saved["axes"]), repeats=saved["repeats"], shared=saved["shared"])
    cell = next(c for c in grid.cells() if c.name == row["cell"])
    out = tmp_path / "out"
    (out / row["run_dir"]).parent.mkdir(parents=True)
    shutil.copytree(run_dir, out / row["run_dir"])
    result = cell_result(out, grid, cell)
    assert result.request_ms_median == 10.6 and "10.6" in markdown_cells(result)


def test_interrupted_sweep_resumes_only_what_is_missing(swept, data, tmp_path, capsys):
    """Stopped during the second of two missing runs: the first is kept, the second is partial; the
    same command then runs only the second."""
    out = tmp_path / "interrupted"
    shutil.copytree(swept, out)
    rows = csv_rows(out)
    missing = [out / rows[i]["run_dir"] for i in (1, 2)]
    for run_dir in missing:
        shutil.rmtree(run_dir)
    kept = {r["cell"]: (out / r["run_dir"] / "summary.json").stat().st_mtime_ns for i, r in enumerate(rows)
            if i not in (1, 2)}
    env = dict(os.environ, PYTHONPATH=str(Path(stallscope.__file__).parents[1]))
    sweep = subprocess.Popen([sys.executable, "-m", "stallscope", *sweep_args(data, out)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = []
        for line in sweep.stdout:  # ends when the sweep does, whatever happens
            lines.append(line)
            if " done in " in line:
                # Into the second run: its train process has made its run directory (a run that lists and
                # reads the emulated store quickly can finish within a fixed wait of a second or two).
                waited = time.monotonic() + 60
                while not missing[1].is_dir() and time.monotonic() < waited:
                    time.sleep(0.02)
                sweep.send_signal(signal.SIGTERM)  # as a scheduler stops it; Ctrl-C takes the same path
                break
        code = sweep.wait(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert "resuming: 2 of 4 runs already complete, 2 to run" in "".join(lines)
    assert code == 130
    assert "run the same command to resume" in sweep.stderr.read()
    assert "0ms" in missing[1].parent.name, "the stopped run was reading an emulated store"
    deadline = time.monotonic() + 15
    while _stores_serving(data) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _stores_serving(data), "the stopped run's emulated store outlived the sweep"
    assert (missing[0] / "summary.json").exists()
    from stallscope.sweep.runner import repeat_complete

    assert not repeat_complete(missing[1], STEPS), "the interrupted run is not taken for complete"
    assert not (out / "results.csv").exists() or len(csv_rows(out)) == 4

    capsys.readouterr()
    assert run_cli(sweep_args(data, out)) == 0
    printed = capsys.readouterr().out
    assert "resuming: 3 of 4 runs already complete, 1 to run" in printed
    assert "runs: 1 ran, 3 already complete, 0 failed" in printed
    assert repeat_complete(missing[1], STEPS)
    assert {r["cell"]: (out / r["run_dir"] / "summary.json").stat().st_mtime_ns
            for r in csv_rows(out) if r["cell"] in kept} == kept
    assert all(r["complete"] == "True" for r in summary_rows(out))


def _stores_serving(folder: Path) -> list[int]:
    """PIDs of `stallscope storage serve` processes serving `folder` (this module's data, or records
    beside it are never served by anything but the sweeps under test)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            words = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in words and b"storage" in words and str(folder.resolve()).encode() in words and _alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def test_a_sweep_run_again_says_which_cells_fall_inside_the_earlier_rerun_intervals(swept, data, tmp_path, capsys):
    """`--against EARLIER`: rerun.csv, a table and a line; here the same runs resumed, one repeat each, so
    every median is the earlier's and no cell has an interval to fall inside."""
    out = tmp_path / "again"
    shutil.copytree(swept, out)
    capsys.readouterr()
    assert run_cli(sweep_args(data, out, "--against", str(swept))) == 0
    printed = capsys.readouterr().out
    line = (f"re-run against {swept}: 0 of 0 cells inside the earlier sweep's 95% re-run intervals, 0 of 0 agree "
            "(the 95% interval of the difference of the two sweeps' means holds 0), 4 of 4 within 5% of its means "
            "(4 earlier cell(s) had no interval: one repeat)")
    assert line in printed and line in (out / "results.md").read_text(encoding="utf-8")
    rows = csv_rows(out, "rerun.csv")
    assert len(rows) == 4 and all(float(r["apart_pct"]) == 0.0 and r["within_rerun_interval"] == "" and r["agree"] == ""
                                  for r in rows)


def test_against_a_folder_without_a_sweep_or_the_same_folder_is_one_line(swept, data, tmp_path, capsys):
    capsys.readouterr()
    assert run_cli(sweep_args(data, tmp_path / "new", "--against", str(tmp_path))) == 2
    assert "--against: expected a sweep folder holding summary.csv" in capsys.readouterr().err
    assert run_cli(sweep_args(data, swept, "--against", str(swept))) == 2
    assert "--against: expected an earlier sweep's folder, got --out" in capsys.readouterr().err


def test_a_run_is_complete_only_when_its_record_says_so(tmp_path):
    import json

    from stallscope.sweep.runner import repeat_complete

    def record(**summary):
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        run_dir.mkdir()
        (run_dir / "steps.csv").write_text("step\n", encoding="utf-8")
        (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
        return run_dir

    assert repeat_complete(record(interrupted=False, last_step=6), 6)
    assert not repeat_complete(record(interrupted=True, last_step=6), 6)
    assert not repeat_complete(record(interrupted=False, last_step=4), 6)
    broken = record(interrupted=False, last_step=6)
    (broken / "summary.json").write_text("{", encoding="utf-8")
    assert not repeat_complete(broken, 6)
    assert not repeat_complete(tmp_path / "absent", 6)


def test_a_different_grid_is_refused_in_one_line(swept, data, capsys):
    argv = sweep_args(data, swept)
    argv[argv.index("local,0ms")] = "local"
    capsys.readouterr()
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("stallscope sweep: error: --out: ")
    assert "stores: local,gcs -> local" in err and "--replace-grid" in err


def test_replace_grid_keeps_cells_with_the_same_settings(swept, data, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(swept, out)
    argv = sweep_args(data, out, "--replace-grid")
    argv[argv.index("files,records")] = "files"
    argv[argv.index("local,0ms")] = "local"
    capsys.readouterr()
    assert run_cli(argv) == 0
    assert "runs: 0 ran, 1 already complete" in capsys.readouterr().out
    assert [(r["format"], r["store"]) for r in summary_rows(out)] == [("files", "local")]


@pytest.mark.parametrize("flag, value, expected", [
    ("--format", "files,tar", "--format: expected files or records, got 'tar'"),
    ("--latency", "10parsecs", "--latency: expected 'local' or a per-request latency"),
    ("--accelerator", "emulated:fast", "--accelerator: expected 'real', 'emulated:IMAGES_PER_SECOND'"),
    ("--lr", "1e-4,-1", "--lr: expected positive numbers"),
    ("--pipeline", "seed,seed", "--pipeline: expected each value once"),
    ("--latency", "10ms,0.01s", "--latency: expected each value once"),
    ("--pipeline", "fastest", "--pipeline: expected presets from"),
    ("--steps", "3", "--steps: expected at least 5"),
    ("--repeats", "0", "--repeats: expected a positive integer"),
    ("--store", "mount", "--store: mount is an emulated store, which needs a per-request --latency"),
    ("--store", "local,nfs", "--store: expected stores from local, gcs, s3, mount, got 'nfs'"),
    ("--bandwidth", "1Kbit", "--bandwidth: applies to an emulated store, which only a --latency other than local"),
])
def test_bad_axis_values_are_one_line_exit_2(data, tmp_path, capsys, flag, value, expected):
    argv = ["sweep", "--data", str(data), "--out", str(tmp_path / "s"), "--warmup-steps", "1", flag, value]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("stallscope sweep: error: ") and expected in err, err
    assert not (tmp_path / "s").exists(), "nothing written for a refused command"


def test_a_sweep_folder_inside_the_data_is_refused(data, capsys):
    assert run_cli(["sweep", "--data", str(data), "--out", str(data / "sweep"), "--accelerator", "emulated:100"]) == 2
    assert "--out: expected a folder outside --data" in capsys.readouterr().err
    assert not (data / "sweep").exists()


def test_a_folder_of_other_files_is_refused(data, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("the user's", encoding="utf-8")
    assert run_cli(["sweep", "--data", str(data), "--out", str(tmp_path), "--accelerator", "emulated:100"]) == 2
    assert "--out: expected a new folder or a sweep folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text(encoding="utf-8") == "the user's"


def test_a_latency_without_the_emulator_is_one_line(data, tmp_path, capsys, monkeypatch):
    """An installation without stallscope.storage (a None entry in sys.modules makes its import fail)."""
    monkeypatch.setitem(sys.modules, "stallscope.storage.emulator", None)
    assert run_cli(["sweep", "--data", str(data), "--out", str(tmp_path / "s"), "--latency", "local,10ms"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--latency: 10ms needs the storage emulator" in err
    assert not (tmp_path / "s").exists(), "nothing written for a refused command"


def test_hparams_read_back(swept):
    """The event files hold what TensorBoard's HParams tab reads: the experiment's axes and metrics at
    the root, one session per cell with its axis values and its medians as scalars."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2
    from tensorboard.util import tensor_util

    def values(folder: Path):
        (path,) = [p for p in folder.iterdir() if p.name.startswith("events.out.tfevents")]
        for event in EventFileLoader(str(path)).Load():
            yield from event.summary.value

    root = [v for v in values(swept / "hparams") if v.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME]
    (experiment,) = [plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content).experiment
                     for v in root]
    assert {h.name for h in experiment.hparam_infos} == {"format", "store", "latency", "latency_ms", "bandwidth",
                                                         "pipeline", "accelerator", "learning_rate"}
    assert {"images_per_second", "input_share_pct"} <= {m.name.tag for m in experiment.metric_infos}
    for row in summary_rows(swept):
        session = {v.tag: v for v in values(swept / "hparams" / row["cell"])}
        start = plugin_data_pb2.HParamsPluginData.FromString(
            session[metadata.SESSION_START_INFO_TAG].metadata.plugin_data.content).session_start_info
        assert start.hparams["format"].string_value == row["format"]
        assert start.hparams["store"].string_value == {"local": "local disk", "gcs": "gs://"}[row["store"]]
        assert start.hparams["latency"].string_value == ("local" if row["store"] == "local" else "0ms")
        # the latency as a number TensorBoard can plot, where a store adds one (not on local disk)
        assert ("latency_ms" in start.hparams) == (row["store"] != "local")
        if row["store"] != "local":
            assert start.hparams["latency_ms"].number_value == 0.0 == float(row["latency_ms"])
        assert start.hparams["learning_rate"].number_value == pytest.approx(float(row["learning_rate"]))
        measured = tensor_util.make_ndarray(session["images_per_second"].tensor).item()
        assert measured == pytest.approx(float(row["images_per_second_median"]))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Appended to a copy of the report: after load, writes what the page shows into the DOM that
# --dump-dom prints (images decoded and their sizes, the figures, table rows, and where the table's
# right edge and the page's widest element end against the window's width).
_PROBE = """<script>window.addEventListener('load', () => {
  const images = [...document.images].map(i => `${i.complete && i.naturalWidth > 0}:${i.naturalWidth}x${i.naturalHeight}`);
  const figures = [...document.querySelectorAll('figure')].map(f => f.id);
  const cells = [...document.querySelectorAll('#cells tr.cell')].map(r => r.dataset.cell);
  const table = document.querySelector('#cells');
  const view = document.documentElement.clientWidth;
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = JSON.stringify({images, figures, cells, view, tableRight: table.getBoundingClientRect().right,
    tableWidth: table.scrollWidth, pageWidth: document.documentElement.scrollWidth});
  document.body.appendChild(out);
});</script>"""
REVIEWER_WINDOW = "1400,1000"  # the width at which the table was cut off


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; "
                                             "`make` installs it where it can), so the report cannot be rendered")
def test_report_renders_in_a_headless_browser(swept, tmp_path):
    import json
    import re

    page = tmp_path / "report.html"
    page.write_text((swept / "report.html").read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
                    encoding="utf-8")
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={REVIEWER_WINDOW}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90)
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout)
    assert match, f"the page did not finish loading: {result.stderr[-500:]}"
    probe = json.loads(match.group(1).replace("&quot;", '"'))
    # files and records: the speedup of one over the other; one speed: no speed plot
    assert probe["figures"] == ["throughput_vs_latency", "speedup_vs_latency", "input_share_vs_latency"]
    assert len(probe["images"]) == 3
    for image in probe["images"]:
        loaded, size = image.split(":")
        width, height = map(int, size.split("x"))
        assert loaded == "true" and width > 300 and height > 200, image
    assert sorted(probe["cells"]) == sorted(r["cell"] for r in summary_rows(swept))
    assert probe["tableRight"] <= probe["view"] and probe["tableWidth"] <= probe["view"], probe
    assert probe["pageWidth"] <= probe["view"], f"the page scrolls sideways: {probe}"


def test_hparams_tab_lists_every_cell(swept):
    """TensorBoard's own HParams plugin, over its own event reader, serves one session group per cell
    with its axis values and medians (what the HParams tab shows)."""
    import json

    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import hparams_plugin
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    logdir = str(swept / "hparams")
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    plugin = hparams_plugin.HParamsPlugin(base_plugin.TBContext(
        logdir=logdir, multiplexer=multiplexer,
        data_provider=data_provider.MultiplexerDataProvider(multiplexer, logdir)))
    request = {"experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN"], "colParams": [], "startIndex": 0,
               "sliceSize": 100}
    response = Client(plugin.get_plugin_apps()["/session_groups"], Response).post(
        "/", data=json.dumps(request), content_type="application/json")
    assert response.status_code == 200
    groups = {g["name"]: g for g in json.loads(response.get_data(as_text=True))["sessionGroups"]}
    rows = {r["cell"]: r for r in summary_rows(swept)}
    assert set(groups) == set(rows)
    for name, group in groups.items():
        assert group["hparams"]["store"] == {"local": "local disk", "gcs": "gs://"}[rows[name]["store"]]
        metrics = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
        assert metrics["images_per_second"] == pytest.approx(float(rows[name]["images_per_second_median"]), rel=1e-5)


def test_a_run_ends_when_the_sweep_is_killed(tmp_path):
    """SIGKILL leaves the sweep no time to stop its run: the run is sent SIGINT by the kernel instead
    (a real process started the way the sweep starts each run)."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         "from stallscope.sweep.runner import interrupted_when_the_sweep_dies\n"
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
         "                         preexec_fn=interrupted_when_the_sweep_dies())\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        env=dict(os.environ, PYTHONPATH=str(Path(stallscope.__file__).parents[1])), stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert Path(f"/proc/{child_pid}").exists()
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), "the run outlived the killed sweep"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie, ended but not yet reaped by init, counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_resumed_sweep_prints_no_tensorflow_start_up_lines(swept, data, tmp_path, faults):
    """A sweep whose runs are all complete only writes its table and HParams: TensorFlow loaded for
    them printed absl's and oneDNN's start-up lines to stderr, which a first pass never shows."""
    out = tmp_path / "resumed"
    shutil.copytree(swept, out)
    outcome = faults.run("sweep resumed with every run complete", sweep_args(data, out), 180,
                         env={"PYTHONPATH": str(Path(stallscope.__file__).parents[1])})
    outcome.check(rc=0, within_s=180, stderr_lines=0)
    assert "runs: 0 ran, 4 already complete, 0 failed" in outcome.stdout
