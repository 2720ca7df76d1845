#!/bin/sh
# Prints the changes js-sink holds for one table: every line of
# $WEIR_TEST_ROOT/<table>/*.jsonl. No folder yet means no rows.
set -eu
dir="$WEIR_TEST_ROOT/$WEIR_TEST_TABLE"
[ -d "$dir" ] || exit 0
find "$dir" -maxdepth 1 -name '*.jsonl' -exec cat {} +
