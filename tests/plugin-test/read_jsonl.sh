#!/bin/sh
# Reader for JSON Lines sinks that write `<root>/<table>/*.jsonl`, one object
# per row with the table's columns and `op` (the forgetful fixture,
# examples/hello-sink): prints every line of every file (`shows: changes`).
# No folder yet, or no file in it: the table is empty.
set -eu
folder="$WEIR_TEST_ROOT/$WEIR_TEST_TABLE"
[ -d "$folder" ] || exit 0
for file in "$folder"/*.jsonl; do
    [ -e "$file" ] || continue
    cat "$file"
done
