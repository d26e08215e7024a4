"""A read-only GCS store on loopback that TensorFlow's built-in `gs://` file system reads.

TF's client has fixed endpoints (https://www.googleapis.com/storage/v1/ for metadata and listings,
https://storage.googleapis.com/BUCKET/OBJECT for media), but its libcurl honours HTTPS_PROXY. So this
server is also the proxy: it answers `CONNECT *.googleapis.com:443` (and refuses any other host),
terminates TLS with the emulator's own CA, and serves the JSON API from the folder on that same
connection. Plain HTTP works too (STORAGE_EMULATOR_HOST for the Python clients).

Served: bucket metadata, object metadata, media download (with Range; `alt=media` on the JSON path or
the storage.googleapis.com path), listings with prefix, delimiter, maxResults and pageToken.
Writes (uploads, deletes, patches) are refused with 403: the store serves a folder read-only.
"""

from __future__ import annotations

import datetime
import json
import socketserver
import ssl
import urllib.parse

from stallscope.storage.http_base import CountingHandler, LoopbackServer
from stallscope.storage.objects import ByteRangeError, FolderBucket, ObjectInfo, parse_range, read_range

JSON_API = "/storage/v1/b/"
DOWNLOAD_API = "/download/storage/v1/b/"
ALLOWED_TUNNEL_SUFFIX = ".googleapis.com"


class GcsServer(LoopbackServer):
    """`bucket` served on 127.0.0.1:`port`; `tls` terminates the CONNECT tunnels (None: plain only)."""

    def __init__(self, port: int, bucket: FolderBucket, counters, tls: ssl.SSLContext | None) -> None:
        self.bucket = bucket
        self.tls = tls
        super().__init__(port, GcsHandler, counters)


def _rfc3339(mtime_ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(mtime_ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def object_resource(bucket: str, info: ObjectInfo) -> dict:
    return {
        "kind": "storage#object", "id": f"{bucket}/{info.key}/{info.mtime_ns}", "name": info.key,
        "bucket": bucket, "size": str(info.size), "generation": str(info.mtime_ns), "metageneration": "1",
        "contentType": "application/octet-stream", "storageClass": "STANDARD",
        "timeCreated": _rfc3339(info.mtime_ns), "updated": _rfc3339(info.mtime_ns),
    }


class GcsHandler(CountingHandler):
    server: GcsServer

    # ----- the tunnel
    def do_CONNECT(self) -> None:  # noqa: N802 - http.server's naming
        host, _, port = self.path.rpartition(":")
        if not host.endswith(ALLOWED_TUNNEL_SUFFIX) or port != "443" or self.server.tls is None:
            self.send_response(403, "Forbidden")
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.close_connection = True
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        try:
            self.connection = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.close_connection = True
            return
        self.rfile = self.connection.makefile("rb", self.rbufsize)
        self.wfile = socketserver._SocketWriter(self.connection)  # type: ignore[attr-defined]
        self.close_connection = False

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
            return self._list(query, head_only)
        return self._media(key, head_only)

    def _metadata(self, key: str, head_only: bool) -> None:
        info = self.server.bucket.stat(key)
        if info is None:
            return self._error(404, f"No such object: {self.server.bucket.name}/{key}", "notFound")
        self._json(object_resource(self.server.bucket.name, info), head_only)

    def _media(self, key: str, head_only: bool) -> None:
        bucket = self.server.bucket
        path = bucket.path_of(key)
        info = bucket.stat(key) if path is not None else None
        if info is None:
            return self._error(404, f"No such object: {bucket.name}/{key}", "notFound")
        try:
            wanted = parse_range(self.headers.get("Range"), info.size)
        except ByteRangeError:
            self.count_request(errors=1)
            return self.send_body(416, {"Content-Range": f"bytes */{info.size}"}, b"", 0, head_only=head_only)
        headers = {"Content-Type": "application/octet-stream", "x-goog-generation": str(info.mtime_ns),
                   "x-goog-stored-content-length": str(info.size), "Accept-Ranges": "bytes"}
        self.count_request()
        if info.size == 0:
            return self.send_body(200, headers, b"", 0, head_only=head_only)
        first, last = wanted or (0, info.size - 1)
        if wanted:
            headers["Content-Range"] = f"bytes {first}-{last}/{info.size}"
        self.send_body(206 if wanted else 200, headers, read_range(path, first, last),
                       last - first + 1, head_only=head_only)

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

    # ----- refused writes
    def _refuse_write(self) -> None:
        self.drain_body()
        self._error(403, "This emulated store is read-only: it serves a local folder and takes no writes.",
                    "forbidden")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_write  # noqa: N815

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
