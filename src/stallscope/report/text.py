"""The terminal report of an analysis: numbers become text only here."""

from __future__ import annotations

from pathlib import Path

from stallscope.analysis.analyze import Analysis
from stallscope.analysis.checklist import between_steps_text
from stallscope.analysis.fetch_wait import others_fill_the_cores, others_text
from stallscope.analysis.steps import Spread, StepBreakdown
from stallscope.analysis.tfdata import DEVICE_FEED_NOTE
from stallscope.pipeline.config import describe_knob
from stallscope.verdict import NOT_MEASURED, fmt_share, verdict_phrase  # fmt_share: the one share formatter


def fmt_ms(value: float | None) -> str:
    if value is None:
        return NOT_MEASURED
    return f"{value:.2f} ms" if value < 100 else f"{value:.0f} ms"


def fmt_count(count: int, noun: str) -> str:
    """'1 step', '3 steps': a count with its noun in the right number."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def knob_value(value) -> str:
    """A knob's value as typed on the command line: autotune, off, true/false, a number or a word."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or (isinstance(value, int) and value < 0):
        return describe_knob(value)
    return str(value)


def fmt_knobs(knobs: dict) -> str:
    """Knobs as the flags a user types (`--map-parallelism autotune`), the one spelling every
    report uses for advice (train and diagnose take the same flags)."""
    return ", ".join(f"--{key.replace('_', '-')} {knob_value(value)}" for key, value in knobs.items())


def counted_steps_text(steps: StepBreakdown) -> str:
    """How many steps the figures average, and why: XProf leaves out the first and last step of a
    window of 3 or more (they may be cut by the capture); a shorter window is counted whole."""
    counted = fmt_count(steps.counted_steps, "step")
    if len(steps.steps) >= 3:
        return f"{counted}; first and last steps left out, as TensorBoard does"
    return (f"{counted}, all counted: a window of {fmt_count(len(steps.steps), 'step')} is too short to leave out "
            f"its first and last as TensorBoard does from 3 steps on; a few more steps give a steadier figure")


def verdict_line(analysis: Analysis) -> str:
    """One verdict per run, saying which figure it is (the run's own steps where measured, else the
    profiled window's) with the other beside it where they disagree; then what the run waits on: reads
    from a store (latency-bound), or the stage the walk found, a bottleneck only when the run waits."""
    steps = analysis.steps
    if analysis.input_share is None:
        return unmeasured_line(steps)
    line = (f"Input share {fmt_share(analysis.input_share)}: {verdict_phrase(analysis.verdict)} "
            f"({headline_source_text(analysis)})")
    if analysis.fetch is not None:
        return f"{line}; latency-bound, {analysis.fetch.text()}{fetch_stage_text(analysis)}"
    if analysis.slowest_stage is None:
        return line + cpu_limit_text(analysis)
    if analysis.input_bound:
        return f"{line}; bottleneck: {analysis.slowest_stage}{cpu_limit_text(analysis)}"
    return f"{line}; the input keeps up (slowest stage: {analysis.slowest_stage}, not holding the run back)"


def headline_source_text(analysis: Analysis) -> str:
    """Which steps the verdict is from, and the profiled window's figure beside it where it differs."""
    if analysis.headline_from != "steps.csv":
        return f"the profiled window: {counted_steps_text(analysis.steps)}"
    text = f"the run's own steps: {fmt_count(analysis.run.steps, 'measured step')} in steps.csv"
    window = analysis.steps.input_share
    if window is None:
        return text
    beside = f"{text}; the profiled window ({counted_steps_text(analysis.steps)}): {fmt_share(window)}"
    if not analysis.window_disagrees:
        return beside
    why = ("its steps were served from a filled buffer (a shuffle's) while the run's slow steps refill it"
           if window < analysis.input_share else
           "it holds slow steps (an epoch start, a buffer filling) that are rarer over the whole run")
    return f"{beside}, {verdict_phrase(analysis.steps.verdict)}: {why}"


def fetch_stage_text(analysis: Analysis) -> str:
    """Where the reads show in the profiled window's stage tree, or why they do not."""
    fetch = analysis.fetch
    if fetch.stage is not None:
        return f"; the reads run in {fetch.stage} (the profiled window's walk stops there)"
    if analysis.slowest_stage is not None:
        return (f"; the profiled window's walk stops at {analysis.slowest_stage}, whose steps did not wait on the "
                "reads")
    return ""


def unmeasured_line(steps: StepBreakdown) -> str:
    """No share and no verdict, and why: the iterator runs between the step markers, or there is none."""
    if steps.between is not None:
        return ("Input share: not measurable, verdict unknown: the tf.data iterator's IteratorGetNext runs between "
                f"the step markers, not inside them ({between_steps_text(steps)}); fetch the batch inside the "
                "marker (Fix below)")
    return ("Input share: not measurable, verdict unknown: no tf.data iterator in the profiled steps "
            "(input fed as NumPy arrays?)")


def spread_rows(steps: StepBreakdown) -> list[tuple[str, Spread | None]]:
    """The per-step table's rows; the input wait/compute split is None (n/a) where the share was not measured."""
    measured = steps.input_share is not None
    return [("step", steps.step_ms), ("input wait", steps.input_ms if measured else None),
            ("compute", steps.compute_ms if measured else None)]


def spread_cells(spread: Spread | None) -> list[str]:
    """mean, p50, p90, std as text; n/a for a figure not measured."""
    if spread is None:
        return [NOT_MEASURED] * 4
    return [fmt_ms(spread.mean), fmt_ms(spread.p50), fmt_ms(spread.p90), fmt_ms(spread.std)]


def no_fix_line(analysis: Analysis) -> str:
    """What an empty fix list means: the input keeps up, nothing measured says what to fix, or the run
    is input-bound and no change weighed is predicted to help (never 'keeps up' above the threshold)."""
    if analysis.input_share is None:
        return "none advised; the input share was not measured, so whether the input keeps up is unknown"
    if analysis.input_bound and analysis.fetch is not None:
        return (f"none found: the run is {verdict_phrase(analysis.verdict)} ({fmt_share(analysis.input_share)}) "
                f"waiting on reads ({analysis.fetch.text()}); more reads in flight shorten the wait (latency x "
                "throughput), but the store's request times were not timed to size them")
    if analysis.input_bound:
        stage = analysis.slowest_stage or "no stage found"
        weighed = f" ({len(analysis.checked)} change(s) checked below)" if analysis.checked else ""
        return (f"none found: the run is {verdict_phrase(analysis.verdict)} ({fmt_share(analysis.input_share)}) at "
                f"{stage}, and no change stallscope knows is predicted to gain 5% or more{weighed}")
    return "none needed; the input pipeline keeps up"


def gain_text(item) -> str:
    """'+42% predicted (step 20.1 -> 14.2 ms)' or 'gain not predicted'; the basis is said on its own line."""
    if item.predicted_gain is None:
        return "gain not predicted"
    return f"{item.predicted_gain:+.0%} predicted (step -> {fmt_ms(item.predicted_step_ms)})"


def checked_line(item) -> str:
    """A change weighed and not advised, with the model's figure or why none."""
    from stallscope.analysis.fix_gain import below_least_gain_text

    figure = below_least_gain_text(item) if item.predicted_gain is not None else "not advised"
    return f"{item.title}: checked, {figure} ({item.gain_basis})"


def warning_lines(analysis: Analysis) -> list[str]:
    return [f"warning: {w}" for w in analysis.warnings]


def cpu_limit_text(analysis: Analysis) -> str:
    """'; the CPU is the limit: ...' where the run waits for input and every core was busy over its steps."""
    cpu = next((c for c in analysis.checklist if c.key == "cpu_saturated"), None)
    if not analysis.input_bound or cpu is None or cpu.answer != "yes" or analysis.fetch is not None:
        return ""
    if others_fill_the_cores(analysis.cpu_window):
        return f"; the cores were saturated, but {others_text(analysis.cpu_window)}"
    return "; the CPU is the limit (saturated over the steps): more parallelism cannot help, less work per image can"


def advice_flags(analysis: Analysis, item) -> str:
    """The advice's knobs as `stallscope train`/`diagnose` flags, only for a run of stallscope's own
    workload (its pipeline.json has the requested config): a user's own pipeline has no such flags,
    its fix is the code."""
    return fmt_knobs(item.knobs) if item.knobs and analysis.config is not None else ""


def run_timing_line(analysis: Analysis) -> str | None:
    """The run's own clock (steps.csv), beside the profile's figures; None for a bare profile."""
    run = analysis.run
    if run is None:
        return None
    rate = f", {run.images_per_second:.1f} images/s" if run.images_per_second is not None else ""
    line = (f"The run's own timing (steps.csv, {fmt_count(run.steps, 'step')} without warm-up): step "
            f"{fmt_ms(run.step_ms.mean)}")
    if run.input_ms is None:
        return (f"{line}{rate}; its input wait was not timed (a callback sees whole steps), so the split "
                "above is the profile's")
    line += f", input wait {fmt_ms(run.input_ms.mean)}, input share {fmt_share(run.input_share)} ({run.verdict}){rate}"
    if analysis.window_disagrees:
        line += (f"; the verdict above is this one; the profiled window ({fmt_count(analysis.steps.counted_steps, 'step')}"
                 f") says {analysis.steps.verdict} input-bound: slow steps (an epoch start, a shuffle buffer filling) "
                 f"fall inside or outside a window; the stage table and checklist are the window's")
    return line


STAGE_COLUMNS_NOTE = ("  busy: wall-clock time of the stage's own work (the figure the bottleneck walk and checklist "
                      "use); work: that work summed over its calls, larger when calls ran at once (parallel column, "
                      "calls in flight in brackets)")


def xprof_line(analysis: Analysis) -> str:
    figure = analysis.xprof
    if figure is None:
        return "TensorBoard (xprof): not run"
    if figure.input_share is None and figure.error:
        return f"TensorBoard (xprof): no figure ({figure.error})"
    found = f"stallscope found {fmt_count(len(analysis.steps.steps), 'step')} by {analysis.steps.method}"
    if figure.input_share is None and analysis.steps.method.startswith("step markers"):
        return f"TensorBoard (xprof): no figure: XProf found no steps in this profile; {found}"
    if figure.input_share is None:
        return ("TensorBoard (xprof): no figure: XProf counts only steps marked with _r=1 "
                "(tf.profiler.experimental.Trace('train', step_num=i, _r=1), as StallMonitor and stallscope.profile "
                f"write them) and finds none in Keras 3 fit profiles; {found}")
    window = analysis.steps.input_share  # the same profiled steps TensorBoard reads
    if window is None:
        return (f"TensorBoard says {fmt_share(figure.input_share)} over {fmt_count(figure.steps, 'step')} "
                "(stallscope: not measurable, no iterator call inside the steps; its figure counts none either)")
    delta = (window - figure.input_share) * 100
    of = " on the profiled window" if analysis.headline_from == "steps.csv" else ""
    return (f"TensorBoard says {fmt_share(figure.input_share)} over {fmt_count(figure.steps, 'step')}{of} "
            f"(stallscope {fmt_share(window)}, difference {delta:+.1f} pp)")


def capture_lines(analysis: Analysis) -> list[str]:
    """Which capture was read and which others are there (`--capture NAME` picks one)."""
    others = [c for c in analysis.captures if c != str(Path(analysis.profile_path).parent)]
    if not others:
        return []
    return [f"also found {len(others)} other capture(s) (choose with --capture NAME): " + ", ".join(others)]


def batch_lines(steps: StepBreakdown) -> list[str]:
    """Under steps_per_execution a step runs several batches: the figures per batch too."""
    n = steps.batches_per_step
    if n <= 1:
        return []
    wait = fmt_ms(steps.input_ms.mean / n) if steps.input_share is not None else NOT_MEASURED
    return [f"each step runs {n} batches (steps_per_execution={n}): per batch, step "
            f"{fmt_ms(steps.step_ms.mean / n)}, input wait {wait}"]


def host_lines(analysis: Analysis) -> list[str]:
    """A capture of several hosts: each host's share; the rest of the report is the slowest host's."""
    if len(analysis.hosts) < 2:
        return []
    lines = [f"{len(analysis.hosts)} hosts in this capture; the report below is of the slowest, "
             f"{analysis.slowest_host} (the one the others wait for):"]
    for host in analysis.hosts:
        mark = " <- slowest" if host.host == analysis.slowest_host else ""
        wait = fmt_ms(host.steps.input_ms.mean) if host.steps.input_share is not None else NOT_MEASURED
        lines.append(f"  {host.host:<20} input share {fmt_share(host.steps.input_share):>6}, step "
                     f"{fmt_ms(host.steps.step_ms.mean)}, input wait {wait}{mark}")
    return lines


def source_lines(analysis: Analysis) -> list[str]:
    """Where the figures come from: other captures, how steps were found, batches per step, hosts."""
    steps = analysis.steps
    return [*capture_lines(analysis), f"steps: {len(steps.steps)} found by {steps.method}",
            *batch_lines(steps), *host_lines(analysis), *warning_lines(analysis)]


def render_text(analysis: Analysis) -> str:
    lines = [*_heading(analysis), "", verdict_line(analysis), xprof_line(analysis), "", *_step_spread(analysis)]
    timing = run_timing_line(analysis)
    if timing is not None:
        lines += ["", timing]
    lines += _stage_tree(analysis)
    lines += ["", "Checklist (TF Profiler guide to tf.data)"]
    for item in analysis.checklist:
        lines.append(f"  {item.question:<36} {item.answer:<10} {item.evidence}")
    lines += _as_written_and_run(analysis)
    lines += ["", "Fix, most helpful first" if analysis.advice else f"Fix: {no_fix_line(analysis)}"]
    for number, item in enumerate(analysis.advice, 1):
        flags = advice_flags(analysis, item)
        knobs = f" [{flags}]" if flags else ""
        lines.append(f"  {number}. {item.title}{knobs}: {gain_text(item)}; {item.reason}")
        if item.gain_basis:
            lines.append(f"     model: {item.gain_basis}")
        if item.command:
            lines.append(f"     $ {item.command}")
        lines += [f"     {code}" for code in item.code.splitlines()]
        if item.sizing is not None:
            lines += [f"     {line}" for line in service_lines(item.sizing)]
    for item in analysis.checked:
        lines.append(f"  - {checked_line(item)}")
    for note in analysis.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


PROFILE_IN_DIAGNOSIS = ("the verdict and the advice above are the diagnosis' (its probes and one model); "
                        "`stallscope analyze {source}` gives this profile's own reading")


def render_profile_section(analysis: Analysis) -> str:
    """The profiled steps inside a diagnosis: what the profile adds (per-step spread, the stage tree, the
    pipeline as run), not a second verdict and fix list whose figures would differ from the diagnosis'."""
    lines = [*_heading(analysis), "", *_step_spread(analysis), *_stage_tree(analysis),
             *_as_written_and_run(analysis), "", PROFILE_IN_DIAGNOSIS.format(source=analysis.source)]
    return "\n".join(lines) + "\n"


def _heading(analysis: Analysis) -> list[str]:
    return [f"stallscope analyze {analysis.source}", f"profile: {analysis.profile_path}", *source_lines(analysis)]


def _step_spread(analysis: Analysis) -> list[str]:
    lines = [f"{'per step':<12}{'mean':>11}{'p50':>11}{'p90':>11}{'std':>11}"]
    for label, spread in spread_rows(analysis.steps):
        lines.append(f"{label:<12}" + "".join(f"{cell:>11}" for cell in spread_cells(spread)))
    return lines


def _stage_tree(analysis: Analysis) -> list[str]:
    lines = ["", "tf.data stages (outermost first, each followed by its inputs)",
              f"  {'stage':<30}{'calls':>7}{'total':>11}{'busy':>11}{'work':>11}{'per call':>10}{'parallel':>10}"]
    for stage in analysis.tree.stages:
        mark = f" <- {analysis.stage_label}" if stage.long_name == analysis.tree.bottleneck else ""
        parallel = "" if stage.parallelism is None else describe_knob(stage.parallelism)
        if stage.asynchronous and stage.concurrency > 1.05:
            parallel += f" ({stage.concurrency:.1f})"
        name = ("  " * stage.depth + stage.label + (" *" if stage.asynchronous else "")
                + (" ~" if stage.per_element else ""))
        lines.append(f"  {name:<30}{stage.calls:>7}{fmt_ms(stage.total_ms):>11}{fmt_ms(stage.busy_ms):>11}"
                     f"{fmt_ms(stage.own_ms):>11}{stage.per_element_us:>8.0f}us{parallel:>10}{mark}")
    lines.append("  * asynchronous: its total is time spent waiting for it; its work is that of its function")
    if any(stage.device_feed for stage in analysis.tree.stages):
        lines.append(f"  {DEVICE_FEED_NOTE}")
    if any(stage.per_element for stage in analysis.tree.stages):
        lines.append("  ~ made by its parent's function for each element of the parent's input "
                     "(an interleave's reader per file)")
    lines.append(STAGE_COLUMNS_NOTE)
    return lines


def _as_written_and_run(analysis: Analysis) -> list[str]:
    lines = ["", "Pipeline as written vs as run"]
    if analysis.written_chain:
        lines.append(f"  written: {' -> '.join(analysis.written_chain)}")
    lines.append(f"  ran:     {' -> '.join(analysis.ran_chain)}")
    for change in analysis.rewrites:
        lines.append(f"  TF rewrite: {change.describe()}")
    if analysis.written_chain and not analysis.rewrites:
        lines.append("  TF ran what was written")
    return lines


def service_heading(plan) -> str:
    """What the service what-if assumed: the workers' cores and the link, each given or assumed."""
    inputs = plan.inputs
    cores = "given" if inputs.worker_cores_given else "assumed: this host's free cores"
    link = "given" if inputs.link_given else "assumed"
    return (f"service what-if (workers of {inputs.worker_cores:g} cores, {cores}; link {inputs.link_gbps:g} Gbit/s, "
            f"{link}; compression {inputs.compression})")


def service_table(plan) -> tuple[list[str], list[list[str]]]:
    """The what-if's header and a row per worker count: workers, images/s, what limits it, link MB/s."""
    unit = "images/s" if plan.inputs.images_per_element > 1 else "elements/s"
    rows = [[str(row.workers), f"{row.images_per_second:,.0f}", row.bound,
             "" if row.link_mb_per_second is None else f"{row.link_mb_per_second:,.0f}"] for row in plan.rows]
    return ["workers", unit, "limited by", "link MB/s"], rows


def service_alone(plan) -> str | None:
    """The trainer alone now, for the crossover (None: not known)."""
    inputs = plan.inputs
    if inputs.local_elements_per_second is None:
        return None
    unit = "images/s" if inputs.images_per_element > 1 else "elements/s"
    return f"trainer alone now: {inputs.local_elements_per_second * inputs.images_per_element:,.0f} {unit}"


def service_lines(plan) -> list[str]:
    """The tf.data service what-if of a `service_sizing.ServiceSizing`: a row per worker count, then
    the trainer alone now."""
    header, rows = service_table(plan)

    def line(cells) -> str:  # the bound left-aligned, the figures right-aligned
        widths = (7, 12, 10, 9)
        return "  " + "  ".join(f"{c:<{w}}" if i == 2 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [f"{service_heading(plan)}:", line(header), *map(line, rows)]
    if (alone := service_alone(plan)) is not None:
        lines.append(f"  {alone}")
    return lines


STORAGE_HEADER = ["store", "format", "client", "requests/image", "sequential", "parallel", "enough in flight"]


def fmt_rate(images_per_second: float) -> str:
    return "unbounded" if images_per_second == float("inf") else f"{images_per_second:,.0f}/s"


def _cell(cell) -> str:
    """'125/s 90% (C=1.6, requests)': images/s, input share, reads in flight and the limiting term."""
    return (f"{fmt_rate(cell.images_per_second)} {fmt_share(cell.prediction.input_share, 0)} "
            f"(C={cell.in_flight:.3g}, {cell.bound})")


STORAGE_BASES = {  # measured and counted figures are per image trained: fetched over the images the probe took
    "measured": "measured by the store, per image trained",
    "reader": "requests and bytes counted by stallscope's reader, per image trained, connections modelled for {client}",
    "modelled": "modelled for {client}",
}


def storage_figure_line(figures) -> str:
    """Per image: requests, connections, bytes, waiting; measured by the store, counted by stallscope's
    reader, or modelled; and a request's time as the reader saw it."""
    local = ""
    if figures.read_calls is not None:
        local = f"; locally {figures.read_calls:.2f} read calls, {figures.files_opened:.3g} files opened"
    timed = ""
    if figures.request_ms_median is not None:
        timed = (f"; a request took {figures.request_ms_median:.1f} ms (median), {figures.request_ms_p90:.1f} ms "
                 "(90th percentile) from asking to its last byte")
    what = STORAGE_BASES[figures.basis].format(client=figures.client)
    steady = figures.steady_requests
    steady = f" ({steady:.3g} per image read, the what-if's)" if steady is not None else ""
    return (f"storage per image ({what}): requests {figures.requests:.3g}{steady}, connections opened "
            f"{figures.connections:.3g}, {figures.bytes / 1024:.1f} KiB, {figures.wait_ms:.2f} ms waiting for "
            f"storage{timed}{local}")


def storage_rows(what) -> list[list[str]]:
    """The storage what-if as rows of STORAGE_HEADER (one per store and format)."""
    rows = []
    for row in what.scenarios:
        for f in row.formats:
            mark = " (yours)" if f.format == what.source_format else ""
            rows.append([row.scenario.label, f.format + mark, f.client,
                         f"{f.requests_per_image:.3g} {f.basis}", _cell(f.sequential), _cell(f.parallel),
                         _cell(f.enough_in_flight) + f", pool {f.enough_in_flight.private_threadpool_size}"])
    return rows


def storage_lines(figures, what) -> list[str]:
    """The terminal section: per-image figures and the what-if table, columns aligned."""
    lines = []
    if figures is not None:
        lines.append(storage_figure_line(figures))
    if what is None:
        return lines
    rows = [STORAGE_HEADER, *storage_rows(what)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(STORAGE_HEADER))]
    lines.append("storage what-if (images/s of the pipeline alone, input share of the step, C = requests in "
                 "flight, what limits it):")
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip() for r in rows]
    lines += [f"  note: {note}" for note in what.notes]
    if not any(row.named for row in what.scenarios):
        lines.append("  (presets; name your store with --what-if-storage 10ms,200Mbit to get storage advice)")
    return lines
