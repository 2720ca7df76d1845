#!/usr/bin/env python3
"""A webhook receiver for testing the webhook sink (`weir-webhook-sink`),
as docs/sinks/webhook.md asks a receiver to be: it stores each batch once,
deduplicated by `Idempotency-Key`.

    webhook_receiver.py FOLDER [--port PORT] [--verbose]

Listens on 127.0.0.1 (PORT, or a free one) and prints its base URL,
`http://127.0.0.1:<port>`, as the first line on stdout once it accepts
requests. Every POST is one batch: JSON Lines, with the headers
`Idempotency-Key` (the batch id), `Weir-Destination` and `Weir-Rows`. The
batch's rows go to `FOLDER/<destination>/<sha256 of the key>.jsonl`,
written to a temporary file and renamed into place: the file is both the
rows and the record that the key was accepted, so they land together. A key
seen before is answered 200 and stored nothing. A request without the
headers, with lines that are not JSON objects, or whose line count is not
`Weir-Rows` is answered 400 naming what is wrong.

read_webhook.py prints what a destination holds. Only the standard library.
"""

import argparse
import hashlib
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def table_folder(folder: str, destination: str) -> str:
    """Where the batches of `destination` are kept (one safe file name)."""
    return os.path.join(folder, urllib.parse.quote(destination, safe=".-_"))


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    folder = "."
    verbose = False
    lock = threading.Lock()

    def answer(self, status: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while self.rfile.readline().strip():
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_POST(self):
        body = self.read_body()
        key = self.headers.get("Idempotency-Key")
        destination = self.headers.get("Weir-Destination")
        rows_header = self.headers.get("Weir-Rows")
        if not key or not destination or rows_header is None:
            return self.answer(400, "needs Idempotency-Key, Weir-Destination and Weir-Rows")
        # Header values that are not ASCII come percent-encoded.
        destination = urllib.parse.unquote(destination)
        lines = [line for line in body.decode("utf-8", "replace").split("\n") if line.strip()]
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError as e:
                return self.answer(400, f"line {number} is not JSON: {e}")
            if not isinstance(row, dict):
                return self.answer(400, f"line {number} is not a JSON object")
        if str(len(lines)) != rows_header.strip():
            return self.answer(400, f"Weir-Rows says {rows_header}, the body has {len(lines)} lines")
        folder = table_folder(self.folder, destination)
        path = os.path.join(folder, hashlib.sha256(key.encode()).hexdigest() + ".jsonl")
        with self.lock:
            if os.path.exists(path):
                return self.answer(200, f"duplicate: batch {key} was stored before")
            os.makedirs(folder, exist_ok=True)
            temporary = path + ".tmp"
            with open(temporary, "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        self.answer(200, f"stored {len(lines)} rows of batch {key}")

    def log_message(self, format, *args):
        if self.verbose:
            sys.stderr.write("webhook_receiver: " + format % args + "\n")


def main():
    parser = argparse.ArgumentParser(description="A deduplicating webhook receiver for tests.")
    parser.add_argument("folder")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    options = parser.parse_args()
    os.makedirs(options.folder, exist_ok=True)
    Receiver.folder = options.folder
    Receiver.verbose = options.verbose
    server = ThreadingHTTPServer(("127.0.0.1", options.port), Receiver)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
