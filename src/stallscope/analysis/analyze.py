"""`analyze_run(path) -> Analysis`: everything `stallscope analyze` reports, as numbers.

A path may be a run directory (profile under plugins/profile, plus the run's own steps.csv,
pipeline.json and resources.json), a capture directory, or a `.xplane.pb` file. A profile inside a
run directory is matched back to its run, so the run's own files are read either way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from stallscope.analysis import advice as advice_module
from stallscope.analysis.checklist import CheckItem, checklist, input_bound
from stallscope.analysis.cpu_window import CpuWindow, cpu_over_steps
from stallscope.analysis.fetch_wait import FetchWait, fetch_wait
from stallscope.analysis.rewrites import Rewrite, config_rewrites, rewrites
from stallscope.analysis.steps import RunTiming, StepBreakdown, XprofFigure, run_timing, step_breakdown, xprof_figure
from stallscope.analysis.stored_images import StoredImages, stored_images
from stallscope.analysis.service_sizing import ServiceAssumptions
from stallscope.analysis.tfdata import SERVED_NOTE, StageTree, served, stage_tree
from stallscope.analysis.xplane import XPLANE_SUFFIX, capture_files, find_captures, load_profile
from stallscope.config import json_ready
from stallscope.errors import StallscopeError
from stallscope.pipeline.config import PipelineConfig
from stallscope.verdict import verdict_for
from stallscope.workload import rundir

log = logging.getLogger(__name__)

FEW_STEPS = 5   # a verdict from fewer counted steps is one slow or fast step away from another


@dataclasses.dataclass(frozen=True)
class HostSteps:
    """One host of a capture: its file and its step breakdown (the report's per-host line)."""

    host: str
    profile_path: str
    steps: StepBreakdown

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "profile": self.profile_path, "steps": self.steps.counted_steps,
                "step_ms": self.steps.step_ms.mean, "input_ms": self.steps.input_ms.mean,
                "input_share": self.steps.input_share, "verdict": self.steps.verdict}


@dataclasses.dataclass(frozen=True)
class Analysis:
    source: str                       # the path the user gave
    profile_path: str
    run_dir: str | None
    steps: StepBreakdown
    tree: StageTree
    checklist: tuple[CheckItem, ...]
    advice: tuple["advice_module.Advice", ...]
    xprof: XprofFigure | None
    run: RunTiming | None
    config: PipelineConfig | None     # the pipeline the run asked for (pipeline.json "requested")
    written_chain: tuple[str, ...]
    ran_chain: tuple[str, ...]
    rewrites: tuple[Rewrite, ...]
    notes: tuple[str, ...]
    captures: tuple[str, ...] = ()    # every capture found under the path given, oldest first
    hosts: tuple[HostSteps, ...] = ()  # every host file of the capture; the analysis is of the slowest
    decodes_images: bool | None = None  # pipeline.json's word on whether the dataset decodes images (None: unsaid)
    checked: tuple["advice_module.Advice", ...] = ()  # weighed, not advised: under 5% predicted, or unpredicted
    cpu_window: CpuWindow | None = None  # the CPU over the training steps (resources.json samples, steps.csv)
    stored: StoredImages | None = None   # the stored images' size (stallscope's own runs: summary.json's source)
    image_size: int | None = None        # the model's input side (the run's summary.json)
    examples: int | None = None          # images in the data set (the run's summary.json)
    service: ServiceAssumptions = ServiceAssumptions()  # the service's link and workers' cores, where given
    fetch: FetchWait | None = None       # the wait is reads from a remote store (latency-bound), where it is
    batch_size: int | None = None        # images per batch (the run's summary.json)
    device_images_per_second: float | None = None  # the emulated device's pace (the run's summary.json)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What makes the verdict shaky: too few counted steps (the window's, where the verdict is the window's)."""
        counted = self.steps.counted_steps
        if self.input_share is None or counted >= FEW_STEPS or self.headline_from == "steps.csv":
            return ()
        per = self.steps.batches_per_step
        spe = (f"; under steps_per_execution={per} a window of N batches holds only about N/{per} steps, so "
               f"widen profile_steps" if per > 1 else "")
        return (f"only {counted} step{'' if counted == 1 else 's'} counted: a verdict from fewer than {FEW_STEPS} "
                f"moves with one slow or fast step; profile more steps (a window of {FEW_STEPS + 2} or more "
                f"marked steps){spe}",)

    @property
    def slowest_host(self) -> str | None:
        """The host the others wait for: the most input wait per step (the one analysed)."""
        return slowest(self.hosts).host if len(self.hosts) > 1 else None

    @property
    def headline_from(self) -> str:
        """Which figure the verdict is: 'steps.csv' (every measured step of the run, where stallscope's own
        run timed each step's input wait; a program's own loop times them less surely, its first steps
        included) or 'profile' (the profiled window's steps). One verdict per run:
        a window of steps served from a filled shuffle buffer can miss the refill steps the run waited on."""
        own_run = self.config is not None  # stallscope's own workload: pipeline.json has the requested config
        return "steps.csv" if own_run and self.run is not None and self.run.input_share is not None else "profile"

    @property
    def input_share(self) -> float | None:
        """Input wait / step time (0..1) of the headline's figure; None when not measured."""
        return self.run.input_share if self.headline_from == "steps.csv" else self.steps.input_share

    @property
    def input_wait_ms(self) -> float | None:
        """Mean input wait per step of the headline's figure."""
        if self.headline_from == "steps.csv":
            return self.run.input_ms.mean if self.run.input_ms is not None else None
        return self.steps.input_ms.mean if self.steps.input_share is not None else None

    @property
    def verdict(self) -> str | None:
        """'highly', 'moderately' or 'not' input-bound; None with an unmeasured share."""
        return verdict_for(self.input_share) if self.headline_from == "steps.csv" else self.steps.verdict

    @property
    def window_disagrees(self) -> bool:
        """The profiled window's verdict differs from the run's own steps' (the headline's)."""
        return (self.headline_from == "steps.csv" and self.steps.input_share is not None
                and self.steps.verdict != self.verdict)

    @property
    def input_bound(self) -> bool:
        """Whether the run waits for input (the headline's verdict is 'highly' or 'moderately')."""
        if self.headline_from == "steps.csv":
            return self.verdict in ("highly", "moderately")
        return input_bound(self.steps)

    @property
    def slowest_stage(self) -> str | None:
        """The stage seed-004's walk stops at, whether or not the run waits for it."""
        stage = self.tree.bottleneck_stage
        return stage.name if stage else None

    @property
    def bottleneck(self) -> str | None:
        """What holds the run back where it is input-bound: 'fetch' for reads from a remote store
        (latency-bound), else the slowest stage; None when the input keeps up."""
        if not self.input_bound:
            return None
        return "fetch" if self.fetch is not None else self.slowest_stage

    @property
    def stage_label(self) -> str:
        """What the reports call the walk's stage: a 'bottleneck' only when the run is input-bound."""
        return "bottleneck" if self.input_bound else "slowest stage"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `input_share` (0..1) and `bottleneck` (stage name) at the top level; the share,
        verdict, input_bound and the input/compute split are null where the share was not measured."""
        stages = [dict(dataclasses.asdict(s), busy_ms=s.busy_ms) for s in self.tree.stages]
        measured = self.input_share is not None
        return json_ready({
            "input_share": self.input_share,
            "bottleneck": self.bottleneck,
            "slowest_stage": self.slowest_stage,
            "input_bound": self.input_bound if measured else None,
            "verdict": self.verdict,
            "input_share_from": self.headline_from if measured else None,
            "window_input_share": self.steps.input_share,
            "window_verdict": self.steps.verdict,
            "fetch": dict(dataclasses.asdict(self.fetch), text=self.fetch.text()) if self.fetch else None,
            "source": self.source,
            "profile": self.profile_path,
            "run_dir": self.run_dir,
            "captures": list(self.captures),
            "hosts": [h.to_dict() for h in self.hosts],
            "slowest_host": self.slowest_host,
            "steps": {
                "found_by": self.steps.method,
                "batches_per_step": self.steps.batches_per_step,
                "has_iterator": self.steps.has_iterator,
                "counted": self.steps.counted_steps,
                "step_ms": dataclasses.asdict(self.steps.step_ms),
                "input_ms": dataclasses.asdict(self.steps.input_ms) if measured else None,
                "compute_ms": dataclasses.asdict(self.steps.compute_ms) if measured else None,
                "get_next_mean_us": self.steps.get_next_mean_us if measured else None,
                "between_steps": dataclasses.asdict(self.steps.between) if self.steps.between else None,
                "per_step": [dataclasses.asdict(s) for s in self.steps.steps],
            },
            "xprof": dataclasses.asdict(self.xprof) if self.xprof else None,
            "run_timing": dataclasses.asdict(self.run) if self.run else None,
            "stages": stages,
            "bottleneck_stage": self.tree.bottleneck,
            "bottleneck_walk": list(self.tree.walk),
            "bottleneck_reason": self.tree.reason,
            "checklist": [dataclasses.asdict(c) for c in self.checklist],
            "advice": [a.to_dict() for a in self.advice],
            "checked": [a.to_dict() for a in self.checked],
            "warnings": list(self.warnings),
            "cpu_over_steps": dataclasses.asdict(self.cpu_window) if self.cpu_window else None,
            "stored_images": dataclasses.asdict(self.stored) if self.stored else None,
            "pipeline": {
                "requested": self.config.to_dict() if self.config else None,
                "written": list(self.written_chain),
                "ran": list(self.ran_chain),
                "rewrites": [dict(dataclasses.asdict(r), text=r.describe()) for r in self.rewrites],
            },
            "notes": list(self.notes),
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def analyze_run(path: Path | str, *, with_xprof: bool = True, capture: str | None = None,
                service: ServiceAssumptions = ServiceAssumptions()) -> Analysis:
    """Reads the profile (and the run's own files when there is a run) and diagnoses it.

    A directory is searched for captures at any depth (a Keras log's train/ and validation/);
    the newest is read unless `capture` names another. `service`: the tf.data service's link and
    workers' cores where the user said them, for the service advice's sizing (else assumed).
    """
    files = capture_files(path, capture=capture)
    captures = find_captures(path) if Path(path).is_dir() else [files[0].parent]
    hosts, profiles = [], {}
    for file in files:
        profiles[str(file)] = load_profile(file)
        hosts.append(HostSteps(file.name.removesuffix(XPLANE_SUFFIX), str(file), step_breakdown(profiles[str(file)])))
    chosen = slowest(hosts)
    profile_file, profile, steps = Path(chosen.profile_path), profiles[chosen.profile_path], chosen.steps
    run_dir = _run_dir_of(Path(path), profile_file)
    tree = stage_tree(profile)
    notes: list[str] = []
    if steps.input_share is None:
        notes.append(_unmeasured_note(steps))
    resources = _optional_json(run_dir, rundir.RESOURCES_NAME, notes) if run_dir else None
    pipeline = _optional_json(run_dir, rundir.PIPELINE_NAME, []) if run_dir else None  # its absence: a note below
    summary = _optional_json(run_dir, rundir.SUMMARY_NAME, []) if run_dir else None
    run, window = None, None
    if run_dir is not None and (run_dir / rundir.STEPS_NAME).exists():
        records = rundir.read_steps(run_dir)
        run, window = run_timing(records), cpu_over_steps(resources, records)
    config = _requested_config(pipeline, notes)
    decodes = pipeline.get("decodes_images") if isinstance(pipeline, dict) else None
    written = tuple(_chain(pipeline, "written"))
    ran = tuple(_chain(pipeline, "ran")) or tuple(tree.chain())
    if written:
        changes = rewrites(written, ran)
    elif config is not None:
        changes = config_rewrites(config, ran)
    else:
        changes = ()
        notes.append("no pipeline.json with the written chain or requested config: TF's rewrites are not shown")
    on_service = served([s.name for s in tree.stages]) or served(ran) or served(written)
    if on_service:
        notes.append(SERVED_NOTE)
    figure = xprof_figure(profile_file) if with_xprof else None
    partial = Analysis(
        source=str(path), profile_path=str(profile_file), run_dir=str(run_dir) if run_dir else None,
        steps=steps, tree=tree, checklist=checklist(steps, tree, resources, window), advice=(), xprof=figure, run=run,
        config=config, written_chain=written, ran_chain=ran, rewrites=changes, notes=tuple(notes),
        captures=tuple(str(c) for c in captures), hosts=tuple(hosts),
        decodes_images=decodes if isinstance(decodes, bool) else None,
        cpu_window=window, stored=stored_images(summary), image_size=_summary_int(summary, "image_size", config),
        examples=_summary_int(summary, "dataset_size", None), service=service,
        batch_size=_summary_int(summary, "batch_size", None), device_images_per_second=_device_pace(summary),
    )
    walked = tree.bottleneck_stage  # the window's stage where it is one that reads (a seed map reads each file)
    reading = walked.name if walked is not None and advice_module.reads_files(walked) else None
    partial = dataclasses.replace(partial, fetch=fetch_wait(
        summary, window, input_share=partial.input_share if partial.input_bound else None,
        wait_ms=partial.input_wait_ms, batch_size=partial.batch_size, stage=reading))
    cpu = resources.get("cpu") if isinstance(resources, dict) else None
    advised = advice_module.recommend(partial, config, cpu=cpu)
    if on_service:  # already served: more CPU is the workers' (more of them), not a service to start
        advised = [a for a in advised if a.key != "data_service"]
    fixes, checked = advice_module.split_by_gain(advised)
    return dataclasses.replace(partial, advice=tuple(fixes), checked=tuple(checked))


def _summary_int(summary: dict[str, Any] | None, key: str, config: PipelineConfig | None) -> int | None:
    """A positive whole number from summary.json, else (image_size) the requested config's."""
    value = (summary or {}).get(key) if isinstance(summary, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return config.image_size if config is not None and key == "image_size" else None


def _device_pace(summary: dict[str, Any] | None) -> float | None:
    """The emulated device's images/s (summary.json's accelerator), None for a real model or unsaid."""
    accelerator = (summary or {}).get("accelerator") if isinstance(summary, dict) else None
    pace = accelerator.get("images_per_second") if isinstance(accelerator, dict) else None
    return float(pace) if isinstance(pace, (int, float)) and not isinstance(pace, bool) and pace > 0 else None


def _unmeasured_note(steps: StepBreakdown) -> str:
    """Why the share is not measured: the iterator runs outside the step markers, or there is none."""
    if steps.between is not None:
        return ("the tf.data iterator's IteratorGetNext runs between the step markers, not inside them (a "
                "`for x in dataset:` loop fetches the batch before the step marker opens): the input share is not "
                "measurable from the steps; fetch the batch inside the marker (see Fix)")
    return ("no tf.data iterator events in the profiled steps (input fed as NumPy arrays or tensors?): the input "
            "share is not measurable from this profile")


def slowest(hosts: list[HostSteps] | tuple[HostSteps, ...]) -> HostSteps:
    """In synchronous training every host waits for the one whose input is slowest."""
    return max(hosts, key=lambda h: (h.steps.input_ms.mean, h.steps.step_ms.mean))


def _run_dir_of(given: Path, profile_file: Path) -> Path | None:
    """The run directory of the capture: its own folder where it keeps copies of the run files
    (stallscope.profile), the one holding plugins/profile/<capture>/file, or holding that in
    profile/ (StallMonitor; an earlier fit's in LOG_DIR/fit-K/); else the path given."""
    holder = profile_file.parent.parent.parent.parent
    mine = [profile_file.parent, holder, *([holder.parent] if holder.name == rundir.MONITOR_PROFILE_DIR else [])]
    for candidate in (*mine, given):
        if candidate.is_dir() and any((candidate / name).exists() for name in
                                      (rundir.STEPS_NAME, rundir.SUMMARY_NAME, rundir.PIPELINE_NAME,
                                       rundir.RESOURCES_NAME)):
            return candidate
    return None


def _optional_json(run_dir: Path, name: str, notes: list[str]) -> dict[str, Any] | None:
    if not (run_dir / name).exists():
        notes.append(f"{run_dir / name}: missing")
        return None
    return rundir.read_json(run_dir, name)


def _requested_config(pipeline: dict[str, Any] | None, notes: list[str]) -> PipelineConfig | None:
    requested = (pipeline or {}).get("requested")
    if not isinstance(requested, dict):
        return None
    try:
        return PipelineConfig.from_dict(requested, source="pipeline.json requested")
    except StallscopeError as exc:
        notes.append(f"pipeline.json: the requested config could not be read ({exc}); advice ignores it")
        return None


def _chain(pipeline: dict[str, Any] | None, key: str) -> list[str]:
    value = (pipeline or {}).get(key)
    if isinstance(value, dict):  # {"chain": [...], ...}
        value = value.get("chain")
    return [str(v) for v in value] if isinstance(value, list) else []
