#!/usr/bin/env python3
"""Reader for the webhook sink (`weir-webhook-sink`) behind
webhook_receiver.py: every row the receiver stored for the table, one line
per change (`shows: changes`), `op` from the body's `__op`.

    read_webhook.py FOLDER

FOLDER is the receiver's. Only the standard library.
"""

import glob
import json
import os
import sys

import weir_rows
from webhook_receiver import table_folder


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = table_folder(sys.argv[1], weir_rows.table())
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError as e:
                        sys.exit(f"read_webhook.py: {path}:{number}: not JSON: {e}")
                    weir_rows.print_row(row)


if __name__ == "__main__":
    main()
