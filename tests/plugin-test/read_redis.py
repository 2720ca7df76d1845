#!/usr/bin/env python3
"""Reader for the Redis sink (`weir-redis-sink`): the live rows of an upsert
table (`shows: state`), read with `redis-cli`.

    read_redis.py HOST:PORT [PREFIX]

Key layout (docs/sinks/redis.md): a row of table `<destination>` is the hash
`<prefix>:<destination>:<key>`, where every part after the prefix is
escaped (`\\` -> `\\\\`, `:` -> `\\:`); the hash holds the row's non-null
columns as text. The tests' tables have one key column, so a row's key has
exactly one part. Values are printed as Redis holds them (text); the harness
reads numbers from text. An append table is a stream at
`<prefix>:<destination>`, which has no live rows: refused.

Needs only the standard library and `redis-cli` (Redis 7: `--json`).
"""

import json
import subprocess
import sys

import weir_rows


def escape_part(part: str) -> str:
    return part.replace("\\", "\\\\").replace(":", "\\:")


def glob_escape(text: str) -> str:
    """`text` matched literally by a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class Redis:
    def __init__(self, address: str):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            sys.exit(f"read_redis.py: {address!r} is not HOST:PORT")
        self.args = ["redis-cli", "-h", host.strip("[]"), "-p", port, "-e", "--json"]

    def call(self, *command: str):
        try:
            done = subprocess.run(
                self.args + list(command), capture_output=True, text=True, timeout=30
            )
        except FileNotFoundError:
            sys.exit("read_redis.py: redis-cli is not installed (scripts/setup installs it)")
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip())[:300]
            sys.exit(f"read_redis.py: redis-cli {' '.join(command)}: {said}")
        return json.loads(done.stdout)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    redis = Redis(sys.argv[1])
    prefix = sys.argv[2] if len(sys.argv) == 3 else "weir"
    table_key = f"{prefix}:{escape_part(weir_rows.table())}"

    kind = redis.call("TYPE", table_key)
    if kind != "none":
        sys.exit(f"read_redis.py: {table_key} is a {kind}: an append table has no live rows")

    pattern = glob_escape(table_key + ":") + "*"
    keys, cursor = set(), "0"
    while True:
        cursor, found = redis.call("SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
        keys.update(found)
        if cursor == "0":
            break
    for key in sorted(keys):
        rest = key[len(table_key) + 1 :]
        # One key column: an unescaped `:` would mean a composite key.
        unescaped = rest.replace("\\\\", "").replace("\\:", "")
        if ":" in unescaped:
            sys.exit(f"read_redis.py: {key!r} has more than one key part")
        row = redis.call("HGETALL", key)
        if not isinstance(row, dict):
            sys.exit(f"read_redis.py: {key!r} does not hold a hash: {row!r}")
        weir_rows.print_row(row)


if __name__ == "__main__":
    main()
