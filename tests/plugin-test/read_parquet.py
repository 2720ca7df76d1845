#!/usr/bin/env python3
"""Reader for the Parquet sink (`weir-parquet-sink`): every file
`<root>/<table, '.' as '/'>/*.parquet` (one per committed batch, named by
its batch id), one line per change (`shows: changes`), `op` from `__op`.
Each file is read on its own: a later batch may have a column an earlier one
did not (a new nullable column).

Needs pyarrow (the repository's .venv).
"""

import glob
import os

import pyarrow.parquet as pq

import weir_rows


def main():
    folder = os.path.join(weir_rows.root(), *weir_rows.table().split("."))
    for path in sorted(glob.glob(os.path.join(folder, "*.parquet"))):
        weir_rows.print_arrow_table(pq.read_table(path))


if __name__ == "__main__":
    main()
