#!/usr/bin/env python3
"""Reads several Iceberg tables in one process, for the crash matrix.

    read_iceberg_tables.py pyiceberg|duckdb METADATA_JSON...

The readers and the canonical forms are tests/readers/read_iceberg.py's;
this only saves starting Python and loading DuckDB's extensions once per
table after every kill. Prints a JSON list, one object per table in the
order given: {"columns": [...], "rows": [[...], ...]}.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "readers"))
import read_iceberg  # noqa: E402


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("pyiceberg", "duckdb"):
        raise SystemExit(__doc__)
    reader = read_iceberg.read_pyiceberg if sys.argv[1] == "pyiceberg" else read_iceberg.read_duckdb
    out = []
    for metadata in sys.argv[2:]:
        table, _ = reader(metadata)
        columns = table.column_names
        canon = [read_iceberg.canonical_column(table.column(i)) for i in range(len(columns))]
        out.append({"columns": columns, "rows": [list(r) for r in zip(*canon)] if canon else []})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
