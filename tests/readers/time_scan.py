#!/usr/bin/env python3
"""Times full scans of an Iceberg table by a reader weir did not write.

    time_scan.py pyiceberg|duckdb METADATA_JSON ROUNDS SUM_COLUMN

Each round opens the table afresh and reads every row into Arrow (DuckDB:
`SELECT * FROM iceberg_scan(...)`; pyiceberg: `scan().to_arrow()`), so the
time includes planning, reading data files and applying delete files, and
not Python's start-up or the extensions' loading. Prints one JSON object:
the best and median seconds, the row count and the sum of SUM_COLUMN (for
the caller to check the rows against its own truth).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_iceberg import duckdb_connection  # noqa: E402


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("pyiceberg", "duckdb"):
        raise SystemExit(__doc__)
    reader, metadata, rounds, column = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    times, table = [], None
    if reader == "duckdb":
        con = duckdb_connection()
        escaped = metadata.replace("'", "''")
        for _ in range(rounds):
            started = time.perf_counter()
            table = con.execute(f"SELECT * FROM iceberg_scan('{escaped}')").to_arrow_table()
            times.append(time.perf_counter() - started)
    else:
        from pyiceberg.table import StaticTable

        for _ in range(rounds):
            started = time.perf_counter()
            table = StaticTable.from_metadata(metadata).scan().to_arrow()
            times.append(time.perf_counter() - started)
    import pyarrow.compute as pc

    total = pc.sum(table.column(column)).as_py()
    times.sort()
    json.dump(
        {
            "best": times[0],
            "median": times[len(times) // 2],
            "rows": table.num_rows,
            "sum": 0 if total is None else int(total),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
