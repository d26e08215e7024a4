"""The pipeline as written and as TF really runs it, as stage chains in the profiler's vocabulary.

TF applies its static rewrites (map_parallelization, inject_prefetch, map_and_batch_fusion, ...)
when an iterator is made, in the `FinalizeDataset` op. `pipeline_as_run` applies that same op to
the dataset's variant and reads the serialized graph of the result, so the chain it returns is the
one the iterator runs, without iterating. `pipeline_as_written` reads the graph before finalizing.

Stage names are the dataset op names without "Dataset" and version suffixes ("ParallelMapDatasetV2"
-> "ParallelMap"), which are also the `Iterator::...` names in a TF profile. A chain is listed
outermost first, depth-first: a stage, then the datasets its function builds (an interleave's
per-shard reader), then its input. Threading/autotune wrappers (Model, PrivateThreadPool,
MaxIntraOpParallelism, Options) are left out unless asked for.
"""

from __future__ import annotations

import re

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.ops import gen_dataset_ops

from stallscope.pipeline.config import PipelineConfig

INFRASTRUCTURE_STAGES = frozenset({"Model", "PrivateThreadPool", "MaxIntraOpParallelism", "Options"})
PARALLEL_STAGES = frozenset({"ParallelMap", "ParallelInterleave", "MapAndBatch", "ParallelBatch", "Prefetch"})
_EXTERNAL_STATE_ALLOW = 0  # StatefulOps policy: serialize stateful ops (file reads) without complaint
# Ops of a graph that decodes images (Python may: PIL in a py_function), where storing smaller ones helps.
IMAGE_DECODING_OPS = frozenset({"DecodeJpeg", "DecodeAndCropJpeg", "DecodeImage", "DecodePng", "DecodeBmp",
                                "DecodeGif", "DecodeWebP", "PyFunc", "PyFuncStateless", "EagerPyFunc"})
_MAP_OPS = frozenset({"MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2", "MapAndBatchDataset",
                      "ExperimentalMapAndBatchDataset"})


def stage_name(op: str) -> str:
    """`ParallelMapDatasetV2` -> `ParallelMap`, `ExperimentalMapAndBatchDataset` -> `MapAndBatch`."""
    name = re.sub(r"^Experimental", "", op)
    return re.sub(r"Dataset(V\d+)?$", "", name)


def pipeline_as_run(dataset: tf.data.Dataset, *, include_infrastructure: bool = False) -> list[str]:
    """The stage chain after TF's static rewrites (what the iterator runs), outermost first."""
    return chain_in(graph_as_run(dataset), include_infrastructure)


def chains_of(dataset: tf.data.Dataset) -> dict | None:
    """`pipeline_record` of the dataset; None where its graph cannot be serialized."""
    try:
        return pipeline_record(graph_as_built(dataset), graph_as_run(dataset))
    except (ValueError, tf.errors.OpError):
        return None


def pipeline_record(built: graph_pb2.GraphDef, ran: graph_pb2.GraphDef) -> dict:
    """{"written": the stages as built, "ran": as TF runs them, "decodes_images": whether the graph
    does}, as a run's pipeline.json holds them, so an analysis names TF's rewrites and advises storing
    smaller images only where images are decoded."""
    return {"written": chain_in(built), "ran": chain_in(ran), "decodes_images": decodes_images(built)}


def decodes_images(graph: graph_pb2.GraphDef) -> bool:
    """Whether any op of the graph or of its functions decodes images (or runs Python, which may)."""
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    return bool(ops & IMAGE_DECODING_OPS)


def map_parallelism_in(ran: graph_pb2.GraphDef) -> int | None:
    """The parallel calls of the maps TF runs (`ran`: the graph after its rewrites; map_parallelization
    and map_and_batch_fusion turn a map written sequential into an AUTOTUNE one): None where one of them
    runs one call at a time (a MapAndBatch fused from a stateful map has 1) or there is none, else the
    fewest fixed calls of any, else -1 (all AUTOTUNE)."""
    nodes = {n.name: n for n in ran.node}
    calls = [_parallel_calls(nodes, node) for node in _on_chain(nodes) if node.op in _MAP_OPS]
    if not calls or None in calls or 1 in calls:
        return None
    fixed = [c for c in calls if c > 0]
    return min(fixed) if fixed else -1


def _parallel_calls(nodes: dict, node) -> int | None:
    """A map node's num_parallel_calls (-1: AUTOTUNE); None for a sequential map."""
    if node.op == "MapDataset":
        return None
    arguments = len(node.attr["Targuments"].list.type)
    index = 1 + arguments + (1 if "MapAndBatch" in node.op else 0)  # input, captured arguments, [batch_size]
    const = nodes.get(_input_name(node.input[index])) if index < len(node.input) else None
    values = list(const.attr["value"].tensor.int64_val or const.attr["value"].tensor.int_val) if const else []
    return int(values[0]) if values else -1


def _on_chain(nodes: dict):
    """The dataset nodes from the graph's output down their first dataset inputs (not into functions)."""
    output = next((n for n in nodes.values() if n.op == "_Retval"), None)
    name, seen = (_input_name(output.input[0]) if output is not None else None), set()
    while name in nodes and name not in seen:
        seen.add(name)
        node = nodes[name]
        yield node
        name = next((_input_name(i) for i in node.input if not i.startswith("^") and _is_dataset(nodes, _input_name(i))),
                    None)


def graph_as_run(dataset: tf.data.Dataset) -> graph_pb2.GraphDef:
    """The dataset's graph after TF's static rewrites (`FinalizeDataset`, as an iterator applies them)."""
    finalized = gen_dataset_ops.finalize_dataset(
        dataset._variant_tensor,  # noqa: SLF001 - the one handle FinalizeDataset takes
        output_types=dataset._flat_types,  # noqa: SLF001
        output_shapes=dataset._flat_shapes,  # noqa: SLF001
    )
    serialized = gen_dataset_ops.dataset_to_graph_v2(
        finalized, external_state_policy=_EXTERNAL_STATE_ALLOW, strip_device_assignment=True
    )
    return graph_pb2.GraphDef.FromString(serialized.numpy())


def pipeline_as_built(dataset: tf.data.Dataset, *, include_infrastructure: bool = False) -> list[str]:
    """The stage chain of a built dataset before TF's rewrites."""
    return chain_in(graph_as_built(dataset), include_infrastructure)


def graph_as_built(dataset: tf.data.Dataset) -> graph_pb2.GraphDef:
    """The dataset's graph as its code built it, before TF's rewrites."""
    serialized = dataset._as_serialized_graph(  # noqa: SLF001
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE, strip_device_assignment=True
    )
    return graph_pb2.GraphDef.FromString(serialized.numpy())


def pipeline_as_written(config: PipelineConfig, source) -> list[str]:
    """What the user asked for: the chain `build_dataset` writes for this config and source."""
    from stallscope.pipeline.builder import build_dataset

    return pipeline_as_built(build_dataset(config, source))


def given_name(node) -> str:
    """The name a dataset op of a serialized graph was given (`name=`), from its metadata; "" where none."""
    from tensorflow.core.framework import dataset_metadata_pb2

    if not node.attr["metadata"].s:
        return ""
    metadata = dataset_metadata_pb2.Metadata()
    metadata.ParseFromString(node.attr["metadata"].s)
    return metadata.name.decode("utf-8", "replace")


def parallel_stages(chain: list[str]) -> list[str]:
    """The stages of a chain that run in parallel or asynchronously."""
    return [stage for stage in chain if stage in PARALLEL_STAGES]


def chain_in(graph: graph_pb2.GraphDef, include_infrastructure: bool = False) -> list[str]:
    """The stage chain of a serialized dataset graph, outermost first."""
    functions = {f.signature.name: f for f in graph.library.function}
    nodes = {n.name: n for n in graph.node}
    output = next((n for n in graph.node if n.op == "_Retval"), None)
    if output is None:
        raise ValueError("dataset graph has no output node")
    stages = _walk(nodes, _input_name(output.input[0]), functions)
    if not include_infrastructure:
        stages = [s for s in stages if s not in INFRASTRUCTURE_STAGES]
    return stages


def _input_name(ref: str) -> str:
    """Graph inputs are `node` or `node:0`; function-body inputs are `node:handle:0`."""
    return ref.lstrip("^").split(":")[0]


def _walk(nodes: dict, name: str, functions: dict) -> list[str]:
    stages: list[str] = []
    seen: set[str] = set()
    while name in nodes and name not in seen:
        seen.add(name)
        node = nodes[name]
        if node.op == "Identity":
            name = _input_name(node.input[0])
            continue
        if not node.op.endswith(("Dataset", "DatasetV2", "DatasetV3", "DatasetV4", "DatasetV5")):
            break
        inner = _function_chain(node, functions)
        upstream = next(
            (_input_name(i) for i in node.input if not i.startswith("^") and _is_dataset(nodes, _input_name(i))),
            None,
        )
        if _is_reader_wrapper(node, inner, nodes, upstream):
            stages.extend(inner)  # TFRecordDataset(filename tensor) = TensorSlice -> FlatMap(reader)
            break
        stages.append(stage_name(node.op))
        stages.extend(inner)
        if upstream is None:
            break
        name = upstream
    return stages


def _is_dataset(nodes: dict, name: str) -> bool:
    node = nodes.get(name)
    return node is not None and ("Dataset" in node.op or node.op == "Identity")


def _function_chain(node, functions: dict) -> list[str]:
    """The chain of datasets built by a stage's function (interleave / flat_map), if any."""
    for key in ("f", "dataset_fn"):
        if key in node.attr and node.attr[key].HasField("func"):
            function = functions.get(node.attr[key].func.name)
            if function is None or not function.ret:
                return []
            body = {n.name: n for n in function.node_def}
            ret = _input_name(next(iter(function.ret.values())))
            if ret in body and _is_dataset(body, ret):
                return _walk(body, ret, functions)
    return []


def _is_reader_wrapper(node, inner: list[str], nodes: dict, upstream: str | None) -> bool:
    return (
        node.op == "FlatMapDataset"
        and len(inner) == 1
        and upstream is not None
        and nodes[upstream].op == "TensorSliceDataset"
    )
