#!/usr/bin/env python3
"""Reader for the Iceberg sink (`weir-iceberg-sink`): the table's live rows
(`shows: state`), read by DuckDB's iceberg extension, which applies the
sink's equality deletes.

The sink keeps table `a.b` at `<root>/a/b` (metadata under `metadata/`;
`version-hint.text` names the current version, but may lag by one). Its
metadata records absolute locations under the `warehouse` URL of the test
config, which cannot name the harness's temporary root; DuckDB's
`allow_moved_paths` reads the files where they are instead. A table without a version hint, or
whose current metadata has no snapshot yet, is empty.

The extensions come from the pip packages `duckdb-extension-avro` and
`duckdb-extension-iceberg` and load by file path, as tests/readers/
read_iceberg.py loads them: nothing is downloaded at run time. Needs the
repository's .venv.
"""

import importlib.util
import json
import os

import weir_rows


def current_version(folder: str):
    """The newest metadata version of the table at `folder`, or None."""
    hint = os.path.join(folder, "metadata", "version-hint.text")
    if not os.path.exists(hint):
        return None
    with open(hint) as f:
        version = int(f.read().strip())
    # The sink commits by writing `v<N+1>.metadata.json` and only then the
    # hint, so the hint may lag behind a commit that landed (a crash in
    # between): the newest metadata file is the table.
    while os.path.exists(metadata_path(folder, version + 1)):
        version += 1
    return version


def metadata_path(folder: str, version: int) -> str:
    return os.path.join(folder, "metadata", f"v{version}.metadata.json")


def connect():
    # The same DuckDB set-up as the suite's other Iceberg reader (loaded by
    # path: it has this file's name).
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "readers", "read_iceberg.py")
    spec = importlib.util.spec_from_file_location("suite_read_iceberg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.duckdb_connection()


def main():
    folder = os.path.join(weir_rows.root(), *weir_rows.table().split("."))
    version = current_version(folder)
    if version is None:
        return
    with open(metadata_path(folder, version)) as f:
        snapshot = json.load(f).get("current-snapshot-id")
    if snapshot is None or snapshot == -1:
        return
    con = connect()
    escaped = folder.replace("'", "''")
    # `version` names the metadata file, instead of DuckDB trusting the hint.
    result = con.execute(
        f"SELECT * FROM iceberg_scan('{escaped}', version => '{version}', allow_moved_paths => true)"
    )
    columns = [d[0] for d in result.description]
    for values in result.fetchall():
        weir_rows.print_row(dict(zip(columns, values)))


if __name__ == "__main__":
    main()
