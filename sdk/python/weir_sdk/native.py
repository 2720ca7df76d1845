"""Runs a sink under plain CPython, without WebAssembly, for unit tests.

The blob store is a local folder; logs go to standard error; errors are
raised as the SDK's exceptions (what the host would receive), so a test can
``assertRaises(weir_sdk.Poison)``::

    from weir_sdk.native import NativeSink

    sink = NativeSink(MySink(), "/tmp/out")
    sink.open("p", {})
    sink.write(Table("orders", ["id"]), "b1", ipc_bytes)
    sink.commit("orders", high=b"\\x02")
"""

import os

from . import CommitRequest, Table
from . import blob as _blob
from ._component import Runner, as_sink_error

__all__ = ["NativeSink", "FolderBlobStore"]


class FolderBlobStore:
    """A blob store in a local folder, with the host's path rules."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def _path(self, path):
        parts = path.split("/")
        if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
            raise _blob.BlobDenied("path %r is outside the root or malformed" % path)
        return os.path.join(self.root, *parts)

    def get(self, path):
        try:
            with open(self._path(path), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise _blob.BlobNotFound(path) from None

    def get_range(self, path, offset, length):
        return self.get(path)[offset : offset + length]

    def put(self, path, data):
        target = self._path(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = target + ".partial"
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, target)

    def put_if_absent(self, path, data):
        if os.path.exists(self._path(path)):
            raise _blob.BlobAlreadyExists(path)
        self.put(path, data)

    def list(self, prefix):
        found = []
        for folder, _, files in os.walk(self.root):
            for name in files:
                full = os.path.join(folder, name)
                relative = os.path.relpath(full, self.root).replace(os.sep, "/")
                if relative.startswith(prefix):
                    found.append(_blob.ObjectMeta(relative, os.path.getsize(full)))
        return found

    def delete(self, path):
        try:
            os.remove(self._path(path))
        except FileNotFoundError:
            pass


class NativeSink:
    """One sink instance driven like the host drives a component, its blob
    store the folder ``root``. Every method raises what the host would
    receive: a :class:`~weir_sdk.SinkError` subclass."""

    def __init__(self, sink, root):
        self.runner = Runner(lambda: sink)
        _blob._backend = FolderBlobStore(root)

    def _call(self, function, *args):
        try:
            return function(*args)
        except Exception as e:
            raise as_sink_error(e) from e

    def open(self, pipeline, config):
        self._call(self.runner.open, pipeline, list(dict(config).items()))

    def write(self, table, batch_id, ipc, low=b"", high=b"", rows=None):
        """Stages the Arrow IPC stream ``ipc`` as batch ``batch_id`` of
        ``table`` (a :class:`~weir_sdk.Table` or a table name). ``rows``
        defaults to the stream's row count."""
        if isinstance(table, str):
            table = Table(table)
        if rows is None:
            from .arrow import read_stream

            _, columns = read_stream(ipc)
            rows = len(columns[0].values) if columns else 0
        self._call(self.runner.write, table, batch_id, low, high, rows, ipc)

    def commit(self, table, high=b"", pipeline="test", epoch=1):
        self._call(self.runner.commit, CommitRequest(table, high, pipeline, epoch))

    def abort(self, table):
        self._call(self.runner.abort, table)

    def committed(self, pipeline, table):
        return self._call(self.runner.committed, pipeline, table)
