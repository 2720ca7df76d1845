//! Postgres types into Iceberg, exactly: a table with a column of every
//! type weir carries goes through `examples/postgres-to-iceberg.yaml` (the
//! file itself, with its environment variables), by backfill and then by
//! the stream (inserts, updates, deletes, an added array column, updates
//! that leave a long out-of-line text unchanged), and
//! DuckDB and pyiceberg must each return what Postgres itself returns for
//! the same rows. A uuid-keyed table large enough for two backfill chunks
//! checks that uuid keys page and resume. A table of only the types the
//! backfill reads in binary COPY takes that path with the same edge values.
//! Values no Iceberg type holds (a numeric NaN, a two-dimensional array)
//! stop the pipeline with an error naming the column.
//!
//! See docs/postgres.md, "Types", for the table this test stands behind.

use crate::common;
use crate::iceberg_support;
use crate::postgres_support;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{text, weir};
use iceberg_support::{Lake, read_python};
use postgres_support::{Pg, PgPipeline, cluster};
use weir_source::postgres::decode::copy_fields;
use weir_test_support::iceberg_rest::IcebergRestServer;
use weir_test_support::moto::MotoServer;

/// How a column's value is compared: Postgres' side is produced by SQL in
/// the canonical form of tests/readers/read_iceberg.py, and both sides are
/// normalised where readers print one value in more than one way.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// Compared as printed.
    Plain,
    /// A decimal: compared by value (`1.50`, `1.5` and `15E-1` are equal).
    Decimal,
    /// A time of day: compared in microseconds.
    Time,
    /// A list: Postgres gives JSON, readers print the Python list.
    List,
}

/// `(column, SQL giving Postgres' canonical text of it, form)`.
const TYPED: &[(&str, &str, Form)] = &[
    ("id", "id::text", Form::Plain),
    ("i2", "i2::text", Form::Plain),
    ("i4", "i4::text", Form::Plain),
    ("i8", "i8::text", Form::Plain),
    ("f4", "encode(float8send(f4::float8), 'hex')", Form::Plain),
    ("f8", "encode(float8send(f8), 'hex')", Form::Plain),
    ("money", "money::text", Form::Decimal),
    ("free", "free::text", Form::Decimal),
    (
        "flag",
        "CASE WHEN flag THEN 'true' WHEN NOT flag THEN 'false' END",
        Form::Plain,
    ),
    ("body", "body", Form::Plain),
    ("code", "code::text", Form::Plain),
    ("blob", "encode(blob, 'hex')", Form::Plain),
    ("uid", "uid::text", Form::Plain),
    ("doc", "doc::text", Form::Plain),
    ("docb", "docb::text", Form::Plain),
    ("day", "(day - date '1970-01-01')::text", Form::Plain),
    ("at", "at::text", Form::Time),
    (
        "ts",
        "(extract(epoch FROM ts) * 1000000)::bigint::text",
        Form::Plain,
    ),
    (
        "tstz",
        "(extract(epoch FROM tstz) * 1000000)::bigint::text",
        Form::Plain,
    ),
    ("ints", "to_json(ints)::text", Form::List),
    ("words", "to_json(words)::text", Form::List),
    ("span", "span::text", Form::Plain),
];

const SCHEMA: &str = r#"
CREATE TABLE public.typed (
    id bigint PRIMARY KEY,
    i2 int2, i4 int4, i8 int8, f4 float4, f8 float8,
    money numeric(12,2), free numeric, flag boolean,
    body text, code varchar(20), blob bytea, uid uuid, doc json, docb jsonb,
    day date, at time, ts timestamp, tstz timestamptz,
    ints int4[], words text[], span interval
);
-- Stored out of line once long: an update that leaves it alone reaches
-- the source as "unchanged TOAST", read by key after the transaction.
ALTER TABLE public.typed ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE public.by_uuid (id uuid PRIMARY KEY, n int4 NOT NULL, tags text[]);
CREATE TABLE public.plain (
    id bigint PRIMARY KEY,
    i2 int2, i4 int4, i8 int8, f8 float8, money numeric(12,2), free numeric, flag boolean,
    body text, code varchar(20), fixed char(5), blob bytea, uid uuid,
    day date, at time, ts timestamp, tstz timestamptz
);
"#;

/// Rows read by the backfill: edge values, all nulls, empty arrays.
const BACKFILL: &str = r#"
INSERT INTO public.typed VALUES
 (1, -32768, 2147483647, -9223372036854775808, 1.5, 0.1, -1234.56, 3.14159, true,
  'héllo ✓ it''s', 'abc', '\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{"a": [1, "x"]}', '{"b": null, "a": 1}', '2024-02-29', '13:14:15.123456',
  '2024-01-02 03:04:05.678901', '2024-01-02 03:04:05.678901+02', '{1,NULL,-3}',
  '{"with, comma","q\"d",NULL,"{b}","it''s","back\\slash"}', '1 year 2 mons 3 days 04:05:06'),
 (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, '{}', '{}', NULL),
 (3, 0, 0, 0, 'NaN', '-Infinity', 0, -0.000000000000000001, false, '', '', '\x',
  '00000000-0000-0000-0000-000000000000', 'null', '[]', '0001-01-01 BC', '00:00:00',
  '1900-01-01 00:00:00', '1970-01-01 00:00:00+00', NULL, NULL, '-1 days'),
 (4, 7, 8, 9, '-0', 'Infinity', 9999999999.99, 12345678901234567890.123456789012345678, true,
  E'tab\there\nnewline', 'x', '\xdeadbeef', 'ffffffff-ffff-ffff-ffff-ffffffffffff',
  '"s"', '{"nested": {"k": [true, false]}}', '1970-01-01', '23:59:59.999999',
  '1970-01-01 00:00:00', '2024-06-30 23:59:59.5-07:30', '{2147483647,-2147483648}',
  '{NULL}', '00:00:00.000001');
INSERT INTO public.typed (id, i4, free, words, uid, tstz)
SELECT g, g, g / 7.0, ARRAY['w' || g, NULL], md5(g::text)::uuid,
       timestamptz '2020-01-01 00:00:00+00' + g * interval '1 hour 1 second'
FROM generate_series(10, 300) g;
-- About 22 KB each, out of line: the stream's update of these rows leaves
-- them unchanged.
UPDATE public.typed
SET body = (SELECT string_agg(md5(g::text || id::text), '') FROM generate_series(1, 700) g)
WHERE id BETWEEN 10 AND 20;
INSERT INTO public.by_uuid
SELECT md5('k' || g)::uuid, g, CASE WHEN g % 3 = 0 THEN ARRAY['a', NULL] END
FROM generate_series(1, 12000) g;
INSERT INTO public.plain
SELECT id, i2, i4, i8, f8, money, free, flag, body, code, code, blob, uid, day, at, ts, tstz
FROM public.typed;
"#;

/// Changes the stream carries: inserts, updates of every kind of column,
/// deletes, uuid key changes, and a new array column.
const STREAM: &str = r#"
BEGIN;
INSERT INTO public.typed VALUES
 (500, 1, 2, 3, 4.25, 5.5, 6.75, 7.125, false, 'streamed', 'y', '\x01',
  'c0ffee00-0000-4000-8000-000000000001', '[1,2]', '{"z": "ü"}', '2000-02-29',
  '12:00:00.5', '2000-02-29 12:00:00.5', '2000-02-29 12:00:00.5+00', '{5,NULL}',
  '{"", " ", "NULL"}', '2 hours');
UPDATE public.typed SET ints = '{}', words = '{NULL,x}', uid = NULL, at = '01:02:03',
  free = -1.5, docb = '{"u": 1}' WHERE id = 1;
UPDATE public.typed SET ints = '{9}', free = 0.000000000000000001, day = '2099-12-31'
  WHERE id BETWEEN 10 AND 60;
DELETE FROM public.typed WHERE id BETWEEN 200 AND 250;
COMMIT;
UPDATE public.by_uuid SET n = -n, tags = '{}' WHERE n % 100 = 0;
DELETE FROM public.by_uuid WHERE n % 100 = 1;
UPDATE public.by_uuid SET id = md5('moved' || n)::uuid WHERE n % 1000 = 2;
ALTER TABLE public.typed ADD COLUMN later int8[];
INSERT INTO public.typed (id, later, words) VALUES (600, '{1,NULL,3}', '{a}');
UPDATE public.typed SET later = '{}' WHERE id = 3;
"#;

/// A table of the types the backfill reads in binary COPY (every column's
/// type has a binary reader, and its key prints the same either way), with
/// the edge values of `typed` above: its columns of those types, compared
/// as in `TYPED`, and `fixed`, a `char(5)` copy of `code`.
fn plain_columns() -> Vec<(&'static str, &'static str, Form)> {
    const SHARED: &[&str] = &[
        "id", "i2", "i4", "i8", "f8", "money", "free", "flag", "body", "code", "blob", "uid",
        "day", "at", "ts", "tstz",
    ];
    let mut columns: Vec<_> = TYPED
        .iter()
        .filter(|(name, _, _)| SHARED.contains(name))
        .copied()
        .collect();
    assert_eq!(
        columns.len(),
        SHARED.len(),
        "every shared column is in TYPED"
    );
    // char(n) keeps its padding; a cast to text drops it.
    columns.push(("fixed", "rpad(fixed::text, 5)", Form::Plain));
    columns
}

const BY_UUID: &[(&str, &str, Form)] = &[
    ("id", "id::text", Form::Plain),
    ("n", "n::text", Form::Plain),
    ("tags", "to_json(tags)::text", Form::List),
];

/// The rows of `table` as Postgres returns them, in canonical form.
fn postgres_rows(pg: &Pg, db: &str, table: &str, columns: &[(&str, &str, Form)]) -> Vec<Row> {
    let select: Vec<&str> = columns.iter().map(|(_, sql, _)| *sql).collect();
    let sql = format!("COPY (SELECT {} FROM {table}) TO STDOUT", select.join(", "));
    let out = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &pg.dsn(db), "-c", &sql])
        .env("PGOPTIONS", "-c TimeZone=UTC -c extra_float_digits=3")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "psql failed");
    let mut rows: Vec<Row> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            copy_fields(line)
                .unwrap()
                .into_iter()
                .zip(columns)
                .map(|(v, (_, _, form))| v.map(|v| normalise(*form, &v, true)))
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

type Row = Vec<Option<String>>;

/// What `reader` returns for `columns` of the table, normalised.
fn reader_rows(reader: &str, metadata: &Path, columns: &[(&str, &str, Form)]) -> Vec<Row> {
    let read = read_python(reader, metadata)
        .unwrap_or_else(|e| panic!("{reader} cannot read {}: {e}", metadata.display()));
    normalised(&read, columns)
}

/// `columns` of what a reader read, normalised and sorted.
fn normalised(read: &iceberg_support::Read, columns: &[(&str, &str, Form)]) -> Vec<Row> {
    let names: Vec<String> = columns.iter().map(|(n, _, _)| n.to_string()).collect();
    let mut rows: Vec<Row> = read
        .project(&names)
        .into_iter()
        .map(|row| {
            row.into_iter()
                .zip(columns)
                .map(|(v, (_, _, form))| v.map(|v| normalise(*form, &v, false)))
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

fn normalise(form: Form, text: &str, from_postgres: bool) -> String {
    match form {
        Form::Plain => text.to_string(),
        Form::Decimal => decimal(text),
        Form::Time => time_micros(text).to_string(),
        Form::List if from_postgres => python_list(text),
        Form::List => text.to_string(),
    }
}

/// A decimal's value as `[-]digits.digits` without trailing zeros, from
/// plain (`-1.50`) or scientific (`-15E-1`) notation.
fn decimal(text: &str) -> String {
    let (mantissa, exponent) = match text.split_once(['E', 'e']) {
        Some((m, e)) => (m, e.parse::<i64>().unwrap()),
        None => (text, 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let (whole, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{frac}");
    // The value is digits * 10^point_shift.
    let scale = frac.len() as i64 - exponent;
    let (int_part, frac_part) = if scale <= 0 {
        (
            format!("{digits}{}", "0".repeat((-scale) as usize)),
            String::new(),
        )
    } else {
        let scale = scale as usize;
        let padded = format!("{}{digits}", "0".repeat(scale.saturating_sub(digits.len())));
        let split = padded.len() - scale;
        (padded[..split].to_string(), padded[split..].to_string())
    };
    let int_part = int_part.trim_start_matches('0');
    let frac_part = frac_part.trim_end_matches('0');
    let body = match (int_part.is_empty(), frac_part.is_empty()) {
        (true, true) => return "0".to_string(),
        (_, true) => int_part.to_string(),
        (true, false) => format!("0.{frac_part}"),
        (false, false) => format!("{int_part}.{frac_part}"),
    };
    if negative { format!("-{body}") } else { body }
}

/// `HH:MM:SS[.f]` -> microseconds since midnight.
fn time_micros(text: &str) -> i64 {
    let (clock, frac) = text.split_once('.').unwrap_or((text, ""));
    let parts: Vec<i64> = clock.split(':').map(|p| p.parse().unwrap()).collect();
    let micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().unwrap()
    };
    ((parts[0] * 60 + parts[1]) * 60 + parts[2]) * 1_000_000 + micros
}

/// A JSON array as Python prints the list a reader returns for it
/// (`[1, None, 'a']`).
fn python_list(json: &str) -> String {
    let items: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
    let shown: Vec<String> = items
        .iter()
        .map(|item| match item {
            serde_json::Value::Null => "None".to_string(),
            serde_json::Value::String(s) => python_str(s),
            other => other.to_string(),
        })
        .collect();
    format!("[{}]", shown.join(", "))
}

/// Python's `repr` of a string.
fn python_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Where the example's tables are kept: the file-system catalog in the
/// lake folder (examples/postgres-to-iceberg.yaml), or a REST catalog
/// (examples/postgres-to-iceberg-rest.yaml) whose tables are read back
/// through it.
enum Catalog<'a> {
    Files,
    /// The catalog, and the S3 server its tables' data is on.
    Rest(&'a IcebergRestServer, &'a MotoServer),
}

/// The S3 bucket and prefix of the REST variant's tables.
const REST_WAREHOUSE: &str = "s3://weir-types-lake/lake";

/// Runs the example until caught up; what it said (with the backfill's
/// debug lines).
fn run_example(pg: &Pg, db: &str, lake: &Lake, state: &Path, catalog: &Catalog) -> String {
    // The components may be built outside the checkout (CARGO_TARGET_DIR).
    let plugin = common::plugin("weir-iceberg-sink");
    let plugins = plugin.parent().unwrap().to_str().unwrap();
    let dsn = pg.dsn(db);
    let warehouse = match catalog {
        Catalog::Files => lake.warehouse(),
        Catalog::Rest(..) => REST_WAREHOUSE.to_string(),
    };
    let mut env = vec![
        ("WEIR_PLUGINS", plugins),
        ("PG_DSN", dsn.as_str()),
        ("WAREHOUSE", warehouse.as_str()),
        ("STATE_DIR", state.to_str().unwrap()),
        ("EXIT_WHEN_CAUGHT_UP", "true"),
        (
            "WEIR_LOG",
            "info,weir_source::postgres::backfill=debug,weir_source::postgres::toast=debug",
        ),
    ];
    let example = match catalog {
        Catalog::Files => common::workspace().join("examples/postgres-to-iceberg.yaml"),
        Catalog::Rest(server, moto) => {
            env.extend([
                ("CATALOG_URI", server.uri()),
                ("CATALOG_HOST", server.uri()),
                ("SLOT", "weir_cdc_rest"),
            ]);
            if let Some(token) = server.token() {
                env.push(("CATALOG_TOKEN", token));
            }
            // The example as a user on S3 runs it: its blob store given the
            // S3 server's options, every other line as shipped.
            let shipped = std::fs::read_to_string(
                common::workspace().join("examples/postgres-to-iceberg-rest.yaml"),
            )
            .unwrap();
            let store = r#"blob_store: { url: "${WAREHOUSE}" }"#;
            assert!(
                shipped.contains(store),
                "the example's blob store line changed"
            );
            let options = serde_json::to_string(&moto.blob_store_options()).unwrap();
            let on_s3 = shipped.replace(
                store,
                &format!(r#"blob_store: {{ url: "${{WAREHOUSE}}", options: {options} }}"#),
            );
            let copy = state
                .parent()
                .unwrap()
                .join("postgres-to-iceberg-rest.yaml");
            std::fs::write(&copy, on_s3).unwrap();
            copy
        }
    };
    let out = weir(&["run", example.to_str().unwrap()], &env);
    assert!(out.status.success(), "weir run failed: {}", text(&out));
    text(&out)
}

fn assert_readers_equal_postgres(
    pg: &Pg,
    db: &str,
    lake: &Lake,
    catalog: &Catalog,
    table: &str,
    columns: &[(&str, &str, Form)],
) {
    let want = postgres_rows(pg, db, table, columns);
    for reader in ["duckdb", "pyiceberg"] {
        let got = match catalog {
            Catalog::Files => {
                let metadata = lake.metadata(table).expect("the table was written");
                reader_rows(reader, &metadata, columns)
            }
            Catalog::Rest(server, _) => rest_reader_rows(server, reader, table, columns),
        };
        let missing: Vec<&Row> = want.iter().filter(|r| !got.contains(r)).take(3).collect();
        let extra: Vec<&Row> = got.iter().filter(|r| !want.contains(r)).take(3).collect();
        assert!(
            missing.is_empty() && extra.is_empty() && want.len() == got.len(),
            "{reader}, {table}: Postgres has {} rows, the reader {}.\nPostgres only: {missing:?}\n\
             {reader} only: {extra:?}",
            want.len(),
            got.len()
        );
        println!("{reader}, {table}: {} rows equal to Postgres", want.len());
    }
}

/// What `reader` returns for `columns` of `table` read through the REST
/// catalog, normalised as [`reader_rows`] does.
fn rest_reader_rows(
    server: &IcebergRestServer,
    reader: &str,
    table: &str,
    columns: &[(&str, &str, Form)],
) -> Vec<Row> {
    let (namespace, name) = table.split_once('.').expect("schema.table");
    let rows = match reader {
        "duckdb" => server.rows_via_duckdb(&[namespace], name),
        _ => server.rows_via_pyiceberg(&[namespace], name),
    };
    let read = iceberg_support::Read {
        columns: rows.columns,
        rows: rows.rows,
    };
    normalised(&read, columns)
}

#[test]
fn every_carried_type_round_trips_through_the_example_into_duckdb_and_pyiceberg() {
    round_trip_every_type("weir_types", "weir_cdc", &Catalog::Files);
}

/// The same through an Iceberg REST catalog (its own example file), read
/// back through the catalog by both readers.
#[test]
fn every_carried_type_round_trips_through_a_rest_catalog() {
    let moto = MotoServer::start();
    moto.create_bucket("weir-types-lake");
    let server = IcebergRestServer::builder()
        .token("weir-types")
        .s3(&moto, REST_WAREHOUSE)
        .start();
    round_trip_every_type(
        "weir_types_rest",
        "weir_cdc_rest",
        &Catalog::Rest(&server, &moto),
    );
    assert!(
        !moto.keys("weir-types-lake", "lake/").is_empty(),
        "nothing was written to the bucket"
    );
}

/// Backfill, then stream, every carried type through the example of
/// `catalog` (its slot `slot`, which a crashed earlier run may hold).
fn round_trip_every_type(db: &str, slot: &str, catalog: &Catalog) {
    let pg = cluster();
    // Slots are per cluster.
    pg.sql(
        "weir",
        &format!(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = '{slot}' AND active_pid IS NOT NULL;\n\
             SELECT pg_sleep(0.5);\n\
             SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = '{slot}';"
        ),
    );
    pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    pg.sql(db, BACKFILL);
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let state = dir.path().join("state");

    let said = run_example(&pg, db, &lake, &state, catalog);
    for (table, format) in [("public.plain", "binary"), ("public.typed", "text")] {
        assert!(
            said.lines()
                .any(|l| l.contains(&format!("in {format} COPY")) && l.contains(table)),
            "{table} was not read in {format} COPY: {said}"
        );
    }
    assert_readers_equal_postgres(&pg, db, &lake, catalog, "public.typed", TYPED);
    assert_readers_equal_postgres(&pg, db, &lake, catalog, "public.by_uuid", BY_UUID);
    assert_readers_equal_postgres(&pg, db, &lake, catalog, "public.plain", &plain_columns());

    pg.sql(db, STREAM);
    let said = run_example(&pg, db, &lake, &state, catalog);
    assert!(
        said.lines()
            .any(|l| l.contains("read unchanged TOAST values by key") && l.contains("public.typed")),
        "INCONCLUSIVE: the stream's update of the long bodies never read one by key: {said}"
    );
    let mut typed = TYPED.to_vec();
    typed.push(("later", "to_json(later)::text", Form::List));
    assert_readers_equal_postgres(&pg, db, &lake, catalog, "public.typed", &typed);
    assert_readers_equal_postgres(&pg, db, &lake, catalog, "public.by_uuid", BY_UUID);
}

#[test]
fn a_numeric_nan_and_a_two_dimensional_array_stop_the_pipeline_naming_the_column() {
    let pg = cluster();
    let db = "weir_types_refused";
    let dsn = pg.fresh_db(db);
    pg.sql(
        db,
        "CREATE TABLE public.prices (sku text PRIMARY KEY, price numeric, sizes int4[]);\n\
         INSERT INTO public.prices VALUES ('a', 1.5, '{1,2}'), ('b''s', 'NaN', NULL);",
    );
    let dir = tempfile::tempdir().unwrap();
    let pipeline =
        PgPipeline::new(&dsn, &["public.prices"]).write(dir.path(), &dir.path().join("sink"));
    let run = || {
        let out = weir(
            &["run", pipeline.to_str().unwrap()],
            &[("WEIR_PG_EXIT", "true")],
        );
        (out.status.success(), text(&out))
    };

    // By the backfill: the row is named by its key.
    let (ok, said) = run();
    assert!(!ok, "a NaN numeric was carried: {said}");
    for part in [
        "table public.prices, column price, row with key (sku) = ('b''s')",
        "numeric NaN has no decimal form",
    ] {
        assert!(said.contains(part), "missing {part:?} in: {said}");
    }

    // Once the row is fixed the backfill goes on; by the stream, a
    // two-dimensional array stops it again.
    pg.sql(db, "UPDATE public.prices SET price = 2 WHERE sku = 'b''s';");
    let (ok, said) = run();
    assert!(ok, "the fixed table did not go through: {said}");
    pg.sql(
        db,
        "INSERT INTO public.prices VALUES ('c', 3, '{{1,2},{3,4}}');",
    );
    let (ok, said) = run();
    assert!(!ok, "a two-dimensional array was carried: {said}");
    for part in [
        "column sizes",
        "a 2-dimensional array; weir carries one-dimensional arrays only",
    ] {
        assert!(said.contains(part), "missing {part:?} in: {said}");
    }
}

#[test]
fn a_numeric_nan_read_in_binary_copy_stops_the_backfill_naming_the_row() {
    let pg = cluster();
    let db = "weir_types_refused_binary";
    let dsn = pg.fresh_db(db);
    // Every column's type is read in binary COPY (no array, as above).
    pg.sql(
        db,
        "CREATE TABLE public.costs (id int8 PRIMARY KEY, cost numeric, at timestamptz);\n\
         INSERT INTO public.costs VALUES (1, 1.5, now()), (2, 'NaN', now()), (3, 2, 'infinity');",
    );
    let dir = tempfile::tempdir().unwrap();
    let pipeline =
        PgPipeline::new(&dsn, &["public.costs"]).write(dir.path(), &dir.path().join("sink"));
    let run = || {
        let out = weir(
            &["run", pipeline.to_str().unwrap()],
            &[("WEIR_PG_EXIT", "true")],
        );
        (out.status.success(), text(&out))
    };
    let (ok, said) = run();
    assert!(!ok, "a NaN numeric was carried: {said}");
    for part in [
        "table public.costs, column cost, row with key (id) = ('2')",
        "numeric NaN has no decimal form",
    ] {
        assert!(said.contains(part), "missing {part:?} in: {said}");
    }
    pg.sql(db, "UPDATE public.costs SET cost = 2 WHERE id = 2;");
    let (ok, said) = run();
    assert!(!ok, "an infinite timestamptz was carried: {said}");
    for part in [
        "table public.costs, column at, row with key (id) = ('3')",
        "timestamptz infinity has no equivalent",
    ] {
        assert!(said.contains(part), "missing {part:?} in: {said}");
    }
}
