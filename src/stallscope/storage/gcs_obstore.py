"""gs:// objects listed and read through obstore (pipelines with `gcs_reader="pooled"`, listings,
convert's chunks): GETs on kept-alive connections, where TF's own gs:// client opens a new TCP+TLS
connection for every request.

On 2 cores through the emulated store at 10 ms (`storage serve --gcs`, 75 KB JPEGs, 64 in flight),
obstore's GETs cost this process ~0.26 ms of CPU each and the store ~0.16 ms, against ~0.70 ms and
~0.75 ms through TF's gs:// (tf_gcs_client in analysis/storage_whatif.py).

It reaches the store the way TF's gs:// does, so both read the same bucket with the same settings:
the endpoints are Google's, through HTTPS_PROXY where one is set (NO_PROXY honoured), trusting
CURL_CA_BUNDLE's certificates beside the system's. Credentials: TF's test token
(GOOGLE_AUTH_TOKEN_FOR_TESTING, which `storage serve --gcs` prints) where set, else obstore's own
Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default
login`, a service account on the VM).
"""

from __future__ import annotations

import datetime
import os

from stallscope.errors import UsageError
from stallscope.extras import install_line
from stallscope.storage.deadlines import storage_timeout
from stallscope.storage.obstore_client import ObstoreReader, installed, read_ca_bundle

TEST_TOKEN_ENV = "GOOGLE_AUTH_TOKEN_FOR_TESTING"


def available() -> bool:
    """True where obstore (the stores extra) is installed."""
    return installed()


def require_obstore() -> None:
    if not available():
        raise UsageError(f"--gcs-reader pooled: expected the obstore package ({install_line('stores')}), "
                         "or --gcs-reader tf for TF's own gs:// client")


def _proxy() -> tuple[str | None, str | None]:
    """(proxy URL, hosts that bypass it) as curl, and so TF's gs://, reads them from the environment."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or None
    excludes = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or None
    return proxy, excludes


class GcsObjectReader(ObstoreReader):
    """The gs:// stores, one per bucket and process."""

    def _new_store(self, bucket: str):
        require_obstore()
        from obstore.store import GCSStore

        limit = datetime.timedelta(seconds=storage_timeout())
        options: dict = {"connect_timeout": limit, "timeout": limit}
        proxy, excludes = _proxy()
        if proxy:
            options["proxy_url"] = proxy
            if excludes:
                options["proxy_excludes"] = excludes
        bundle = os.environ.get("CURL_CA_BUNDLE")  # what TF's gs:// trusts
        if bundle:
            options["root_certificate"] = read_ca_bundle(bundle, "CURL_CA_BUNDLE")
        token = os.environ.get(TEST_TOKEN_ENV)
        credentials = {"bearer_token": token} if token else {}
        return GCSStore(bucket, client_options=options, retry_config={"max_retries": 1, "retry_timeout": limit},
                        **credentials)
