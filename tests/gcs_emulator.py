"""gcp-storage-emulator, in memory on a loopback port, with the fixes TensorFlow's GCS client
needs. Run as a process: `python -m tests.gcs_emulator --port PORT`.

TensorFlow's built-in `gs://` filesystem talks libcurl to the hard-coded Google endpoints; the
test proxy (`tests/gcs_proxy.py`) forwards that traffic here. gcp-storage-emulator serves
google-cloud-storage as it is, but libcurl's uploads hit three gaps, fixed in a subclass of its
request handler (the package itself is not modified):

1. `Expect: 100-continue`: the emulator speaks HTTP/1.0, never answers it, and libcurl waits
   1 s before every upload body. Speaking HTTP/1.1 makes `BaseHTTPRequestHandler` answer
   `100 Continue` (every response carries a Content-Length, so keep-alive is safe).
2. Chunked bodies: the emulator reads `Content-Length` bytes when the header is present, even
   when the body is also sent chunked, and then parses chunk framing as data. Here every body
   is read once (de-chunked when chunked) and handed to the emulator with an exact
   Content-Length.
3. Empty uploads: `tf.io.gfile.makedirs` writes empty `dir/` placeholder objects; the emulator
   turns an empty body into `None` and fails on `len(None)`. An empty body is handed over as
   an empty object instead.

It also enforces `ifGenerationMatch` (which the emulator ignores) on uploads, downloads and
deletes, as Cloud Storage does: 412 when the object's generation is another (0: no object),
each such request served alone, so a check and its write are one step (the job dir's lease,
trainer/storage/lease.py, relies on it).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import signal
import sys
import threading
import urllib.parse
from functools import partial
from http import server

from gcp_storage_emulator import server as emulator
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.storage import Storage

_PRECONDITIONS = threading.Lock()  # requests with a precondition, served one at a time
_OBJECT_PATH = re.compile(r"/b/([^/]+)/o/([^?]+)")


def _read_chunked(rfile) -> bytes:
    """Reads a chunked transfer-encoded body (chunk extensions and trailers ignored)."""
    body = bytearray()
    while True:
        size = int(rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline().strip():  # trailers, up to the blank line
                pass
            return bytes(body)
        body += rfile.read(size)
        rfile.readline()  # the CRLF after each chunk


def _read_body(handler: server.BaseHTTPRequestHandler) -> bytes:
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        return _read_chunked(handler.rfile)
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


class _EmptyBody(bytes):
    """An empty body that is still 'present': the emulator tests `if not raw_data` and turns
    b"" into None; this value passes that test and has length 0."""

    def __bool__(self) -> bool:
        return True


class _BodyReader(io.BytesIO):
    """The request body as the emulator reads it; fix 3: an empty upload reads as
    `_EmptyBody`, which the emulator keeps as an empty object instead of dropping it."""

    def __init__(self, body: bytes, *, empty_is_object: bool):
        super().__init__(body)
        self._empty_is_object = empty_is_object and not body

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        return _EmptyBody() if self._empty_is_object and not data else data


class FixedRequestHandler(emulator.RequestHandler):
    """The emulator's handler with the three fixes of the module docstring."""

    protocol_version = "HTTP/1.1"  # fix 1: answers Expect: 100-continue
    rfile: io.BufferedIOBase

    def _route(self, method: str) -> None:
        body = _read_body(self)  # fix 2: one exact body, de-chunked
        del self.headers["Transfer-Encoding"]
        del self.headers["Content-Length"]
        self.headers["Content-Length"] = str(len(body))
        connection_rfile = self.rfile
        self.rfile = _BodyReader(body, empty_is_object=self._is_upload(method))
        try:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if "ifGenerationMatch" not in query:
                emulator.Router(self).handle(method)
                return
            with _PRECONDITIONS:
                wanted = query["ifGenerationMatch"][0]
                found = self._generation(query, body)
                if found != wanted:
                    self._precondition_failed(wanted, found)
                    return
                emulator.Router(self).handle(method)
        finally:
            self.rfile = connection_rfile

    def _generation(self, query: dict, body: bytes) -> str:
        """The generation of the object the request names ("0": none)."""
        path = urllib.parse.urlsplit(self.path).path
        match = _OBJECT_PATH.search(path)
        if match:
            bucket, name = match.group(1), urllib.parse.unquote(match.group(2))
        else:  # an upload: the name is a parameter, or in a multipart body's metadata
            bucket = path.split("/b/", 1)[1].split("/", 1)[0]
            name = query.get("name", [""])[0] or _multipart_name(body)
        try:
            return str(self.storage.get_file_obj(bucket, name)["generation"])
        except NotFound:
            return "0"

    def _precondition_failed(self, wanted: str, found: str) -> None:
        message = f"ifGenerationMatch {wanted}: the object's generation is {found}"
        data = json.dumps({"error": {"code": 412, "message": message}}).encode()
        self.send_response(412)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _is_upload(self, method: str) -> bool:
        """A request whose body is object data (not JSON metadata)."""
        return method == emulator.PUT or (
            method == emulator.POST and "uploadType=media" in self.path
        )

    def do_GET(self):
        self._route(emulator.GET)

    def do_POST(self):
        self._route(emulator.POST)

    def do_PUT(self):
        self._route(emulator.PUT)

    def do_DELETE(self):
        self._route(emulator.DELETE)

    def do_PATCH(self):
        self._route(emulator.PATCH)


def _multipart_name(body: bytes) -> str:
    """The object name in a multipart upload's JSON metadata part."""
    match = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
    return json.loads(b'"' + match.group(1) + b'"') if match else ""


def serve(host: str, port: int) -> server.ThreadingHTTPServer:
    """Starts the in-memory emulator in a background thread; returns the server."""
    storage = Storage(use_memory_fs=True)
    httpd = server.ThreadingHTTPServer((host, port), partial(FixedRequestHandler, storage))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    httpd = serve(args.host, args.port)
    print(f"gcs emulator listening on {args.host}:{args.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    httpd.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
