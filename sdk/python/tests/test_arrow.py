"""The pure-Python Arrow IPC reader against pyarrow, a reader we did not
write: every supported type decodes to what pyarrow decodes, and what it
does not support is refused naming the column.

Run: .venv/bin/python -m unittest discover -s sdk/python/tests
"""

import datetime
import decimal
import io
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import pyarrow as pa  # noqa: E402
import pyarrow.ipc  # noqa: E402

from weir_sdk import Poison, read_stream  # noqa: E402


def stream(table, **options):
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(**options)) as w:
        for batch in table.to_batches(max_chunksize=3):
            w.write_batch(batch)
    return sink.getvalue()


def every_type():
    utc = datetime.timezone.utc
    columns = {
        "n": pa.array([None] * 5, pa.null()),
        "b": pa.array([True, None, False, True, False]),
        "i8": pa.array([-128, 127, None, 0, 1], pa.int8()),
        "i16": pa.array([-32768, 32767, None, 0, 1], pa.int16()),
        "i32": pa.array([-(2**31), 2**31 - 1, None, 0, 1], pa.int32()),
        "i64": pa.array([-(2**63), 2**63 - 1, None, 0, 1], pa.int64()),
        "u8": pa.array([0, 255, None, 7, 1], pa.uint8()),
        "u16": pa.array([0, 65535, None, 7, 1], pa.uint16()),
        "u32": pa.array([0, 2**32 - 1, None, 7, 1], pa.uint32()),
        "u64": pa.array([0, 2**64 - 1, None, 7, 1], pa.uint64()),
        "f32": pa.array([1.5, -0.25, None, float("inf"), 0.0], pa.float32()),
        "f64": pa.array([1.5, -1e300, None, 0.1, -0.0], pa.float64()),
        "s": pa.array(["a", "", None, "é\n\"x\"", "ünïcødé"], pa.utf8()),
        "ls": pa.array(["a", "", None, "bb", "c"], pa.large_utf8()),
        "bin": pa.array([b"\x00\x01", b"", None, b"\xff", b"z"], pa.binary()),
        "lbin": pa.array([b"\x00\x01", b"", None, b"\xff", b"z"], pa.large_binary()),
        "d": pa.array([datetime.date(1970, 1, 1), datetime.date(1, 1, 1), None,
                       datetime.date(9999, 12, 31), datetime.date(2024, 2, 29)], pa.date32()),
        "ts_us": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 678901), None,
                           datetime.datetime(1900, 1, 1), datetime.datetime(1970, 1, 1),
                           datetime.datetime(2038, 1, 19, 3, 14, 8)], pa.timestamp("us")),
        "ts_utc": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=utc), None,
                            datetime.datetime(1960, 1, 1, tzinfo=utc),
                            datetime.datetime(1970, 1, 1, tzinfo=utc),
                            datetime.datetime(2000, 1, 1, tzinfo=utc)],
                           pa.timestamp("us", tz="+00:00")),
        "ts_s": pa.array([0, 1, None, -1, 86400], pa.timestamp("s")),
        "ts_ms": pa.array([0, 1, None, -1, 86400000], pa.timestamp("ms", tz="+05:30")),
        "ts_ns": pa.array([0, 1000, None, -1000, 86400 * 10**9], pa.timestamp("ns", tz="UTC")),
        "dec": pa.array([decimal.Decimal("123.45"), decimal.Decimal("-0.05"), None,
                         decimal.Decimal("9999999999.99"), decimal.Decimal("0.00")],
                        pa.decimal128(12, 2)),
        "dec0": pa.array([decimal.Decimal("-17"), None, decimal.Decimal("0"),
                          decimal.Decimal("10") ** 37, decimal.Decimal("1")], pa.decimal128(38, 0)),
        "lst": pa.array([[1, None, 3], [], None, [4], [5, 6]], pa.list_(pa.int32())),
        "llst": pa.array([["x"], [], None, [None], ["y", "z"]], pa.large_list(pa.utf8())),
    }
    return pa.table(columns)


class ReadsWhatPyarrowWrites(unittest.TestCase):
    def test_every_supported_type_matches_pyarrow(self):
        table = every_type()
        fields, columns = read_stream(stream(table))
        self.assertEqual([f.name for f in fields], table.column_names)
        for column in columns:
            expected = table.column(column.name).to_pylist()
            self.assertEqual(column.values, expected, column.name)
            # Decimals keep their scale, as the destination must.
            if column.name == "dec":
                self.assertEqual(str(column.values[4]), "0.00")

    def test_field_types_are_described(self):
        fields, _ = read_stream(stream(every_type()))
        types = {f.name: f.type for f in fields}
        self.assertEqual(types["i64"], "int64")
        self.assertEqual(types["u8"], "uint8")
        self.assertEqual(types["ts_utc"], "timestamp[us, +00:00]")
        self.assertEqual(types["dec"], "decimal128(12, 2)")
        self.assertEqual(types["lst"], "list<int32>")

    def test_sliced_arrays_keep_their_offsets(self):
        table = every_type().slice(2, 3)
        _, columns = read_stream(stream(table))
        for column in columns:
            self.assertEqual(column.values, table.column(column.name).to_pylist(), column.name)

    def test_an_empty_stream_has_columns_and_no_rows(self):
        table = every_type().slice(0, 0)
        fields, columns = read_stream(stream(table))
        self.assertEqual(len(fields), table.num_columns)
        self.assertTrue(all(c.values == [] for c in columns))


class RefusesWhatItCannotRead(unittest.TestCase):
    def assertPoisonNaming(self, data, *words):
        with self.assertRaises(Poison) as caught:
            read_stream(data)
        for word in words:
            self.assertIn(word, str(caught.exception))

    def test_dictionary_columns(self):
        table = pa.table({"id": [1], "tier": pa.array(["gold"]).dictionary_encode()})
        self.assertPoisonNaming(stream(table), "`tier`", "dictionary")

    def test_compressed_batches(self):
        table = pa.table({"id": pa.array(range(100), pa.int64())})
        self.assertPoisonNaming(stream(table, compression="zstd"), "compressed")

    def test_unsupported_types(self):
        for name, array in [
            ("half", pa.array([1.0], pa.float16())),
            ("when", pa.array([1], pa.time64("us"))),
            ("pair", pa.array([{"a": 1}])),
            ("big", pa.array([decimal.Decimal(1)], pa.decimal256(40, 0))),
        ]:
            with self.subTest(name):
                table = pa.table({"id": [1], name: array})
                self.assertPoisonNaming(stream(table), "`%s`" % name)

    def test_nanoseconds_python_cannot_hold(self):
        table = pa.table({"at": pa.array([1], pa.timestamp("ns"))})
        self.assertPoisonNaming(stream(table), "`at`", "nanoseconds")

    def test_truncated_and_garbage_streams(self):
        data = stream(every_type())
        for cut in (3, 20, len(data) // 2, len(data) - 9):
            with self.subTest(cut=cut):
                with self.assertRaises(Poison):
                    read_stream(data[:cut])
        with self.assertRaises(Poison):
            read_stream(b"not arrow at all")


if __name__ == "__main__":
    unittest.main()
