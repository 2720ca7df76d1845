//! Lists, structs and maps through the Iceberg sink (run natively), read
//! back by the `iceberg` crate, DuckDB and pyiceberg. No source of weir
//! makes structs or maps yet (Postgres arrays arrive as lists, see
//! `postgres_types.rs`), but a sink is handed whatever Arrow carries, and
//! what it writes must read back the same in every engine, also after an
//! upsert replaced and deleted rows through position deletes.

use crate::iceberg_support;

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, Int64Builder, ListBuilder, MapBuilder, StringBuilder, StructBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields};
use iceberg_support::*;
use weir_iceberg_sink::IcebergSink;
use weir_sdk::native::{NativeSink, encode_ipc};
use weir_sdk::{BatchMeta, CommitRequest, Mode, Op, Table};
use weir_test_support::BatchBuilder;

const TABLE: &str = "app.profiles";

/// One row's nested values: tags, a point, attributes and order items.
struct Profile {
    id: i64,
    tags: Option<Vec<Option<&'static str>>>,
    point: Option<(Option<i32>, &'static str)>,
    attrs: Option<Vec<(&'static str, Option<i64>)>>,
    items: Vec<(&'static str, i32)>,
}

fn point_fields() -> Fields {
    Fields::from(vec![
        Field::new("x", DataType::Int32, true),
        Field::new("label", DataType::Utf8, true),
    ])
}

fn item_fields() -> Fields {
    Fields::from(vec![
        Field::new("sku", DataType::Utf8, true),
        Field::new("qty", DataType::Int32, true),
    ])
}

/// The profiles' columns, as a source would hand them to the sink.
fn columns(profiles: &[Profile]) -> Vec<(&'static str, ArrayRef)> {
    let mut ids = Int64Builder::new();
    let mut tags = ListBuilder::new(StringBuilder::new());
    let mut point = StructBuilder::from_fields(point_fields(), profiles.len());
    let mut attrs = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
    let mut items = ListBuilder::new(StructBuilder::from_fields(item_fields(), 0));
    for p in profiles {
        ids.append_value(p.id);
        match &p.tags {
            Some(list) => {
                for tag in list {
                    tags.values().append_option(*tag);
                }
                tags.append(true);
            }
            None => tags.append(false),
        }
        let (x, label) = p.point.unwrap_or((None, ""));
        point
            .field_builder::<Int32Builder>(0)
            .unwrap()
            .append_option(x);
        point
            .field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(label);
        point.append(p.point.is_some());
        match &p.attrs {
            Some(entries) => {
                for (k, v) in entries {
                    attrs.keys().append_value(k);
                    attrs.values().append_option(*v);
                }
                attrs.append(true).unwrap();
            }
            None => attrs.append(false).unwrap(),
        }
        for (sku, qty) in &p.items {
            let item = items.values();
            item.field_builder::<StringBuilder>(0)
                .unwrap()
                .append_value(sku);
            item.field_builder::<Int32Builder>(1)
                .unwrap()
                .append_value(*qty);
            item.append(true);
        }
        items.append(true);
    }
    vec![
        ("id", Arc::new(ids.finish())),
        ("tags", Arc::new(tags.finish())),
        ("point", Arc::new(point.finish())),
        ("attrs", Arc::new(attrs.finish())),
        ("items", Arc::new(items.finish())),
    ]
}

/// A change batch of `profiles` with operation `op`, at positions from
/// `first_pos`.
fn batch(profiles: &[Profile], op: Op, first_pos: u8) -> RecordBatch {
    columns(profiles)
        .into_iter()
        .fold(BatchBuilder::new(), |b, (name, array)| {
            b.column(name, array)
        })
        .changes(
            profiles.iter().map(|_| op),
            (first_pos..).take(profiles.len()).map(|p| [p]),
        )
        .build()
}

fn table() -> Table {
    Table {
        name: TABLE.into(),
        key_columns: vec!["id".into()],
        mode: Mode::Upsert,
        destination: "app.profiles".into(),
        metadata: Vec::new(),
    }
}

/// Writes `batches` as one commit standing at `high`.
fn commit(sink: &mut NativeSink<IcebergSink>, batches: &[RecordBatch], high: u8) {
    for (n, rb) in batches.iter().enumerate() {
        let meta = BatchMeta {
            table: table(),
            id: format!("b-{high}-{n}"),
            low: vec![high],
            high: vec![high],
            rows: rb.num_rows() as u32,
        };
        sink.write(meta, &encode_ipc(rb)).unwrap();
    }
    sink.commit(CommitRequest {
        table: TABLE.into(),
        high: vec![high],
        pipeline: "nested".into(),
        epoch: 1,
    })
    .unwrap();
}

/// The first commit's rows.
fn first() -> Vec<Profile> {
    vec![
        Profile {
            id: 1,
            tags: Some(vec![Some("red"), None, Some("blue")]),
            point: Some((Some(3), "home")),
            attrs: Some(vec![("age", Some(41)), ("score", None)]),
            items: vec![("sku-1", 2), ("sku-2", 1)],
        },
        Profile {
            id: 2,
            tags: Some(vec![]),
            point: Some((None, "unknown")),
            attrs: Some(vec![]),
            items: vec![],
        },
        Profile {
            id: 3,
            tags: None,
            point: None,
            attrs: None,
            items: vec![("sku-3", 7)],
        },
        Profile {
            id: 4,
            tags: Some(vec![Some("green")]),
            point: Some((Some(-8), "work")),
            attrs: Some(vec![("age", Some(19))]),
            items: vec![("sku-4", 1)],
        },
        Profile {
            id: 5,
            tags: Some(vec![]),
            point: Some((None, "nowhere")),
            attrs: Some(vec![]),
            items: vec![],
        },
    ]
}

/// The second commit: row 2 replaced, row 4 deleted.
fn second() -> (Vec<Profile>, Vec<Profile>) {
    let updated = vec![Profile {
        id: 2,
        tags: Some(vec![Some("new"), Some("again")]),
        point: Some((Some(5), "moved")),
        attrs: Some(vec![("age", Some(30)), ("visits", Some(12))]),
        items: vec![("sku-9", 3)],
    }];
    let deleted = first().into_iter().filter(|p| p.id == 4).collect();
    (updated, deleted)
}

/// What the table must hold after both commits, by id.
fn expected() -> Vec<Profile> {
    let (updated, _) = second();
    let mut rows: Vec<Profile> = first()
        .into_iter()
        .filter(|p| p.id != 2 && p.id != 4)
        .chain(updated)
        .collect();
    rows.sort_by_key(|p| p.id);
    rows
}

/// A Python value as `str()` prints it: what the reader script returns for
/// a nested value (pyarrow's `to_pylist`: lists, dicts for structs, lists
/// of (key, value) tuples for maps).
fn python_str(text: Option<&str>) -> String {
    match text {
        Some(s) => format!("'{s}'"),
        None => "None".into(),
    }
}

fn python_int<T: ToString>(n: Option<T>) -> String {
    n.map_or("None".into(), |n| n.to_string())
}

/// Each expected row as the Python readers render it.
fn python_rows(profiles: &[Profile]) -> Vec<Row> {
    profiles
        .iter()
        .map(|p| {
            let tags = p.tags.as_ref().map(|list| {
                let shown: Vec<String> = list.iter().map(|t| python_str(*t)).collect();
                format!("[{}]", shown.join(", "))
            });
            let point = p
                .point
                .map(|(x, label)| format!("{{'x': {}, 'label': '{label}'}}", python_int(x)));
            let attrs = p.attrs.as_ref().map(|entries| {
                let shown: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("('{k}', {})", python_int(*v)))
                    .collect();
                format!("[{}]", shown.join(", "))
            });
            let items: Vec<String> = p
                .items
                .iter()
                .map(|(sku, qty)| format!("{{'sku': '{sku}', 'qty': {qty}}}"))
                .collect();
            vec![
                Some(p.id.to_string()),
                tags,
                point,
                attrs,
                Some(format!("[{}]", items.join(", "))),
            ]
        })
        .collect()
}

/// Every column of `batch`, each value as Arrow's display prints it.
fn displayed(batch: &RecordBatch, names: &[&str]) -> Vec<Vec<String>> {
    let options = arrow_cast::display::FormatOptions::default().with_null("null");
    let formatters: Vec<_> = names
        .iter()
        .map(|n| {
            let column = batch
                .column_by_name(n)
                .unwrap_or_else(|| panic!("no column {n}"));
            arrow_cast::display::ArrayFormatter::try_new(column.as_ref(), &options).unwrap()
        })
        .collect();
    let mut rows: Vec<Vec<String>> = (0..batch.num_rows())
        .map(|row| {
            formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn lists_structs_and_maps_read_back_the_same_in_every_reader_after_upserts() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    let mut sink = NativeSink::new(IcebergSink::default(), &lake.root);
    sink.open("nested", &[("warehouse".into(), lake.warehouse())])
        .unwrap();
    commit(&mut sink, &[batch(&first(), Op::Insert, 1)], 4);
    let (updated, deleted) = second();
    commit(
        &mut sink,
        &[
            batch(&updated, Op::Update, 5),
            batch(&deleted, Op::Delete, 6),
        ],
        6,
    );
    let metadata = lake.metadata("app.profiles").expect("the table exists");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&metadata).unwrap()).unwrap();
    let current = summary["current-snapshot-id"].clone();
    let snapshot = summary["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshot-id"] == current)
        .unwrap()
        .clone();
    assert_eq!(
        snapshot["summary"]["total-position-deletes"], "2",
        "the update and the delete were not position deletes: {snapshot}"
    );

    let names = ["id", "tags", "point", "attrs", "items"];
    let want = expected();

    // The iceberg crate: the same values as the batch the sink was given.
    let want_batch = RecordBatch::try_from_iter(columns(&want)).unwrap();
    let scanned = scan_native(&metadata);
    let scanned =
        arrow_select::concat::concat_batches(&scanned.first().expect("rows").schema(), &scanned)
            .unwrap();
    assert_eq!(
        displayed(&scanned, &names),
        displayed(&want_batch, &names),
        "the iceberg crate"
    );

    let mut want_python = python_rows(&want);
    want_python.sort();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    for reader in ["duckdb", "pyiceberg"] {
        let read = read_python(reader, &metadata)
            .unwrap_or_else(|e| panic!("{reader} cannot read {}: {e}", metadata.display()));
        assert_rows(reader, &want_python, &read.project(&names));
    }
}

/// The same rows through an Iceberg REST catalog, which may number the
/// fields anew when it creates the table (the sink then writes by the
/// catalog's schema): read back through the catalog, every reader returns
/// the same values.
#[test]
fn nested_types_through_a_rest_catalog_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake {
        root: dir.path().join("lake"),
    };
    std::fs::create_dir_all(&lake.root).unwrap();
    let catalog = weir_test_support::iceberg_rest::IcebergRestServer::builder()
        .warehouse(&lake.warehouse())
        .start();
    let mut sink = NativeSink::new(IcebergSink::default(), &lake.root).grant_http(catalog.uri());
    let mut config = vec![
        ("warehouse".to_string(), lake.warehouse()),
        ("catalog".to_string(), "rest".to_string()),
        ("catalog_uri".to_string(), catalog.uri().to_string()),
    ];
    if let Some(token) = catalog.token() {
        config.push(("catalog_token".to_string(), token.to_string()));
    }
    sink.open("nested", &config).unwrap();
    commit(&mut sink, &[batch(&first(), Op::Insert, 1)], 4);
    let (updated, deleted) = second();
    commit(
        &mut sink,
        &[
            batch(&updated, Op::Update, 5),
            batch(&deleted, Op::Delete, 6),
        ],
        6,
    );
    let names: Vec<String> = ["id", "tags", "point", "attrs", "items"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    let mut want = python_rows(&expected());
    want.sort();
    for (reader, rows) in [
        (
            "pyiceberg",
            catalog.rows_via_pyiceberg(&["app"], "profiles"),
        ),
        ("duckdb", catalog.rows_via_duckdb(&["app"], "profiles")),
    ] {
        let read = Read {
            columns: rows.columns,
            rows: rows.rows,
        };
        assert_rows(
            &format!("{reader} through the REST catalog"),
            &want,
            &read.project(&names),
        );
    }
}
