//! The decoder on hand-built pgoutput messages: no server needed.

use super::*;
use crate::commit_order::stream_position;
use crate::postgres::catalog::{PgColumn, PgTableInfo};
use crate::postgres::decode::PgKind;
use crate::postgres::table::{Table, added_column};
use weir_core::position::Position;

const DOCS_OID: u32 = 16_400;
const NUMERIC_12_2: i32 = (12 << 16 | 2) + 4;

/// A column of `sql_type` (as `format_type` writes it), with its type oid.
pub(in crate::postgres) fn column(name: &str, kind: PgKind, sql_type: &str) -> PgColumn {
    let (type_oid, typmod) = match sql_type {
        "boolean" => (16, -1),
        "bytea" => (17, -1),
        "bigint" => (20, -1),
        "integer" => (23, -1),
        "text" => (25, -1),
        "double precision" => (701, -1),
        "integer[]" => (1007, -1),
        "date" => (1082, -1),
        "timestamp without time zone" => (1114, -1),
        "timestamp with time zone" => (1184, -1),
        "numeric(12,2)" => (1700, NUMERIC_12_2),
        other => panic!("no oid for {other}"),
    };
    PgColumn {
        name: name.to_string(),
        type_oid,
        typmod,
        kind,
        sql_type: sql_type.to_string(),
        not_null: false,
    }
}

/// A table with the given key; append mode when the key is empty.
pub(in crate::postgres) fn table_of(
    qualified: &str,
    columns: Vec<PgColumn>,
    key: Vec<usize>,
) -> Table {
    let (schema, name) = qualified.split_once('.').unwrap();
    let append = key.is_empty();
    let info = PgTableInfo {
        oid: DOCS_OID,
        schema: schema.to_string(),
        name: name.to_string(),
        columns,
        identity_columns: key.clone(),
        unique_indexes: vec![key.clone()],
        key,
        estimated_rows: -1.0,
        replica_identity: b'd',
        row_filter: None,
        partitions: Vec::new(),
        unsent_columns: Vec::new(),
        unsent_key_columns: Vec::new(),
    };
    Table::new(info, None, append).unwrap()
}

fn tables(table: Table) -> Tables {
    let mut tables = Tables::default();
    tables.push(table);
    tables
}

/// `public.docs (id bigint key, title text, body text)`.
fn docs() -> Tables {
    tables(table_of(
        "public.docs",
        vec![
            column("id", PgKind::Int64, "bigint"),
            column("title", PgKind::Text, "text"),
            column("body", PgKind::Text, "text"),
        ],
        vec![0],
    ))
}

// ---------------------------------------------------- message builders

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// A Relation message describing `columns` as `(name, type oid, typmod)`,
/// with the default replica identity: the column `id`, the test tables' key.
fn relation(oid: u32, qualified: &str, columns: &[(&str, u32, i32)]) -> Vec<u8> {
    relation_with_identity(oid, qualified, columns, b'd', &["id"])
}

/// A Relation message whose replica identity is `identity` (`d`, `n`, `f`,
/// `i`), with the key flag on the columns named in `identity_columns`.
fn relation_with_identity(
    oid: u32,
    qualified: &str,
    columns: &[(&str, u32, i32)],
    identity: u8,
    identity_columns: &[&str],
) -> Vec<u8> {
    let (schema, name) = qualified.split_once('.').unwrap();
    let mut out = vec![b'R'];
    out.extend_from_slice(&oid.to_be_bytes());
    cstr(&mut out, schema);
    cstr(&mut out, name);
    out.push(identity);
    out.extend_from_slice(&(columns.len() as i16).to_be_bytes());
    for (name, type_oid, typmod) in columns {
        out.push(u8::from(identity_columns.contains(name)));
        cstr(&mut out, name);
        out.extend_from_slice(&type_oid.to_be_bytes());
        out.extend_from_slice(&typmod.to_be_bytes());
    }
    out
}

/// The Relation message the server sends for `table` as it is.
fn relation_of(table: &Table) -> Vec<u8> {
    let columns: Vec<(&str, u32, i32)> = table
        .info
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid, c.typmod))
        .collect();
    let key: Vec<&str> = table
        .info
        .key
        .iter()
        .map(|&k| table.info.columns[k].name.as_str())
        .collect();
    relation_with_identity(table.info.oid, &table.schema.name, &columns, b'd', &key)
}

/// A tuple: Some(text) is a value, None a null, [`UNCHANGED`] an unchanged TOAST value.
fn tuple(out: &mut Vec<u8>, values: &[Option<&str>]) {
    out.extend_from_slice(&(values.len() as i16).to_be_bytes());
    for value in values {
        match value {
            None => out.push(b'n'),
            Some(UNCHANGED) => out.push(b'u'),
            Some(text) => {
                out.push(b't');
                out.extend_from_slice(&(text.len() as i32).to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
}

const UNCHANGED: &str = "\u{0}u";

fn insert(oid: u32, new: &[Option<&str>]) -> Vec<u8> {
    let mut out = vec![b'I'];
    out.extend_from_slice(&oid.to_be_bytes());
    out.push(b'N');
    tuple(&mut out, new);
    out
}

fn update(oid: u32, old: Option<(u8, &[Option<&str>])>, new: &[Option<&str>]) -> Vec<u8> {
    let mut out = vec![b'U'];
    out.extend_from_slice(&oid.to_be_bytes());
    if let Some((marker, old)) = old {
        out.push(marker);
        tuple(&mut out, old);
    }
    out.push(b'N');
    tuple(&mut out, new);
    out
}

fn delete(oid: u32, marker: u8, old: &[Option<&str>]) -> Vec<u8> {
    let mut out = vec![b'D'];
    out.extend_from_slice(&oid.to_be_bytes());
    out.push(marker);
    tuple(&mut out, old);
    out
}

/// Decodes `messages` as one transaction committed at `lsn` and seals it.
fn transaction(tables: &Tables, lsn: u64, messages: &[Vec<u8>]) -> Transaction {
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), tables).unwrap();
    decoder.begin(lsn, 0);
    for message in messages {
        assert!(decoder.decode(message, tables).unwrap().is_none());
    }
    let open = decoder.commit().expect("open transaction");
    open.seal(tables, &mut Emitted::default())
        .expect("something new")
}

fn text(s: &str) -> Value {
    Value::Utf8(s.into())
}

// ---------------------------------------------------- tests

#[test]
fn begin_insert_commit_gives_one_transaction_at_the_commit_lsn() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    assert!(!decoder.in_transaction());
    decoder.begin(0x100, 1_000_000);
    assert!(decoder.in_transaction());
    decoder
        .decode(&insert(DOCS_OID, &[Some("1"), Some("a"), None]), &tables)
        .unwrap();
    decoder
        .decode(
            &insert(DOCS_OID, &[Some("2"), Some("b"), Some("x")]),
            &tables,
        )
        .unwrap();
    let open = decoder.commit().unwrap();
    assert!(!decoder.in_transaction());
    let mut emitted = Emitted::default();
    let tx = open.seal(&tables, &mut emitted).unwrap();
    assert_eq!(tx.changes.len(), 2);
    let first = &tx.changes[0];
    assert_eq!(first.op, Op::Insert);
    assert_eq!(first.pos, stream_position(0x100, 0));
    assert_eq!(first.values, vec![Value::Int64(1), text("a"), Value::Null]);
    assert_eq!(first.commit_ts_micros, 1_000_000 + PG_EPOCH_MICROS);
    assert!(!first.snapshot);
    assert_eq!(tx.end, stream_position(0x100, 1));
    assert!(emitted.covers(&tx.end));
}

#[test]
fn decodes_every_supported_type() {
    let columns = vec![
        column("b", PgKind::Bool, "boolean"),
        column("i4", PgKind::Int32, "integer"),
        column("i8", PgKind::Int64, "bigint"),
        column("f", PgKind::Float64, "double precision"),
        column(
            "n",
            PgKind::Decimal {
                precision: 12,
                scale: 2,
            },
            "numeric(12,2)",
        ),
        column("by", PgKind::Bytea, "bytea"),
        column("d", PgKind::Date, "date"),
        column("ts", PgKind::Timestamp, "timestamp without time zone"),
        column("tz", PgKind::TimestampTz, "timestamp with time zone"),
        column("t", PgKind::Text, "text"),
        column("a", PgKind::Array(Box::new(PgKind::Int32)), "integer[]"),
    ];
    let tables = tables(table_of("public.types", columns, vec![2]));
    let row = [
        Some("t"),
        Some("-7"),
        Some("9000000000"),
        Some("1.5"),
        Some("-123.40"),
        Some("\\x00ff"),
        Some("1970-01-02"),
        Some("1970-01-01 00:00:01.5"),
        Some("1970-01-01 01:00:00+01"),
        Some("héllo"),
        Some("{1,NULL,3}"),
    ];
    let tx = transaction(&tables, 7, &[insert(DOCS_OID, &row)]);
    assert_eq!(
        tx.changes[0].values,
        vec![
            Value::Bool(true),
            Value::Int32(-7),
            Value::Int64(9_000_000_000),
            Value::Float64(1.5),
            Value::Decimal128(-12340),
            Value::Binary(vec![0, 255]),
            Value::Date32(1),
            Value::TimestampMicros(1_500_000),
            Value::TimestampMicros(0),
            text("héllo"),
            Value::List(vec![Value::Int32(1), Value::Null, Value::Int32(3)]),
        ]
    );
}

#[test]
fn a_value_that_does_not_decode_names_its_table_column_and_row() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(1, 0);
    let err = decoder
        .decode(&insert(DOCS_OID, &[Some("one"), None, None]), &tables)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("table public.docs, column id, row with key (id) = ('one')"),
        "{err}"
    );
}

#[test]
fn an_update_that_changes_the_key_deletes_the_old_key_first() {
    let tables = docs();
    let old: &[Option<&str>] = &[Some("1"), None, None];
    let tx = transaction(
        &tables,
        9,
        &[update(
            DOCS_OID,
            Some((b'K', old)),
            &[Some("2"), Some("t"), Some("b")],
        )],
    );
    assert_eq!(tx.changes.len(), 2);
    assert_eq!(tx.changes[0].op, Op::Delete);
    assert_eq!(
        tx.changes[0].values,
        vec![Value::Int64(1), Value::Null, Value::Null]
    );
    assert_eq!(tx.changes[1].op, Op::Update);
    assert_eq!(tx.changes[1].values[0], Value::Int64(2));
    assert_eq!(tx.changes[1].pos, stream_position(9, 1));
}

#[test]
fn an_append_table_keeps_whole_rows_and_never_splits_an_update() {
    let tables = tables(table_of(
        "public.log",
        vec![
            column("id", PgKind::Int64, "bigint"),
            column("body", PgKind::Text, "text"),
        ],
        vec![],
    ));
    let old: &[Option<&str>] = &[Some("1"), Some("a")];
    let tx = transaction(
        &tables,
        9,
        &[
            update(DOCS_OID, Some((b'O', old)), &[Some("2"), Some("b")]),
            delete(DOCS_OID, b'O', &[Some("2"), Some("b")]),
        ],
    );
    let ops: Vec<Op> = tx.changes.iter().map(|c| c.op).collect();
    assert_eq!(ops, vec![Op::Update, Op::Delete]);
    assert_eq!(tx.changes[1].values, vec![Value::Int64(2), text("b")]);
}

#[test]
fn a_delete_carries_only_the_key() {
    let tables = docs();
    let tx = transaction(
        &tables,
        3,
        &[delete(DOCS_OID, b'K', &[Some("5"), None, None])],
    );
    assert_eq!(tx.changes[0].op, Op::Delete);
    assert_eq!(
        tx.changes[0].values,
        vec![Value::Int64(5), Value::Null, Value::Null]
    );
}

#[test]
fn unchanged_toast_comes_from_a_whole_old_row_or_is_left_to_look_up() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(4, 0);
    let old: &[Option<&str>] = &[Some("1"), Some("old"), Some("big body")];
    let full = update(
        DOCS_OID,
        Some((b'O', old)),
        &[Some("1"), Some("new"), Some(UNCHANGED)],
    );
    let bare = update(DOCS_OID, None, &[Some("2"), Some("new"), Some(UNCHANGED)]);
    decoder.decode(&full, &tables).unwrap();
    decoder.decode(&bare, &tables).unwrap();
    let open = decoder.commit().unwrap();
    assert_eq!(open.tx.changes[0].values[2], text("big body"));
    assert!(open.tx.changes[0].unchanged.is_empty());
    assert_eq!(open.tx.changes[1].values[2], Value::Null);
    assert_eq!(open.tx.changes[1].unchanged, vec![2]);
    assert_eq!(open.tx.changes[1].key_text, vec!["2".to_string()]);
}

#[test]
fn an_added_trailing_column_waits_for_its_type_then_widens_the_rows() {
    let mut tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    let widened = relation(
        DOCS_OID,
        "public.docs",
        &[
            ("id", 20, -1),
            ("title", 25, -1),
            ("body", 25, -1),
            ("n", 23, -1),
        ],
    );
    let pending = decoder
        .decode(&widened, &tables)
        .unwrap()
        .expect("new column");
    assert_eq!(pending.table(), 0);
    assert_eq!(pending.added.len(), 1);
    let column = added_column(&pending.added[0], PgKind::Int32, "integer".into());
    tables[0].add_columns(vec![column], u64::MAX);
    decoder.install(pending, &tables).unwrap();
    assert_eq!(tables[0].schema.columns.len(), 4);
    assert!(tables[0].schema.columns[3].nullable);
    decoder.begin(5, 0);
    decoder
        .decode(
            &insert(DOCS_OID, &[Some("1"), None, None, Some("42")]),
            &tables,
        )
        .unwrap();
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut Emitted::default())
        .unwrap();
    assert_eq!(tx.changes[0].values[3], Value::Int32(42));
}

#[test]
fn rows_from_before_an_added_column_read_null_there() {
    let mut tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    let rc = pgoutput::RelationColumn {
        name: "n".into(),
        type_oid: 23,
        typmod: -1,
        key: false,
    };
    tables[0].add_columns(
        vec![added_column(&rc, PgKind::Int32, "integer".into())],
        u64::MAX,
    );
    decoder.begin(5, 0);
    decoder
        .decode(&insert(DOCS_OID, &[Some("1"), None, None]), &tables)
        .unwrap();
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut Emitted::default())
        .unwrap();
    assert_eq!(tx.changes[0].values.len(), 4);
    assert_eq!(tx.changes[0].values[3], Value::Null);
}

/// A relation without `body` for a table whose columns all existed at LSN
/// 100: a transaction committed before then is WAL from before `body` was
/// added (null there); one committed after it was written with `body`, so
/// the column is left to be read by key and the transaction says which.
#[test]
fn a_change_decoded_without_a_column_it_was_written_with_leaves_it_to_be_read_by_key() {
    let mut tables = docs();
    tables[0].columns_present_at(100);
    let mut decoder = Decoder::new("weir_cdc");
    let narrower = relation(
        DOCS_OID,
        "public.docs",
        &[("id", 20, -1), ("title", 25, -1)],
    );
    assert!(decoder.decode(&narrower, &tables).unwrap().is_none());

    decoder.begin(90, 0);
    decoder
        .decode(&insert(DOCS_OID, &[Some("1"), Some("a")]), &tables)
        .unwrap();
    let before = decoder.commit().unwrap().tx;
    assert!(before.changes[0].unchanged.is_empty());
    assert!(before.missing_columns.is_empty());

    decoder.begin(110, 0);
    decoder
        .decode(&insert(DOCS_OID, &[Some("2"), Some("b")]), &tables)
        .unwrap();
    decoder
        .decode(&update(DOCS_OID, None, &[Some("1"), Some("c")]), &tables)
        .unwrap();
    decoder
        .decode(&delete(DOCS_OID, b'K', &[Some("2"), None]), &tables)
        .unwrap();
    let after = decoder.commit().unwrap().tx;
    assert_eq!(after.changes[0].unchanged, vec![2]);
    assert_eq!(after.changes[1].unchanged, vec![2]);
    assert!(
        after.changes[2].unchanged.is_empty(),
        "a delete carries the key only"
    );
    assert_eq!(
        after.missing_columns.iter().copied().collect::<Vec<_>>(),
        vec![(0, 2)]
    );
}

#[test]
fn other_changes_of_shape_are_refused() {
    let tables = docs();
    let refused = |columns: &[(&str, u32, i32)], oid: u32| {
        let mut decoder = Decoder::new("weir_cdc");
        let err = decoder
            .decode(&relation(oid, "public.docs", columns), &tables)
            .unwrap_err();
        err.to_string()
    };
    let dropped = refused(&[("id", 20, -1), ("body", 25, -1)], DOCS_OID);
    assert!(
        dropped.contains("dropped, renamed or reordered"),
        "{dropped}"
    );
    let retyped = refused(
        &[("id", 23, -1), ("title", 25, -1), ("body", 25, -1)],
        DOCS_OID,
    );
    assert!(
        retyped.contains("the type of column `id` changed"),
        "{retyped}"
    );
    let inserted = refused(
        &[
            ("id", 20, -1),
            ("x", 25, -1),
            ("title", 25, -1),
            ("body", 25, -1),
        ],
        DOCS_OID,
    );
    assert!(
        inserted.contains("column `x` is new but not at the end"),
        "{inserted}"
    );
    let recreated = refused(&[("id", 20, -1), ("title", 25, -1), ("body", 25, -1)], 99);
    assert!(recreated.contains("dropped and re-created"), "{recreated}");
    let mut decoder = Decoder::new("weir_cdc");
    let joined = decoder
        .decode(&relation(77, "public.other", &[("id", 20, -1)]), &tables)
        .unwrap_err()
        .to_string();
    assert!(joined.contains("joined publication `weir_cdc`"), "{joined}");
}

#[test]
fn truncate_stops_the_stream_and_names_the_table() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(0x1_0000_0010, 0);
    let mut message = vec![b'T'];
    message.extend_from_slice(&1i32.to_be_bytes());
    message.push(0);
    message.extend_from_slice(&DOCS_OID.to_be_bytes());
    let err = decoder.decode(&message, &tables).unwrap_err().to_string();
    assert!(err.contains("TRUNCATE of public.docs"), "{err}");
    assert!(err.contains("LSN 1/10"), "{err}");
}

/// A TRUNCATE message of relation `oid`.
fn truncate(oid: u32) -> Vec<u8> {
    let mut message = vec![b'T'];
    message.extend_from_slice(&1i32.to_be_bytes());
    message.push(0);
    message.extend_from_slice(&oid.to_be_bytes());
    message
}

#[test]
fn the_truncate_error_names_the_lsn_and_the_way_to_skip_it() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(0x2_0000_0abc, 0);
    let err = decoder
        .decode(&truncate(DOCS_OID), &tables)
        .unwrap_err()
        .to_string();
    for part in [
        "TRUNCATE of public.docs",
        "committed at LSN 2/ABC",
        "skip_transaction_at: 2/ABC",
        "empty the destination table(s) by hand",
    ] {
        assert!(err.contains(part), "missing {part:?} in: {err}");
    }
}

#[test]
fn a_relation_renamed_streams_into_the_table_it_had_by_its_oid() {
    let tables = docs();
    let columns = [("id", 20, -1), ("title", 25, -1), ("body", 25, -1)];
    let mut decoder = Decoder::new("weir_cdc");
    // Renamed while weir lags: the stream names it anew, the OID is the same.
    decoder
        .decode(&relation(DOCS_OID, "public.papers", &columns), &tables)
        .unwrap();
    decoder.begin(0x40, 0);
    decoder
        .decode(&insert(DOCS_OID, &[Some("1"), Some("t"), None]), &tables)
        .unwrap();
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut Emitted::default())
        .unwrap();
    assert_eq!(tx.changes[0].table.name, "public.docs");

    // Renamed while weir was stopped: the catalog has the new name, the
    // sinks the old one; the WAL still names the table as it was.
    let mut table = table_of(
        "public.papers",
        vec![
            column("id", PgKind::Int64, "bigint"),
            column("title", PgKind::Text, "text"),
            column("body", PgKind::Text, "text"),
        ],
        vec![0],
    )
    .with_destination("public.docs");
    table.info.oid = 700;
    let tables = self::tables(table);
    let mut decoder = Decoder::new("weir_cdc");
    decoder
        .decode(&relation(700, "public.docs", &columns), &tables)
        .unwrap();
    decoder.begin(0x50, 0);
    decoder
        .decode(&insert(700, &[Some("2"), Some("u"), None]), &tables)
        .unwrap();
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut Emitted::default())
        .unwrap();
    assert_eq!(tx.changes[0].table.name, "public.docs");
    assert_eq!(tx.changes[0].values[0], Value::Int64(2));
    // A new table that took the old name is another table.
    let err = decoder
        .decode(&relation(701, "public.papers", &columns), &tables)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("dropped and re-created") && err.contains("OID 701"),
        "{err}"
    );
}

#[test]
fn the_transaction_at_skip_transaction_at_is_left_out_whole_and_nothing_else() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.skip_transaction_at(Some(0x200));
    let mut emitted = Emitted::default();
    let mut run = |decoder: &mut Decoder, lsn: u64, messages: &[Vec<u8>]| {
        decoder.begin(lsn, 0);
        for m in messages {
            decoder.decode(m, &tables).unwrap();
        }
        decoder.commit().unwrap().seal(&tables, &mut emitted)
    };
    let row = |id: &str| insert(DOCS_OID, &[Some(id), None, None]);
    let before = run(&mut decoder, 0x100, &[relation_of(&tables[0]), row("1")]).unwrap();
    assert_eq!(before.end, stream_position(0x100, 0));
    // The skipped one: a relation description in it still holds after it.
    let skipped = run(
        &mut decoder,
        0x200,
        &[
            relation_of(&tables[0]),
            row("2"),
            truncate(DOCS_OID),
            row("3"),
        ],
    )
    .unwrap();
    assert!(skipped.changes.is_empty());
    assert_eq!(skipped.end, stream_position(0x200, u32::MAX));
    let after = run(&mut decoder, 0x300, &[row("4")]).unwrap();
    assert_eq!(after.changes.len(), 1);
    assert_eq!(after.changes[0].pos, stream_position(0x300, 0));
    assert_eq!(after.changes[0].values[0], Value::Int64(4));
    // Received again after a restart: nothing of it is handed on again.
    assert!(run(&mut decoder, 0x200, &[row("2")]).is_none());
    // Without the key, the same TRUNCATE stops the stream.
    let mut plain = Decoder::new("weir_cdc");
    plain.decode(&relation_of(&tables[0]), &tables).unwrap();
    plain.begin(0x200, 0);
    assert!(plain.decode(&truncate(DOCS_OID), &tables).is_err());
}

#[test]
fn a_skip_lsn_the_stream_passes_without_a_match_is_settled_once() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.skip_transaction_at(Some(0x150));
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(0x100, 0);
    decoder.commit().unwrap();
    assert!(!decoder.skip.settled);
    decoder.begin(0x200, 0);
    decoder
        .decode(&insert(DOCS_OID, &[Some("1"), None, None]), &tables)
        .unwrap();
    assert!(decoder.skip.settled);
    // Passing it skips nothing.
    assert_eq!(decoder.commit().unwrap().tx.changes.len(), 1);
}

#[test]
fn changes_out_of_order_are_invalid() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    let row = insert(DOCS_OID, &[Some("1"), None, None]);
    let early = decoder.decode(&row, &tables).unwrap_err().to_string();
    assert!(early.contains("before its description"), "{early}");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    let outside = decoder.decode(&row, &tables).unwrap_err().to_string();
    assert!(outside.contains("outside a transaction"), "{outside}");
    decoder.begin(1, 0);
    let wide = insert(DOCS_OID, &[Some("1"), None, None, None]);
    let too_wide = decoder.decode(&wide, &tables).unwrap_err().to_string();
    assert!(
        too_wide.contains("more columns than its description"),
        "{too_wide}"
    );
}

#[test]
fn malformed_messages_are_invalid_not_panics() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(1, 0);
    let whole = insert(DOCS_OID, &[Some("1"), Some("abc"), None]);
    let mut binary = whole.clone();
    binary[8] = b'b';
    let mut unknown_tag = whole.clone();
    unknown_tag[8] = b'?';
    let mut no_new_tuple = whole.clone();
    no_new_tuple[5] = b'X';
    let mut not_utf8 = whole.clone();
    // The last byte of "abc" (the null after it is one byte).
    let bad_utf8_at = whole.len() - 2;
    not_utf8[bad_utf8_at] = 0xff;
    for (what, message) in [
        ("empty", Vec::new()),
        ("truncated", whole[..whole.len() - 2].to_vec()),
        ("binary value", binary),
        ("unknown tuple tag", unknown_tag),
        ("insert without new tuple", no_new_tuple),
        ("value not UTF-8", not_utf8),
        ("string without terminator", vec![b'R', 0, 0, 0, 1, b'p']),
    ] {
        let result = decoder.decode(&message, &tables);
        assert!(
            matches!(result, Err(SourceError::Invalid(_))),
            "{what}: {:?}",
            result.map(|_| ())
        );
    }
}

#[test]
fn sealing_skips_what_was_emitted_and_stands_after_an_empty_transaction() {
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    let two_rows = |decoder: &mut Decoder| {
        decoder.begin(20, 0);
        for id in ["1", "2"] {
            decoder
                .decode(&insert(DOCS_OID, &[Some(id), None, None]), &tables)
                .unwrap();
        }
        decoder.commit().unwrap()
    };
    // Resuming inside the transaction: only the part after the position.
    let mut emitted = Emitted::default();
    emitted.advance(stream_position(20, 0));
    let tx = two_rows(&mut decoder).seal(&tables, &mut emitted).unwrap();
    assert_eq!(tx.changes.len(), 1);
    assert_eq!(tx.changes[0].pos, stream_position(20, 1));
    // Received again whole: nothing new, so it stands after the transaction...
    let tx = two_rows(&mut decoder).seal(&tables, &mut emitted).unwrap();
    assert!(tx.changes.is_empty());
    assert_eq!(tx.end, stream_position(20, u32::MAX));
    // ...and a third time it is skipped altogether.
    assert!(two_rows(&mut decoder).seal(&tables, &mut emitted).is_none());
    // A transaction without our changes stands after itself.
    decoder.begin(30, 0);
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut emitted)
        .unwrap();
    assert!(tx.changes.is_empty());
    assert_eq!(tx.end, stream_position(30, u32::MAX));
}

#[test]
fn a_change_is_read_through_the_mapping_of_its_own_relation_oid() {
    // The relation known only under the OID the message names, not under
    // the catalog's (as when the table was re-created since the catalog
    // was read): the change must be read through the message's mapping.
    let tables = docs();
    let mut decoder = Decoder::new("weir_cdc");
    let message_oid = DOCS_OID + 1;
    decoder.relations.insert(
        message_oid,
        Mapping {
            table: 0,
            columns: vec![0, 1, 2],
        },
    );
    decoder.begin(7, 0);
    decoder
        .decode(&insert(message_oid, &[Some("5"), Some("t"), None]), &tables)
        .unwrap();
    let open = decoder.commit().unwrap();
    assert_eq!(open.tx.changes[0].values[0], Value::Int64(5));
    // Nothing was left out, so no key is kept for a look-up.
    assert!(open.tx.changes[0].key_text.is_empty());
}

#[test]
fn a_relation_whose_replica_identity_misses_the_key_is_refused() {
    let tables = docs();
    let columns = [("id", 20, -1), ("title", 25, -1), ("body", 25, -1)];
    let decode = |identity: u8, flagged: &[&str]| {
        let mut decoder = Decoder::new("weir_cdc");
        decoder
            .decode(
                &relation_with_identity(DOCS_OID, "public.docs", &columns, identity, flagged),
                &tables,
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    // The identity is another column: an update of `id` would keep the old row.
    let other = decode(b'i', &["title"]).unwrap_err();
    assert!(
        other.contains("public.docs")
            && other.contains("`id`")
            && other.contains("replica identity"),
        "{other}"
    );
    let nothing = decode(b'n', &[]).unwrap_err();
    assert!(nothing.contains("REPLICA IDENTITY NOTHING"), "{nothing}");
    assert_eq!(decode(b'd', &["id"]), Ok(()));
    assert_eq!(decode(b'i', &["id", "title"]), Ok(()));
    assert_eq!(decode(b'f', &[]), Ok(()));
}

/// `public.docs` as a partitioned table with leaf `public.docs_a` (OID
/// 501), whose changes arrive under the leaf's OID and name, its columns
/// in the leaf's own order.
#[test]
fn a_leaf_partition_changes_its_partitioned_table_by_column_name() {
    use crate::postgres::catalog::Partition;
    let mut table = table_of(
        "public.docs",
        vec![
            column("id", PgKind::Int64, "bigint"),
            column("title", PgKind::Text, "text"),
            column("body", PgKind::Text, "text"),
        ],
        vec![0],
    );
    table.info.partitions = vec![Partition {
        oid: 501,
        qualified: "public.docs_a".into(),
    }];
    let tables = tables(table);
    let leaf = [("body", 25, -1), ("id", 20, -1), ("title", 25, -1)];
    let mut decoder = Decoder::new("weir_cdc");
    decoder
        .decode(&relation(501, "public.docs_a", &leaf), &tables)
        .unwrap();
    decoder.begin(0x10, 0);
    decoder
        .decode(&insert(501, &[Some("b"), Some("7"), Some("t")]), &tables)
        .unwrap();
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut Emitted::default())
        .unwrap();
    assert_eq!(tx.changes[0].table.name, "public.docs");
    assert_eq!(
        tx.changes[0].values,
        vec![Value::Int64(7), text("t"), text("b")]
    );

    // A column the leaf gained after all of the table's: added; a new one
    // among them: refused, as is a leaf the table does not have.
    let mut decoder = Decoder::new("weir_cdc");
    let mut grown = leaf.to_vec();
    grown.push(("extra", 25, -1));
    let pending = decoder
        .decode(&relation(501, "public.docs_a", &grown), &tables)
        .unwrap()
        .expect("waits for the added column's type");
    assert_eq!(pending.added.len(), 1);
    let mut renamed = leaf.to_vec();
    renamed[2].0 = "heading";
    let err = decoder
        .decode(&relation(501, "public.docs_a", &renamed), &tables)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("public.docs_a") && err.contains("`heading` is new but not at the end"),
        "{err}"
    );
    let err = decoder
        .decode(&relation(502, "public.docs_a", &leaf), &tables)
        .unwrap_err();
    assert!(err.to_string().contains("dropped and re-created"), "{err}");
}

/// Decodes inserts of ids `ids` into the open transaction, collecting the
/// pieces the decoder hands on meanwhile.
fn inserts_in_pieces(
    decoder: &mut Decoder,
    tables: &Tables,
    ids: std::ops::Range<u32>,
) -> Vec<Piece> {
    let mut pieces = Vec::new();
    for id in ids {
        let id = id.to_string();
        decoder
            .decode(&insert(DOCS_OID, &[Some(&id), Some("t"), None]), tables)
            .unwrap();
        pieces.extend(decoder.full_piece());
    }
    pieces
}

#[test]
fn a_transaction_past_the_piece_limit_is_handed_on_in_numbered_pieces() {
    let tables = docs();
    let limits = PieceLimits {
        changes: 4,
        bytes: usize::MAX,
    };
    let mut decoder = Decoder::with_limits("weir_cdc", limits);
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(0x40, 0);
    let mut pieces = inserts_in_pieces(&mut decoder, &tables, 0..10);
    assert_eq!(pieces.len(), 2, "two full pieces before the commit");
    assert!(decoder.in_transaction());
    pieces.push(decoder.commit().unwrap());
    let mut emitted = Emitted::default();
    let txs: Vec<Transaction> = pieces
        .into_iter()
        .map(|p| p.seal(&tables, &mut emitted).unwrap())
        .collect();
    let sizes: Vec<usize> = txs.iter().map(|t| t.changes.len()).collect();
    assert_eq!(sizes, [4, 4, 2]);
    // Positions run on across the pieces, and each piece ends at its last
    // change: never after the transaction, which is still open.
    let positions: Vec<Position> = txs
        .iter()
        .flat_map(|t| t.changes.iter().map(|c| c.pos.clone()))
        .collect();
    let want: Vec<Position> = (0..10).map(|i| stream_position(0x40, i)).collect();
    assert_eq!(positions, want);
    assert_eq!(txs[0].end, stream_position(0x40, 3));
    assert_eq!(txs[1].end, stream_position(0x40, 7));
    assert_eq!(txs[2].end, stream_position(0x40, 9));
    assert_eq!(txs[2].changes[1].values[0], Value::Int64(9));

    // The next transaction numbers from 0 again.
    decoder.begin(0x80, 0);
    let pieces = inserts_in_pieces(&mut decoder, &tables, 0..4);
    let tx = pieces
        .into_iter()
        .next()
        .unwrap()
        .seal(&tables, &mut emitted)
        .unwrap();
    assert_eq!(tx.changes[0].pos, stream_position(0x80, 0));
    // Its commit right after a full piece leaves nothing but the end.
    let tx = decoder
        .commit()
        .unwrap()
        .seal(&tables, &mut emitted)
        .unwrap();
    assert!(tx.changes.is_empty());
    assert_eq!(tx.end, stream_position(0x80, u32::MAX));
}

#[test]
fn a_transaction_received_again_resumes_after_the_piece_that_was_emitted() {
    let tables = docs();
    let limits = PieceLimits {
        changes: 3,
        bytes: usize::MAX,
    };
    let mut decoder = Decoder::with_limits("weir_cdc", limits);
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    // Committed up to ordinal 4 before a restart: the replay skips the
    // first piece whole and the second up to 4.
    let mut emitted = Emitted::default();
    emitted.advance(stream_position(0x40, 4));
    decoder.begin(0x40, 0);
    let mut pieces = inserts_in_pieces(&mut decoder, &tables, 0..8);
    pieces.push(decoder.commit().unwrap());
    let mut handed_on = Vec::new();
    for mut piece in pieces {
        piece.leave_out_emitted(&emitted);
        if let Some(tx) = piece.seal(&tables, &mut emitted) {
            handed_on.push(tx);
        }
    }
    let positions: Vec<Position> = handed_on
        .iter()
        .flat_map(|t| t.changes.iter().map(|c| c.pos.clone()))
        .collect();
    assert_eq!(
        positions,
        [5, 6, 7].map(|i| stream_position(0x40, i)).to_vec()
    );
}

#[test]
fn a_piece_is_also_cut_by_bytes_with_unchanged_toast_values_counted_large() {
    let tables = docs();
    let limits = PieceLimits {
        changes: 1_000,
        bytes: 3 * UNCHANGED_VALUE_BYTES,
    };
    let mut decoder = Decoder::with_limits("weir_cdc", limits);
    decoder.decode(&relation_of(&tables[0]), &tables).unwrap();
    decoder.begin(0x40, 0);
    let mut pieces = Vec::new();
    for id in ["1", "2", "3", "4"] {
        let bare = update(DOCS_OID, None, &[Some(id), Some("new"), Some(UNCHANGED)]);
        decoder.decode(&bare, &tables).unwrap();
        pieces.extend(decoder.full_piece());
    }
    assert_eq!(pieces.len(), 1);
    assert_eq!(pieces[0].tx.changes.len(), 3);
    assert!(!pieces[0].last);
    let rest = decoder.commit().unwrap();
    assert_eq!((rest.first, rest.tx.changes.len(), rest.last), (3, 1, true));
}
