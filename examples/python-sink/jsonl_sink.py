"""python-sink: hello-sink's JSON Lines sink, written in Python.

Every committed batch becomes one JSON Lines file, ``<table>/<batch id>.jsonl``,
one object per row: the table's columns plus ``op`` (``insert``, ``update``,
``delete`` or ``read``). The bytes are those hello-sink (Rust, arrow-json)
writes for the same batch: nulls left out, numbers as JSON numbers,
decimals unquoted, binary as hex, dates and timestamps as ISO 8601 text.
"""

import datetime
import struct
from decimal import Decimal
from json.encoder import encode_basestring

import weir_sdk
from weir_sdk import blob


class JsonLinesSink(weir_sdk.Sink):
    def __init__(self):
        # Nothing may become visible before `commit`, so `write` only stages:
        # table name -> [(path, file bytes)], encoded at once so that a batch
        # JSON cannot hold fails in `write`, as a poison batch.
        self.staged = {}

    def open(self, pipeline, config):
        # No settings: a misspelt one must not be silently ignored.
        config.reject_unknown(known=())

    def write(self, batch):
        # Named after the batch id: a batch replayed after a crash
        # overwrites its file instead of adding a duplicate.
        path = "%s/%s.jsonl" % (batch.table.name, batch.id)
        self.staged.setdefault(batch.table.name, []).append((path, to_json_lines(batch)))

    def commit(self, request):
        # An error from `put` escapes: an I/O failure is retried by the host,
        # a denied path stops the pipeline.
        for path, data in self.staged.get(request.table, ()):
            blob.put(path, data)
        # Drop the staged batches only once all of them are durable: if a put
        # failed, the host retries the commit and we write them again.
        self.staged.pop(request.table, None)

    def abort(self, table):
        self.staged.pop(table, None)


def to_json_lines(batch):
    """The batch's data columns plus `op`, one JSON object per line."""
    columns = []
    for field in batch.data_fields:
        prefix = encode_basestring(field.name) + ":"
        columns.append((prefix, value_encoder(field, batch), batch.column(field.name)))
    columns.append(('"op":', encode_basestring, batch.ops))
    lines = []
    for row in range(batch.num_rows):
        members = []
        for prefix, encode, values in columns:
            value = values[row]
            # arrow-json leaves nulls out of the object.
            if value is not None:
                members.append(prefix + encode(value))
        lines.append("{" + ",".join(members) + "}\n")
    return "".join(lines).encode("utf-8")


def value_encoder(field, batch):
    """A function from one non-null value of `field` to its JSON text."""
    type_name = field.type
    if type_name == "bool":
        return lambda v: "true" if v else "false"
    if type_name.startswith(("int", "uint")):
        return str
    if type_name == "float64":
        return encode_float64
    if type_name == "float32":
        return encode_float32
    if type_name in ("utf8", "large_utf8"):
        return encode_basestring
    if type_name in ("binary", "large_binary"):
        return lambda v: '"' + v.hex() + '"'
    if type_name == "date32":
        return lambda v: '"' + v.isoformat() + '"'
    if type_name.startswith("timestamp"):
        return encode_timestamp
    if type_name.startswith("decimal"):
        return lambda v: format(v, "f")
    if type_name == "null":
        return lambda v: "null"
    if type_name.startswith(("list<", "large_list<")):
        item = value_encoder(field.children[0], batch)
        return lambda v: "[" + ",".join("null" if x is None else item(x) for x in v) + "]"
    raise weir_sdk.Poison("batch %s of %s: column `%s` has type %s, which python-sink cannot "
                          "write as JSON" % (batch.id, batch.table.name, field.name, type_name))


def encode_float64(value):
    return format_shortest(value, repr(value))


def encode_float32(value):
    # The shortest digits that read back as the same float32, as Rust prints it.
    for digits in range(1, 10):
        text = "%.*g" % (digits, value)
        try:
            if struct.unpack("<f", struct.pack("<f", float(text)))[0] == value:
                return format_shortest(value, text)
        except OverflowError:  # rounded up past float32's largest value
            continue
    return format_shortest(value, repr(value))


def format_shortest(value, shortest):
    """`shortest` (digits that round-trip) laid out as Rust's lexical-core
    does: positional between 1e-5 and 1e10, else `1.5e-7`; JSON has no
    NaN or infinity, so those are null, as arrow-json writes them."""
    if value != value or value in (float("inf"), float("-inf")):
        return "null"
    sign, raw_digits, exponent = Decimal(shortest).as_tuple()
    raw = "".join(map(str, raw_digits))
    digits = raw.rstrip("0")
    if not digits:
        return "-0.0" if sign else "0.0"
    # The decimal exponent of the first digit.
    leading = len(raw) - 1 + exponent
    minus = "-" if sign else ""
    if leading < -5 or leading >= 10:
        return "%s%s.%se%d" % (minus, digits[0], digits[1:] or "0", leading)
    if leading < 0:
        return "%s0.%s%s" % (minus, "0" * (-leading - 1), digits)
    whole = digits[: leading + 1].ljust(leading + 1, "0")
    fraction = digits[leading + 1 :] or "0"
    return "%s%s.%s" % (minus, whole, fraction)


def encode_timestamp(value):
    """ISO 8601 as chrono prints it: seconds, then 3, 6 or no fractional
    digits; `Z` for UTC, `+hh:mm` for other offsets, nothing when naive."""
    text = "%04d-%02d-%02dT%02d:%02d:%02d" % (
        value.year, value.month, value.day, value.hour, value.minute, value.second)
    micros = value.microsecond
    if micros:
        text += ".%03d" % (micros // 1000) if micros % 1000 == 0 else ".%06d" % micros
    offset = value.utcoffset()
    if offset is not None:
        if offset == datetime.timedelta(0):
            text += "Z"
        else:
            minutes = int(offset.total_seconds()) // 60
            sign = "-" if minutes < 0 else "+"
            text += "%s%02d:%02d" % (sign, abs(minutes) // 60, abs(minutes) % 60)
    return '"' + text + '"'


# componentize-py looks for the class `Sink` in the app module.
Sink = weir_sdk.export_sink(JsonLinesSink)
