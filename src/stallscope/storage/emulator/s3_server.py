"""An S3-compatible store on loopback: GetObject (with Range), HeadObject, HeadBucket, ListObjectsV2
and ListObjects over a local folder, path-style (`http://127.0.0.1:PORT/BUCKET/KEY`); served
`writable`, also PutObject (plain or aws-chunked bodies), CopyObject, DeleteObject and DeleteObjects, each object
whole or not at all. Multipart uploads are refused (501): objects here are test-sized.

Signatures are not checked (any AWS_ACCESS_KEY_ID works); writes to a read-only store get 403. Ours rather
than moto's server mode: moto spends about 3 ms of CPU per request, which on a 2-core machine becomes
the storage cost being measured.
"""

from __future__ import annotations

import email.utils
import ssl
import urllib.parse
import xml.etree.ElementTree as ElementTree
from xml.sax.saxutils import escape

from stallscope.storage.emulator.http_loop import EventLoopServer
from stallscope.storage.emulator.http_handler import CountingHandler
from stallscope.storage.emulator.folder_bucket import (
    ByteRangeError,
    FolderBucket,
    StoredObject,
    WriteRefused,
    parse_range,
)

_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"


class S3Server(EventLoopServer):
    """`bucket` on 127.0.0.1:`port`, all connections on one event loop; `tls` serves it over HTTPS."""

    def __init__(self, port: int, bucket: FolderBucket, counters, *, latency_s: float = 0.0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.bucket = bucket
        super().__init__(port, S3Handler, counters, latency_s=latency_s, tls=tls)


def _etag(info: StoredObject) -> str:
    return f'"{info.size:x}{info.mtime_ns:x}"'


def list_bucket_result(bucket: FolderBucket, query: dict) -> str:
    """ListObjectsV2 (`list-type=2`) or ListObjects as S3's XML ListBucketResult, which GCS's XML API
    answers too; a max-keys that is not a number is a ValueError."""
    def one(name: str) -> str:
        return query.get(name, [""])[0]

    version2 = one("list-type") == "2"
    prefix, delimiter = one("prefix"), one("delimiter")
    token = one("continuation-token") if version2 else one("marker")
    start_after = one("start-after") if version2 else ""
    page_size = int(one("max-keys") or 1000)
    page = bucket.list(prefix, delimiter, token or start_after, page_size)
    parts = [f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{_XMLNS}">',
             f"<Name>{escape(bucket.name)}</Name><Prefix>{escape(prefix)}</Prefix>",
             f"<MaxKeys>{page_size}</MaxKeys><IsTruncated>{'true' if page.next_token else 'false'}</IsTruncated>"]
    if delimiter:
        parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
    if version2:
        parts.append(f"<KeyCount>{len(page.objects) + len(page.prefixes)}</KeyCount>")
        if token:
            parts.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
        if page.next_token:
            parts.append(f"<NextContinuationToken>{escape(page.next_token)}</NextContinuationToken>")
    else:
        parts.append(f"<Marker>{escape(token)}</Marker>")
        if page.next_token:
            parts.append(f"<NextMarker>{escape(page.next_token)}</NextMarker>")
    for info in page.objects:
        parts.append(f"<Contents><Key>{escape(info.key)}</Key><LastModified>{info.modified()}</LastModified>"
                     f"<ETag>{escape(_etag(info))}</ETag><Size>{info.size}</Size>"
                     f"<StorageClass>STANDARD</StorageClass></Contents>")
    for common in page.prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{escape(common)}</Prefix></CommonPrefixes>")
    parts.append("</ListBucketResult>")
    return "".join(parts)


class S3Handler(CountingHandler):
    server: S3Server

    def _answer(self, *, head_only: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        name, _, key = url.path.lstrip("/").partition("/")
        name, key = urllib.parse.unquote(name), urllib.parse.unquote(key)
        bucket = self.server.bucket
        if name != bucket.name:
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist", name, head_only)
        if key:
            return self._object(key, head_only)
        if "location" in query:
            body = f'<?xml version="1.0" encoding="UTF-8"?><LocationConstraint xmlns="{_XMLNS}"></LocationConstraint>'
            return self._xml(body, head_only)
        if head_only:
            self.count_request()
            return self.send_body(200, {"x-amz-bucket-region": "us-east-1"}, b"", 0, head_only=True)
        return self._list(query)

    def _object(self, key: str, head_only: bool) -> None:
        bucket = self.server.bucket
        found = bucket.lookup(key)
        if found is None:
            return self._error(404, "NoSuchKey", "The specified key does not exist.", key, head_only)
        path, info = found
        try:
            wanted = parse_range(self.headers.get("Range"), info.size)
        except ByteRangeError:
            return self._error(416, "InvalidRange", "The requested range is not satisfiable", key, head_only)
        headers = {"Content-Type": "application/octet-stream", "ETag": _etag(info), "Accept-Ranges": "bytes",
                   "Last-Modified": email.utils.formatdate(info.mtime_ns / 1e9, usegmt=True)}
        self.send_object(path, info.size, headers, wanted, head_only=head_only)

    def _list(self, query: dict) -> None:
        try:
            body = list_bucket_result(self.server.bucket, query)
        except ValueError:
            return self._error(400, "InvalidArgument", "max-keys must be an integer", query.get("max-keys", [""])[0],
                               False)
        self._xml(body, False, lists=1)

    # ----- writes (a writable bucket; otherwise each is refused with 403)
    def _object_key(self) -> tuple[str, str, dict]:
        url = urllib.parse.urlsplit(self.path)
        name, _, key = url.path.lstrip("/").partition("/")
        return urllib.parse.unquote(name), urllib.parse.unquote(key), \
            urllib.parse.parse_qs(url.query, keep_blank_values=True)

    def do_PUT(self) -> None:  # noqa: N802
        name, key, query = self._object_key()
        body = self.read_body()
        if name != self.server.bucket.name:
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist", name, False)
        if not key:
            return self._error(403, "AccessDenied", "Buckets are not created here", name, False)
        if "uploadId" in query or "partNumber" in query:
            return self._error(501, "NotImplemented", "Multipart uploads are not served here", key, False)
        source = self.headers.get("x-amz-copy-source")
        try:
            if source:
                source_name, _, source_key = urllib.parse.unquote(source.split("?")[0]).lstrip("/").partition("/")
                if source_name != self.server.bucket.name:
                    return self._error(404, "NoSuchBucket", "The specified bucket does not exist", source_name, False)
                info = self.server.bucket.copy(source_key, key)
                if info is None:
                    return self._error(404, "NoSuchKey", "The specified key does not exist.", source_key, False)
                return self._xml(f'<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult xmlns="{_XMLNS}">'
                                 f"<LastModified>{info.modified()}</LastModified><ETag>{escape(_etag(info))}"
                                 "</ETag></CopyObjectResult>", False)
            info = self.server.bucket.put(key, self._decoded(body))
        except WriteRefused as refused:
            return self._error(403, "AccessDenied", str(refused), key, False)
        self.count_request()
        self.send_body(200, {"ETag": _etag(info)}, b"", 0)

    def _decoded(self, body: bytes) -> bytes:
        """An aws-chunked body (`SIZE;chunk-signature=...\\r\\nDATA\\r\\n`..., then trailers) as its data."""
        streamed = (self.headers.get("x-amz-content-sha256") or "").startswith("STREAMING-")
        if "aws-chunked" not in (self.headers.get("Content-Encoding") or "") and not streamed:
            return body
        data, at = [], 0
        while at < len(body):
            end = body.index(b"\r\n", at)
            size = int(body[at:end].split(b";")[0], 16)
            if size == 0:
                break
            data.append(body[end + 2:end + 2 + size])
            at = end + 2 + size + 2
        return b"".join(data)

    def do_DELETE(self) -> None:  # noqa: N802
        name, key, _ = self._object_key()
        self.drain_body()
        if name != self.server.bucket.name:
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist", name, False)
        try:
            self.server.bucket.delete(key)  # S3 answers 204 whether or not the key was there
        except WriteRefused as refused:
            return self._error(403, "AccessDenied", str(refused), key, False)
        self.count_request()
        self.send_body(204, {}, b"", 0)

    def do_POST(self) -> None:  # noqa: N802
        """DeleteObjects (`POST /BUCKET?delete`: obstore's delete, s3fs's rm); anything else posted is refused."""
        name, key, query = self._object_key()
        if key or "delete" not in query:
            return self._refuse_write()
        if name != self.server.bucket.name:
            self.drain_body()
            return self._error(404, "NoSuchBucket", "The specified bucket does not exist", name, False)
        try:
            keys = [element.text or "" for element in ElementTree.fromstring(self.read_body()).iter()
                    if element.tag.rpartition("}")[2] == "Key"]
        except ElementTree.ParseError:
            return self._error(400, "MalformedXML", "expected a Delete document", name, False)
        try:
            for one in keys:
                self.server.bucket.delete(one)
        except WriteRefused as refused:
            return self._error(403, "AccessDenied", str(refused), name, False)
        deleted = "".join(f"<Deleted><Key>{escape(one)}</Key></Deleted>" for one in keys)
        self._xml(f'<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="{_XMLNS}">{deleted}</DeleteResult>', False)

    def _refuse_write(self) -> None:
        self.drain_body()
        self._error(403 if not self.server.bucket.writable else 501, "AccessDenied" if not self.server.bucket.writable
                    else "NotImplemented", "This emulated store takes PutObject, CopyObject, DeleteObject(s) only.",
                    self.path, self.command == "HEAD")

    do_PATCH = _refuse_write  # noqa: N815

    def _xml(self, body: str, head_only: bool, *, lists: int = 0) -> None:
        data = body.encode()
        self.count_request(lists=lists)
        self.send_body(200, {"Content-Type": "application/xml"}, data, len(data), head_only=head_only)

    def _error(self, status: int, code: str, message: str, resource: str, head_only: bool) -> None:
        data = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{escape(message)}'
                f"</Message><Resource>{escape(resource)}</Resource></Error>").encode()
        self.count_request(errors=1)
        self.send_body(status, {"Content-Type": "application/xml"}, data, len(data), head_only=head_only)
