"""A read-only GCS store on loopback that TensorFlow's built-in `gs://` file system reads.

TF's client has fixed endpoints (https://www.googleapis.com/storage/v1/ for metadata and listings,
https://storage.googleapis.com/BUCKET/OBJECT for media), but its libcurl honours HTTPS_PROXY. So this
server is also the proxy: it answers `CONNECT *.googleapis.com:443` (and refuses any other host),
terminates TLS with the emulator's own CA, and serves the JSON API from the folder on that same
connection. Plain HTTP works too (STORAGE_EMULATOR_HOST for the Python clients).

Every connection is served on one event loop (`http_loop`), as the S3 store's are. TF's client
opens a new connection per request (CONNECT, TLS handshake, one GET), so a thread per connection, its
TLS socket and `email`'s header parser were paid per request: 1.2-2.0 ms of the store's CPU per 75 KB
JPEG with the latency relay in front, on the 2 cores the training ran on. With a latency, the server
holds each request itself (the CONNECT, the handshake's flight, the GET: three round trips, as the
relay made them); the relay stays for a bandwidth cap.

Served: bucket metadata, object metadata, media download (with Range; `alt=media` on the JSON path or
the storage.googleapis.com path), listings with prefix, delimiter, maxResults and pageToken, and the
XML API's listing (`list-type=2`, obstore's).
Writes are refused with 403 unless the folder is served `writable`; then the uploads TF's gs:// makes
(resumable sessions, in one or several chunks; `uploadType=media`), object deletes and
rewrites/copies (TF's rename) land in the folder, each object whole or not at all.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import re
import secrets
import ssl
import urllib.parse
from pathlib import Path
from typing import BinaryIO

from stallscope.storage.emulator.http_loop import EventLoopServer
from stallscope.storage.emulator.http_handler import CountingHandler
from stallscope.storage.emulator.s3_server import list_bucket_result
from stallscope.storage.emulator.folder_bucket import (
    ByteRangeError,
    FolderBucket,
    StoredObject,
    WriteRefused,
    parse_range,
)

JSON_API = "/storage/v1/b/"
DOWNLOAD_API = "/download/storage/v1/b/"
UPLOAD_API = "/upload/storage/v1/b/"
ALLOWED_TUNNEL_SUFFIX = ".googleapis.com"
MAX_OPEN_UPLOADS = 256  # resumable sessions begun and not finished; the oldest is dropped past this
_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")


@dataclasses.dataclass
class Upload:
    """A resumable upload session: the object's key and the hidden file its bytes go to so far."""

    key: str
    part: Path
    handle: BinaryIO
    received: int = 0


class GcsServer(EventLoopServer):
    """`bucket` served on 127.0.0.1:`port`, all connections on one event loop; `tunnel_tls` terminates
    the CONNECT tunnels (None: plain HTTP only); `latency_s` is held per request and per handshake."""

    def __init__(self, port: int, bucket: FolderBucket, counters, tunnel_tls: ssl.SSLContext | None, *,
                 latency_s: float = 0.0) -> None:
        self.bucket = bucket
        self.tunnel_tls = tunnel_tls
        self.uploads: dict[str, Upload] = {}  # touched only on the loop's thread
        super().__init__(port, GcsHandler, counters, latency_s=latency_s)

    def server_close(self) -> None:
        """Unfinished uploads leave nothing behind (their objects never existed)."""
        super().server_close()
        for upload in self.uploads.values():
            upload.handle.close()
            self.bucket.abandon(upload.part)
        self.uploads.clear()


def object_resource(bucket: str, info: StoredObject) -> dict:
    return {
        "kind": "storage#object", "id": f"{bucket}/{info.key}/{info.mtime_ns}", "name": info.key,
        "bucket": bucket, "size": str(info.size), "generation": str(info.mtime_ns), "metageneration": "1",
        "contentType": "application/octet-stream", "storageClass": "STANDARD",
        "timeCreated": info.modified(), "updated": info.modified(),
    }


class GcsHandler(CountingHandler):
    server: GcsServer

    # ----- the tunnel
    def do_CONNECT(self) -> None:  # noqa: N802 - http.server's naming
        host, _, port = self.path.rpartition(":")
        if not host.endswith(ALLOWED_TUNNEL_SUFFIX) or port != "443" or self.server.tunnel_tls is None:
            self.send_response(403, "Forbidden")
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.close_connection = True
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.start_tls(self.server.tunnel_tls)

    # ----- reads
    def _answer(self, *, head_only: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        raw_path, query = url.path, urllib.parse.parse_qs(url.query)
        bucket = self.server.bucket
        media = query.get("alt", [""])[0] == "media"
        for api in (JSON_API, DOWNLOAD_API):
            if raw_path.startswith(api):
                name, _, rest = raw_path[len(api):].partition("/")
                name = urllib.parse.unquote(name)
                if name != bucket.name:
                    return self._error(404, f"The specified bucket does not exist: {name}", "notFound")
                if rest == "":
                    return self._json({"kind": "storage#bucket", "id": name, "name": name,
                                       "location": "US-CENTRAL1", "storageClass": "STANDARD"}, head_only)
                if rest == "o":
                    return self._list(query, head_only)
                if rest.startswith("o/"):
                    key = urllib.parse.unquote(rest[2:])
                    return self._media(key, head_only) if media or api == DOWNLOAD_API else self._metadata(key, head_only)
                return self._error(404, f"Not found: {raw_path}", "notFound")
        # storage.googleapis.com/BUCKET/OBJECT (TF's media path), or BUCKET.storage.googleapis.com/OBJECT
        host = (self.headers.get("Host") or "").split(":")[0]
        path = raw_path.lstrip("/")
        if host.endswith(".storage.googleapis.com"):
            name, key = host[: -len(".storage.googleapis.com")], path
        else:
            name, _, key = path.partition("/")
        name, key = urllib.parse.unquote(name), urllib.parse.unquote(key)
        if name != bucket.name:
            return self._error(404, f"The specified bucket does not exist: {name}", "notFound")
        if not key:
            return self._xml_list(query, head_only) if "list-type" in query else self._list(query, head_only)
        return self._media(key, head_only)

    def _metadata(self, key: str, head_only: bool) -> None:
        info = self.server.bucket.stat(key)
        if info is None:
            return self._error(404, f"No such object: {self.server.bucket.name}/{key}", "notFound")
        self._json(object_resource(self.server.bucket.name, info), head_only)

    def _media(self, key: str, head_only: bool) -> None:
        bucket = self.server.bucket
        found = bucket.lookup(key)
        if found is None:
            return self._error(404, f"No such object: {bucket.name}/{key}", "notFound")
        path, info = found
        try:
            wanted = parse_range(self.headers.get("Range"), info.size)
        except ByteRangeError:
            self.count_request(errors=1)
            return self.send_body(416, {"Content-Range": f"bytes */{info.size}"}, b"", 0, head_only=head_only)
        headers = {"Content-Type": "application/octet-stream", "x-goog-generation": str(info.mtime_ns),
                   "x-goog-stored-content-length": str(info.size), "Accept-Ranges": "bytes",
                   "ETag": f'"{info.mtime_ns:x}"',
                   "Last-Modified": email.utils.formatdate(info.mtime_ns / 1e9, usegmt=True)}
        self.send_object(path, info.size, headers, wanted, head_only=head_only)

    def _list(self, query: dict, head_only: bool) -> None:
        def one(name: str) -> str:
            return query.get(name, [""])[0]

        try:
            page_size = int(one("maxResults") or 1000)
        except ValueError:
            return self._error(400, f"Invalid maxResults: {one('maxResults')}", "invalid")
        page = self.server.bucket.list(one("prefix"), one("delimiter"), one("pageToken"), page_size)
        body: dict = {"kind": "storage#objects"}
        if page.objects:
            body["items"] = [object_resource(self.server.bucket.name, info) for info in page.objects]
        if page.prefixes:
            body["prefixes"] = list(page.prefixes)
        if page.next_token:
            body["nextPageToken"] = page.next_token
        self._json(body, head_only, lists=1)

    def _xml_list(self, query: dict, head_only: bool) -> None:
        """The XML API's listing (`storage.googleapis.com/BUCKET?list-type=2`, obstore's), as S3 writes it."""
        try:
            body = list_bucket_result(self.server.bucket, query).encode()
        except ValueError:
            return self._error(400, f"Invalid max-keys: {query.get('max-keys', [''])[0]}", "invalid")
        self.count_request(lists=1)
        self.send_body(200, {"Content-Type": "application/xml"}, body, len(body), head_only=head_only)

    # ----- writes (a writable bucket; otherwise each is refused with 403)
    def do_POST(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path.startswith(UPLOAD_API):
            name, _, rest = url.path[len(UPLOAD_API):].partition("/")
            if not self._our_bucket(urllib.parse.unquote(name)) or rest != "o":
                return self._drained_error(404, f"Not found: {url.path}", "notFound")
            key = query.get("name", [""])[0]
            kind = query.get("uploadType", [""])[0]
            if kind == "media":
                return self._write(lambda: self.server.bucket.put(key, self.read_body()))
            if kind == "resumable":
                self.read_body()  # the object's metadata, if any: the name in the query is what counts
                return self._begin_upload(key)
            return self._drained_error(400, f"uploadType={kind!r} is not served here; expected media or resumable",
                                       "invalid")
        if url.path.startswith(JSON_API):
            parts = url.path[len(JSON_API):].split("/")
            # B/o/SRC/rewriteTo/b/B2/o/DST (or copyTo): TF's rename is a rewrite, then a delete
            if len(parts) == 8 and parts[1] == "o" and parts[3] in ("rewriteTo", "copyTo") and parts[4:7:2] == ["b", "o"]:
                source_bucket, source, target_bucket, target = (urllib.parse.unquote(parts[i]) for i in (0, 2, 5, 7))
                if not (self._our_bucket(source_bucket) and self._our_bucket(target_bucket)):
                    return self._drained_error(404, "The specified bucket does not exist", "notFound")
                self.read_body()
                return self._copy(source, target, rewrite=parts[3] == "rewriteTo")
        return self._drained_error(404, f"Not found: {url.path}", "notFound")

    def do_PUT(self) -> None:  # noqa: N802
        """A chunk of a resumable upload (`Content-Range: bytes FIRST-LAST/TOTAL`), or its status query
        (`bytes */TOTAL` or `bytes */*` with no body)."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        upload = self.server.uploads.get(query.get("upload_id", [""])[0])
        if upload is None:
            return self._drained_error(404, "No such upload session", "notFound")
        match = _CONTENT_RANGE.match((self.headers.get("Content-Range") or "bytes */*").strip())
        if match is None:
            return self._drained_error(400, f"Content-Range: expected 'bytes FIRST-LAST/TOTAL', got "
                                            f"{self.headers.get('Content-Range')!r}", "invalid")
        first, last, total = match.groups()
        body = self.read_body()
        if first is not None:
            if int(first) != upload.received or int(last) - int(first) + 1 != len(body):
                return self._error(400, f"Content-Range {first}-{last}: expected bytes from {upload.received} "
                                        f"and a body of that length, got {len(body)} bytes", "invalid")
            upload.handle.write(body)
            upload.received += len(body)
        if total != "*" and int(total) == upload.received:
            self.server.uploads.pop(query["upload_id"][0], None)
            upload.handle.close()
            return self._write(lambda: self.server.bucket.commit(upload.key, upload.part), abandon=upload.part)
        headers = {"Range": f"bytes=0-{upload.received - 1}"} if upload.received else {}
        self.count_request()
        self.send_body(308, headers, b"", 0)

    def do_DELETE(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        parts = url.path[len(JSON_API):].split("/", 2) if url.path.startswith(JSON_API) else []
        self.drain_body()
        if len(parts) != 3 or parts[1] != "o" or not self._our_bucket(urllib.parse.unquote(parts[0])):
            return self._error(404, f"Not found: {url.path}", "notFound")
        key = urllib.parse.unquote(parts[2])
        try:
            gone = self.server.bucket.delete(key)
        except WriteRefused as refused:
            return self._error(403, str(refused), "forbidden")
        if not gone:
            return self._error(404, f"No such object: {self.server.bucket.name}/{key}", "notFound")
        self.count_request()
        self.send_body(204, {}, b"", 0)

    def do_PATCH(self) -> None:  # noqa: N802
        self._drained_error(403, "Metadata patches are not served by this emulated store.", "forbidden")

    def _our_bucket(self, name: str) -> bool:
        return name == self.server.bucket.name

    def _begin_upload(self, key: str) -> None:
        try:
            part, handle = self.server.bucket.open_part(key)
        except WriteRefused as refused:
            return self._error(403, str(refused), "forbidden")
        upload_id = secrets.token_hex(12)
        self.server.uploads[upload_id] = Upload(key, part, handle)
        while len(self.server.uploads) > MAX_OPEN_UPLOADS:
            dropped = self.server.uploads.pop(next(iter(self.server.uploads)))
            dropped.handle.close()
            self.server.bucket.abandon(dropped.part)
        scheme = "https" if self.over_tls else "http"
        host = self.headers.get("Host") or f"127.0.0.1:{self.server.port}"
        bucket = urllib.parse.quote(self.server.bucket.name, safe="")
        location = f"{scheme}://{host}{UPLOAD_API}{bucket}/o?uploadType=resumable&upload_id={upload_id}"
        self.count_request()
        self.send_body(200, {"Location": location}, b"", 0)

    def _copy(self, source: str, target: str, *, rewrite: bool) -> None:
        try:
            info = self.server.bucket.copy(source, target)
        except WriteRefused as refused:
            return self._error(403, str(refused), "forbidden")
        if info is None:
            return self._error(404, f"No such object: {self.server.bucket.name}/{source}", "notFound")
        resource = object_resource(self.server.bucket.name, info)
        if rewrite:
            resource = {"kind": "storage#rewriteResponse", "totalBytesRewritten": str(info.size),
                        "objectSize": str(info.size), "done": True, "resource": resource}
        self._json(resource, False)

    def _write(self, make, abandon: Path | None = None) -> None:
        try:
            info: StoredObject = make()
        except WriteRefused as refused:
            if abandon is not None:
                self.server.bucket.abandon(abandon)
            return self._error(403, str(refused), "forbidden")
        self._json(object_resource(self.server.bucket.name, info), False)

    def _drained_error(self, status: int, message: str, reason: str) -> None:
        self.drain_body()
        self._error(status, message, reason)

    # ----- answers
    def _json(self, body: dict, head_only: bool, *, lists: int = 0) -> None:
        data = json.dumps(body).encode()
        self.count_request(lists=lists)
        self.send_body(200, {"Content-Type": "application/json; charset=UTF-8"}, data, len(data), head_only=head_only)

    def _error(self, status: int, message: str, reason: str) -> None:
        data = json.dumps({"error": {"code": status, "message": message,
                                     "errors": [{"message": message, "domain": "global", "reason": reason}]}}).encode()
        self.count_request(errors=1)
        self.send_body(status, {"Content-Type": "application/json; charset=UTF-8"}, data, len(data),
                       head_only=self.command == "HEAD")
