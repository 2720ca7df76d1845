#!/usr/bin/env python3
"""Reader for the positioned fixture and the flawed fixture
(`weir-fixture-positioned`, `weir-fixture-flawed`): every Arrow IPC file
under `<root>/<table>/`, in name order, one line per change (`shows:
changes`). The commit objects `<seq, 20 digits>.arrow` hold every column the
host sent, `__op` and `__pos` included; a commit of nothing is a file with
no columns and no rows. Any other Arrow file there is part of what the
table shows too: a reader sees it.

Needs pyarrow (the repository's .venv).
"""

import glob
import os

import pyarrow as pa

import weir_rows


def main():
    folder = os.path.join(weir_rows.root(), weir_rows.table())
    for path in sorted(glob.glob(os.path.join(folder, "*.arrow"))):
        with pa.memory_map(path) as source:
            weir_rows.print_arrow_table(pa.ipc.open_file(source).read_all())


if __name__ == "__main__":
    main()
