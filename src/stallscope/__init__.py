"""stallscope: find, explain and remove input-pipeline stalls in TensorFlow fine-tuning."""

import os as _os

# TensorFlow's C++ start-up chatter hides our output; users can still set their own level.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from stallscope.version import __version__  # noqa: E402, F401


def step(number: int):
    """`with stallscope.step(i):` around each step of a custom loop marks it for the profiler; it goes around
    the call of a tf.function, not inside one (a UsageError says so)."""
    from stallscope.workload.marking import step as _step

    return _step(number)


def profile(log_dir, steps=(10, 20), dataset=None):
    """`with stallscope.profile(LOG, steps=(10, 20)):` captures those `stallscope.step`s; `.analyze()` after
    reads this window's own capture and CPU figures, whatever later windows wrote to LOG. A LOG that is a
    file or cannot be written is a UsageError here, before the loop runs.
    `dataset=`: the tf.data.Dataset the loop reads, so the analysis names TF's rewrites of it."""
    from stallscope.analysis.captures import Profile

    return Profile(log_dir, steps, dataset)


def serve_profiler(port: int, host: str = "127.0.0.1") -> int:
    """Starts TF's profiler server so `stallscope capture localhost:PORT` can attach to this job. TF's
    server listens on every interface with no authentication: stallscope keeps the port to this machine
    unless `host` names another of its addresses, or "0.0.0.0" for every machine that can reach it."""
    from stallscope.workload.marking import serve_profiler as _serve

    return _serve(port, host)


def watch_storage(timeout_s: float = 30.0, on_stuck=None):
    """Watches this process's file calls on network file systems (TF's reads of your data, a checkpoint's
    writes): one the server has not answered for `timeout_s` goes to `on_stuck(message)`. By default the
    message is printed and the process ends with exit code 2, since the thread waiting in the call cannot
    be stopped. Returns the watch: a context manager, or `.stop()` it. Linux (x86-64, arm64) only."""
    from stallscope.storage.stuck_calls import StuckCallWatch, end_process

    limit = "watch_storage's timeout_s"
    give_up = on_stuck or end_process
    return StuckCallWatch(timeout_s, lambda stuck: give_up(stuck.message(timeout_s, limit=limit))).start()


def analyze(path, *, capture: str | None = None, with_xprof: bool = True):
    """What `stallscope analyze PATH` reports, as an Analysis: `input_share` (0..1), `verdict` ("not",
    "moderately" or "highly" input-bound; None where no step held an iterator call), `bottleneck`, the
    stage tree (`tree.stages`), the checklist, the `advice` and `to_dict()`. PATH: a run folder, a log
    folder holding captures at any depth (a Keras TensorBoard log_dir), a capture folder or an
    .xplane.pb file; `capture` names one of several. `with_xprof=False` skips the cross-check against
    TensorBoard's Input Pipeline Analyzer (made only where the xprof extra is installed), as --no-xprof."""
    from stallscope.analysis.analyze import analyze_run

    return analyze_run(path, with_xprof=with_xprof, capture=capture)


def diagnose(dataset, *, model=None, accelerator: str = "emulated:2000", steps: int = 30, files=None,
             what_if_storage: str | None = None, storage_client: str | None = None, work_dir=None,
             service_link: str | None = None, service_worker_cores: float | None = None):
    """The probes of `stallscope diagnose` on your own tf.data.Dataset: compute alone (your compiled
    model, or an emulated device of `accelerator` speed), the pipeline alone warm and cold (where its
    files are known), end to end; returns a Diagnosis (input_share, verdict, cause, to_dict(), text()).
    `what_if_storage` ("10ms,200Mbit", preset names; as `diagnose --what-if-storage`) adds the storage
    what-if, which files in a store get with the presets anyway; `storage_client` picks its client.
    `work_dir`: where the profile of the end-to-end steps is kept (a new folder in it each call, named in
    `.analysis.profile_path`), for `stallscope analyze` and TensorBoard; None keeps nothing: the profile's
    temporary folder is removed before diagnose returns. Where the input is CPU-bound the
    tf.data service is sized: `service_link` ("10Gbit/s", as `--service-link`) and `service_worker_cores`
    say its link and each worker's cores (None: a 10 Gbit/s link, workers with this host's free cores)."""
    from stallscope.analysis.dataset_diagnosis import DatasetDiagnoseOptions, diagnose_dataset
    from stallscope.analysis.service_sizing import ServiceAssumptions
    from stallscope.analysis.storage_whatif import parse_scenarios
    from stallscope.report.diagnosis import with_text

    options = DatasetDiagnoseOptions(steps=steps, accelerator=accelerator,
                                     files=tuple(files) if files is not None else None,
                                     storage_scenarios=parse_scenarios(what_if_storage) if what_if_storage else (),
                                     storage_client=storage_client, work_dir=work_dir,
                                     service=ServiceAssumptions.given(service_link, service_worker_cores))
    return with_text(diagnose_dataset(dataset, model=model, options=options))


def distribute(dataset, service: str, *, processing_mode: str = "dynamic", compression: str = "none",
               job_name: str | None = None, timeout_s: float = 30.0):
    """Your tf.data.Dataset run on a tf.data service (`stallscope serve`) at `service` (HOST:PORT): the
    workers make its elements, this program receives them. `processing_mode` "dynamic" makes each
    element once (a pass split over the workers), "parallel_epochs" a whole pass per worker;
    `compression` "none" suits decoded images (snappy barely shrinks pixels and costs the workers CPU),
    "auto" is TF's snappy; `job_name` lets several trainers share one stream. A dispatcher that does
    not answer within `timeout_s` is a one-line error. Put a prefetch after it."""
    from stallscope.service.servers import DistributeOptions
    from stallscope.service.servers import distribute as _distribute

    return _distribute(dataset, service, DistributeOptions(processing_mode=processing_mode, compression=compression,
                                                           job_name=job_name, timeout_s=timeout_s))


def list_files(url, pattern: str = "*"):
    """Every file below a folder, `gs://bucket/prefix` or `s3://bucket/prefix` matching `pattern`, sorted."""
    from stallscope.storage.own_pipeline import list_files as _list_files

    return _list_files(url, pattern)


def read_files(dataset, in_flight: int = 64, *, deterministic=None):
    """Your tf.data.Dataset of paths (or of tuples led by one) with each path replaced by the file's
    bytes, read from a folder, gs:// or s3:// through stallscope's readers, `in_flight` at once."""
    from stallscope.storage.own_pipeline import read_files as _read_files

    return _read_files(dataset, in_flight, deterministic=deterministic)


def read_records(filenames, num_parallel_reads=None, *, deterministic=None):
    """TFRecordDataset's records from a folder, gs:// or s3://, shards in a bucket streamed by
    stallscope's reader with every record's checksums checked."""
    from stallscope.storage.own_pipeline import read_records as _read_records

    return _read_records(filenames, num_parallel_reads, deterministic=deterministic)


def store_requests():
    """What stallscope's readers (read_files, read_records, the s3:// and pooled gs:// pipelines) have
    asked stores for in this process so far: a RequestTally of requests, bytes and request times.
    `later.since(earlier)` is what was asked between two calls; `percentile_ms(0.5)` its median."""
    from stallscope.storage.request_tally import snapshot

    return snapshot()
