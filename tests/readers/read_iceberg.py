#!/usr/bin/env python3
"""Reads an Iceberg table with a reader weir did not write, for the tests.

    read_iceberg.py pyiceberg|duckdb METADATA_JSON
    read_iceberg.py duckdb-parquet FOLDER

The third form reads every Parquet file under FOLDER with DuckDB's own
read_parquet (columns matched by name across files): the Parquet sink's
change log, `__op` and `__pos` included, for the caller to fold.

METADATA_JSON is a local path or an s3:// URL. For S3, WEIR_S3_ENDPOINT
(http://host:port), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
AWS_DEFAULT_REGION say where and how: each reader then goes through the S3
API itself (pyarrow's S3 file system, DuckDB's httpfs), path-style.

Prints one JSON object: the reader, the table's columns, every row as a list
of canonical strings (null stays null), and the current snapshot's summary.
Canonical forms, the same the Rust side builds from the generator's values:
integers and decimals as text ("12.30"), booleans "true"/"false", floats as
the hex of their IEEE-754 bits, binary as hex, dates as days and timestamps
as microseconds since the Unix epoch.
"""

import glob
import json
import os
import struct
import sys

import pyarrow as pa
import pyarrow.compute as pc


def canonical_column(column: pa.ChunkedArray) -> list:
    t = column.type
    if pa.types.is_timestamp(t):
        values = pc.cast(column, pa.timestamp("us", tz=t.tz)).cast(pa.int64()).to_pylist()
        return [None if v is None else str(v) for v in values]
    if pa.types.is_date32(t):
        return [None if v is None else str(v) for v in column.cast(pa.int32()).to_pylist()]
    if pa.types.is_floating(t):
        return [
            None if v is None else struct.pack(">d", v).hex() for v in column.to_pylist()
        ]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return [None if v is None else v.hex() for v in column.to_pylist()]
    if pa.types.is_boolean(t):
        return [None if v is None else ("true" if v else "false") for v in column.to_pylist()]
    return [None if v is None else str(v) for v in column.to_pylist()]


def s3_settings():
    """(endpoint URL, key id, secret, region) when reading through S3."""
    endpoint = os.environ.get("WEIR_S3_ENDPOINT")
    if not endpoint:
        return None
    return (
        endpoint,
        os.environ["AWS_ACCESS_KEY_ID"],
        os.environ["AWS_SECRET_ACCESS_KEY"],
        os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    )


def read_pyiceberg(metadata: str):
    from pyiceberg.table import StaticTable

    properties = {}
    s3 = s3_settings()
    if s3 is not None:
        endpoint, key, secret, region = s3
        properties = {
            "s3.endpoint": endpoint,
            "s3.access-key-id": key,
            "s3.secret-access-key": secret,
            "s3.region": region,
            "s3.force-virtual-addressing": "false",
        }
    table = StaticTable.from_metadata(metadata, properties)
    snapshot = table.current_snapshot()
    summary = {}
    if snapshot is not None and snapshot.summary is not None:
        summary = {k: v for k, v in snapshot.summary.additional_properties.items()}
        summary["operation"] = str(snapshot.summary.operation.value)
    return table.scan().to_arrow(), summary


def duckdb_connection():
    """A DuckDB connection in UTC with the avro and iceberg extensions, and
    httpfs with a secret for the S3 endpoint when reading through S3."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    modules = [(duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")]
    s3 = s3_settings()
    if s3 is not None:
        import duckdb_extension_httpfs

        modules.append((duckdb_extension_httpfs, "httpfs"))
    # The extensions come from pip packages and load by file path: no
    # download at run time.
    for module, name in modules:
        base = os.path.dirname(module.__file__)
        found = sorted(glob.glob(os.path.join(base, "extensions", "*", f"{name}.duckdb_extension")))
        if not found:
            raise SystemExit(f"no {name}.duckdb_extension under {base}")
        con.execute(f"LOAD '{found[-1]}'")
    if s3 is not None:
        endpoint, key, secret, region = s3
        host = endpoint.split("://", 1)[-1].rstrip("/")
        quote = lambda v: "'" + v.replace("'", "''") + "'"
        con.execute(
            f"CREATE SECRET weir_s3 (TYPE s3, KEY_ID {quote(key)}, SECRET {quote(secret)}, "
            f"REGION {quote(region)}, ENDPOINT {quote(host)}, URL_STYLE 'path', "
            f"USE_SSL {'true' if endpoint.startswith('https://') else 'false'})"
        )
    return con


def read_duckdb(metadata: str):
    con = duckdb_connection()
    escaped = metadata.replace("'", "''")
    result = con.execute(f"SELECT * FROM iceberg_scan('{escaped}')")
    table = result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.fetch_arrow_table()
    summary = {}
    rows = con.execute(
        f"SELECT * FROM iceberg_snapshots('{escaped}') ORDER BY sequence_number DESC LIMIT 1"
    ).fetchall()
    if rows:
        summary["sequence_number"] = str(rows[0][0])
    return table, summary


def read_duckdb_parquet(folder: str):
    con = duckdb_connection()
    pattern = os.path.join(folder, "**", "*.parquet").replace("'", "''")
    result = con.execute(f"SELECT * FROM read_parquet('{pattern}', union_by_name = true)")
    table = result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.fetch_arrow_table()
    return table, {}


def main():
    readers = {"pyiceberg": read_pyiceberg, "duckdb": read_duckdb, "duckdb-parquet": read_duckdb_parquet}
    if len(sys.argv) != 3 or sys.argv[1] not in readers:
        raise SystemExit(__doc__)
    reader, metadata = sys.argv[1], sys.argv[2]
    table, summary = readers[reader](metadata)
    columns = table.column_names
    canon = [canonical_column(table.column(i)) for i in range(len(columns))]
    rows = [list(r) for r in zip(*canon)] if canon else []
    json.dump(
        {"reader": reader, "columns": columns, "rows": rows, "summary": summary},
        sys.stdout,
    )


if __name__ == "__main__":
    main()
