use crate::commit_order::stream_position;
use arrow_array::cast::AsArray;

use super::*;
use crate::Source;
use crate::change::{Column, Op};
use crate::generator::{self, ExpectedState, Generator, GeneratorConfig};
use arrow_schema::DataType;
use std::collections::HashMap;
use weir_contract::utc_micros;

fn table(name: &str, columns: &[(&str, DataType)], key: &[usize]) -> Arc<TableSchema> {
    Arc::new(TableSchema {
        name: name.into(),
        columns: columns
            .iter()
            .map(|(name, data_type)| Column {
                name: (*name).into(),
                data_type: data_type.clone(),
                nullable: true,
            })
            .collect(),
        key: key.to_vec(),
    })
}

fn kv() -> Arc<TableSchema> {
    table(
        "t.kv",
        &[("id", DataType::Int64), ("v", DataType::Utf8)],
        &[0],
    )
}

fn log() -> Arc<TableSchema> {
    table("t.log", &[("msg", DataType::Utf8)], &[])
}

fn change(
    table: &Arc<TableSchema>,
    op: Op,
    (commit, ordinal): (u64, u32),
    values: Vec<Value>,
) -> Change {
    Change {
        table: table.clone(),
        op,
        pos: stream_position(commit, ordinal),
        commit_ts_micros: 1_000_000 * commit as i64,
        snapshot: op == Op::Read,
        values,
    }
}

fn put(table: &Arc<TableSchema>, op: Op, at: (u64, u32), id: i64, v: Option<&str>) -> Change {
    change(
        table,
        op,
        at,
        vec![
            Value::Int64(id),
            v.map_or(Value::Null, |v| Value::Utf8(v.into())),
        ],
    )
}

fn tx(changes: Vec<Change>) -> Transaction {
    let end = changes
        .last()
        .expect("use heartbeat() for an empty transaction")
        .pos
        .clone();
    Transaction::of_changes(changes, end)
}

fn heartbeat(at: (u64, u32)) -> Transaction {
    Transaction::of_changes(vec![], stream_position(at.0, at.1))
}

fn limits(max_rows: usize, max_bytes: usize) -> BatchLimits {
    BatchLimits {
        max_rows,
        max_bytes,
        linger: Duration::from_secs(1),
    }
}

fn batcher(tables: Vec<Arc<TableSchema>>, max_rows: usize) -> Batcher {
    Batcher::new(tables, limits(max_rows, usize::MAX), vec![])
}

fn pos(at: (u64, u32)) -> Position {
    stream_position(at.0, at.1)
}

fn positions(batch: &TableBatch) -> Vec<Position> {
    batch
        .positions()
        .iter()
        .map(|p| Position::from_bytes(p.unwrap().to_vec()))
        .collect()
}

fn strings(batch: &TableBatch, column: &str) -> Vec<Option<String>> {
    let array = batch
        .records
        .column_by_name(column)
        .unwrap()
        .as_string::<i32>();
    array.iter().map(|s| s.map(str::to_string)).collect()
}

/// The batch's rows as changes (without commit timestamps).
fn changes_of(batch: &TableBatch) -> Vec<Change> {
    let ops = strings(batch, OP_COLUMN);
    positions(batch)
        .into_iter()
        .enumerate()
        .map(|(row, pos)| {
            let op = match ops[row].as_deref() {
                Some("insert") => Op::Insert,
                Some("update") => Op::Update,
                Some("delete") => Op::Delete,
                other => panic!("unexpected op {other:?}"),
            };
            let values = (0..batch.table.columns.len())
                .map(|i| value_at(batch.records.column(i), row))
                .collect();
            Change {
                table: batch.table.clone(),
                op,
                pos,
                commit_ts_micros: 0,
                snapshot: false,
                values,
            }
        })
        .collect()
}

#[test]
fn last_write_wins_per_key_in_position_order() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    let pushes = [
        tx(vec![
            put(&kv, Op::Insert, (1, 0), 1, Some("a")),
            put(&kv, Op::Insert, (1, 1), 2, Some("b")),
        ]),
        tx(vec![
            put(&kv, Op::Update, (2, 0), 1, Some("c")),
            put(&kv, Op::Delete, (2, 1), 2, None),
        ]),
        // Inserted and deleted in one batch: still a delete for the sink.
        tx(vec![
            put(&kv, Op::Insert, (3, 0), 3, Some("d")),
            put(&kv, Op::Delete, (3, 1), 3, None),
        ]),
        tx(vec![
            put(&kv, Op::Update, (4, 0), 1, Some("e")),
            put(&kv, Op::Insert, (4, 1), 2, Some("f")),
        ]),
    ];
    for t in pushes {
        assert!(batcher.push(t).unwrap().is_empty());
    }
    let flush = batcher.flush(false).unwrap();
    assert_eq!(flush.high, pos((4, 1)));
    let [batch] = &flush.batches[..] else {
        panic!("one table")
    };
    assert_eq!(positions(batch), [pos((3, 1)), pos((4, 0)), pos((4, 1))]);
    assert_eq!(
        strings(batch, OP_COLUMN),
        [Some("delete"), Some("update"), Some("insert")].map(|s| s.map(String::from))
    );
    assert_eq!(
        strings(batch, "v"),
        [None, Some("e".into()), Some("f".into())]
    );
    assert_eq!(
        (batch.low.clone(), batch.high.clone()),
        (pos((3, 1)), pos((4, 1)))
    );
    assert!(batcher.flush(false).is_none());
}

#[test]
fn snapshot_reads_fold_with_the_streamed_changes_that_follow_them() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    // A backfill's reads, not folded as they come...
    let reads = (0..3)
        .map(|i| {
            put(
                &kv,
                Op::Read,
                (1, i),
                i64::from(i),
                Some(["a", "b", "c"][i as usize]),
            )
        })
        .collect();
    assert!(batcher.push(tx(reads)).unwrap().is_empty());
    // ...then the stream, in the same batch, changes two of those keys.
    let stream = tx(vec![
        put(&kv, Op::Update, (2, 0), 1, Some("B")),
        put(&kv, Op::Delete, (2, 1), 2, None),
        put(&kv, Op::Update, (2, 2), 1, Some("BB")),
    ]);
    assert!(batcher.push(stream).unwrap().is_empty());
    let flush = batcher.flush(false).unwrap();
    let [batch] = &flush.batches[..] else {
        panic!("one table")
    };
    assert_eq!(positions(batch), [pos((1, 0)), pos((2, 1)), pos((2, 2))]);
    assert_eq!(
        strings(batch, "v"),
        [Some("a".into()), None, Some("BB".into())]
    );

    // The next batch starts with an empty index: a read there stands alone.
    let read = tx(vec![put(&kv, Op::Read, (3, 0), 1, Some("x"))]);
    assert!(batcher.push(read).unwrap().is_empty());
    let flush = batcher.flush(false).unwrap();
    assert_eq!(positions(&flush.batches[0]), [pos((3, 0))]);
}

#[test]
fn keyless_tables_keep_every_change() {
    let log = log();
    let mut batcher = batcher(vec![log.clone()], 100);
    let same = |at| change(&log, Op::Insert, at, vec![Value::Utf8("same".into())]);
    batcher.push(tx(vec![same((1, 0)), same((1, 1))])).unwrap();
    batcher.push(tx(vec![same((2, 0))])).unwrap();
    let flush = batcher.flush(false).unwrap();
    assert_eq!(
        positions(&flush.batches[0]),
        [pos((1, 0)), pos((1, 1)), pos((2, 0))]
    );
}

#[test]
fn limits_hold_without_splitting_transactions() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 5);
    let pair = |commit| {
        tx(vec![
            put(&kv, Op::Insert, (commit, 0), commit as i64 * 2, None),
            put(&kv, Op::Insert, (commit, 1), commit as i64 * 2 + 1, None),
        ])
    };
    assert!(batcher.push(pair(1)).unwrap().is_empty());
    assert!(batcher.push(pair(2)).unwrap().is_empty());
    // A third pair would make 6 rows: the buffer goes first, whole.
    let flushes = batcher.push(pair(3)).unwrap();
    let [flush] = &flushes[..] else {
        panic!("one flush")
    };
    assert_eq!(flush.high, pos((2, 1)));
    assert_eq!(flush.batches[0].rows(), 4);
    assert_eq!(batcher.consumed(), Some(&pos((3, 1))));
    assert_eq!(batcher.buffered_changes(), 2);
    // Reaching the limit exactly flushes at once.
    let triple = tx((0..3)
        .map(|i| put(&kv, Op::Insert, (4, i), 100 + i as i64, None))
        .collect());
    let flushes = batcher.push(triple).unwrap();
    assert_eq!(
        flushes.iter().map(|f| f.high.clone()).collect::<Vec<_>>(),
        [pos((4, 2))]
    );
    assert_eq!(flushes[0].batches[0].rows(), 5);

    // The byte limit works the same way.
    let big = |commit, len| {
        tx(vec![put(
            &kv,
            Op::Insert,
            (commit, 0),
            commit as i64,
            Some(&"x".repeat(len)),
        )])
    };
    let one = change_bytes(&big(1, 100).changes[0]);
    let mut batcher = Batcher::new(vec![kv.clone()], limits(usize::MAX, 2 * one + 10), vec![]);
    assert!(batcher.push(big(1, 100)).unwrap().is_empty());
    assert!(batcher.push(big(2, 100)).unwrap().is_empty());
    let flushes = batcher.push(big(3, 100)).unwrap();
    assert_eq!(flushes.len(), 1);
    assert_eq!(flushes[0].high, pos((2, 0)));
}

#[test]
fn an_oversized_transaction_commits_in_ordered_pieces() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 2);
    batcher
        .push(tx(vec![put(&kv, Op::Insert, (1, 0), 1, None)]))
        .unwrap();
    let large = tx((0..5)
        .map(|i| put(&kv, Op::Insert, (2, i), 10 + i as i64, None))
        .collect());
    let flushes = batcher.push(large).unwrap();
    let highs: Vec<Position> = flushes.iter().map(|f| f.high.clone()).collect();
    assert_eq!(highs, [pos((1, 0)), pos((2, 1)), pos((2, 3)), pos((2, 4))]);
    let rows: Vec<usize> = flushes.iter().map(|f| f.batches[0].rows()).collect();
    assert_eq!(rows, [1, 2, 2, 1]);
    for flush in &flushes {
        assert!(flush.batches.iter().all(|b| b.high == flush.high));
    }
    assert_eq!(batcher.consumed(), Some(&pos((2, 4))));
    assert!(batcher.flush(false).is_none());

    // A single change over the byte limit still goes, alone.
    let mut batcher = Batcher::new(vec![kv.clone()], limits(100, 50), vec![]);
    let huge = tx(vec![
        put(&kv, Op::Insert, (3, 0), 1, Some("small")),
        put(&kv, Op::Insert, (3, 1), 2, Some(&"x".repeat(500))),
        put(&kv, Op::Insert, (3, 2), 3, Some("small")),
    ]);
    let highs: Vec<Position> = batcher
        .push(huge)
        .unwrap()
        .into_iter()
        .map(|f| f.high)
        .collect();
    assert_eq!(highs, [pos((3, 0)), pos((3, 1)), pos((3, 2))]);
}

#[test]
fn idle_tables_get_empty_batches_only_when_asked() {
    let (kv, log) = (kv(), log());
    let mut batcher = batcher(vec![kv.clone(), log.clone()], 100);
    assert!(
        batcher.flush(true).is_none(),
        "nothing consumed, nowhere to advance to"
    );
    batcher
        .push(tx(vec![put(&kv, Op::Insert, (1, 0), 1, None)]))
        .unwrap();
    let flush = batcher.flush(false).unwrap();
    assert_eq!(
        flush
            .batches
            .iter()
            .map(|b| b.table.name.as_str())
            .collect::<Vec<_>>(),
        ["t.kv"]
    );

    // A heartbeat moves the position without changes.
    assert!(batcher.push(heartbeat((5, 0))).unwrap().is_empty());
    assert!(batcher.flush(false).is_none());
    let flush = batcher.flush(true).unwrap();
    assert_eq!(flush.high, pos((5, 0)));
    assert_eq!(flush.batches.len(), 2);
    for batch in &flush.batches {
        assert!(batch.is_empty());
        assert_eq!((&batch.low, &batch.high), (&flush.high, &flush.high));
        assert_eq!(
            batch.id,
            batch_id(&batch.table.name, &flush.high, &flush.high)
        );
        let names: Vec<&str> = batch
            .records
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names.last_chunk(), Some(&[OP_COLUMN, POS_COLUMN]));
    }
    assert!(
        batcher.flush(true).is_none(),
        "every table already stands at the high"
    );

    // Tables with changes get rows, the others an empty batch at the same high.
    batcher
        .push(tx(vec![change(
            &log,
            Op::Insert,
            (6, 0),
            vec![Value::Utf8("hi".into())],
        )]))
        .unwrap();
    let flush = batcher.flush(true).unwrap();
    let shape: Vec<(&str, usize)> = flush
        .batches
        .iter()
        .map(|b| (b.table.name.as_str(), b.rows()))
        .collect();
    assert_eq!(shape, [("t.kv", 0), ("t.log", 1)]);
    assert!(flush.batches.iter().all(|b| b.high == pos((6, 0))));
}

#[test]
fn a_heartbeat_due_rides_on_the_next_flush_whatever_makes_it() {
    // A backfill in batch-sized pieces always has a commit in flight, so
    // the run never flushes for the heartbeat itself: the flushes the
    // pieces force must bring the idle tables along, once.
    let (kv, log) = (kv(), log());
    let mut batcher = batcher(vec![kv.clone(), log.clone()], 2);
    batcher
        .push(tx(vec![put(&kv, Op::Insert, (1, 0), 1, None)]))
        .unwrap();
    batcher.heartbeat_due();
    assert!(batcher.is_heartbeat_due());
    let forced = batcher
        .push(tx(vec![put(&kv, Op::Insert, (2, 0), 2, None)]))
        .unwrap();
    let [flush] = forced.as_slice() else {
        panic!("a full batch flushes: {} flushes", forced.len());
    };
    let shape: Vec<(&str, usize)> = flush
        .batches
        .iter()
        .map(|b| (b.table.name.as_str(), b.rows()))
        .collect();
    assert_eq!(shape, [("t.kv", 2), ("t.log", 0)]);
    assert!(!batcher.is_heartbeat_due(), "carried once");
    let forced = batcher
        .push(tx(vec![
            put(&kv, Op::Insert, (3, 0), 3, None),
            put(&kv, Op::Insert, (3, 1), 4, None),
        ]))
        .unwrap();
    let tables: Vec<Vec<&str>> = forced
        .iter()
        .map(|f| f.batches.iter().map(|b| b.table.name.as_str()).collect())
        .collect();
    assert_eq!(tables, [["t.kv"]], "no heartbeat due: the idle table waits");
}

#[test]
fn batch_ids_are_deterministic() {
    // Pinned (computed independently with Python's hashlib): sha256 over
    // each of name, low, high preceded by its 8-byte big-endian length.
    assert_eq!(
        batch_id("shop.orders", &pos((5, 0)), &pos((9, 2))),
        "f6822d7624cff68e7f23c2e0775d4c9a"
    );
    let kv = kv();
    let build = |at: (u64, u32)| {
        let mut batcher = batcher(vec![kv.clone()], 100);
        batcher
            .push(tx(vec![
                put(&kv, Op::Insert, at, 1, None),
                put(&kv, Op::Insert, (at.0, 9), 2, None),
            ]))
            .unwrap();
        batcher.flush(false).unwrap().batches.remove(0)
    };
    let a = build((1, 0));
    assert_eq!(a.id, build((1, 0)).id);
    assert_eq!(a.id, batch_id("t.kv", &pos((1, 0)), &pos((1, 9))));
    assert_eq!(a.id.len(), 32);
    assert_ne!(a.id, build((1, 1)).id, "low moved");
    assert_ne!(a.id, build((2, 0)).id, "high moved");
    assert_ne!(batch_id("t.other", &a.low, &a.high), a.id);
}

#[test]
fn filter_after_keeps_the_uncommitted_rows() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    for (commit, id) in [(1, 1), (2, 2), (3, 3)] {
        batcher
            .push(tx(vec![put(&kv, Op::Insert, (commit, 0), id, Some("v"))]))
            .unwrap();
    }
    batcher.push(heartbeat((4, 0))).unwrap();
    let batch = batcher.flush(false).unwrap().batches.remove(0);
    assert_eq!(batch.high, pos((4, 0)));

    let rest = batch.filter_after(&pos((1, 0)));
    assert_eq!(positions(&rest), [pos((2, 0)), pos((3, 0))]);
    assert_eq!((&rest.low, &rest.high), (&pos((2, 0)), &batch.high));
    assert_eq!(rest.id, batch_id("t.kv", &rest.low, &rest.high));
    assert_eq!(rest.records.schema(), batch.records.schema());

    let unchanged = batch.filter_after(&Position::default());
    assert_eq!((unchanged.rows(), &unchanged.id), (3, &batch.id));

    let none = batch.filter_after(&pos((3, 0)));
    assert!(none.is_empty());
    assert_eq!(none.low, batch.high);
    assert_eq!(none.id, batch_id("t.kv", &batch.high, &batch.high));
}

#[test]
fn metadata_columns_are_typed_and_placed() {
    let kv = kv();
    let metadata: Vec<MetadataColumn> = [
        ("commit_ts", "_committed"),
        ("op", "_op"),
        ("phase", "_phase"),
        ("pos", "_pos"),
        ("snapshot", "_snapshot"),
        ("ingest_ts", "_ingested"),
    ]
    .into_iter()
    .map(|(field, name)| MetadataColumn {
        field: field.parse().unwrap(),
        name: name.into(),
    })
    .collect();
    validate_metadata(std::slice::from_ref(&kv), &metadata).unwrap();
    let mut batcher = Batcher::new(vec![kv.clone()], limits(100, usize::MAX), metadata);
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    batcher
        .push(tx(vec![
            put(&kv, Op::Read, (1, 0), 1, Some("snap")),
            put(&kv, Op::Update, (1, 1), 2, Some("live")),
        ]))
        .unwrap();
    let batch = batcher.flush(false).unwrap().batches.remove(0);
    let schema = batch.records.schema();
    let fields: Vec<(&str, &DataType, bool)> = schema
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type(), f.is_nullable()))
        .collect();
    let utc = utc_micros();
    assert_eq!(
        fields,
        [
            ("id", &DataType::Int64, true),
            ("v", &DataType::Utf8, true),
            ("_committed", &utc, false),
            ("_op", &DataType::Utf8, false),
            ("_phase", &DataType::Utf8, false),
            ("_pos", &DataType::Binary, false),
            ("_snapshot", &DataType::Boolean, false),
            ("_ingested", &utc, false),
            (OP_COLUMN, &DataType::Utf8, false),
            (POS_COLUMN, &DataType::Binary, false),
        ]
    );
    let column = |name| batch.records.column_by_name(name).unwrap();
    assert_eq!(
        [0, 1].map(|row| value_at(column("_committed"), row)),
        [const { Value::TimestampMicros(1_000_000) }; 2]
    );
    assert_eq!(strings(&batch, "_op"), strings(&batch, OP_COLUMN));
    assert_eq!(
        strings(&batch, OP_COLUMN),
        [Some("read".into()), Some("update".into())]
    );
    assert_eq!(
        strings(&batch, "_phase"),
        [Some("snapshot".into()), Some("stream".into())]
    );
    assert_eq!(column("_pos"), column(POS_COLUMN));
    assert_eq!(
        [0, 1].map(|row| value_at(column("_snapshot"), row)),
        [Value::Bool(true), Value::Bool(false)]
    );
    let Value::TimestampMicros(ingested) = value_at(column("_ingested"), 0) else {
        panic!()
    };
    assert!(ingested >= before);
}

#[test]
fn metadata_names_must_not_clash() {
    let tables = [kv(), log()];
    let meta = |field: ContextField, name: &str| MetadataColumn {
        field,
        name: name.into(),
    };
    assert!(
        validate_metadata(
            &tables,
            &[meta(ContextField::Op, "op"), meta(ContextField::Pos, "pos")]
        )
        .is_ok()
    );
    let error = validate_metadata(&tables, &[meta(ContextField::CommitTs, "msg")]).unwrap_err();
    assert!(
        error.contains("t.log") && error.contains("`msg`"),
        "{error}"
    );
    let error = validate_metadata(&tables, &[meta(ContextField::Op, OP_COLUMN)]).unwrap_err();
    assert!(error.contains(OP_COLUMN), "{error}");
    assert!(
        validate_metadata(
            &tables,
            &[meta(ContextField::Op, "x"), meta(ContextField::Pos, "x")]
        )
        .is_err()
    );
    let clashing = table("t.bad", &[(POS_COLUMN, DataType::Binary)], &[]);
    let error = validate_metadata(&[clashing], &[]).unwrap_err();
    assert!(
        error.contains("t.bad") && error.contains(POS_COLUMN),
        "{error}"
    );

    for field in ContextField::ALL {
        assert_eq!(field.as_str().parse::<ContextField>(), Ok(field));
    }
    assert!(
        "lsn"
            .parse::<ContextField>()
            .unwrap_err()
            .contains("commit_ts")
    );
}

#[test]
fn values_that_do_not_fit_are_rejected_whole() {
    let kv = kv();
    let money = table("t.money", &[("amount", DataType::Decimal128(5, 2))], &[]);
    let mut batcher = batcher(vec![kv.clone(), money.clone()], 100);
    let bad = tx(vec![
        put(&kv, Op::Insert, (1, 0), 1, None),
        change(
            &kv,
            Op::Insert,
            (1, 1),
            vec![Value::Utf8("1".into()), Value::Null],
        ),
    ]);
    let error = batcher.push(bad).unwrap_err();
    assert_eq!((error.table.as_str(), &error.pos), ("t.kv", &pos((1, 1))));
    assert!(error.to_string().contains("`id`"), "{error}");
    assert_eq!(
        batcher.buffered_changes(),
        0,
        "nothing of a rejected transaction is kept"
    );
    assert_eq!(batcher.consumed(), None);

    let short = tx(vec![change(&kv, Op::Insert, (2, 0), vec![Value::Int64(1)])]);
    assert!(
        batcher
            .push(short)
            .unwrap_err()
            .reason
            .contains("1 values for 2 columns")
    );
    let fits = tx(vec![change(
        &money,
        Op::Insert,
        (3, 0),
        vec![Value::Decimal128(-99_999)],
    )]);
    assert!(batcher.push(fits).is_ok());
    let wide = tx(vec![change(
        &money,
        Op::Insert,
        (4, 0),
        vec![Value::Decimal128(100_000)],
    )]);
    assert!(batcher.push(wide).unwrap_err().reason.contains("5 digits"));
}

#[test]
fn linger_runs_from_the_oldest_buffered_change() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    let now = Instant::now();
    assert!(!batcher.linger_expired(now + Duration::from_secs(60)));
    batcher.push(heartbeat((1, 0))).unwrap();
    assert!(
        !batcher.linger_expired(now + Duration::from_secs(60)),
        "a heartbeat holds no rows"
    );
    batcher
        .push(tx(vec![put(&kv, Op::Insert, (2, 0), 1, None)]))
        .unwrap();
    assert!(!batcher.linger_expired(Instant::now()));
    assert!(batcher.linger_expired(Instant::now() + Duration::from_secs(1)));
    batcher.flush(false).unwrap();
    assert!(!batcher.linger_expired(Instant::now() + Duration::from_secs(60)));
}

/// The generator's stream through the batcher under many limits: flushes
/// commit in order, respect the limits, and applying them gives the
/// generator's final state. Every value the generator makes round-trips
/// through Arrow on the way.
#[test]
fn generator_stream_round_trips_under_any_limits() {
    const SEED: u64 = 21;
    const CHANGES: u64 = 3_000;
    let expected = generator::expected_state(SEED, CHANGES);
    for (max_rows, max_bytes) in [
        (1, usize::MAX),
        (4, usize::MAX),
        (10, usize::MAX),
        (100_000, usize::MAX),
        (50, 400),
        (1_000, 4_000),
    ] {
        let mut source = Generator::new(GeneratorConfig {
            seed: SEED,
            max_changes: Some(CHANGES),
        });
        let tables = source.tables();
        let mut batcher = Batcher::new(tables.clone(), limits(max_rows, max_bytes), vec![]);
        let mut flushes = Vec::new();
        let mut ends = Vec::new();
        while let Some(tx) = source.next_transaction().unwrap() {
            ends.push(tx.end.clone());
            flushes.extend(batcher.push(tx).unwrap());
        }
        flushes.extend(batcher.flush(true));
        assert_eq!(batcher.consumed(), ends.last());

        let mut applied = ExpectedState::with_tables(&tables);
        let mut table_highs: HashMap<&str, &Position> = HashMap::new();
        for flush in &flushes {
            if max_rows >= 6 && max_bytes == usize::MAX {
                assert!(
                    ends.binary_search(&flush.high).is_ok(),
                    "transactions stay whole"
                );
            }
            let changes: Vec<Change> = flush.batches.iter().flat_map(changes_of).collect();
            assert!(changes.len() <= max_rows);
            assert!(
                changes.len() == 1 || changes.iter().map(change_bytes).sum::<usize>() <= max_bytes
            );
            for batch in &flush.batches {
                assert_eq!(batch.high, flush.high);
                let previous = table_highs.insert(&batch.table.name, &batch.high);
                assert!(
                    previous < Some(&batch.high),
                    "each table's batches commit in order"
                );
                assert_eq!(
                    batch.id,
                    batch_id(&batch.table.name, &batch.low, &batch.high)
                );
                let positions = positions(batch);
                assert!(positions.is_sorted());
                assert!(positions.iter().all(|p| *p <= flush.high));
            }
            for change in &changes {
                applied.apply(change);
            }
        }
        // The final flush(true) brought every table to the end.
        for table in &tables {
            let high = table_highs.get(table.name.as_str()).copied();
            assert_eq!(high, ends.last(), "{}", table.name);
        }
        assert_eq!(
            applied, expected,
            "limits {max_rows} rows, {max_bytes} bytes"
        );
    }
}

#[test]
fn append_tables_keep_every_change_to_a_key() {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    batcher.keep_every_change(&kv.name);
    batcher
        .push(tx(vec![
            put(&kv, Op::Insert, (1, 0), 1, Some("a")),
            put(&kv, Op::Update, (1, 1), 1, Some("b")),
            put(&kv, Op::Delete, (1, 2), 1, None),
        ]))
        .unwrap();
    let flush = batcher.flush(false).unwrap();
    assert_eq!(
        positions(&flush.batches[0]),
        [pos((1, 0)), pos((1, 1)), pos((1, 2))]
    );
}

/// `changes` (reads of one table) as the columnar rows a backfill hands on.
fn snapshot_rows(changes: &[Change]) -> SnapshotRows {
    let table = changes[0].table.clone();
    let columns = table
        .columns
        .iter()
        .enumerate()
        .map(|(i, column)| {
            column_array(
                &column.data_type,
                changes.iter().map(|c| &c.values[i]),
                changes.len(),
            )
        })
        .collect();
    SnapshotRows {
        table,
        columns,
        positions: BinaryArray::from_iter_values(changes.iter().map(|c| c.pos.as_bytes())),
        commit_ts_micros: changes[0].commit_ts_micros,
    }
}

fn reads_tx(pieces: Vec<SnapshotRows>) -> Transaction {
    let last = pieces.last().unwrap();
    let end = last.position(last.len() - 1);
    Transaction::of_reads(pieces, end)
}

/// Reads of `t.typed` with every kind of value, keys `from..to`.
fn typed_reads(from: i64, to: i64) -> Vec<Change> {
    let typed = table(
        "t.typed",
        &[
            ("id", DataType::Int64),
            ("name", DataType::Utf8),
            ("amount", DataType::Decimal128(10, 2)),
            ("at", utc_micros()),
        ],
        &[0],
    );
    (from..to)
        .map(|id| Change {
            table: typed.clone(),
            op: Op::Read,
            pos: Position::snapshot("t.typed", &id.to_be_bytes()),
            commit_ts_micros: 77,
            snapshot: true,
            values: vec![
                Value::Int64(id),
                if id % 3 == 0 {
                    Value::Null
                } else {
                    Value::Utf8(format!("n{id}"))
                },
                Value::Decimal128(i128::from(id) * 101),
                Value::TimestampMicros(id * 1_000_000),
            ],
        })
        .collect()
}

#[test]
fn snapshot_rows_make_the_batch_their_changes_would() {
    let metadata: Vec<MetadataColumn> = ["commit_ts", "op", "phase", "pos", "snapshot"]
        .into_iter()
        .map(|field| MetadataColumn {
            field: field.parse().unwrap(),
            name: format!("_{field}"),
        })
        .collect();
    let reads = typed_reads(0, 10);
    let table = reads[0].table.clone();
    let build = |tx: Transaction| {
        let mut batcher = Batcher::new(
            vec![table.clone()],
            limits(100, usize::MAX),
            metadata.clone(),
        );
        assert!(batcher.push(tx).unwrap().is_empty());
        batcher.flush(false).unwrap().batches.remove(0)
    };
    let by_change = build(tx(reads.clone()));
    // Two pieces, as a backfill hands on a chunk.
    let by_column = build(reads_tx(vec![
        snapshot_rows(&reads[..4]),
        snapshot_rows(&reads[4..]),
    ]));
    assert_eq!(by_column.records, by_change.records);
    assert_eq!(
        (&by_column.low, &by_column.high, &by_column.id),
        (&by_change.low, &by_change.high, &by_change.id)
    );
}

/// A batcher of `t.kv` holding `count` snapshot rows, keys from 0, "read".
fn kv_with_reads(count: u32) -> (Arc<TableSchema>, Batcher) {
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    let reads: Vec<Change> = (0..count)
        .map(|i| put(&kv, Op::Read, (1, i), i64::from(i), Some("read")))
        .collect();
    let flushes = batcher.push(reads_tx(vec![snapshot_rows(&reads)])).unwrap();
    assert!(flushes.is_empty());
    (kv, batcher)
}

#[test]
fn streamed_changes_after_snapshot_rows_commit_those_first() {
    let (kv, mut batcher) = kv_with_reads(3);
    // The stream changes key 1: the rows read are not indexed by key, so
    // they are committed before the change that must win over one of them.
    let flushes = batcher
        .push(tx(vec![put(&kv, Op::Update, (2, 0), 1, Some("streamed"))]))
        .unwrap();
    let [first] = &flushes[..] else {
        panic!("one flush of the rows read, got {}", flushes.len())
    };
    assert_eq!(first.high, pos((1, 2)));
    assert_eq!(
        strings(&first.batches[0], "v"),
        vec![Some("read".to_string()); 3]
    );
    let then = batcher.flush(false).unwrap();
    assert_eq!(positions(&then.batches[0]), [pos((2, 0))]);
}

#[test]
fn oversized_snapshot_rows_commit_in_pieces_ending_at_their_last_row() {
    let reads = typed_reads(0, 10);
    let table = reads[0].table.clone();
    let mut batcher = batcher(vec![table.clone()], 4);
    let flushes = batcher
        .push(reads_tx(vec![
            snapshot_rows(&reads[..3]),
            snapshot_rows(&reads[3..]),
        ]))
        .unwrap();
    let rows: Vec<usize> = flushes.iter().map(|f| f.batches[0].rows()).collect();
    assert_eq!(rows, [4, 4, 2], "batches filled to the limit, in order");
    let highs: Vec<&Position> = flushes.iter().map(|f| &f.high).collect();
    assert_eq!(highs, [&reads[3].pos, &reads[7].pos, &reads[9].pos]);
    let all: Vec<Position> = flushes
        .iter()
        .flat_map(|f| positions(&f.batches[0]))
        .collect();
    assert_eq!(all, reads.iter().map(|c| c.pos.clone()).collect::<Vec<_>>());
    assert!(batcher.flush(false).is_none());
}

#[test]
fn snapshot_rows_that_do_not_fit_their_table_are_refused() {
    let reads = typed_reads(0, 2);
    let table = reads[0].table.clone();
    let mut batcher = batcher(vec![table.clone()], 100);
    let mut rows = snapshot_rows(&reads);
    rows.columns[2] = Arc::new(arrow_array::Int32Array::from(vec![1, 2]));
    let err = batcher.push(reads_tx(vec![rows])).unwrap_err();
    assert_eq!(err.table, "t.typed");
    assert!(err.reason.contains("column `amount`"), "{}", err.reason);
    let mut short = snapshot_rows(&reads);
    short.columns.pop();
    assert!(batcher.push(reads_tx(vec![short])).is_err());
    assert!(
        batcher.flush(false).is_none(),
        "nothing of either was buffered"
    );
}

/// `t.kv` with a column `w` added.
fn kv_widened() -> Arc<TableSchema> {
    table(
        "t.kv",
        &[
            ("id", DataType::Int64),
            ("v", DataType::Utf8),
            ("w", DataType::Int32),
        ],
        &[0],
    )
}

#[test]
fn a_column_added_after_snapshot_rows_leaves_them_their_shape() {
    let (_, mut batcher) = kv_with_reads(2);
    let wider = kv_widened();
    let change = change(
        &wider,
        Op::Insert,
        (2, 0),
        vec![Value::Int64(5), Value::Null, Value::Int32(7)],
    );
    let flushes = batcher.push(tx(vec![change])).unwrap();
    assert_eq!(flushes.len(), 1);
    assert_eq!(flushes[0].batches[0].records.num_columns(), 2 + 2);
    let then = batcher.flush(false).unwrap();
    assert_eq!(then.batches[0].records.num_columns(), 3 + 2);
}

#[test]
fn snapshot_rows_of_a_table_widened_before_any_were_read_carry_the_added_column() {
    // The source found a column added while it started (before the slot's
    // snapshot): the first rows it reads have the wider shape.
    let kv = kv();
    let mut batcher = batcher(vec![kv.clone()], 100);
    let wider = kv_widened();
    let reads: Vec<Change> = (0..3)
        .map(|i| {
            change(
                &wider,
                Op::Read,
                (1, i),
                vec![
                    Value::Int64(i64::from(i)),
                    Value::Null,
                    Value::Int32(10 * i as i32),
                ],
            )
        })
        .collect();
    assert!(
        batcher
            .push(reads_tx(vec![snapshot_rows(&reads)]))
            .unwrap()
            .is_empty()
    );
    let flush = batcher.flush(false).unwrap();
    let records = &flush.batches[0].records;
    assert_eq!(records.num_columns(), 3 + 2);
    let w = records
        .column_by_name("w")
        .expect("the added column")
        .as_any()
        .downcast_ref::<arrow_array::Int32Array>()
        .unwrap();
    assert_eq!(w.values().to_vec(), vec![0, 10, 20]);

    // Rows of the old shape already buffered are arrays that cannot be
    // widened: wider rows after them are refused, not given nulls.
    let (_, mut batcher) = kv_with_reads(2);
    let later: Vec<Change> = vec![change(
        &wider,
        Op::Read,
        (1, 5),
        vec![Value::Int64(5), Value::Null, Value::Int32(7)],
    )];
    assert!(batcher.push(reads_tx(vec![snapshot_rows(&later)])).is_err());
}

/// A column built a value at a time is the array `column_array` makes of
/// the same values: each type, its own values, nulls, and values of
/// another variant (null in both).
#[test]
fn a_column_builder_builds_what_column_array_does() {
    use arrow_schema::{Field, TimeUnit};
    let cases: Vec<(DataType, Vec<Value>)> = vec![
        (
            DataType::Int32,
            vec![Value::Int32(-1), Value::Null, Value::Int32(i32::MAX)],
        ),
        (
            DataType::Int64,
            vec![Value::Int64(5), Value::Utf8("x".into()), Value::Null],
        ),
        (
            DataType::Float64,
            vec![
                Value::Float64(-0.5),
                Value::Null,
                Value::Float64(f64::INFINITY),
            ],
        ),
        (DataType::Date32, vec![Value::Date32(19_000), Value::Null]),
        (
            DataType::Time64(TimeUnit::Microsecond),
            vec![Value::Int64(86_399_999_999), Value::Null, Value::Int64(0)],
        ),
        (
            DataType::Decimal128(10, 2),
            vec![Value::Decimal128(-12_345), Value::Null, Value::Int64(3)],
        ),
        (
            utc_micros(),
            vec![
                Value::TimestampMicros(1),
                Value::Null,
                Value::TimestampMicros(-7),
            ],
        ),
        (
            DataType::Timestamp(TimeUnit::Microsecond, None),
            vec![Value::TimestampMicros(42), Value::Null],
        ),
        (
            DataType::Utf8,
            vec![
                Value::Utf8("héllo".into()),
                Value::Null,
                Value::Utf8(String::new()),
            ],
        ),
        (
            DataType::Binary,
            vec![Value::Binary(vec![0, 1, 2]), Value::Null, Value::Int32(1)],
        ),
        (
            DataType::Boolean,
            vec![Value::Bool(true), Value::Null, Value::Bool(false)],
        ),
        (
            DataType::FixedSizeBinary(2),
            vec![Value::Binary(vec![1, 2]), Value::Null],
        ),
        (
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
            vec![Value::List(vec![Value::Int32(1), Value::Null]), Value::Null],
        ),
    ];
    for (data_type, values) in cases {
        let expected = column_array(&data_type, values.iter(), values.len());
        let mut builder = ColumnBuilder::new(&data_type, 1);
        for value in values.iter().cloned() {
            builder.push(value);
        }
        let built = builder.finish();
        assert_eq!(built.data_type(), &data_type);
        assert_eq!(&built.to_data(), &expected.to_data(), "{data_type}");
    }
}
