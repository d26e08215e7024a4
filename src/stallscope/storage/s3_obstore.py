"""s3:// through obstore (Rust object_store bindings): the stores `S3Store` lists, reads, writes,
renames and deletes with.

s3fs spends ~2.4 ms of Python per GET on one event loop, holding the GIL: a few hundred JPEGs a
second per process, on any number of cores. obstore's GETs cost ~0.35 ms of this process's CPU each
(the emulator, 16-32 in flight) and run outside the GIL. A shard's 16 MB blocks cost about the same
CPU per MiB through either (~1.5 ms), but cut into checked records obstore's took 0.3x the CPU at 3x
the rate: s3fs's event loop and the parser take turns at the GIL (benchmarks/s3_reader.py).
Credentials come from botocore's chain (environment, AWS_PROFILE, ~/.aws, SSO, instance roles: what
boto3 and s3fs use), the endpoint, region and CA bundle from the AWS configuration as botocore reads
it; a bucket's region, where none is configured, from a HEAD of the bucket through botocore's client.
STALLSCOPE_S3_READER=s3fs reads objects through s3fs instead (`s3_store`); everything else stays here.
"""

from __future__ import annotations

import datetime
import functools
import os

from stallscope.storage.deadlines import storage_timeout
from stallscope.storage.obstore_client import ObstoreReader, read_ca_bundle

CREDENTIALS_TTL = datetime.timedelta(minutes=5)  # how long obstore keeps refreshable credentials


# What decides the endpoint botocore's clients use (besides the config file's contents).
ENDPOINT_INPUTS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE",
                   "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")


def endpoint_url(session) -> str | None:
    """The S3 endpoint botocore (and so boto3 and s3fs) would use: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, or the
    profile's `endpoint_url` (its services section first), so that listings and reads reach one store.
    None: AWS's own endpoints. Read from botocore's public client (its `meta.endpoint_url`, against a
    client that ignores configured endpoints), once per session and environment: a client costs ~40 ms."""
    return _configured_endpoint(session, tuple(os.environ.get(name) for name in ENDPOINT_INPUTS))


@functools.lru_cache(maxsize=8)
def _configured_endpoint(session, _inputs: tuple[str | None, ...]) -> str | None:
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError

    region = session.get_config_variable("region") or "us-east-1"
    try:
        configured = session.create_client("s3", region_name=region).meta.endpoint_url
        own = session.create_client("s3", region_name=region,
                                    config=Config(ignore_configured_endpoint_urls=True)).meta.endpoint_url
    except BotoCoreError:  # a profile it cannot read: the credentials' check names it
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    return None if configured == own else configured


class NoCredentials(Exception):
    """botocore's chain found no credentials (S3Store.error names what it looked for)."""


def bucket_region(session, bucket: str) -> str | None:
    """The bucket's region as S3 names it in a HEAD of the bucket (botocore follows a redirect to
    it; a refusal names it too), through botocore's client with the storage timeout and no retry.
    None where it cannot be had (refused, missing or unreachable: the request it is made for then
    says so in one line); a store that does not answer is a TimeoutError (the request would wait
    as long again)."""
    from botocore.config import Config
    from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

    seconds = storage_timeout()
    try:
        client = session.create_client("s3", config=Config(
            connect_timeout=seconds, read_timeout=seconds, retries={"total_max_attempts": 1, "mode": "standard"}))
        found = client.head_bucket(Bucket=bucket)
    except (ConnectTimeoutError, ReadTimeoutError):
        raise TimeoutError(f"no answer to a HEAD of bucket {bucket!r} in {seconds:.0f} s") from None
    except ClientError as exc:
        found = exc.response
    except Exception:  # noqa: BLE001 - unreachable, or no credentials: the request names it
        return None
    return (found.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get("x-amz-bucket-region") or None


class ObjectReader(ObstoreReader):
    """The s3:// stores: credentials from botocore's chain, endpoint, region and CA bundle from the
    AWS configuration."""

    def __init__(self) -> None:
        super().__init__()
        self._session = None
        self._regions: dict[str, str] = {}  # bucket -> the region its stores are made for

    def _forget_process_state(self) -> None:
        self._session = None
        self._regions = {}

    def store_for_transfer(self, bucket: str, seconds: float):
        """A store of `bucket` whose requests may each take `seconds` (an upload of many bytes), not
        kept: made for one operation (~5 ms of CPU), its requests end with it."""
        with self._lock:
            self._fresh()
        return self._new_store(bucket, seconds)

    def _credentials(self) -> dict:
        credentials = self._session.get_credentials()
        if credentials is None:
            raise NoCredentials("Unable to locate credentials")
        frozen = credentials.get_frozen_credentials()  # refreshes credentials that are about to expire
        refreshable = getattr(credentials, "refresh_needed", None) is not None
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": datetime.datetime.now(datetime.timezone.utc) + CREDENTIALS_TTL if refreshable else None}

    def _ca_bundle(self) -> bytes | None:
        """The PEM certificates botocore would trust (AWS_CA_BUNDLE or the profile's ca_bundle), for a
        store behind a private CA; None where none is configured."""
        bundle = self._session.get_config_variable("ca_bundle")
        if not bundle:
            return None
        source = "AWS_CA_BUNDLE" if os.environ.get("AWS_CA_BUNDLE") == bundle else "the AWS profile's ca_bundle"
        return read_ca_bundle(bundle, source)

    def _new_store(self, bucket: str, seconds: float | None = None):
        import botocore.session
        from obstore.store import S3Store as ObstoreS3

        if self._session is None:
            self._session = botocore.session.Session()
        self._credentials()  # none at all: one line now, not a wrapped error per request
        seconds = seconds or storage_timeout()
        endpoint = endpoint_url(self._session)
        limit = datetime.timedelta(seconds=seconds)
        options = {"connect_timeout": limit, "timeout": limit,
                   "allow_http": bool(endpoint and endpoint.startswith("http://"))}
        authorities = self._ca_bundle()
        if authorities:  # trusted beside the system's roots, as botocore trusts the bundle
            options["root_certificate"] = authorities
        # botocore follows a bucket's redirect to its region; obstore does not, so it is told.
        region = self._session.get_config_variable("region") or self._regions.get(bucket)
        if region is None:
            region = self._regions[bucket] = bucket_region(self._session, bucket) or "us-east-1"
        return ObstoreS3(bucket, endpoint=endpoint, region=region,
                         credential_provider=self._credentials, client_options=options,
                         retry_config={"max_retries": 1, "retry_timeout": limit})
