"""stallscope.diagnose and `stallscope diagnose --dataset-fn` on a user's own dataset and model."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import sys
from pathlib import Path

import pytest

import stallscope
from stallscope.analysis.dataset_diagnosis import config_from_chain, dataset_files
from stallscope.cli.main import main
from stallscope.errors import UsageError

PROGRAMS = Path(__file__).parent / "programs"
sys.path.insert(0, str(PROGRAMS))
import pipelines  # noqa: E402

import tensorflow as tf  # noqa: E402


# Both against one emulated device of 100 ms a step: the stalled map waits 20 ms per image, 160 ms per
# batch, sequential and not prefetched (over half of each step, however busy the machine: a wait is no
# faster on a fast one); the healthy batches come cached and prefetched, and the few ms a loaded machine
# makes a get_next wait for a core are a few % of 100 ms. (Against the real model, whose step grows with
# the load, the stalled share fell toward 0.5 and the healthy one rose toward 20% on a busy machine.)
EMULATED_STEP = "emulated:100ms"


@pytest.mark.whole_machine  # the healthy verdict: a cached, prefetched pipeline keeps up only with its cores free
def test_verdict_differs_between_a_stalled_and_a_healthy_dataset():
    stalled = stallscope.diagnose(pipelines.dataset("stalled", decode_s=0.020), accelerator=EMULATED_STEP, steps=8)
    healthy = stallscope.diagnose(pipelines.dataset("healthy"), accelerator=EMULATED_STEP, steps=8)
    assert stalled.verdict == "highly" and stalled.input_share > 0.5
    assert healthy.verdict != "highly" and healthy.input_share < stalled.input_share / 3
    assert stalled.cause in ("fetch", "preprocessing") and healthy.verdict != stalled.verdict
    data = stalled.to_dict()
    json.dumps(data)  # JSON-ready
    assert data["verdict"] == "highly" and data["bottleneck"] == "Map"
    assert any(s["name"] == "Map" for s in data["stage_tree"])
    assert any("cold page cache not probed" in n for n in data["notes"])  # in memory: nothing to evict
    assert "prefetch" in [a.key for a in stalled.advice]      # its stages have none at the end
    assert "prefetch" not in [a.key for a in healthy.advice]  # its stages end in one
    text = stalled.text()
    assert "highly input-bound" in text and "<- bottleneck" in text
    # one verdict and one list of fixes: the profiled steps add their stage tree, not a second reading
    # whose figures differ (it printed its own "Input share" verdict and "Fix, most helpful first")
    assert text.count("Input share") == 0 and "Fix, most helpful first" not in text and "Checklist" not in text
    # no work_dir: the profile is removed once read, and the report says how to keep it for analyze
    assert "the profile was not kept: give work_dir= to keep it" in text


def _records(tmp_path, count=16):
    path = tmp_path / "part-0.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(count):
            writer.write(tf.io.serialize_tensor(tf.fill([32, 32, 3], float(i))).numpy())
    return path


def test_files_are_found_in_the_dataset_graph_and_probed_cold(tmp_path):
    path = _records(tmp_path)
    pattern = tf.data.Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False)
    named = tf.data.TFRecordDataset([str(path)])
    assert dataset_files(tf.data.TFRecordDataset(pattern)) == [str(path)]
    assert dataset_files(named) == [str(path)]
    assert dataset_files(tf.data.Dataset.range(4)) == []
    dataset = named.map(lambda r: (tf.io.parse_tensor(r, tf.float32), 0)).batch(4)
    diagnosis = stallscope.diagnose(dataset, accelerator="emulated:2000", steps=4)
    assert diagnosis.cold is not None and diagnosis.source["files"] == 1
    assert diagnosis.pipeline_breakdown.cold_ms is not None


def test_the_pipeline_knobs_read_from_its_stages_steer_the_advice():
    stalled = config_from_chain(["BatchV2", "Map", "TensorSlice"], batch_size=8)
    assert stalled.map_parallelism is None and stalled.prefetch is None
    healthy = config_from_chain(["Prefetch", "ParallelMap", "ParallelInterleave"], batch_size=8)
    assert healthy.map_parallelism is not None and healthy.prefetch is not None
    assert healthy.read_parallelism is not None
    # an asynchronous last stage makes the next batch while the step runs, as a prefetch would: a prefetch
    # was advised at +23-136% for a sequential MapAndBatch at the end and measured 0-7%
    # (benchmarks/advice_programs.py)
    for outer in ("MapAndBatch", "ParallelMapV2", "ParallelBatch"):
        assert config_from_chain([outer, "ShuffleAndRepeat", "TensorSlice"], batch_size=8).prefetch is not None
    assert config_from_chain(["MapAndBatch", "TensorSlice"], batch_size=8).map_parallelism is None


def test_bad_arguments_name_themselves():
    with pytest.raises(UsageError, match="dataset: expected a tf.data.Dataset"):
        stallscope.diagnose([1, 2, 3])
    with pytest.raises(UsageError, match="steps"):
        stallscope.diagnose(tf.data.Dataset.range(4), steps=1)
    with pytest.raises(UsageError, match="accelerator"):
        stallscope.diagnose(tf.data.Dataset.range(4), accelerator="fast")
    uncompiled = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    with pytest.raises(UsageError, match="model: compile it first"):
        stallscope.diagnose(tf.data.Dataset.range(4).batch(2), model=uncompiled)


def test_cli_dataset_fn_and_model_fn(capsys, tmp_path):
    code = main(["diagnose", "--dataset-fn", f"{PROGRAMS / 'pipelines.py'}:stalled",
                 "--model-fn", f"{PROGRAMS / 'pipelines.py'}:model", "--probe-steps", "6", "--json",
                 "--work_dir", str(tmp_path / "work")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["verdict"] == "highly" and report["bottleneck"] == "Map"
    assert report["accelerator"].startswith("model ")
    assert list((tmp_path / "work").glob("*/plugins/profile/*/*.xplane.pb"))  # the profile kept where asked


@pytest.mark.parametrize("args, message", [
    (["--dataset-fn", "nocolon"], "--dataset-fn: expected MODULE:FUNCTION"),
    (["--dataset-fn", "missing_dir/missing.py:make"], "--dataset-fn: 'missing_dir/missing.py' is not a file"),
    (["--dataset-fn", "no_such_module_xyz:make"], "--dataset-fn: cannot import 'no_such_module_xyz'"),
    (["--dataset-fn", f"{PROGRAMS / 'pipelines.py'}:nothing"], "has no 'nothing'"),
    (["--dataset-fn", f"{PROGRAMS / 'pipelines.py'}:broken"], "raised ValueError: unknown pipeline"),
    (["--model-fn", f"{PROGRAMS / 'pipelines.py'}:model"], "--model-fn: needs --dataset-fn"),
    (["--dataset-fn", f"{PROGRAMS / 'pipelines.py'}:stalled", "--fix"], "--fix: applies to stallscope's own"),
])
def test_cli_errors_are_one_line(args, message, capsys):
    assert main(["diagnose", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_serve_profiler_reports_a_taken_port_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"serve_profiler: port {port} cannot be bound"):
            stallscope.serve_profiler(port)
    with pytest.raises(UsageError, match="port must be an integer"):
        stallscope.serve_profiler(70000)


def test_the_probes_steady_pace_leaves_out_a_slow_start():
    """The pace after the first batch is what a chain of reads and decodes costs once running (the
    storage what-if's sequential chain); a slow first batch (tracing, buffers) stays out of it."""
    import time

    from stallscope.analysis.probes import probe_dataset

    def slow_first(i):
        if int(i) < 4:
            time.sleep(0.1)
        return i

    dataset = tf.data.Dataset.range(64).map(lambda i: tf.py_function(slow_first, [i], tf.int64)).batch(4)
    probe = probe_dataset(dataset, cache_state="warm", files=[], max_batches=8, budget_s=30)
    assert probe.batches == 8 and probe.steady_images == probe.images - 4
    assert probe.steady_ms_per_image < probe.ms_per_image / 4  # 0.4 s of start over 32 images
    assert probe.to_dict()["steady_ms_per_image"] == pytest.approx(probe.steady_ms_per_image)


def test_gs_files_read_by_tfs_client_get_stallscopes_reader_as_advice():
    from stallscope.analysis.dataset_diagnosis import graph_ops, reader_advice

    paths = ["gs://data/a/1.jpg", "gs://data/a/2.jpg"]
    by_tf = tf.data.Dataset.from_tensor_slices(paths).map(tf.io.read_file)
    assert [a.key for a in reader_advice(graph_ops(by_tf), paths, "evidence")] == ["read_files"]
    assert "stallscope.read_files(dataset" in reader_advice(graph_ops(by_tf), paths, "evidence")[0].code
    records = tf.data.TFRecordDataset(["gs://data/r/train-0", "gs://data/r/train-1"])
    assert reader_advice(graph_ops(records), ["gs://data/r/train-0"], "") == []  # big blocks hide the latency already
    by_stallscope = stallscope.read_files(tf.data.Dataset.from_tensor_slices((paths, [0, 1])))
    assert reader_advice(graph_ops(by_stallscope), paths, "") == []  # already through stallscope's reader
    assert dataset_files(by_stallscope) == paths  # objects named in the graph count as its files
    local = tf.data.Dataset.from_tensor_slices(["/data/1.jpg"]).map(tf.io.read_file)
    assert reader_advice(graph_ops(local), ["/data/1.jpg"], "") == []


def test_the_storage_what_if_runs_on_your_own_dataset_of_files(tiny_tree, capsys):
    files = stallscope.list_files(tiny_tree, "*.jpg")
    labels = [int(f.split("/")[-2].split("_")[-1]) for f in files]

    def decode(jpeg, label):
        return tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (32, 32)), label

    dataset = stallscope.read_files(tf.data.Dataset.from_tensor_slices((files, labels)).repeat(), in_flight=4)
    dataset = dataset.map(decode).batch(4)
    diagnosis = stallscope.diagnose(dataset, steps=4, files=files, what_if_storage="10ms,200Mbit,object-store-region",
                                    storage_client="obstore")
    what = diagnosis.storage_whatif
    assert what is not None, diagnosis.notes
    assert what.source_format == "files" and what.object_client == "obstore"
    assert [s.scenario.latency_ms for s in what.scenarios] == [10.0, 20.0]
    for scenario in what.scenarios:
        by_format = {f.format: f for f in scenario.formats}
        assert set(by_format) == {"files", "records"}
        files_row, records_row = by_format["files"], by_format["records"]
        assert files_row.requests_per_image == 1.0 and records_row.requests_per_image < 0.1
        assert 0 < files_row.sequential.images_per_second < files_row.enough_in_flight.images_per_second
        # read_files' own reads, as its stage's name and the dataset's options give them
        assert files_row.parallel.reads.startswith("4 requests in flight, in groups of 4") and \
            "a private pool of" in files_row.parallel.reads
    assert diagnosis.storage.bytes == pytest.approx(sum(os.path.getsize(f) for f in files) / len(files))
    text = diagnosis.text()
    assert "storage what-if" in text and "10ms,200Mbit" in text and "object-store-region" in text
    with pytest.raises(UsageError, match="storage_client: expected one of"):
        stallscope.diagnose(dataset, steps=4, files=files, storage_client="nfs")


def test_cli_dataset_fn_takes_the_storage_what_if_and_says_when_it_cannot_make_one(capsys):
    code = main(["diagnose", "--dataset-fn", f"{PROGRAMS / 'pipelines.py'}:stalled", "--probe-steps", "4",
                 "--what-if-storage", "10ms,200Mbit", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["storage_what_if"] is None  # a dataset built from memory: no files to read from a store
    assert any(note.startswith("storage what-if not made") for note in report["notes"])


def test_the_map_that_reads_is_found_with_its_parallel_calls():
    from stallscope.analysis.dataset_diagnosis import read_map
    from stallscope.analysis.dataset_storage import ReadMap, as_read
    from stallscope.config import AUTOTUNE
    from stallscope.pipeline.config import PipelineConfig

    paths = tf.data.Dataset.from_tensor_slices((["a.jpg"], [0]))
    separate = paths.map(lambda p, label: (tf.io.read_file(p), label), num_parallel_calls=16)
    separate = separate.map(lambda jpeg, label: (tf.io.decode_jpeg(jpeg), label), num_parallel_calls=tf.data.AUTOTUNE)
    assert read_map(separate) == ReadMap(16, decodes=False)
    together = paths.map(lambda p, label: (tf.io.decode_jpeg(tf.io.read_file(p)), label),
                         num_parallel_calls=tf.data.AUTOTUNE)
    assert read_map(together) == ReadMap(AUTOTUNE, decodes=True)
    assert read_map(paths.map(lambda p, label: (tf.io.read_file(p), label))) == ReadMap(None, decodes=False)
    assert read_map(tf.data.Dataset.range(3)) is None
    config = PipelineConfig(preset="your dataset", map_parallelism=AUTOTUNE)
    assert as_read(config, "tf", 18, ReadMap(16, decodes=False)).read_parallelism == 16
    assert as_read(config, "tf", 18, ReadMap(16, decodes=False)).private_threadpool_size == 18
    by_stallscope = stallscope.read_files(paths, in_flight=64)
    assert as_read(config, "pooled", 6, read_map(by_stallscope)).read_parallelism == 64


def _busy_dataset(private_pool: int = 0) -> tf.data.Dataset:
    """A parallel map of real CPU work on TF's shared pool (a thread per CPU), or on a private one."""
    def work(i):
        square = tf.random.stateless_uniform([256, 256], seed=tf.stack([i, i]))
        return tf.reduce_sum(tf.linalg.matmul(square, square)), i % 4

    dataset = tf.data.Dataset.range(256).repeat().map(work, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(8).prefetch(tf.data.AUTOTUNE)
    if private_pool:
        options = tf.data.Options()
        options.threading.private_threadpool_size = private_pool
        dataset = dataset.with_options(options)
    return dataset


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to limit the run to fewer")
def test_a_dataset_on_tfs_pool_under_a_cpu_quota_is_advised_a_pool_of_the_quotas_cores(cpu_cgroup):
    """Your own pipeline in a container limited to half a CPU on a machine of more: on TF's shared
    pool (a thread per CPU) it is advised a private pool of the quota's one core; with that pool, not."""
    cpu_cgroup.limit(0.5)
    cpu_cgroup.procs.write_text(str(os.getpid()))
    try:
        shared = stallscope.diagnose(_busy_dataset(), accelerator="emulated:1ms", steps=24)
        private = stallscope.diagnose(_busy_dataset(private_pool=1), accelerator="emulated:1ms", steps=24)
    finally:
        cpu_cgroup.home.write_text(str(os.getpid()))
    assert shared.warm.throttled_share >= 0.2 and private.warm.throttled_share >= 0.2, (shared.warm, private.warm)
    pool = next((a for a in shared.advice if a.key == "quota_pool"), None)
    assert pool is not None, [a.key for a in shared.advice]
    assert pool.knobs == {"private_threadpool_size": 1}
    assert "options.threading.private_threadpool_size = 1" in pool.code
    assert "quota_pool" not in [a.key for a in private.advice]


def _slow_decoded(i):
    def work(x):
        time.sleep(0.005)  # 5 ms per element before the shuffle: each pass's refill of 48 takes 240 ms
        return x
    image = tf.numpy_function(work, [tf.fill([8, 8, 3], tf.cast(i, tf.float32))], tf.float32, stateful=False)
    return tf.ensure_shape(image, [8, 8, 3]), i % 4


def test_a_finite_dataset_with_a_shuffle_is_probed_over_whole_passes():
    """Your own finite dataset whose shuffle holds every element: the buffer fills again as each pass
    starts, so the window is whole passes (24 batches), not 6 batches served from a full buffer."""
    dataset = tf.data.Dataset.range(48).map(_slow_decoded).shuffle(48).batch(2)
    diagnosis = stallscope.diagnose(dataset, accelerator="emulated:1ms", steps=6)
    assert diagnosis.phases[0].end_to_end.steps == 24
    assert diagnosis.verdict == "highly" and diagnosis.input_share > 0.5, diagnosis.phases[0]


def test_a_repeated_dataset_with_a_shuffle_refilling_each_pass_is_probed_over_whole_passes():
    """Repeated for `fit(steps_per_epoch=...)`: TF gives no length, but the pass under the repeat is 24
    batches and the shuffle after the map fills again as each starts, so the window is whole passes."""
    dataset = tf.data.Dataset.range(48).map(_slow_decoded).shuffle(48).batch(2).repeat()
    diagnosis = stallscope.diagnose(dataset, accelerator="emulated:1ms", steps=6)
    assert diagnosis.phases[0].end_to_end.steps == 24
    assert diagnosis.verdict == "highly" and diagnosis.input_share > 0.5, diagnosis.phases[0]
    assert diagnosis.source["examples"] == 48
    # the buffer holds the whole pass: moving the shuffle before the map is weighed, and priced (it lets the
    # 5 ms maps overlap a 1 ms step, no more: a fix or, under MIN_GAIN, a change checked)
    shuffle = next((a for a in diagnosis.advice if a.key == "shuffle_encoded"), None)
    assert (shuffle is not None and shuffle.predicted_gain >= 0.05) or \
        any(n.startswith("checked, no gain expected: Shuffle before decoding") for n in diagnosis.notes), diagnosis.notes
    # the profile spans the passes too: the map under the shuffle is seen at work, as the input share is
    analysis = diagnosis.analysis
    assert len(analysis.steps.steps) >= 20 and analysis.input_share > 0.5, analysis.steps
    assert any(stage.name.startswith(("Map", "ParallelMap")) and stage.calls >= 48 for stage in analysis.tree.stages)
    assert analysis.decodes_images is True  # its map runs Python, which may decode
    # advice on a dataset of your own comes as code, not as stallscope's flags
    text = diagnosis.text()
    assert "--shuffle-at" not in text and "--read-parallelism" not in text
    if shuffle is not None:
        assert "dataset = dataset.shuffle(buffer)" in text


def test_a_pass_too_long_to_probe_whole_is_named_in_a_note():
    from stallscope.analysis.dataset_diagnosis import _window
    from stallscope.analysis.dataset_passes import passes

    made = tf.data.Dataset.range(6000).map(lambda x: x + 1)
    notes: list[str] = []
    assert _window(passes(made.shuffle(1000).batch(2)), 6, notes) == 6  # 3,000 batches a pass
    assert len(notes) == 1 and "holds no start of a pass" in notes[0] and "steps=3000" in notes[0]
    assert "1,000 made elements" in notes[0]
    notes = []
    assert _window(passes(made.shuffle(1000).batch(2)), 6, notes, ms_per_element=2.0) == 6
    assert "about 2.0 s at the pipeline's pace alone" in notes[0]
    # TF cannot count a pass (records, a filter): the window stays, and a note says what it may leave out
    unknown = made.filter(lambda x: x > 0).shuffle(500).batch(2).repeat()
    notes = []
    assert _window(passes(unknown), 6, notes) == 6
    assert len(notes) == 1 and "how many elements a pass over the dataset holds is not known" in notes[0]
    assert "up to 500 made" in notes[0]
    assert "assert_cardinality" in notes[0]
    # none where a shuffle refills at no cost (of names, before the map), refills little, or keeps its buffer
    for quiet in (tf.data.Dataset.range(6000).shuffle(6000).map(lambda x: x + 1).batch(2),
                  made.shuffle(100).batch(2), made.shuffle(1000).repeat().batch(2),
                  tf.data.Dataset.range(48).batch(2)):
        notes = []
        assert _window(passes(quiet), 6, notes) == 6 and notes == [], quiet
    assert _window(passes(tf.data.Dataset.range(16).batch(2)), 6, []) == 8  # a short pass: whole


def test_a_pass_is_known_once_the_dataset_asserts_its_length(tmp_path):
    """A filter loses the count of a pass (the records under it are counted); `assert_cardinality`
    after it, as the note advises, gives it back, and the window becomes whole passes where the
    shuffle after the parse refills."""
    from stallscope.analysis.dataset_diagnosis import _window
    from stallscope.analysis.dataset_passes import Passes, passes

    read = tf.data.TFRecordDataset([str(_records(tmp_path, count=16))]).filter(lambda record: True)
    unknown = read.map(tf.strings.length).shuffle(16).batch(2).repeat()
    asserted = read.apply(tf.data.experimental.assert_cardinality(16)).map(tf.strings.length).shuffle(16).batch(2).repeat()
    assert passes(unknown).steps is None
    assert passes(asserted) == Passes(8, shuffle_buffer=16, after_map=True, refill=16, elements=16)
    assert _window(passes(asserted), 6, []) == 8


def test_stages_whose_arguments_cannot_be_read_leave_the_window_as_asked(monkeypatch):
    """The pass is read from TF's private attributes: where another TF names them otherwise, the
    diagnosis goes on with the window it was given and says why."""
    from stallscope.analysis import dataset_diagnosis

    def renamed(dataset):
        raise AttributeError("'_ShuffleDataset' object has no attribute '_buffer_size'")
    monkeypatch.setattr(dataset_diagnosis, "passes", renamed)
    dataset = tf.data.Dataset.range(48).map(_slow_decoded).shuffle(48).batch(2).repeat()
    diagnosis = stallscope.diagnose(dataset, accelerator="emulated:1ms", steps=6)
    assert diagnosis.phases[0].end_to_end.steps == 6
    assert any("pass length and shuffle could not be read (AttributeError" in note for note in diagnosis.notes)


def test_a_map_tfs_rewrites_made_parallel_is_shown_as_rewritten_and_not_advised_parallel():
    """A map written sequential runs, fused with its batch, as TF's AUTOTUNE MapAndBatch (map_and_batch_
    fusion): the profile says so beside the chain as written, and neither the diagnosis nor the profile
    advises making that map parallel again, though it is the bottleneck."""
    square = tf.random.uniform([384, 384])

    def busy(i):
        return tf.reduce_mean(tf.linalg.matmul(square, square)) + tf.cast(i, tf.float32)

    dataset = tf.data.Dataset.range(64).map(busy).batch(8).repeat()
    diagnosis = stallscope.diagnose(dataset, accelerator="emulated:1ms", steps=8)
    analysis = diagnosis.analysis
    fused = next(s for s in analysis.tree.stages if s.name == "MapAndBatch")
    assert fused.autotuned and analysis.written_chain == ("Repeat", "Batch", "Map", "Range")
    assert "Batch + Map became MapAndBatch (map_and_batch_fusion)" in [c.describe() for c in analysis.rewrites]
    assert diagnosis.pipeline.map_parallelism == -1  # read from the graph TF runs
    assert analysis.bottleneck.endswith("MapAndBatch"), analysis.bottleneck
    assert "parallel_map" not in [a.key for a in diagnosis.advice + analysis.advice]
    assert "max_side" not in [a.key for a in diagnosis.advice + analysis.advice]  # it decodes no images
    assert analysis.decodes_images is False
    from stallscope.analysis.advice import _underparallel
    assert not _underparallel(fused)  # however busy it was here: AUTOTUNE sizes it
    assert _underparallel(dataclasses.replace(fused, autotuned=False, parallelism=2))  # a fixed 2 would be


def test_a_map_tf_leaves_sequential_for_its_stateful_op_is_named_with_the_stateless_way_out():
    """TF's map_parallelization parallelizes only stateless functions: a map drawing with tf.random runs one
    call at a time (fused with its batch, 1 call), is advised parallel, and a note names the op."""
    def stateful(i):
        square = tf.random.uniform([64, 64])
        return tf.reduce_mean(tf.linalg.matmul(square, square)) + tf.cast(i, tf.float32)

    def stateless(i):
        square = tf.random.stateless_uniform([64, 64], seed=tf.stack([i, 0]))
        return tf.reduce_mean(tf.linalg.matmul(square, square))

    drawn = stallscope.diagnose(tf.data.Dataset.range(64).map(stateful).batch(8).repeat(),
                                accelerator="emulated:1ms", steps=6)
    assert drawn.pipeline.map_parallelism is None
    note = next(n for n in drawn.notes if "map_parallelization left a map sequential" in n)
    assert "(RandomUniform)" in note and "tf.random.stateless_uniform" in note
    seeded = stallscope.diagnose(tf.data.Dataset.range(64).map(stateless).batch(8).repeat(),
                                 accelerator="emulated:1ms", steps=6)
    assert seeded.pipeline.map_parallelism == -1 and not any("stateful" in n for n in seeded.notes)


def test_the_dataset_is_probed_as_fit_runs_it_epoch_by_epoch_and_steps_per_execution_batches_a_step():
    """diagnose added a `.repeat()` (TF then injects a prefetch above it that fit never runs) and stepped a
    batch at a time under steps_per_execution=4. Now each epoch is the dataset as given from a new
    iterator, and a step is one call of fit's train function: 4 batches fetched inside one graph."""
    import numpy as np

    images = np.zeros((48, 16, 16, 3), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((images, np.arange(48) % 4)).map(lambda x, y: (x + 1.0, y)).batch(4)
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(4, 3),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(4)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    diagnosis = stallscope.diagnose(dataset, model=model, steps=4)
    analysis = diagnosis.analysis
    names = [stage.name for stage in analysis.tree.stages]
    assert names and not any("Repeat" in name or "Prefetch" in name for name in names), names
    assert analysis.steps.batches_per_step == 4
    counted = [s for s in analysis.steps.steps if s.counted]
    assert counted and all(s.get_next_calls == 4 for s in counted), analysis.steps.steps
    end_to_end = diagnosis.phases[0].end_to_end
    assert end_to_end.steps >= 3 and end_to_end.images_per_second > 0
