"""A throwaway certificate authority for the emulated GCS endpoints.

TensorFlow's `gs://` client talks HTTPS to fixed Google host names. The emulator answers those names
with a certificate from a CA made at start (ECDSA: a cheap handshake), and the client trusts that CA
through `CURL_CA_BUNDLE`; nothing is added to the system's trust store.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from stallscope.extras import needs_extra

GOOGLE_API_HOSTS = ("www.googleapis.com", "storage.googleapis.com", "*.googleapis.com", "*.storage.googleapis.com")


def server_context(ca_pem_path: Path) -> ssl.SSLContext:
    """A server-side TLS context for the Google API host names; writes the CA's certificate (PEM)
    to `ca_pem_path` for clients to trust."""
    with needs_extra("emulator", "the emulated gs:// endpoint's TLS"):
        import trustme

    authority = trustme.CA(organization_name="stallscope storage emulator")
    certificate = authority.issue_cert(*GOOGLE_API_HOSTS)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.num_tickets = 0  # TF's curl does not resume sessions; tickets would only add a burst
    certificate.configure_cert(context)
    authority.cert_pem.write_to_path(str(ca_pem_path))
    return context
