"""Prints the rows python-sink holds for one table, one JSON object per line:
every line of `$WEIR_TEST_ROOT/$WEIR_TEST_TABLE/*.jsonl` (the reader command
of plugin-test.yaml). No folder yet means an empty table: no output."""

import glob
import json
import os
import sys

folder = os.path.join(os.environ["WEIR_TEST_ROOT"], os.environ["WEIR_TEST_TABLE"])
for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                json.loads(line)
            except ValueError as e:
                sys.exit("%s, line %d: not JSON: %s" % (path, number, e))
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
