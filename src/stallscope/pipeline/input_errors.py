"""TensorFlow's errors from the input pipeline, met in the middle of training, as one line naming the file.

TF says `DataLossError: corrupted record at 1234` without the shard, and `Invalid JPEG data` without
the image, and `FailedPreconditionError: PATH; Transport endpoint is not connected` where a FUSE mount's
server died mid-run. Once such an error has stopped a run, the source is searched for the culprit with the
project's own checks (`verify`'s framing parser for records, TF's decoder for image files), so the
user is told which file, record and byte, and how to check the rest.
"""

from __future__ import annotations

import logging
import os
import re
import shlex

from stallscope.errors import DataError

log = logging.getLogger(__name__)


def _tf_line(exc) -> str:
    from stallscope.records.verify import tf_error_line

    return tf_error_line(getattr(exc, "message", None) or str(exc))


def data_errors() -> tuple[type, ...]:
    """TF's errors for input that is damaged, gone or unreadable: `input_error` names the file.
    FailedPreconditionError is how TF raises ENOTCONN, a mount whose server is gone; a read in flight
    when it went fails with ECONNABORTED, which TF raises as an InternalError (see `_read_unavailable`)."""
    import tensorflow as tf

    return (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError,
            tf.errors.PermissionDeniedError, tf.errors.FailedPreconditionError, tf.errors.InternalError)


def _read_unavailable(exc) -> bool:
    """TF's ReadFile failing as UnavailableError inside tf.data is re-raised as an InternalError that says so."""
    return "originally returned UnavailableError" in (getattr(exc, "message", None) or str(exc))


def store_errors() -> tuple[type, ...]:
    """TF's errors for a store that stopped answering (its gs:// client after its retries): `store_error`."""
    import tensorflow as tf

    return tf.errors.AbortedError, tf.errors.UnavailableError, tf.errors.DeadlineExceededError


def input_error(source, exc) -> DataError:
    """A DataError naming where `exc` (a TF error raised while reading `source`) comes from."""
    import tensorflow as tf

    what = _tf_line(exc)
    if isinstance(exc, tf.errors.FailedPreconditionError) or _read_unavailable(exc):
        return _unreachable_error(source, " ".join((getattr(exc, "message", None) or str(exc)).split()))
    if source is None or isinstance(exc, tf.errors.InternalError):
        return DataError(f"the input pipeline failed: {what}")
    if isinstance(exc, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError)):
        return _unreadable_error(source, what)
    if source.kind == "records":
        return _records_error(source, what)
    return _files_error(source, what)


def store_error(source, exc):
    """A store that stopped answering in the middle of the run (TF's own gs:// client gives up with
    AbortedError after its retries): one line naming the object it was reading, not a traceback."""
    import re

    from stallscope.storage.deadlines import refused, refused_connection
    from stallscope.storage.gcs_store import gcs_endpoint, libcurl_reason
    from stallscope.storage.location import StorageError, short

    text = " ".join((getattr(exc, "message", None) or str(exc)).split())
    named = re.search(r"(?:gs|s3)://\S+?(?=[\s,;'\"]|$)", text)
    where = named.group(0) if named else (str(source.path) if source is not None else "the input")
    if refused_connection(text):  # the store was stopped mid-run: waiting longer cannot help
        endpoint, who = gcs_endpoint() if where.startswith("gs://") else \
            (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the S3 endpoint", "store")
        return refused(f"--dataset-path: {where}", endpoint, who)
    return StorageError(f"--dataset-path: {where}: the store did not answer ({short(libcurl_reason(text))}); "
                        "expected it to answer within --storage-timeout")


# ENOTCONN, as the kernel words it: a FUSE mount whose daemon ended (or was killed) without unmounting;
# ECONNABORTED: a request that was in flight when it did.
_GONE_SERVER = ("Transport endpoint is not connected", "Software caused connection abort")


def _unreachable_error(source, text: str) -> DataError:
    """A file the pipeline could no longer reach: named from TF's whole message (`...: PATH; reason
    [[{{node ReadFile}}]]`), or the input when it names none. Nothing more is read to find it: the
    mount answers nothing now."""
    found = re.search(r"(\S+); ([^\[]+?)\s*(?:\[\[|$)", text)
    where = found.group(1) if found else (str(source.path) if source is not None else "the input")
    reason = found.group(2) if found else _tf_line(text)
    gone = next((reason for reason in _GONE_SERVER if reason in text), None)
    if gone is not None:
        return DataError(f"{where}: cannot be read: the mount's server is gone ({gone}: the FUSE daemon "
                         "serving it ended); expected it to serve the files until the run ends: remount it and "
                         "run again (a checkpointed run resumes)")
    return DataError(f"{where}: cannot be read any more ({reason}); expected every listed file to stay readable "
                     "until the run ends")


def _records_error(source, what: str) -> DataError:
    from stallscope.records.verify import verify_records

    check = f"run `stallscope verify {shlex.quote(str(source.path))}` to check every shard"
    wanted = {shard.name for shard in source.files}
    for decode in (False, True):  # framing and checksums first: cheap, and what DataLossError means
        log.info("looking for the damaged record in %s (decode=%s)", source.path, decode)
        report = verify_records(source.path, decode=decode)
        problem = next((p for p in report.problems if p.file in wanted), None)
        if problem is not None:
            return DataError(f"{source.path / problem.file}: " + str(problem).split(": ", 1)[1] + f" (TensorFlow: {what}); {check}")
    return DataError(f"{source.path}: reading the records failed ({what}); {check}")


def _files_error(source, what: str) -> DataError:
    import tensorflow as tf

    from stallscope.storage.location import is_remote

    log.info("looking for the image TensorFlow cannot decode among %d file(s)", len(source.files))
    for path in source.files:
        try:
            # A local name's bytes as they are: a name that is not UTF-8 (a\xff.jpg) is no str TF takes.
            name = str(path) if is_remote(str(path)) else os.fsencode(path)
            tf.io.decode_image(tf.io.read_file(name), channels=3, expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError, tf.errors.DataLossError) as exc:
            return DataError(
                f"{path}: TensorFlow cannot decode this image ({_tf_line(exc)}); "
                f"repair or remove it, or convert the tree (`stallscope convert` skips unusable images)"
            )
        except tf.errors.OpError as exc:
            return DataError(f"{path}: cannot be read ({_tf_line(exc)})")
    return DataError(f"{source.path}: the input pipeline failed ({what}); every image decodes on its own")


def _unreadable_error(source, what: str) -> DataError:
    """A file the run listed at its start that is gone or may no longer be read (a sync job deleted it,
    its permissions changed): found by a look at each listed file, no decode, so it is quick on a large
    tree. Files in a store are named by TF's own line, which names the object."""
    from stallscope.storage.location import is_remote

    listed = "listed when the run started"
    named = [path for path in source.files if str(path) in what]  # the file TF failed on, where its line names it
    for path in (*named, *source.files):
        if is_remote(str(path)):
            break
        if not os.path.lexists(path):
            return DataError(f"{path}: no longer there ({listed}; deleted or moved since); "
                             f"expected every listed file to stay until the run ends (TensorFlow: {what})")
        if not os.access(path, os.R_OK):
            return DataError(f"{path}: cannot be read any more (permission denied; {listed}); "
                             f"expected every listed file to stay readable (TensorFlow: {what})")
    return DataError(f"{source.path}: a file of the input cannot be read ({what})")
