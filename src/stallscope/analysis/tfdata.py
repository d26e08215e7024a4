"""The tf.data stage tree from a profile's `Iterator::...` events, and seed-004's bottleneck walk.

Each `Iterator::` event's metadata name is its long name (`Iterator::Root::Prefetch::BatchV2`): the
chain from the outermost stage down to it, so the tree is built from names alone. Synchronous stages
(Map, Batch, ...) run their inputs nested on the same thread, so own time = their time minus the
nested input events. Asynchronous stages (Prefetch, ParallelMap, ParallelInterleave, MapAndBatch)
run their inputs on other threads: their consumer-side events are waiting, not work. Their work is
the user function they run, found by the function call ids inside their producer events (whose
input events name the stage by `parent_id`) and the executions carrying the same id elsewhere.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

from stallscope.analysis.xplane import Event, Profile, ps_to_ms

ITERATOR_PREFIX = "Iterator::"
ROOT_NAMES = ("Root", "Model")
ASYNC_PREFIXES = ("Prefetch", "LegacyPrefetch", "ParallelMap", "ParallelInterleave", "MapAndBatch",
                  "ParallelBatch", "ParallelFilter", "DataService")
FUNCTION_CALLS = ("InstantiatedCapturedFunction::RunAsync", "InstantiatedCapturedFunction::Run")
FUNCTION_EXECUTIONS = ("ExecutorState::Process", "FunctionRun")
_INDEX = re.compile(r"\[\d+\]")
# `...ParallelInterleaveV4[3]::FlatMap`: the parent's function made it for its input's element 3
_PER_ELEMENT = re.compile(r"(Interleave|FlatMap)[A-Za-z0-9]*\[\d+\]::[^:]+$")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One transformation or source of the pipeline, with the time it took (ms, summed over calls)."""

    long_name: str             # Iterator::Root::Prefetch::BatchV2 (per-element indices removed)
    name: str                  # BatchV2
    dataset: str               # the op's own name from the stats, e.g. BatchDatasetV2:2
    depth: int                 # 0 for the outermost stage below Root
    asynchronous: bool
    calls: int
    total_ms: float            # time in its events (for async stages: the consumer waiting)
    own_ms: float              # work of the stage itself: total minus nested inputs; async: its function
    inputs_ms: float           # time its direct inputs took (on any thread)
    per_element_us: float      # own time per call
    parallelism: int | None    # as configured (stats), -1 for autotune; None for sequential stages
    concurrency: float         # measured: mean number of its function calls in flight while busy
    inputs: tuple[str, ...]    # long names of its direct inputs
    per_element: bool = False  # made by its parent's function once per input element (an interleave's reader per file)
    autotuned: bool = False    # its parallelism is AUTOTUNE's (the profile shows the value tuned at the time)
    device_feed: bool = False  # tf.distribute's per-device `Generator`, which only waits for the host pipeline
    service_map: bool = False  # distribute()'s own map over DataService, uncompressing the workers' elements here

    @property
    def label(self) -> str:
        """The name a report shows: tf.distribute's per-device feed is not a user's Python generator."""
        return f"{self.name} (device feed)" if self.device_feed else self.name

    @property
    def busy_ms(self) -> float:
        """Own work spread over the calls that ran at once: the wall-clock time it needs."""
        return self.own_ms / max(self.concurrency, 1.0)


@dataclasses.dataclass(frozen=True)
class StageTree:
    stages: tuple[Stage, ...]          # outermost first, in tree order: each stage followed by its inputs
    bottleneck: str | None             # long name
    walk: tuple[str, ...]              # long names visited from the outermost stage to the bottleneck
    reason: str

    def stage(self, long_name: str) -> Stage:
        for stage in self.stages:
            if stage.long_name == long_name:
                return stage
        raise KeyError(long_name)

    @property
    def outermost(self) -> Stage | None:
        return self.stages[0] if self.stages else None

    @property
    def bottleneck_stage(self) -> Stage | None:
        return self.stage(self.bottleneck) if self.bottleneck else None

    def chain(self) -> list[str]:
        """Stage names outermost first along the main path (the heaviest input at each level)."""
        names, current = [], self.outermost
        while current is not None:
            names.append(current.name)
            inputs = _past_device_generators([self.stage(i) for i in current.inputs])
            heaviest = max(inputs, key=lambda s: s.total_ms, default=None)
            current = heaviest
        return names


def work_text(stage: Stage) -> str:
    """A stage's time as the stage table shows it: busy (wall clock), and the work behind it when
    several calls ran at once, so the checklist and the table quote the same labelled figures."""
    if stage.concurrency > 1.05:
        return (f"{stage.busy_ms:.1f} ms (work {stage.own_ms:.1f} ms over {stage.concurrency:.1f} calls at once, "
                f"{stage.per_element_us:.0f} us per call)")
    return f"{stage.busy_ms:.1f} ms ({stage.per_element_us:.0f} us per call)"


DEVICE_FEED_NOTE = ("device feed: tf.distribute's per-device iterator (a `Generator` that only waits for the host "
                    "pipeline beside it), not a Python generator of yours; the walk passes it by")
SERVICE_STAGE = "DataService"  # tf.data.experimental.service.distribute(): the stage that receives from the workers
SERVED_NOTE = ("the input is served by the tf.data service (a DataService stage): the stages up to distribute() run "
               "on the service's workers, so this profile, the trainer's, cannot see them: it shows the DataService "
               "stage, the wait for its elements and the stages after it, not the workers' stage tree, CPU or "
               "files; a wait on DataService is the workers' pace or the link (more workers, fewer bytes per "
               "element); diagnose the dataset before distribute() (as a worker runs it) for its stages, and "
               "`stallscope serve` prints each worker's CPU")


def _service_maps(stages: Sequence[Stage], types: dict[str, str]) -> set[str]:
    """The maps distribute() adds on the trainer: a compressed dataset's DataService yields `variant`
    elements and TF puts a ParallelMap over it that uncompresses them (the service's receiving, not a
    stage of the user's). A profile without the DataService's types: a ParallelMap over DataService alone."""
    found = set()
    for stage in stages:
        if not stage.name.startswith("ParallelMap") or len(stage.inputs) != 1:
            continue
        below = stage.inputs[0]
        if short_name(below).startswith(SERVICE_STAGE) and types.get(below, "variant") == "variant":
            found.add(stage.long_name)
    return found


def served(names) -> bool:
    """A pipeline with a DataService stage (stage or chain names): its stages up to it run on the workers."""
    return any(name.startswith(SERVICE_STAGE) for name in names)


def stage_key(event_name: str) -> str:
    """An `Iterator::` event's stage: per-element indices removed, an `XImpl` placed under its `X`
    (`...::MemoryCache::MemoryCacheImpl::...`), where its events run nested."""
    parts: list[str] = []
    for part in _INDEX.sub("", event_name).split("::"):
        base = part[:-len("Impl")] if part.endswith("Impl") else ""
        if base and (not parts or parts[-1] != base):
            parts.append(base)
        parts.append(part)
    return "::".join(parts)


def short_name(long_name: str) -> str:
    return long_name.rsplit("::", 1)[-1]


def is_asynchronous(name: str) -> bool:
    return name.startswith(ASYNC_PREFIXES)


def stage_tree(profile: Profile) -> StageTree:
    """Builds the stage tree from the host plane and walks it to the bottleneck."""
    host = profile.host
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0])  # calls, total_ps, nested_ps
    datasets: dict[str, str] = {}
    parallelism: dict[str, int] = {}
    stage_of_id: dict[int, str] = {}
    types: dict[str, str] = {}
    producer_calls: dict[tuple[str, int], set[int]] = defaultdict(set)
    producer_stage: dict[tuple[str, int], int] = {}
    executions: dict[int, list[Event]] = defaultdict(list)
    run_calls: dict[int, Event] = {}
    per_element: set[str] = set()

    for line in host.lines:
        stack: list[Event] = []
        for event in line.events:
            while stack and stack[-1].end_ps <= event.start_ps:
                stack.pop()
            if event.name.startswith(ITERATOR_PREFIX):
                key = stage_key(event.name)
                if short_name(key) not in ROOT_NAMES:
                    record = totals[key]
                    if _PER_ELEMENT.search(event.name):
                        per_element.add(key)
                    record[0] += 1
                    record[1] += event.duration_ps
                    parent = next((e for e in reversed(stack) if e.name.startswith(ITERATOR_PREFIX)), None)
                    if parent is not None and key.startswith(stage_key(parent.name) + "::"):
                        totals[stage_key(parent.name)][2] += event.duration_ps
                    _note_stats(key, event, datasets, parallelism, stage_of_id)
                    if isinstance(event.stats.get("types"), str):
                        types.setdefault(key, event.stats["types"])
                    owner = _producer(stack)
                    if owner is not None and "parent_id" in event.stats:
                        producer_stage.setdefault((line.name, owner.start_ps), event.stats["parent_id"])
            elif event.name in FUNCTION_EXECUTIONS and "id" in event.stats:
                executions[event.stats["id"]].append(event)
            elif event.name in FUNCTION_CALLS and "id" in event.stats:
                run_calls[event.stats["id"]] = event
                owner = _producer(stack)
                if owner is not None:
                    producer_calls[(line.name, owner.start_ps)].add(event.stats["id"])
            stack.append(event)

    if not totals:
        return StageTree(stages=(), bottleneck=None, walk=(), reason="no Iterator:: events in the profile")

    work_ps: dict[str, float] = {}
    concurrency: dict[str, float] = {}
    runs_of: dict[str, list[Event]] = defaultdict(list)
    for producer, ids in producer_calls.items():
        stage = stage_of_id.get(producer_stage.get(producer, 0))
        if stage is not None and is_asynchronous(short_name(stage)):
            runs_of[stage].extend(run for i in ids for run in _execution_events(i, executions, run_calls))
    for stage, runs in runs_of.items():
        work_ps[stage] = sum(e.duration_ps for e in runs)
        concurrency[stage] = _concurrency(runs)

    stages = _build_stages(totals, datasets, parallelism, work_ps, concurrency, per_element)
    maps = _service_maps(stages, types)
    stages = tuple(dataclasses.replace(s, service_map=True) if s.long_name in maps else s for s in stages)
    walk, bottleneck, reason = _walk(stages)
    return StageTree(stages=stages, bottleneck=bottleneck, walk=walk, reason=reason)


def _note_stats(key: str, event: Event, datasets: dict, parallelism: dict, stage_of_id: dict) -> None:
    if "id" in event.stats:
        stage_of_id[event.stats["id"]] = key
    if key not in datasets and isinstance(event.stats.get("name"), str):
        datasets[key] = event.stats["name"]
    for stat in ("parallelism", "cycle_length", "buffer_limit"):
        value = event.stats.get(stat)
        if isinstance(value, int) and not isinstance(value, bool):
            if event.stats.get("autotune") == "true" and stat == "parallelism":
                parallelism.setdefault(key + "#autotune", 1)
            parallelism[key] = max(parallelism.get(key, value), value)
            break


def _producer(stack: Sequence[Event]) -> Event | None:
    """The producer event (`ParallelMapProduce`, ...) the current event runs in directly, if any:
    calls nested in an inner `Iterator::` event belong to that (synchronous) stage instead."""
    for outer in reversed(stack):
        if outer.name.startswith(ITERATOR_PREFIX):
            return None
        if outer.name.endswith("Produce"):
            return outer
    return None


def _execution_events(call_id: int, executions: dict[int, list[Event]], run_calls: dict[int, Event]) -> list[Event]:
    """The function's execution: executor events with its id, else FunctionRun, else the call itself."""
    events = executions.get(call_id, [])
    process = [e for e in events if e.name == "ExecutorState::Process"]
    if process:
        return process
    if events:
        return events
    return [run_calls[call_id]] if call_id in run_calls else []


def _concurrency(events: Sequence[Event]) -> float:
    if not events:
        return 1.0
    busy, reach = 0, None
    for event in sorted(events, key=lambda e: e.start_ps):
        start = event.start_ps if reach is None else max(event.start_ps, reach)
        if event.end_ps > start:
            busy += event.end_ps - start
            reach = event.end_ps
    total = sum(e.duration_ps for e in events)
    return total / busy if busy else 1.0


def _build_stages(totals, datasets, parallelism, work_ps, concurrency, per_element) -> tuple[Stage, ...]:
    names = sorted(totals)
    roots = [n for n in names if short_name(n) not in ROOT_NAMES]
    base_depth = min(n.count("::") for n in roots)
    stages = []
    for key in _depth_first(roots, totals):
        calls, total_ps, nested_ps = totals[key]
        asynchronous = is_asynchronous(short_name(key))
        inputs = tuple(n for n in roots if n.startswith(key + "::") and n.count("::") == key.count("::") + 1)
        own_ps = work_ps.get(key, 0.0) if asynchronous else max(total_ps - nested_ps, 0)
        configured = parallelism.get(key) if asynchronous else None
        if key + "#autotune" in parallelism and configured is not None:
            configured = -1 if configured <= 0 else configured
        stages.append(Stage(
            long_name=key, name=short_name(key), dataset=datasets.get(key, ""),
            depth=key.count("::") - base_depth, asynchronous=asynchronous, calls=int(calls),
            total_ms=ps_to_ms(total_ps), own_ms=ps_to_ms(own_ps),
            inputs_ms=ps_to_ms(sum(totals[i][1] for i in inputs)),
            per_element_us=own_ps / calls / 1e6 if calls else 0.0,
            parallelism=configured, concurrency=concurrency.get(key, 1.0), inputs=inputs,
            per_element=key in per_element, autotuned=asynchronous and key + "#autotune" in parallelism,
        ))
    feeds = {i.long_name for s in stages for i in _device_generators([t for t in stages if t.long_name in s.inputs])}
    return tuple(dataclasses.replace(s, device_feed=True) if s.long_name in feeds else s for s in stages)


def _depth_first(names: Sequence[str], totals: dict[str, list[float]]) -> list[str]:
    """Long names in tree order: each stage directly followed by its inputs (and theirs), the
    busiest input first, so that printing them indented shows who feeds whom. Sorting by depth
    alone listed a stage under the wrong parent (an interleave's TFRecord under its file Shuffle)."""
    known = set(names)

    def parent(name: str) -> str | None:
        head = name.rsplit("::", 1)[0]
        return head if head in known else None

    children: dict[str | None, list[str]] = defaultdict(list)
    for name in names:
        children[parent(name)].append(name)
    ordered: list[str] = []
    pending = sorted(children[None], key=lambda n: (-totals[n][1], n), reverse=True)
    while pending:
        name = pending.pop()
        ordered.append(name)
        pending.extend(sorted(children[name], key=lambda n: (-totals[n][1], n), reverse=True))
    return ordered


def _past_device_generators(inputs: Sequence[Stage]) -> Sequence[Stage]:
    """Under tf.distribute a multi-device iterator feeds each device through a `Generator` that only
    waits for the host pipeline, which appears beside it (the same Prefetch parent): follow that one."""
    feeds = _device_generators(inputs)
    return [s for s in inputs if s not in feeds] if feeds else inputs


def _device_generators(inputs: Sequence[Stage]) -> list[Stage]:
    """The `Generator` inputs that sit beside a host pipeline (tf.distribute's per-device feeds)."""
    pipelines = [s for s in inputs if s.name != "Generator"]
    return [s for s in inputs if s.name == "Generator"] if pipelines and len(pipelines) < len(inputs) else []


def _walk(stages: Sequence[Stage]) -> tuple[tuple[str, ...], str, str]:
    """seed-004: from the outermost stage toward the source, stop at the first stage whose own
    (wall-clock) work is at least the time its inputs took; otherwise follow the heaviest input."""
    by_name = {s.long_name: s for s in stages}
    top_depth = min(s.depth for s in stages)
    outermost = max((s for s in stages if s.depth == top_depth), key=lambda s: s.total_ms)
    current, walk = outermost, [outermost.long_name]
    while True:
        inputs = [by_name[i] for i in current.inputs]
        if short_name(current.long_name).startswith(SERVICE_STAGE):
            return tuple(walk), current.long_name, _served_reason(current, [by_name[w] for w in walk])
        if current.service_map:  # the service's receiving: the stages it stands for are the workers'
            current = inputs[0]
            walk.append(current.long_name)
            continue
        if not inputs:
            reason = f"{current.name} is the source: busy {work_text(current)} and it has no input"
            return tuple(walk), current.long_name, reason
        if current.busy_ms >= current.inputs_ms and current.own_ms > 0:
            reason = f"{current.name} was busy {work_text(current)} while its inputs took {current.inputs_ms:.1f} ms"
            return tuple(walk), current.long_name, reason
        current = max(_past_device_generators(inputs), key=lambda s: s.total_ms)
        walk.append(current.long_name)


def _served_reason(service: Stage, walked: Sequence[Stage]) -> str:
    """Where the walk reaches the DataService stage: the stages past it are the workers', out of sight."""
    reason = (f"{service.name} receives the elements the tf.data service's workers make: the stages up to "
              f"distribute() run on the service's workers, not in this profile (the trainer's), so the walk "
              f"cannot name one; it waited {service.total_ms:.1f} ms for them")
    maps = [s for s in walked if s.service_map]
    if maps:
        reason += (f"; distribute()'s own {maps[-1].name} above it, which uncompresses them here (the trainer's "
                   f"receiving), was busy {work_text(maps[-1])}")
    return reason
