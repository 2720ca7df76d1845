"""The glue between the SDK and the bindings componentize-py generates
(``wit_world``): adapters the component exports, the host's blob store and
log. Not part of the API; under plain CPython (no ``wit_world``) the
exported classes still import, so an app module can be unit-tested."""

import traceback

from . import Batch, CommitRequest, Committed, Config, Table, MetadataColumn, decode_batch
from . import blob as _blob
from . import log as _log
from .errors import Fatal, Poison, SinkError

try:
    from componentize_py_types import Err
    from wit_world import exports as _exports
    from wit_world.imports import blobstore as _blobstore
    from wit_world.imports import log as _wit_log
    from wit_world.imports import types as _types

    IN_COMPONENT = True
except ImportError:
    IN_COMPONENT = False


class Runner:
    """Holds the one sink instance and turns the contract's values into the
    SDK's; raises the SDK's exceptions."""

    def __init__(self, sink_class):
        self.sink_class = sink_class
        self.instance = None

    def sink(self):
        if self.instance is None:
            self.instance = self.sink_class()
        return self.instance

    def open(self, pipeline, pairs):
        config = Config()
        for key, value in pairs:
            config[key] = value
        self.sink().open(pipeline, config)

    def write(self, table, id, low, high, rows, ipc):
        self.sink().write(decode_batch(table, id, low, high, rows, ipc))

    def commit(self, request):
        self.sink().commit(request)

    def abort(self, table):
        self.sink().abort(table)

    def committed(self, pipeline, table):
        answer = self.sink().committed(pipeline, table)
        if answer is not None and not isinstance(answer, Committed):
            raise Fatal("committed(%r, %r) returned %r, not a weir_sdk.Committed or None"
                        % (pipeline, table, answer))
        return answer


def describe(exception):
    """One line for an unexpected exception: its type, message and the line
    of the sink that raised it."""
    frames = traceback.extract_tb(exception.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = " (%s, line %d, in %s)" % (last.filename, last.lineno, last.name)
    return "%s: %s%s" % (type(exception).__name__, exception, where)


def as_sink_error(exception):
    """The SDK exception the host should see for any exception."""
    if isinstance(exception, SinkError):
        return exception
    if isinstance(exception, _blob.BlobIoError):
        from .errors import Retryable

        return Retryable("blob store: %s" % exception)
    if isinstance(exception, _blob.BlobError):
        return Fatal("blob store: %s: %s" % (type(exception).__name__, exception))
    return Fatal(describe(exception))


if IN_COMPONENT:
    _WIT_ERRORS = {
        "retryable": _types.SinkError_Retryable,
        "poison": _types.SinkError_Poison,
        "fenced": _types.SinkError_Fenced,
        "fatal": _types.SinkError_Fatal,
    }

    def _call(function, *args):
        try:
            return function(*args)
        except Exception as e:
            error = as_sink_error(e)
            raise Err(_WIT_ERRORS[error.kind](error.message)) from None

    def _table(wit_table):
        return Table(
            wit_table.name,
            wit_table.key_columns,
            wit_table.mode,
            wit_table.destination,
            [MetadataColumn(m.source, m.name) for m in wit_table.metadata],
        )

    _BLOB_ERRORS = {
        _blobstore.BlobError_NotFound: _blob.BlobNotFound,
        _blobstore.BlobError_AlreadyExists: _blob.BlobAlreadyExists,
        _blobstore.BlobError_Denied: _blob.BlobDenied,
        _blobstore.BlobError_Io: _blob.BlobIoError,
    }

    def _blob_call(function, *args):
        try:
            return function(*args)
        except Err as e:
            kind = _BLOB_ERRORS.get(type(e.value), _blob.BlobIoError)
            raise kind(e.value.value) from None

    class HostBlobStore:
        """The blob store the host grants, through the contract's imports."""

        def get(self, path):
            return _blob_call(_blobstore.get, path)

        def get_range(self, path, offset, length):
            return _blob_call(_blobstore.get_range, path, offset, length)

        def put(self, path, data):
            _blob_call(_blobstore.put, path, data)

        def put_if_absent(self, path, data):
            _blob_call(_blobstore.put_if_absent, path, data)

        def list(self, prefix):
            return [_blob.ObjectMeta(m.path, m.size) for m in _blob_call(_blobstore.list, prefix)]

        def delete(self, path):
            _blob_call(_blobstore.delete, path)

    _WIT_LEVELS = [_wit_log.Level.TRACE, _wit_log.Level.DEBUG, _wit_log.Level.INFO,
                   _wit_log.Level.WARN, _wit_log.Level.ERROR]
    _log._host_log = lambda level, message: _wit_log.log(_WIT_LEVELS[level], message)
    _blob._backend = HostBlobStore()
    _SinkBase = _exports.Sink
    _PositionsBase = getattr(_exports, "Positions", object)
else:

    def _call(function, *args):
        return function(*args)

    def _table(table):
        return table

    _SinkBase = object
    _PositionsBase = object

# The runner of the exported sink; one per component.
_runner = None


def export(sink_class, positioned):
    """The classes componentize-py instantiates for the `sink` (and
    `positions`) exports, forwarding to one instance of `sink_class`."""
    global _runner
    if _runner is not None:
        raise RuntimeError("weir_sdk: export a sink once per app module")
    _runner = Runner(sink_class)
    runner = _runner

    class SinkExport(_SinkBase):
        def open(self, pipeline, config):
            _call(runner.open, pipeline, config)

        def write(self, batch, ipc):
            _call(runner.write, _table(batch.table), batch.id, batch.low, batch.high,
                  batch.rows, ipc)

        def commit(self, request):
            _call(runner.commit, CommitRequest(request.table, request.high,
                                               request.pipeline, request.epoch))

        def abort(self, table):
            # `abort` cannot fail in the contract: log what went wrong.
            try:
                runner.abort(table)
            except Exception as e:
                _log.error("abort(%r): %s" % (table, describe(e)))

    if not positioned:
        return (SinkExport,)

    class PositionsExport(_PositionsBase):
        def committed(self, pipeline, table):
            answer = _call(runner.committed, pipeline, table)
            if answer is None or not IN_COMPONENT:
                return answer
            from wit_world.exports import positions as _positions

            return _positions.CommittedPosition(answer.position, answer.epoch)

    return SinkExport, PositionsExport


def runner():
    """The runner of the sink exported in this process (for `native`)."""
    if _runner is None:
        raise RuntimeError("no sink was exported: call weir_sdk.export_sink first")
    return _runner


__all__ = ["Runner", "export", "runner", "as_sink_error", "Poison"]
