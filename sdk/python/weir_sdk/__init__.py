"""Write a weir sink in Python.

A weir sink is a WebAssembly component that receives row changes for one
table at a time and makes them durable in a destination. Subclass
:class:`Sink`, export it from your app module, and build the module with
``sdk/python/build-sink`` (componentize-py underneath)::

    import weir_sdk
    from weir_sdk import blob, log


    class Counter(weir_sdk.Sink):
        def __init__(self):
            self.staged = 0

        def write(self, batch):
            self.staged += batch.num_rows

        def commit(self, request):
            log.info("%s: %d rows" % (request.table, self.staged))
            self.staged = 0


    # componentize-py looks for a class named `Sink` in the app module.
    Sink = weir_sdk.export_sink(Counter)

The host calls ``open`` once, then ``write`` for each batch (already
decoded from Arrow IPC into a :class:`Batch`) and ``commit`` for each table
when the staged batches must become durable. Return from ``commit`` only
once the data survives a crash: the host moves its checkpoint as soon as
you do. Raise :class:`Retryable`, :class:`Poison`, :class:`Fenced` or
:class:`Fatal` to say what went wrong and so what the host should do.

The same sink runs under plain CPython with :mod:`weir_sdk.native`, for
unit tests.
"""

from . import blob, log
from .arrow import Column, Field, read_stream
from .errors import Fatal, Fenced, Poison, Retryable, SinkError

__all__ = [
    "Batch", "Column", "CommitRequest", "Committed", "Config", "Fatal", "Fenced",
    "Field", "MetadataColumn", "OPS", "OP_COLUMN", "POS_COLUMN", "Poison", "Retryable",
    "Sink", "SinkError", "Table", "blob", "export_positioned_sink", "export_sink", "log",
    "read_stream",
]

#: The control column holding each row's operation.
OP_COLUMN = "__op"
#: The control column holding each row's position (bytes).
POS_COLUMN = "__pos"
#: The operations a row's ``op`` may be.
OPS = ("insert", "update", "delete", "read")


class Sink:
    """A sink: stages batches per table and commits them.

    The SDK creates one instance (calling the class with no arguments) on
    the host's first call and keeps it for the plugin's life. For each
    table, batches arrive in position order and a batch never mixes tables;
    ``commit`` for a table makes everything staged for that table durable in
    one step. A sink without positions is at-least-once: after a crash the
    host replays batches with the same :attr:`Batch.id`, so name what you
    write after the id (or apply by key) to stay idempotent.
    """

    def open(self, pipeline, config):
        """Called once, before any other call, with the pipeline id and the
        operator's :class:`Config`. Reject configuration you cannot use with
        :class:`Fatal` naming the key. The default accepts anything."""

    def write(self, batch):
        """Stages one :class:`Batch`. Nothing staged may become visible
        before :meth:`commit` for its table. Raise :class:`Poison` for a
        batch the destination can never hold."""
        raise NotImplementedError("a sink must implement write")

    def commit(self, request):
        """Makes everything staged for ``request.table`` durable and visible
        in one step (a :class:`CommitRequest`); return only when durable. A
        commit with nothing staged is valid. On an error the host keeps the
        staged data staged and retries (:class:`Retryable`) or stops."""
        raise NotImplementedError("a sink must implement commit")

    def abort(self, table):
        """Drops everything staged for ``table`` and not yet committed. The
        default does nothing, which is only right for a sink that stages
        nothing."""

    def committed(self, pipeline, table):
        """Only for sinks exported with :func:`export_positioned_sink`:
        where ``table`` stands for ``pipeline``, as a :class:`Committed`
        (the ``high`` and ``epoch`` of its last durable commit), or ``None``
        when nothing was ever committed for it. Every successful
        :meth:`commit` of such a sink must record ``request.high`` and
        ``request.epoch`` atomically with the data."""
        raise NotImplementedError("a positioned sink must implement committed")


class Config(dict):
    """The ``config`` map the operator wrote for this sink in the pipeline:
    a ``dict`` of strings (when a key appears twice the last value wins)
    with helpers that fail with :class:`Fatal` naming the key."""

    def require(self, key):
        """The value of ``key``; :class:`Fatal` when the operator did not set it."""
        if key not in self:
            raise Fatal("config key `%s` is required" % key)
        return self[key]

    def parse(self, key, default, convert=int):
        """``convert(value)`` of ``key``, or ``default`` when absent; a value
        ``convert`` refuses is :class:`Fatal` naming the key."""
        if key not in self:
            return default
        raw = self[key]
        try:
            return convert(raw.strip())
        except (TypeError, ValueError) as e:
            raise Fatal("config key `%s`: cannot use %r: %s" % (key, raw, e)) from None

    def reject_unknown(self, known=()):
        """:class:`Fatal` naming the first key that is not in ``known``, so a
        misspelt setting is not silently ignored."""
        for key in sorted(self):
            if key not in known:
                allowed = ", ".join("`%s`" % k for k in known) or "none"
                raise Fatal("config key `%s` is unknown (known keys: %s)" % (key, allowed))


class MetadataColumn:
    """A context column the operator asked for: ``source`` (``op``, ``pos``,
    ``commit-ts``, ``ingest-ts``, ``snapshot`` or ``phase``) delivered as the
    column ``name``."""

    __slots__ = ("source", "name")

    def __init__(self, source, name):
        self.source = source
        self.name = name

    def __repr__(self):
        return "MetadataColumn(%r, %r)" % (self.source, self.name)


class Table:
    """The table a batch belongs to.

    ``name`` is the source's name (``public.orders``); ``key_columns`` the
    key in key order (empty: apply changes as an append-only log); ``mode``
    ``upsert`` or ``append``; ``destination`` the name the operator chose
    (``name`` when not mapped); ``metadata`` the :class:`MetadataColumn`
    list already present in every batch.
    """

    __slots__ = ("name", "key_columns", "mode", "destination", "metadata")

    def __init__(self, name, key_columns=(), mode="upsert", destination=None, metadata=()):
        self.name = name
        self.key_columns = list(key_columns)
        self.mode = mode
        self.destination = name if destination is None else destination
        self.metadata = list(metadata)

    def __repr__(self):
        return "Table(%r, key=%r, mode=%r, destination=%r)" % (
            self.name, self.key_columns, self.mode, self.destination)


class CommitRequest:
    """A request to make everything staged for ``table`` durable: ``high``
    (bytes) is the position the table is at once it is; ``pipeline`` names
    the committing pipeline; ``epoch`` grows by one each time a host starts
    it (a positioned sink raises :class:`Fenced` for a lower one)."""

    __slots__ = ("table", "high", "pipeline", "epoch")

    def __init__(self, table, high, pipeline, epoch):
        self.table = table
        self.high = bytes(high)
        self.pipeline = pipeline
        self.epoch = epoch

    def __repr__(self):
        return "CommitRequest(%r, high=%s, pipeline=%r, epoch=%d)" % (
            self.table, self.high.hex(), self.pipeline, self.epoch)


class Committed:
    """What :meth:`Sink.committed` returns: the ``position`` (bytes) and
    ``epoch`` of a table's last durable commit."""

    __slots__ = ("position", "epoch")

    def __init__(self, position, epoch):
        self.position = bytes(position)
        self.epoch = int(epoch)


class Batch:
    """One batch of changes for one table, decoded from Arrow IPC.

    ``table`` (:class:`Table`), ``id`` (deterministic for the same table
    and position range, also across restarts: name what you write after
    it), ``low`` and ``high`` (bytes positions), ``num_rows``.

    ``fields`` lists every column of the stream, the control columns
    ``__op`` and ``__pos`` included; ``data_fields`` leaves those two out
    (the table's columns and the metadata columns the pipeline asked for).
    Within a batch there is at most one row per key; a ``delete`` row
    carries the key columns and nulls elsewhere.
    """

    __slots__ = ("table", "id", "low", "high", "num_rows", "fields", "_columns",
                 "ops", "positions", "data_fields")

    def __init__(self, table, id, low, high, fields, columns):
        self.table = table
        self.id = id
        self.low = bytes(low)
        self.high = bytes(high)
        self.fields = fields
        self._columns = {c.field.name: c.values for c in columns}
        self.num_rows = len(columns[0].values) if columns else 0
        where = "batch %s of %s" % (id, table.name)
        for control in (OP_COLUMN, POS_COLUMN):
            if control not in self._columns:
                raise Poison("%s: the control column `%s` is missing" % (where, control))
        #: Each row's operation: ``insert``, ``update``, ``delete`` or ``read``.
        self.ops = self._columns[OP_COLUMN]
        for row, op in enumerate(self.ops):
            if op not in OPS:
                raise Poison("%s, row %d: `%s` is %r, not one of %s"
                             % (where, row, OP_COLUMN, op, ", ".join(OPS)))
        #: Each row's position (bytes).
        self.positions = self._columns[POS_COLUMN]
        self.data_fields = [f for f in fields if f.name not in (OP_COLUMN, POS_COLUMN)]

    def __len__(self):
        return self.num_rows

    def column(self, name):
        """The values of column ``name``, one per row (``None`` for null);
        ``KeyError`` when the batch has no such column."""
        return self._columns[name]

    def rows(self):
        """The data columns as one ``dict`` per row, in column order."""
        names = [f.name for f in self.data_fields]
        columns = [self._columns[n] for n in names]
        return [dict(zip(names, values)) for values in zip(*columns)] if columns \
            else [{} for _ in range(self.num_rows)]

    def __repr__(self):
        return "Batch(%r, id=%r, %d rows)" % (self.table.name, self.id, self.num_rows)


def decode_batch(table, id, low, high, rows, ipc):
    """A :class:`Batch` from the contract's batch header and its Arrow IPC
    stream; :class:`Poison` for a stream that cannot be read or whose row
    count differs from the header's."""
    try:
        fields, columns = read_stream(ipc)
    except Poison as e:
        raise Poison("batch %s of %s: %s" % (id, table.name, e)) from None
    batch = Batch(table, id, low, high, fields, columns)
    if batch.num_rows != rows:
        raise Poison("batch %s of %s: the header says %d rows, the Arrow stream holds %d"
                     % (id, table.name, rows, batch.num_rows))
    return batch


def export_sink(sink_class):
    """Exports ``sink_class`` (a :class:`Sink` subclass whose constructor
    takes no arguments) as the plugin's sink (world ``sink-plugin``: a sink
    without positions, at-least-once). Assign the result to ``Sink`` at the
    top level of the app module::

        Sink = weir_sdk.export_sink(MySink)
    """
    from . import _component

    return _component.export(sink_class, positioned=False)[0]


def export_positioned_sink(sink_class):
    """Exports ``sink_class``, which also implements :meth:`Sink.committed`,
    as a sink with positions (world ``positioned-sink-plugin``:
    exactly-once). Assign both results at the top level of the app module::

        Sink, Positions = weir_sdk.export_positioned_sink(MySink)
    """
    from . import _component

    return _component.export(sink_class, positioned=True)
