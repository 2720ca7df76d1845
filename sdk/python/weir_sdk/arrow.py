"""A pure-Python reader for the Arrow IPC *stream* the host sends with a batch.

componentize-py cannot load native extensions, so pyarrow is out of reach
inside a sink. This module reads what the weir host writes (arrow-rs's
``StreamWriter`` with default options: one schema message, record batch
messages, little-endian, no compression, no dictionaries) and refuses
anything else with :class:`~weir_sdk.errors.Poison` naming the column and
its type, so a sink never guesses.

Supported column types and the Python values they decode to:

=========================  ===================================================
Arrow type                 Python value
=========================  ===================================================
null                       ``None``
bool                       ``bool``
int8 .. int64, uint8 ..    ``int``
float32, float64           ``float``
utf8, large_utf8           ``str``
binary, large_binary       ``bytes``
date32 (days)              ``datetime.date``
timestamp (s/ms/us/ns)     ``datetime.datetime``, aware when the type has a
                           zone (``+00:00``, ``UTC`` or any fixed offset;
                           named zones where ``zoneinfo`` knows them)
decimal128(p, s)           ``decimal.Decimal`` with exactly ``s`` decimals
list<T>, large_list<T>     ``list`` of the item type's values
=========================  ===================================================

A null value of any type decodes to ``None``.
"""

import datetime
import decimal
import struct

from .errors import Poison

__all__ = ["Column", "Field", "read_stream"]

# Type union member ids of Schema.fbs (the order of `union Type`).
_NULL, _INT, _FLOAT, _BINARY, _UTF8, _BOOL, _DECIMAL, _DATE, _TIME, _TIMESTAMP = range(1, 11)
_INTERVAL, _LIST, _STRUCT, _UNION, _FIXED_BINARY, _FIXED_LIST, _MAP, _DURATION = range(11, 19)
_LARGE_BINARY, _LARGE_UTF8, _LARGE_LIST = 19, 20, 21
_TYPE_NAMES = {
    1: "null", 2: "int", 3: "floating point", 4: "binary", 5: "utf8", 6: "bool",
    7: "decimal", 8: "date", 9: "time", 10: "timestamp", 11: "interval", 12: "list",
    13: "struct", 14: "union", 15: "fixed_size_binary", 16: "fixed_size_list", 17: "map",
    18: "duration", 19: "large_binary", 20: "large_utf8", 21: "large_list",
    22: "run_end_encoded", 23: "binary_view", 24: "utf8_view", 25: "list_view",
    26: "large_list_view",
}
# MessageHeader union member ids of Message.fbs.
_SCHEMA_MESSAGE, _DICTIONARY_MESSAGE, _RECORD_BATCH_MESSAGE = 1, 2, 3
_TIMESTAMP_UNITS = ("s", "ms", "us", "ns")
_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_NAIVE = datetime.datetime(1970, 1, 1)


class _Table:
    """One flatbuffers table: fields looked up through its vtable."""

    __slots__ = ("buf", "pos", "vtable", "vtable_len")

    def __init__(self, buf, pos):
        self.buf = buf
        self.pos = pos
        (soffset,) = struct.unpack_from("<i", buf, pos)
        self.vtable = pos - soffset
        (self.vtable_len,) = struct.unpack_from("<H", buf, self.vtable)

    def _field(self, index):
        """The absolute position of field `index`, or 0 when absent."""
        entry = 4 + 2 * index
        if entry >= self.vtable_len:
            return 0
        (offset,) = struct.unpack_from("<H", self.buf, self.vtable + entry)
        return self.pos + offset if offset else 0

    def scalar(self, index, fmt, default):
        at = self._field(index)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else default

    def _indirect(self, at):
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, index):
        at = self._field(index)
        return _Table(self.buf, self._indirect(at)) if at else None

    def string(self, index):
        at = self._field(index)
        if not at:
            return None
        start = self._indirect(at)
        (length,) = struct.unpack_from("<I", self.buf, start)
        return bytes(self.buf[start + 4 : start + 4 + length]).decode("utf-8")

    def _vector(self, index):
        at = self._field(index)
        if not at:
            return 0, 0
        start = self._indirect(at)
        (length,) = struct.unpack_from("<I", self.buf, start)
        return start + 4, length

    def tables(self, index):
        start, length = self._vector(index)
        return [_Table(self.buf, self._indirect(start + 4 * i)) for i in range(length)]

    def structs(self, index, fmt):
        """A vector of fixed-size structs, each unpacked with `fmt`."""
        start, length = self._vector(index)
        size = struct.calcsize(fmt)
        return [struct.unpack_from(fmt, self.buf, start + size * i) for i in range(length)]


def _root(buf):
    (offset,) = struct.unpack_from("<I", buf, 0)
    return _Table(buf, offset)


class Field:
    """A column's name and type as the schema message declares it.

    ``type`` is a short description (``int64``, ``utf8``,
    ``timestamp[us, +00:00]``, ``decimal128(12, 2)``, ``list<int32>``);
    the other attributes hold what decoding needs.
    """

    __slots__ = ("name", "nullable", "kind", "type", "bit_width", "signed",
                 "unit", "timezone", "precision", "scale", "children", "dictionary")

    def __init__(self, name, nullable, kind):
        self.name = name
        self.nullable = nullable
        self.kind = kind
        self.type = _TYPE_NAMES.get(kind, "type #%d" % kind)
        self.bit_width = 0
        self.signed = True
        self.unit = None
        self.timezone = None
        self.precision = 0
        self.scale = 0
        self.children = []
        self.dictionary = False

    def __repr__(self):
        return "Field(%r, %s%s)" % (self.name, self.type, "" if self.nullable else ", not null")


def _read_field(table, path):
    name = table.string(0) or ""
    kind = table.scalar(2, "<B", 0)
    field = Field(name, bool(table.scalar(1, "<B", 0)), kind)
    where = path + [name]
    type_table = table.table(3)
    if kind == _INT:
        field.bit_width = type_table.scalar(0, "<i", 0)
        field.signed = bool(type_table.scalar(1, "<B", 0))
        field.type = "%sint%d" % ("" if field.signed else "u", field.bit_width)
    elif kind == _FLOAT:
        precision = type_table.scalar(0, "<h", 0)
        field.bit_width = {0: 16, 1: 32, 2: 64}.get(precision, 0)
        field.type = "float%d" % field.bit_width
    elif kind == _DECIMAL:
        field.precision = type_table.scalar(0, "<i", 0)
        field.scale = type_table.scalar(1, "<i", 0)
        field.bit_width = type_table.scalar(2, "<i", 128)
        field.type = "decimal%d(%d, %d)" % (field.bit_width, field.precision, field.scale)
    elif kind == _DATE:
        day = type_table.scalar(0, "<h", 1) == 0
        field.type = "date32" if day else "date64"
        field.unit = "day" if day else "ms"
    elif kind == _TIMESTAMP:
        unit = type_table.scalar(0, "<h", 0)
        field.unit = _TIMESTAMP_UNITS[unit] if 0 <= unit < 4 else "unit #%d" % unit
        field.timezone = type_table.string(1)
        zone = ", " + field.timezone if field.timezone else ""
        field.type = "timestamp[%s%s]" % (field.unit, zone)
    field.children = [_read_field(child, where) for child in table.tables(5)]
    if kind in (_LIST, _LARGE_LIST) and field.children:
        prefix = "large_list" if kind == _LARGE_LIST else "list"
        field.type = "%s<%s>" % (prefix, field.children[0].type)
    field.dictionary = table.table(4) is not None
    _check_supported(field, ".".join(where))
    return field


def _check_supported(field, where):
    """Refuses, before any row is read, a column this reader cannot decode."""
    if field.dictionary:
        raise Poison("column `%s` (%s) is dictionary-encoded, which the Python SDK "
                     "does not read" % (where, field.type))
    supported = field.kind in (_NULL, _BOOL, _BINARY, _UTF8, _LARGE_BINARY, _LARGE_UTF8,
                               _LIST, _LARGE_LIST)
    if field.kind == _INT:
        supported = field.bit_width in (8, 16, 32, 64)
    elif field.kind == _FLOAT:
        supported = field.bit_width in (32, 64)
    elif field.kind == _DECIMAL:
        supported = field.bit_width == 128
    elif field.kind == _DATE:
        supported = field.unit == "day"
    elif field.kind == _TIMESTAMP:
        supported = field.unit in _TIMESTAMP_UNITS
    if not supported:
        raise Poison("column `%s` has type %s, which the Python SDK does not read"
                     % (where, field.type))


def _messages(data):
    """Yields (header type, header table, body) for each message of a stream."""
    view = memoryview(data)
    at = 0
    while at + 4 <= len(view):
        (length,) = struct.unpack_from("<i", view, at)
        at += 4
        if length == -1:  # the continuation marker before the real length
            if at + 4 > len(view):
                raise Poison("Arrow IPC stream: cut off after a continuation marker at byte %d" % at)
            (length,) = struct.unpack_from("<i", view, at)
            at += 4
        if length == 0:  # end of stream
            return
        if length < 0 or at + length > len(view):
            raise Poison("Arrow IPC stream: message of %d bytes at byte %d runs past the end (%d bytes)"
                         % (length, at, len(view)))
        message = _root(view[at : at + length])
        at += length
        version = message.scalar(0, "<h", 0)
        if version < 3:
            raise Poison("Arrow IPC stream: metadata version V%d is older than V4" % (version + 1))
        header_type = message.scalar(1, "<B", 0)
        body_length = message.scalar(3, "<q", 0)
        if body_length < 0 or at + body_length > len(view):
            raise Poison("Arrow IPC stream: a body of %d bytes at byte %d runs past the end"
                         % (body_length, at))
        body = view[at : at + body_length]
        at += body_length
        yield header_type, message.table(2), body
    if at != len(view):
        raise Poison("Arrow IPC stream: %d stray bytes at its end" % (len(view) - at))


class Column:
    """One decoded column: its :class:`Field` and one Python value per row."""

    __slots__ = ("field", "values")

    def __init__(self, field, values):
        self.field = field
        self.values = values

    @property
    def name(self):
        return self.field.name

    def __repr__(self):
        return "Column(%r, %s, %d values)" % (self.field.name, self.field.type, len(self.values))


def read_stream(data):
    """Decodes an Arrow IPC stream into ``(fields, columns)``.

    ``fields`` is the schema (a list of :class:`Field`); ``columns`` is a list
    of :class:`Column`, one per field, with the rows of every record batch
    of the stream concatenated. Raises :class:`~weir_sdk.errors.Poison`
    naming the column for anything it cannot decode.
    """
    fields = None
    values = None
    for header_type, header, body in _messages(data):
        if header_type == _SCHEMA_MESSAGE:
            if fields is not None:
                raise Poison("Arrow IPC stream: a second schema message")
            if header.scalar(0, "<h", 0) != 0:
                raise Poison("Arrow IPC stream: big-endian data, which the Python SDK does not read")
            fields = [_read_field(f, []) for f in header.tables(1)]
            values = [[] for _ in fields]
        elif header_type == _RECORD_BATCH_MESSAGE:
            if fields is None:
                raise Poison("Arrow IPC stream: a record batch before the schema")
            for column, decoded in zip(values, _read_record_batch(fields, header, body)):
                column.extend(decoded)
        elif header_type == _DICTIONARY_MESSAGE:
            raise Poison("Arrow IPC stream: a dictionary batch; the Python SDK reads no dictionaries")
        else:
            raise Poison("Arrow IPC stream: message type #%d is not a schema or record batch"
                         % header_type)
    if fields is None:
        raise Poison("Arrow IPC stream: no schema message")
    return fields, [Column(f, v) for f, v in zip(fields, values)]


class _BatchReader:
    """Walks a record batch's field nodes and buffers in schema order."""

    def __init__(self, header, body):
        if header.table(3) is not None:
            raise Poison("Arrow IPC stream: the record batch is compressed, "
                         "which the Python SDK does not read")
        self.nodes = header.structs(1, "<qq")
        self.buffers = header.structs(2, "<qq")
        self.body = body
        self.next_node = 0
        self.next_buffer = 0

    def node(self, where):
        if self.next_node >= len(self.nodes):
            raise Poison("column `%s`: the record batch has too few field nodes" % where)
        self.next_node += 1
        return self.nodes[self.next_node - 1]

    def buffer(self, where):
        if self.next_buffer >= len(self.buffers):
            raise Poison("column `%s`: the record batch has too few buffers" % where)
        offset, length = self.buffers[self.next_buffer]
        self.next_buffer += 1
        if offset < 0 or length < 0 or offset + length > len(self.body):
            raise Poison("column `%s`: a buffer (%d bytes at %d) lies outside the body of %d bytes"
                         % (where, length, offset, len(self.body)))
        return self.body[offset : offset + length]


def _read_record_batch(fields, header, body):
    reader = _BatchReader(header, body)
    rows = header.scalar(0, "<q", 0)
    columns = [_read_array(reader, f, f.name) for f in fields]
    for field, column in zip(fields, columns):
        if len(column) != rows:
            raise Poison("column `%s`: %d values in a batch of %d rows"
                         % (field.name, len(column), rows))
    return columns


def _validity(buffer, length, null_count, where):
    """One bool per value: True where the value is present."""
    if null_count == 0:
        return None
    if len(buffer) * 8 < length:
        raise Poison("column `%s`: the validity bitmap is shorter than %d values" % (where, length))
    bits = bytes(buffer)
    return [bool(bits[i >> 3] & (1 << (i & 7))) for i in range(length)]


def _fixed(buffer, fmt, length, where):
    size = struct.calcsize(fmt)
    if len(buffer) < size * length:
        raise Poison("column `%s`: %d bytes of values for %d rows" % (where, len(buffer), length))
    return buffer[: size * length].cast(fmt).tolist()


def _with_nulls(values, valid):
    if valid is None:
        return values
    return [v if ok else None for v, ok in zip(values, valid)]


def _read_array(reader, field, where):
    length, null_count = reader.node(where)
    kind = field.kind
    if kind == _NULL:
        return [None] * length
    valid = _validity(reader.buffer(where), length, null_count, where)
    if kind == _BOOL:
        bits = bytes(reader.buffer(where))
        if len(bits) * 8 < length:
            raise Poison("column `%s`: %d bytes of booleans for %d rows" % (where, len(bits), length))
        values = [bool(bits[i >> 3] & (1 << (i & 7))) for i in range(length)]
    elif kind == _INT:
        fmt = {8: "b", 16: "h", 32: "i", 64: "q"}[field.bit_width]
        values = _fixed(reader.buffer(where), fmt if field.signed else fmt.upper(), length, where)
    elif kind == _FLOAT:
        values = _fixed(reader.buffer(where), "f" if field.bit_width == 32 else "d", length, where)
    elif kind in (_UTF8, _BINARY, _LARGE_UTF8, _LARGE_BINARY):
        large = kind in (_LARGE_UTF8, _LARGE_BINARY)
        offsets = _offsets(reader.buffer(where), length, large, where)
        data = bytes(reader.buffer(where))
        if offsets and (offsets[0] < 0 or offsets[-1] > len(data)):
            raise Poison("column `%s`: offsets point outside its %d data bytes" % (where, len(data)))
        if kind in (_UTF8, _LARGE_UTF8):
            values = []
            for i in range(length):
                try:
                    values.append(data[offsets[i] : offsets[i + 1]].decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise Poison("column `%s`, row %d: not UTF-8 (%s)" % (where, i, e)) from None
        else:
            values = [data[offsets[i] : offsets[i + 1]] for i in range(length)]
    elif kind == _DATE:
        days = _fixed(reader.buffer(where), "i", length, where)
        values = [_date(d, where) for d in days] if valid is None else \
            [_date(d, where) if ok else None for d, ok in zip(days, valid)]
        return values
    elif kind == _TIMESTAMP:
        raw = _fixed(reader.buffer(where), "q", length, where)
        to_datetime = _timestamp_converter(field, where)
        return [to_datetime(v) if valid is None or valid[i] else None for i, v in enumerate(raw)]
    elif kind == _DECIMAL:
        buffer = bytes(reader.buffer(where))
        if len(buffer) < 16 * length:
            raise Poison("column `%s`: %d bytes of decimals for %d rows" % (where, len(buffer), length))
        exponent = -field.scale
        values = [
            decimal.Decimal(int.from_bytes(buffer[16 * i : 16 * i + 16], "little", signed=True)).scaleb(exponent)
            if valid is None or valid[i] else None
            for i in range(length)
        ]
        return values
    elif kind in (_LIST, _LARGE_LIST):
        offsets = _offsets(reader.buffer(where), length, kind == _LARGE_LIST, where)
        items = _read_array(reader, field.children[0], where + "[]")
        if offsets and (offsets[0] < 0 or offsets[-1] > len(items)):
            raise Poison("column `%s`: list offsets point outside its %d items" % (where, len(items)))
        values = [items[offsets[i] : offsets[i + 1]] for i in range(length)]
    else:  # _check_supported refused every other type already
        raise Poison("column `%s` has type %s, which the Python SDK does not read" % (where, field.type))
    return _with_nulls(values, valid)


def _offsets(buffer, length, large, where):
    if length == 0:
        return []
    offsets = _fixed(buffer, "q" if large else "i", length + 1, where)
    for i in range(length):
        if offsets[i] > offsets[i + 1]:
            raise Poison("column `%s`: offsets go backwards at row %d" % (where, i))
    return offsets


def _date(days, where):
    try:
        return _EPOCH_DATE + datetime.timedelta(days=days)
    except OverflowError:
        raise Poison("column `%s`: date32 value %d lies outside the years 1..9999 "
                     "Python's datetime holds" % (where, days)) from None


def _zone(name, where):
    if name in ("UTC", "utc", "Z", "Etc/UTC"):
        return datetime.timezone.utc
    if len(name) == 6 and name[0] in "+-" and name[3] == ":" \
            and name[1:3].isdigit() and name[4:6].isdigit():
        sign = -1 if name[0] == "-" else 1
        delta = datetime.timedelta(hours=int(name[1:3]), minutes=int(name[4:6]))
        return datetime.timezone(sign * delta)
    try:
        import zoneinfo

        return zoneinfo.ZoneInfo(name)
    except Exception as e:  # no tz database inside the component, or an unknown name
        raise Poison("column `%s`: time zone %r is unknown here (%s); use UTC or a fixed "
                     "offset such as +02:00" % (where, name, e)) from None


def _timestamp_converter(field, where):
    """A function from the column's raw integer to a datetime."""
    per_micro = {"s": None, "ms": None, "us": 1, "ns": 1000}[field.unit]
    zone = _zone(field.timezone, where) if field.timezone else None

    def to_micros(value):
        if field.unit == "s":
            return value * 1_000_000
        if field.unit == "ms":
            return value * 1000
        if per_micro == 1:
            return value
        if value % 1000:
            raise Poison("column `%s`: timestamp %d ns has nanoseconds, which Python's "
                         "datetime cannot hold" % (where, value))
        return value // 1000

    def convert(value):
        try:
            naive = _EPOCH_NAIVE + datetime.timedelta(microseconds=to_micros(value))
        except OverflowError:
            raise Poison("column `%s`: timestamp %d %s lies outside the years 1..9999 "
                         "Python's datetime holds" % (where, value, field.unit)) from None
        if zone is None:
            return naive
        return naive.replace(tzinfo=datetime.timezone.utc).astimezone(zone)

    return convert
