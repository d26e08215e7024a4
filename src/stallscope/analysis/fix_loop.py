"""`diagnose --fix`: the advice applied as a new pipeline config, measured again beside its prediction;
where it falls short, the next candidates measured in turn (a bounded search), and the best measured
config saved where `train --pipeline-config` reads it.

The prediction of every candidate is `differential.predict_change`, the model behind each advice's gain,
so the fix's predicted column and the advice can never show two figures for one change.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope.analysis import whatif
from stallscope.analysis.advice import Advice, apply_advice
from stallscope.analysis.differential import (
    MODELLED_KNOBS,
    Diagnosis,
    DiagnoseOptions,
    PhaseDiagnosis,
    PipelineBreakdown,
    Prober,
    ProbeRunDirs,
    finite,
    free_cores,
    open_probed_source,
    predict_change,
)
from stallscope.analysis.probes import LoopProbe
from stallscope.config import AUTOTUNE, json_ready
from stallscope.errors import UsageError
from stallscope.pipeline.config import PipelineConfig
from stallscope.pipeline.presets import NETWORK_FS_READS_IN_FLIGHT, NETWORK_FS_SHARDS_IN_FLIGHT
from stallscope.storage.under import storage_under

if TYPE_CHECKING:
    from stallscope.analysis.storage_whatif import StorageWhatIf
    from stallscope.pipeline.sources import DataSource

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PhaseFix:
    phase: str
    before: LoopProbe
    predicted: whatif.Prediction
    after: LoopProbe


# The fix loop goes on past the advice where the run falls short of its prediction by more than this
# share, or stays input-bound; at most SEARCH_MOST_TRIES more runs.
SEARCH_SHORTFALL = 0.25
SEARCH_MOST_TRIES = 3
MOST_READS_IN_FLIGHT = 128


@dataclasses.dataclass(frozen=True)
class FixTrial:
    """One measured candidate of the fix loop: the config, why it was tried, each phase's run."""

    config: PipelineConfig
    why: str
    phases: tuple[PhaseFix, ...]

    @property
    def images_per_second(self) -> float:
        """The slowest phase's measured images/s: what the candidate is judged by."""
        return min(p.after.images_per_second for p in self.phases)

    @property
    def short_of_prediction(self) -> float:
        """How far the slowest phase fell below its prediction (0.4: 40% short; <= 0: met it)."""
        return max(1.0 - p.after.images_per_second / p.predicted.images_per_second
                   if p.predicted.images_per_second > 0 else 0.0 for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        return {"why": self.why, "pipeline": self.config.to_dict(), "images_per_second": self.images_per_second,
                "phases": [{"phase": p.phase, "predicted": p.predicted.to_dict(), "after": p.after.to_dict()}
                           for p in self.phases]}


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """An advice the fix did not apply: beside the rest, the model predicts the run faster without it."""

    advice: Advice
    with_it: float   # images/s predicted with every applied advice and this one
    without: float   # ... and without this one

    def to_dict(self) -> dict[str, Any]:
        return {"advice": self.advice.key, "predicted_with_it": self.with_it, "predicted_without": self.without}


@dataclasses.dataclass(frozen=True)
class FixResult:
    """`diagnose --fix`: the advice applied, the re-run (and the candidates tried after it), and where
    the best measured config was saved."""

    diagnosis: Diagnosis
    applied: tuple[Advice, ...]
    config: PipelineConfig
    phases: tuple[PhaseFix, ...]
    config_path: Path | None
    trials: tuple[FixTrial, ...] = ()
    left_out: tuple[LeftOut, ...] = ()

    @property
    def config_changes(self) -> dict[str, Any]:
        """The knobs the fix changed, with their new values."""
        old = self.diagnosis.pipeline.to_dict()
        return {k: v for k, v in self.config.to_dict().items() if k != "preset" and old.get(k) != v}

    @property
    def held(self) -> bool:
        """Whether the fix lowered the input share in every phase (the advice held)."""
        return all(p.after.input_share <= p.before.input_share for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        return finite(json_ready({
            "applied": [a.to_dict() for a in self.applied],
            "left_out": [item.to_dict() for item in self.left_out],
            "pipeline": self.config.to_dict(),
            "config_path": str(self.config_path) if self.config_path else None,
            "held": self.held,
            "phases": [{"phase": p.phase, "before": p.before.to_dict(), "predicted": p.predicted.to_dict(),
                        "after": p.after.to_dict()} for p in self.phases],
            "tried": [t.to_dict() for t in self.trials],
        }))


def next_candidates(best: PipelineConfig, *, remote: bool, cores: float, kind: str = "files",
                    gs: bool = False) -> list[tuple[str, PipelineConfig]]:
    """What the fix loop tries after a candidate that fell short: on gs:// read by TF's own client,
    stallscope's pooled reader (kept-alive connections: TF's pays a handshake per request, which the
    model prices only for files); shards read one at a time, read in parallel (a parallel interleave,
    elements free to overtake); on remote storage, reads on tf.data's shared pool given a private one,
    and reads in flight doubled and halved (the storage may serve fewer at once than the model assumes,
    or the reads may crowd out the decode), each on a private pool of the reads plus the cores."""
    reads = best.read_parallelism
    whole = max(1, math.ceil(cores))
    if gs and best.gcs_reader == "tf":
        count = reads if isinstance(reads, int) and reads > 0 else whole
        return [(f"stallscope's pooled gs:// reader, {count} read{'s' if count != 1 else ''} in flight",
                 best.replace(gcs_reader="pooled", read_parallelism=count, private_threadpool_size=count + whole,
                              deterministic=False))]
    if reads is None and kind == "records":
        return [("shards read in parallel", best.replace(read_parallelism=AUTOTUNE, deterministic=False))]
    if remote and reads == AUTOTUNE:  # tf.data's shared pool holds about a read per core: give them their own
        count = NETWORK_FS_SHARDS_IN_FLIGHT if kind == "records" else NETWORK_FS_READS_IN_FLIGHT
        return [(f"{count} reads in flight on a private pool",
                 best.replace(read_parallelism=count, private_threadpool_size=count + whole, deterministic=False))]
    if not remote or reads is None or reads == AUTOTUNE:
        return []
    found = []
    for label, count in (("reads in flight x2", min(MOST_READS_IN_FLIGHT, reads * 2)),
                         ("reads in flight /2", max(whole, reads // 2))):
        if count != reads:
            found.append((f"{label} ({reads} -> {count})",
                          best.replace(read_parallelism=count, private_threadpool_size=count + whole)))
    return found


def first_candidates(fixed: PipelineConfig, *, remote: bool, cores: float, kind: str = "files",
                     gs: bool = False) -> list[tuple[str, PipelineConfig]]:
    """What the fix loop tries first after the advice fell short: a prefetch at the end where the fixed
    config has none (the advice priced it away beside a shuffle that refilled, but once the decode keeps
    up the device's step is what a prefetch hides: records on s3:// at 10 ms, the fix without it 1,090
    images/s where by hand with it 1,753, benchmarks/advice.py), then `next_candidates`."""
    prefetch = [("a prefetch at the end", fixed.replace(prefetch=AUTOTUNE))] if fixed.prefetch is None else []
    return prefetch + next_candidates(fixed, remote=remote, cores=cores, kind=kind, gs=gs)


def predicted_rate(phases: tuple[PhaseDiagnosis, ...], parts: PipelineBreakdown, config: PipelineConfig,
                   new: PipelineConfig, *, cores: float, what: StorageWhatIf | None, examples: int) -> float:
    """The images/s the model predicts for `new`, where `config` was measured, in the slowest phase."""
    return min(predict_change(phase, parts, config, new, cores=cores, what=what, examples=examples).images_per_second
               for phase in phases)


def combined_advice(phases: tuple[PhaseDiagnosis, ...], parts: PipelineBreakdown, config: PipelineConfig,
                    applicable: tuple[Advice, ...], *, cores: float, what: StorageWhatIf | None,
                    examples: int) -> tuple[tuple[Advice, ...], tuple[LeftOut, ...]]:
    """The advice to apply together. Each advice is priced alone, and two that each gain alone may not
    gain together: one whose knobs the model sees is left out where the model predicts the rest faster
    without it (from the last, the least gain, up). Records on the 10 ms mount: the shuffle moved before
    the decode gained alone on the seed, but beside reads in flight it puts each epoch's reads before its
    decode: 1,013 images/s with it, 1,511 without (benchmarks/advice.py)."""
    kept = list(applicable)
    left: list[LeftOut] = []

    def rate(items: list[Advice]) -> float:
        return predicted_rate(phases, parts, config, apply_advice(config, items), cores=cores, what=what,
                              examples=examples)

    for item in reversed(applicable):
        if len(kept) == 1 or any(k not in MODELLED_KNOBS for k in item.knobs):
            continue
        others = [a for a in kept if a is not item]
        with_it, without = rate(kept), rate(others)
        if without > with_it:
            kept = others
            left.append(LeftOut(item, with_it=with_it, without=without))
    return tuple(kept), tuple(left)


def fix(options: DiagnoseOptions, diagnosis: Diagnosis, *, save_to: Path | None = None,
        progress: Callable[[str], None] | None = None, source: DataSource | None = None) -> FixResult:
    """Applies the diagnosis' advice (`combined_advice`) as a new PipelineConfig, runs the end-to-end probe again and
    sets before, predicted and after side by side. Where the run falls short of the prediction by more
    than SEARCH_SHORTFALL, or stays input-bound, it tries the next candidates
    (`first_candidates`, then `next_candidates` of each that does best, at most SEARCH_MOST_TRIES more runs) and keeps the best measured; saves that
    config where `train --pipeline-config FILE` reads it. `source`: the one the diagnosis probed."""
    say = progress or (lambda message: logger.info("%s", message))
    applicable = tuple(a for a in diagnosis.advice if a.knobs)
    if not applicable:
        raise UsageError("--fix: the diagnosis advises no pipeline change "
                         f"({diagnosis.verdict} input-bound); nothing to apply")
    old = diagnosis.pipeline
    if source is None:
        source = open_probed_source(options)
    cores = free_cores(diagnosis.warm)
    remote = storage_under(source.path).remote
    examples = source.num_examples
    what = diagnosis.storage_whatif if remote else None
    applicable, left_out = combined_advice(diagnosis.phases, diagnosis.pipeline_breakdown, old, applicable,
                                           cores=cores, what=what, examples=examples)
    for item in left_out:
        say(f"left out {item.advice.key}: predicted {item.without:,.0f} images/s without it beside the rest, "
            f"{item.with_it:,.0f} with it")
    new = apply_advice(old, applicable).replace(preset="custom" if old.preset == "custom" else f"{old.preset}+fix")
    trials: list[FixTrial] = []
    with ProbeRunDirs(options) as work_dir:
        prober = Prober(options, source, work_dir)
        prober.counter = 50

        def measure(config: PipelineConfig, why: str) -> FixTrial:
            phases = []
            for phase in diagnosis.phases:
                say(f"re-run with the fixed pipeline ({phase.phase}): {why}")
                after = prober.end_to_end(config, phase.phase, phase.end_to_end.steps)  # the diagnosis' window
                phases.append(PhaseFix(phase=phase.phase, before=phase.end_to_end,
                                       predicted=predict_change(phase, diagnosis.pipeline_breakdown, old, config,
                                                                cores=cores, what=what, examples=examples),
                                       after=after))
            return FixTrial(config=config, why=why, phases=tuple(phases))

        trials.append(measure(new, "the advice"))
        gs = str(source.path).startswith("gs://")
        queue = first_candidates(new, remote=remote, cores=cores, kind=source.kind, gs=gs)
        while queue and len(trials) <= SEARCH_MOST_TRIES:
            best = max(trials, key=lambda t: t.images_per_second)
            still_bound = any(p.after.verdict != "not" for p in best.phases)
            if best.short_of_prediction <= SEARCH_SHORTFALL and not still_bound:
                break
            why, candidate = queue.pop(0)
            if any(t.config == candidate for t in trials):
                continue
            trials.append(measure(candidate, why))
            if trials[-1] is max(trials, key=lambda t: t.images_per_second):
                queue = next_candidates(candidate, remote=remote, cores=cores, kind=source.kind, gs=gs) + queue
    best = max(trials, key=lambda t: t.images_per_second)
    result = FixResult(diagnosis=diagnosis, applied=applicable, config=best.config, phases=best.phases,
                       config_path=Path(save_to) if save_to is not None else None,
                       trials=tuple(trials) if len(trials) > 1 else (), left_out=left_out)
    if save_to is not None:
        save_fixed_config(result, Path(save_to))
    return result


def save_fixed_config(result: FixResult, path: Path) -> None:
    """{"pipeline": config, ...the evidence}: `PipelineConfig.load` reads the wrapped config."""
    from stallscope.jsonfile import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {**result.to_dict(), "changed": True, "diagnosis": result.diagnosis.to_dict()})


@dataclasses.dataclass(frozen=True)
class NoPipelineChange:
    """`diagnose --fix` where no pipeline change applies: the diagnosed config is saved unchanged, so the
    command after it (`train --pipeline-config FILE`) runs whatever the verdict, and the file says why
    nothing changed and which advice lies outside the pipeline config (a tf.data service, re-converting)."""

    diagnosis: Diagnosis
    reason: str
    outside: tuple[Advice, ...]
    config_path: Path | None

    @property
    def config(self) -> PipelineConfig:
        return self.diagnosis.pipeline

    def to_dict(self) -> dict[str, Any]:
        return finite(json_ready({
            "changed": False,
            "note": self.reason,
            "pipeline": self.config.to_dict(),
            "config_path": str(self.config_path) if self.config_path else None,
            "advice_outside_the_pipeline": [a.to_dict() for a in self.outside],
        }))


def no_change_reason(diagnosis: Diagnosis) -> str:
    """Why the diagnosed pipeline is kept as it is: it keeps up, or no advice is a pipeline change."""
    share = f"{diagnosis.input_share:.1%} of the step waits for input"
    outside = [a for a in diagnosis.advice if not a.knobs]
    if outside:
        return (f"no change to the pipeline config: {diagnosis.verdict} input-bound ({share}), and the advice "
                f"lies outside it ({', '.join(a.key for a in outside)})")
    if diagnosis.verdict == "not":
        return f"no change needed: not input-bound ({share}), the pipeline keeps up"
    return (f"no change to the pipeline config: {diagnosis.verdict} input-bound ({share}), but no change the "
            "model expects to gain 5% or more")


def keep_config(diagnosis: Diagnosis, *, save_to: Path | None = None) -> NoPipelineChange:
    """`diagnose --fix` with no advice that changes the pipeline: the diagnosed config, saved unchanged
    where `train --pipeline-config FILE` reads it, with the reason and any advice outside the config."""
    if any(a.knobs for a in diagnosis.advice):
        raise UsageError("--fix: the diagnosis advises a pipeline change; apply it with fix(), not keep_config()")
    result = NoPipelineChange(diagnosis=diagnosis, reason=no_change_reason(diagnosis),
                              outside=tuple(a for a in diagnosis.advice if not a.knobs),
                              config_path=Path(save_to) if save_to is not None else None)
    if save_to is not None:
        from stallscope.jsonfile import write_json_atomic

        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(save_to), {**result.to_dict(), "diagnosis": diagnosis.to_dict()})
    return result
