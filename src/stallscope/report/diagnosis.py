"""The report of `stallscope diagnose` (and of `stallscope.diagnose(...).text()`): terminal lines, Markdown,
the fix's before / predicted / after. It renders a Diagnosis it is given; the probes are analysis'."""

from __future__ import annotations

import dataclasses
import math
import shlex

from stallscope.analysis.differential import Diagnosis as _Diagnosis
from stallscope.report.text import PROFILE_IN_DIAGNOSIS, fmt_knobs, render_profile_section, service_lines


class Diagnosis(_Diagnosis):
    """What `stallscope.diagnose` returns: the analysis' Diagnosis, able to render itself."""

    def text(self) -> str:
        """The report `stallscope diagnose` prints, and the profiled steps' stage tree when there is one."""
        return diagnosis_text(self)


def with_text(diagnosis: _Diagnosis) -> Diagnosis:
    """The same diagnosis, with `text()`."""
    return Diagnosis(**{field: getattr(diagnosis, field) for field in diagnosis.__dataclass_fields__})


def diagnosis_text(diagnosis: _Diagnosis) -> str:
    """The report `stallscope diagnose` prints, and the profiled steps' stage tree when there is one."""
    lines = report_lines(diagnosis)
    if diagnosis.analysis is not None:
        lines += ["", *profile_section(diagnosis.analysis)]
    return "\n".join(lines)


NOT_KEPT_CLOSING = ("the verdict and the advice above are the diagnosis' (its probes and one model); the profile was "
                    "not kept: give work_dir= to keep it for `stallscope analyze` and TensorBoard")


def profile_section(analysis) -> list[str]:
    """The profiled steps in the report's one unit: per batch, as every figure above it (a step of
    steps_per_execution=N batches said once, in the heading); where the profile was not kept (no
    work_dir), no command to open it."""
    per = analysis.steps.batches_per_step
    heading = ("profile of end-to-end steps:" if per <= 1 else
               f"profile of end-to-end steps, per batch as above (each profiled step ran {per} batches):")
    lines = render_profile_section(per_batch(analysis) if per > 1 else analysis).rstrip("\n").split("\n")
    if analysis.run_dir is None and analysis.profile_path.startswith("(not kept"):
        closing = PROFILE_IN_DIAGNOSIS.format(source=analysis.source)
        lines = [NOT_KEPT_CLOSING if line == closing else line for line in lines
                 if line != f"stallscope analyze {analysis.source}"]
    return [heading, *lines, ""]


def per_batch(analysis):
    """The analysis with its step figures divided by the batches a step ran (steps_per_execution)."""
    steps = analysis.steps
    per = steps.batches_per_step

    def spread(value):
        return dataclasses.replace(value, mean=value.mean / per, p50=value.p50 / per, p90=value.p90 / per,
                                   std=value.std / per)

    rows = tuple(dataclasses.replace(row, step_ms=row.step_ms / per, input_ms=row.input_ms / per,
                                     compute_ms=row.compute_ms / per) for row in steps.steps)
    steps = dataclasses.replace(steps, steps=rows, step_ms=spread(steps.step_ms), input_ms=spread(steps.input_ms),
                                compute_ms=spread(steps.compute_ms), batches_per_step=1)
    return dataclasses.replace(analysis, steps=steps)


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def _pct(value: float | None) -> str:
    from stallscope.verdict import fmt_share

    return fmt_share(value)


def _rate(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:,.0f} images/s"


def _storage(diagnosis) -> dict:
    return diagnosis.source.get("storage") or {}


def _in_store(diagnosis) -> bool:
    """The data is read from another machine each epoch (a bucket, a network file system)."""
    from stallscope.storage.location import is_remote

    return _storage(diagnosis).get("kind", "local") != "local" or is_remote(str(diagnosis.source.get("path", "")))


def _halves(probe) -> str:
    """'; its halves 3% apart', and where they disagree by more than a run is trusted at, that it is too short."""
    if probe.halves_spread is None:
        return ""
    return f"; its halves {probe.halves_spread:.0%} apart" + ("; too short to trust" if probe.too_short else "")


def _warm_label(diagnosis) -> str:
    """What the pipeline-alone probe read from: the page cache, or the storage every epoch reads again."""
    if not _in_store(diagnosis):
        return "warm cache"
    return "from the mount" if _storage(diagnosis).get("kind") == "network-fs" else "from the store"


def storage_line(diagnosis) -> str | None:
    """"storage: fuse mount, 20.3 ms per open + read, measured": where the data is and its round trip."""
    storage = _storage(diagnosis)
    if not storage:
        return None
    trip = storage.get("round_trip_ms")
    timed = f", {trip:.1f} ms per {storage['round_trip']}, measured" if trip is not None else ""
    return f"storage: {storage['label']}{timed}"


def _io_rows(diagnosis) -> list[tuple[str, str, str]]:
    """The local I/O per image of each probe (none for data in a store: the reads go over the network,
    where these counters do not see them)."""
    if _in_store(diagnosis):
        return []
    rows = []
    for probe in (diagnosis.cold, diagnosis.warm):
        if probe is None or probe.io_per_image is None:
            continue
        io = probe.io_per_image
        rows.append((f"{probe.cache_state} cache",
                     f"{io.bytes_read / 1024:.1f} KiB read ({io.storage_bytes / 1024:.1f} KiB from storage)",
                     f"{io.read_calls:.2f} read calls, {io.files_opened:.3f} files opened"))
    return rows


def report_lines(diagnosis, result=None) -> list[str]:
    """The terminal report: the split per step, I/O per image, what-ifs, advice, and the fix."""
    source = diagnosis.source
    parts = diagnosis.pipeline_breakdown
    lines = [
        f"diagnosis of {source['kind']} {source['path']} ({source['examples']} examples, "
        f"{source['bytes'] / 1e6:.1f} MB), pipeline {diagnosis.pipeline.preset}, accelerator {diagnosis.accelerator}",
        *([f"reader: {source['reader']}"] if source.get("reader", "TF local files") != "TF local files" else []),
        *([line] if (line := storage_line(diagnosis)) else []),
        f"probes took {diagnosis.seconds:.1f} s",
        "",
        "pipeline alone (per batch of %d)" % diagnosis.pipeline.batch_size,
        f"  {_warm_label(diagnosis):<16}{_ms(parts.warm_ms)}  ({_rate(diagnosis.warm.images_per_second)}; "
        f"{_ms(parts.cpu_ms)} CPU work on {parts.threads:g} core(s), {_ms(parts.waiting_ms)} waiting)",
    ]
    if diagnosis.reads is not None:
        reads = diagnosis.reads
        lines.append(f"  records alone   {reads.ms_per_image:.2f} ms per image read by one stream, "
                     f"{reads.cpu_ms_per_image:.2f} ms of it CPU ({_rate(1000.0 / reads.ms_per_image)}), no decode")
    if diagnosis.cold is not None:
        cached = diagnosis.cold.cached_before
        lines.append(f"  cold cache      {_ms(parts.cold_ms)}  ({_rate(diagnosis.cold.images_per_second)}; "
                     f"storage adds {_ms(parts.storage_ms)}"
                     + (f"; {cached * 100:.0f}% of pages cached at start" if cached is not None else "") + ")")
    for label, first, second in _io_rows(diagnosis):
        lines.append(f"  I/O per image, {label}: {first}, {second}")
    for phase in diagnosis.phases:
        lines += [
            "",
            f"phase {phase.phase}: {phase.verdict} input-bound ({_pct(phase.input_share)} of the step waits for input, "
            + (f"reading {_warm_label(diagnosis)}" if _in_store(diagnosis) else f"{phase.steady_cache} page cache")
            + (f"; {_pct(phase.cold_input_share)} with a cold cache" if diagnosis.cold is not None else "")
            + f"), cause: {phase.cause}",
            f"  step            {_ms(phase.step_ms)}  ({_rate(phase.end_to_end.images_per_second)}, "
            f"{'overlapped' if phase.overlapped else 'serial'} input and compute; mean of "
            f"{phase.end_to_end.steps} steps{_halves(phase.end_to_end)})",
            f"  compute         {_ms(phase.compute_ms)}  (batches from memory)",
            f"  preprocessing   {_ms(phase.preprocessing_stall_ms)}  stall per step (CPU)",
            f"  fetch           {_ms(phase.fetch_stall_ms)}  stall per step (storage, latency"
            + (f"; {_ms(phase.cold_fetch_stall_ms)} with a cold cache)" if diagnosis.cold is not None else ")"),
            f"  knee            input limits any device above {_rate(phase.knee_images_per_second)}; "
            f"highly input-bound above {_rate(phase.highly_bound_above)}",
            "  what if the device ran at:   "
            + ", ".join(f"{d.device_images_per_second:,.0f} -> {_pct(d.prediction.input_share)}"
                        for d in phase.devices),
            f"  what if more CPU cores than the {_cores(phase)} free here, stages parallel and prefetched "
            "(training images/s, input share): "
            + ", ".join(f"+{c.extra_cores} -> {c.prediction.images_per_second:,.0f} ({_pct(c.prediction.input_share)})"
                        for c in phase.cores),
            f"  data cached in memory:       {_ms(phase.cached.step_ms)} step, {_pct(phase.cached.input_share)} input "
            f"({phase.cached_basis if phase.cached_basis != 'measured' else 'measured: the end-to-end run, from the page cache'})"
            + (f"  (from storage: {_ms(phase.from_storage.step_ms)}, {_pct(phase.from_storage.input_share)})"
               if phase.from_storage else ""),
        ]
    if diagnosis.storage is not None or diagnosis.storage_whatif is not None:
        from stallscope.report.text import storage_lines

        lines += ["", *storage_lines(diagnosis.storage, diagnosis.storage_whatif)]
    lines += ["", "advice (highest predicted gain first)" if diagnosis.advice else f"advice: {no_advice(diagnosis)}"]
    own_dataset = diagnosis.source.get("kind") == "dataset"  # a dataset of the user's: its code, not our flags
    for number, advice in enumerate(diagnosis.advice, 1):
        knobs = (advice.command if own_dataset else fmt_knobs(advice.knobs) or advice.command)
        lines.append(f"  {number}. {advice.title}" + (f" ({knobs})" if knobs else "") + f"{_gain(advice)}: {advice.reason}")
        if own_dataset:
            lines += [f"     {code}" for code in advice.code.splitlines()]
        if advice.sizing is not None:
            lines += [f"     {line}" for line in service_lines(advice.sizing)]
    lines += [f"note: {note}" for note in diagnosis.notes]
    if result is not None:
        lines += ["", *fix_lines(result)]
    return lines


def _gain(advice) -> str:
    """", +62% predicted": the model's gain of one fix applied alone, where it predicts one."""
    if advice.predicted_gain is not None:
        return f", {advice.predicted_gain:+.0%} predicted"
    return ", gain not predicted" if advice.gain_basis.startswith("not predicted") else ""


def no_advice(diagnosis) -> str:
    """Why there is no advice: the pipeline keeps up, or (input-bound) nothing the model expects to help."""
    if diagnosis.verdict == "not":
        return "none, the pipeline keeps up"
    return (f"none, though {diagnosis.verdict} input-bound: no change the model expects to gain "
            "5% or more (see the what-ifs above)")


def _cores(phase) -> str:
    free = phase.cores[0].cores if phase.cores else 0
    return f"{free:.1f}".rstrip("0").rstrip(".")


def fix_lines(result) -> list[str]:
    lines = [f"fix applied: {', '.join(a.key for a in result.applied)} ({fmt_knobs(result.config_changes)})"]
    lines += [f"left out: {item.advice.key} (with the rest applied, the model predicts {item.without:,.0f} images/s "
              f"without it and {item.with_it:,.0f} with it)" for item in result.left_out]
    lines.append("predicted: the what-if model above (the same free cores), for the fixed pipeline")
    header = f"  {'':16}{'before':>12}{'predicted':>12}{'after':>12}"
    for phase in result.phases:
        lines += [
            f"phase {phase.phase}",
            header,
            f"  {'step time':16}{_ms(phase.before.step_ms):>12}{_ms(phase.predicted.step_ms):>12}"
            f"{_ms(phase.after.step_ms):>12}",
            f"  {'input share':16}{_pct(phase.before.input_share):>12}{_pct(phase.predicted.input_share):>12}"
            f"{_pct(phase.after.input_share):>12}",
            f"  {'images/s':16}{phase.before.images_per_second:>12,.0f}{phase.predicted.images_per_second:>12,.0f}"
            f"{phase.after.images_per_second:>12,.0f}",
        ]
    if result.trials:
        lines.append("tried (the advice fell short of its prediction by more than 25%, or stayed input-bound; "
                     "the best measured is kept):")
        best = max(result.trials, key=lambda t: t.images_per_second)
        for trial in result.trials:
            changed = {k: v for k, v in trial.config.to_dict().items()
                       if k in ("read_parallelism", "private_threadpool_size") and v != getattr(result.diagnosis.pipeline, k)}
            predicted = min(p.predicted.images_per_second for p in trial.phases)
            lines.append(f"  {trial.why:<34} {fmt_knobs(changed):<58} predicted {predicted:>7,.0f}  measured "
                         f"{trial.images_per_second:>7,.0f} images/s" + ("  <- kept" if trial is best else ""))
    lines.append("the advice held: the input share went down" if result.held
                 else "the advice did not hold: the input share did not go down in every phase")
    if result.config_path is not None:
        lines.append(f"fixed pipeline saved to {result.config_path}; reuse it with "
                     f"`stallscope train --pipeline-config {shlex.quote(str(result.config_path))}`")
    return lines


def _md_knobs(advice, own_dataset: bool = False) -> str:
    knobs = advice.command if own_dataset else fmt_knobs(advice.knobs) or advice.command
    return f" (`{knobs}`)" if knobs else ""


def _md_advice(diagnosis) -> list[str]:
    """The advice as a numbered list; for a dataset of the user's, each with its code, not stallscope's flags."""
    own_dataset = diagnosis.source.get("kind") == "dataset"
    lines = []
    for number, advice in enumerate(diagnosis.advice, 1):
        lines.append(f"{number}. **{advice.title}**{_md_knobs(advice, own_dataset)}{_gain(advice)}: {advice.reason}")
        if own_dataset and advice.code:
            lines += ["", "   ```python", *[f"   {code}" for code in advice.code.splitlines()], "   ```"]
        if advice.sizing is not None:
            from stallscope.report.markdown import service_markdown

            lines += ["", *service_markdown(advice.sizing, indent="   ")]
    return lines


def markdown_lines(diagnosis, result=None) -> list[str]:
    parts = diagnosis.pipeline_breakdown
    lines = [
        f"# Diagnosis: {diagnosis.verdict} input-bound, cause: {diagnosis.cause}",
        "",
        f"Source `{diagnosis.source['path']}` ({diagnosis.source['kind']}, {diagnosis.source['examples']} examples), "
        f"pipeline `{diagnosis.pipeline.preset}`, accelerator `{diagnosis.accelerator}`; probes took "
        f"{diagnosis.seconds:.1f} s."
        + (f" {line[0].upper()}{line[1:]}." if (line := storage_line(diagnosis)) else ""),
        "",
        "## Per step",
        "",
        "| phase | step | compute | preprocessing stall | fetch stall | input share | verdict | cause |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in diagnosis.phases:
        lines.append(f"| {p.phase} | {_ms(p.step_ms)} | {_ms(p.compute_ms)} | {_ms(p.preprocessing_stall_ms)} | "
                     f"{_ms(p.fetch_stall_ms)} | {_pct(p.input_share)} | {p.verdict} | {p.cause} |")
    lines += ["", "## Pipeline alone", "",
              f"- {_warm_label(diagnosis)}: {_ms(parts.warm_ms)} per batch ({_ms(parts.cpu_ms)} CPU work on {parts.threads:g} "
              f"core(s), {_ms(parts.waiting_ms)} waiting)"]
    if parts.cold_ms is not None:
        lines.append(f"- cold cache: {_ms(parts.cold_ms)} per batch (storage adds {_ms(parts.storage_ms)})")
    for label, first, second in _io_rows(diagnosis):
        lines.append(f"- I/O per image, {label}: {first}, {second}")
    lines += ["", "## What if", "", "| phase | device images/s | step | input share | verdict |", "|---|---|---|---|---|"]
    for p in diagnosis.phases:
        for d in p.devices:
            lines.append(f"| {p.phase} | {d.device_images_per_second:,.0f} | {_ms(d.prediction.step_ms)} | "
                         f"{_pct(d.prediction.input_share)} | {d.prediction.verdict} |")
    if diagnosis.storage is not None or diagnosis.storage_whatif is not None:
        from stallscope.report.markdown import storage_markdown

        lines += ["", *storage_markdown(diagnosis.storage, diagnosis.storage_whatif)]
    lines += ["", "## Advice", ""]
    lines += _md_advice(diagnosis) or [f"None: {no_advice(diagnosis).split(', ', 1)[1]}."]
    if diagnosis.notes:
        lines += ["", *[f"> note: {note}" for note in diagnosis.notes]]
    if result is not None:
        lines += ["", "## Fix", "", "```", *fix_lines(result), "```"]
    return lines
