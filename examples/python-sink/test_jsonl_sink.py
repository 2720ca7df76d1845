"""python-sink under plain CPython (weir_sdk.native), fed batches pyarrow
encodes: nothing visible before commit, dropped on abort, one file per
batch id, and clear errors for bad config and batches JSON cannot hold.

Run: .venv/bin/python -m unittest discover -s examples/python-sink
"""

import io
import json
import os
import sys
import tempfile
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "sdk", "python")]

import pyarrow as pa  # noqa: E402

import weir_sdk  # noqa: E402
from jsonl_sink import JsonLinesSink  # noqa: E402
from weir_sdk.native import NativeSink  # noqa: E402


def ipc(columns):
    table = pa.table(columns)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def batch(ids, ops, names):
    return ipc({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array(names, pa.utf8()),
        "__op": pa.array(ops, pa.utf8()),
        "__pos": pa.array([bytes([i]) for i in range(len(ids))], pa.binary()),
    })


class JsonLinesSinkTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.sink = NativeSink(JsonLinesSink(), self.root)
        self.sink.open("p", {})

    def files(self):
        found = {}
        for folder, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    found[os.path.relpath(path, self.root)] = f.read()
        return found

    def test_a_committed_batch_becomes_one_file_named_after_its_id(self):
        self.sink.write("shop.orders", "b1", batch([1, 2], ["insert", "delete"], ["ada", None]))
        self.assertEqual(self.files(), {}, "nothing may be visible before commit")
        self.sink.commit("shop.orders")
        self.assertEqual(self.files(), {
            "shop.orders/b1.jsonl":
                '{"id":1,"name":"ada","op":"insert"}\n{"id":2,"op":"delete"}\n',
        })
        # A replay of the same batch id overwrites; it never adds a file.
        self.sink.write("shop.orders", "b1", batch([1, 2], ["insert", "delete"], ["ada", None]))
        self.sink.commit("shop.orders")
        self.assertEqual(len(self.files()), 1)

    def test_abort_drops_what_is_staged(self):
        self.sink.write("t", "b1", batch([1], ["insert"], ["x"]))
        self.sink.abort("t")
        self.sink.commit("t")
        self.assertEqual(self.files(), {})

    def test_strings_are_escaped_as_json(self):
        self.sink.write("t", "b1", batch([1], ["update"], ['quote " back \\ nl \n é']))
        self.sink.commit("t")
        (text,) = self.files().values()
        self.assertEqual(json.loads(text)["name"], 'quote " back \\ nl \n é')

    def test_an_unknown_config_key_is_fatal_naming_it(self):
        sink = NativeSink(JsonLinesSink(), self.root)
        with self.assertRaises(weir_sdk.Fatal) as caught:
            sink.open("p", {"folder": "x"})
        self.assertIn("`folder`", str(caught.exception))

    def test_a_column_json_cannot_hold_is_poison_naming_it(self):
        data = ipc({
            "id": pa.array([1], pa.int64()),
            "tier": pa.array(["gold"]).dictionary_encode(),
            "__op": pa.array(["insert"]),
            "__pos": pa.array([b"\x01"]),
        })
        with self.assertRaises(weir_sdk.Poison) as caught:
            self.sink.write("t", "b9", data, rows=1)
        message = str(caught.exception)
        self.assertIn("`tier`", message)
        self.assertIn("b9", message)

    def test_a_batch_without_control_columns_is_poison(self):
        with self.assertRaises(weir_sdk.Poison) as caught:
            self.sink.write("t", "b2", ipc({"id": pa.array([1], pa.int64())}), rows=1)
        self.assertIn("`__op`", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
