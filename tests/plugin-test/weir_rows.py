"""What the readers of `weir plugin test` share: printing rows as the
harness reads them (one JSON object per line, nothing else on stdout) and
finding a table's folder under the sink's root.

The harness sets WEIR_TEST_ROOT (the sink's blob root), WEIR_TEST_TABLE
(the destination table, e.g. `plugin_test.delivery`) and WEIR_TEST_PIPELINE.
It compares `id`, `name`, `amount`, `note` and, for a reader that shows
changes, `op`; other fields are printed for people and ignored.
"""

import base64
import datetime
import decimal
import json
import os
import sys


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"{name} is not set: this reader is run by `weir plugin test`")
    return value


def root() -> str:
    return env("WEIR_TEST_ROOT")


def table() -> str:
    return env("WEIR_TEST_TABLE")


def json_value(value):
    """A value of pyarrow's `to_pylist()` as JSON can hold it."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # JSON has no NaN or infinity; keep them readable.
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return base64.b64encode(repr(value).encode()).decode()


def print_row(row: dict, op_field: str = "__op") -> None:
    """Prints one row; the sink's `op_field` (weir's `__op`) becomes `op`."""
    out = {name: json_value(value) for name, value in row.items()}
    if op_field in out:
        out["op"] = out.pop(op_field)
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")


def print_arrow_table(arrow_table) -> None:
    """Every row of a pyarrow Table, in order."""
    for row in arrow_table.to_pylist():
        print_row(row)
