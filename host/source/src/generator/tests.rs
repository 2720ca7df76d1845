use crate::commit_order::{StreamPosition, stream_position};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::oracle::{row_key, shop_tables};
use super::simulator::MAX_TX_CHANGES;
use super::values::BASE_COMMIT_MICROS;
use super::*;
use crate::change::{Change, Op, Value};

fn bounded(seed: u64, max_changes: u64) -> Generator {
    Generator::new(GeneratorConfig {
        seed,
        max_changes: Some(max_changes),
    })
}

fn transactions(generator: &mut Generator) -> Vec<Transaction> {
    std::iter::from_fn(|| generator.next_transaction().unwrap()).collect()
}

#[test]
fn same_seed_same_stream() {
    let a: Vec<Change> = change_log(42, 2_000).collect();
    let b: Vec<Change> = change_log(42, 2_000).collect();
    assert_eq!(a, b);
    let c: Vec<Change> = change_log(43, 2_000).collect();
    assert_ne!(a, c);
}

#[test]
fn stream_shape() {
    let txs = transactions(&mut bounded(1, 1_000));
    let total: usize = txs.iter().map(|tx| tx.changes.len()).sum();
    // Transactions are never cut: the last one may pass the count.
    assert!((1_000..1_000 + MAX_TX_CHANGES).contains(&total), "{total}");
    let mut previous = Position::default();
    for (n, tx) in txs.iter().enumerate() {
        assert!((1..=MAX_TX_CHANGES).contains(&tx.changes.len()));
        assert_eq!(tx.end, tx.changes.last().unwrap().pos);
        for (ordinal, change) in tx.changes.iter().enumerate() {
            assert_eq!(change.pos, stream_position(n as u64 + 1, ordinal as u32));
            assert!(change.pos > previous);
            previous = change.pos.clone();
            assert_eq!(
                change.commit_ts_micros,
                BASE_COMMIT_MICROS + (n as i64 + 1) * 1_000
            );
            assert!(!change.snapshot);
            assert_eq!(change.values.len(), change.table.columns.len());
        }
    }
    // The stream without a bound goes on with the very same transactions.
    let mut endless = Generator::new(GeneratorConfig {
        seed: 1,
        max_changes: None,
    });
    for tx in &txs {
        assert_eq!(
            endless.next_transaction().unwrap().unwrap().changes,
            tx.changes
        );
    }
    assert_eq!(endless.head(), txs.last().map(|tx| tx.end.clone()));
    assert!(endless.next_transaction().unwrap().is_some());
}

#[test]
fn resume_from_every_position_yields_the_suffix() {
    let log: Vec<Change> = change_log(7, 300).collect();
    for (i, change) in log.iter().enumerate() {
        let mut generator = bounded(7, 300);
        generator.resume_after(Some(&change.pos)).unwrap();
        let txs = transactions(&mut generator);
        if let Some(first) = txs.first() {
            // A resume inside a transaction gets the rest of it, not a new one.
            let (tx, _) = change.pos.as_stream().unwrap();
            let (first_tx, _) = first.changes[0].pos.as_stream().unwrap();
            let rest_of_tx = log[i + 1..]
                .iter()
                .take_while(|c| c.pos.as_stream().unwrap().0 == tx);
            if rest_of_tx.clone().count() > 0 {
                assert_eq!(first_tx, tx);
                assert_eq!(first.changes.len(), rest_of_tx.count());
            } else {
                assert_eq!(first_tx, tx + 1);
            }
        }
        let resumed: Vec<Change> = txs.into_iter().flat_map(|tx| tx.changes).collect();
        assert_eq!(resumed, log[i + 1..], "resume after {}", change.pos);
    }
    let mut generator = bounded(7, 300);
    generator.resume_after(None).unwrap();
    assert_eq!(
        transactions(&mut generator)
            .into_iter()
            .flat_map(|tx| tx.changes)
            .count(),
        log.len()
    );
    let mut generator = bounded(7, 300);
    generator
        .resume_after(Some(&Position::from_bytes(vec![0x00, 0xff])))
        .unwrap();
    assert_eq!(
        transactions(&mut generator).len(),
        transactions(&mut bounded(7, 300)).len()
    );
    let beyond = Position::from_bytes(vec![PHASE_STREAM + 1]);
    assert!(matches!(
        bounded(7, 300).resume_after(Some(&beyond)),
        Err(SourceError::Resume { .. })
    ));
}

#[test]
fn head_is_the_final_change() {
    let generator = bounded(9, 500);
    let last = change_log(9, 500).last().unwrap();
    assert_eq!(generator.head(), Some(last.pos));
    assert_eq!(bounded(9, 0).head(), None);
    assert!(transactions(&mut bounded(9, 0)).is_empty());
}

#[test]
fn a_bounded_stream_can_have_produced_nothing_past_its_last_change() {
    let last = change_log(9, 500).last().unwrap();
    assert_eq!(bounded(9, 500).ceiling().unwrap(), Some(last.pos));
    // Resuming moves nothing: the ceiling is the stream's, not the run's.
    let mut resumed = bounded(9, 500);
    resumed.resume_after(Some(&stream_position(3, 0))).unwrap();
    assert_eq!(resumed.ceiling().unwrap(), bounded(9, 500).head());
    let mut endless = Generator::new(GeneratorConfig {
        seed: 9,
        max_changes: None,
    });
    endless.next_transaction().unwrap();
    assert_eq!(endless.ceiling().unwrap(), None);
}

#[test]
fn expected_state_is_the_applied_change_log() {
    for (seed, max) in [(3, 1), (3, 300), (11, 20_000), (12, 150_000)] {
        let mut applied = ExpectedState::with_tables(&shop_tables());
        for change in change_log(seed, max) {
            applied.apply(&change);
        }
        let expected = expected_state(seed, max);
        assert_eq!(expected.tables.len(), 3);
        assert_eq!(expected, applied, "seed {seed}, {max} changes");
    }
}

#[test]
fn updates_and_deletes_only_touch_live_keys() {
    let mut live: HashMap<&str, HashSet<Vec<KeyPart>>> = HashMap::new();
    let mut reinserted = HashSet::new();
    let mut deleted: HashMap<&str, HashSet<Vec<KeyPart>>> = HashMap::new();
    let log: Vec<Change> = change_log(5, 50_000).collect();
    for change in &log {
        let key = row_key(&change.table, &change.values);
        let name = change.table.name.as_str();
        let keys = live.entry(name).or_default();
        match change.op {
            Op::Insert => {
                assert!(
                    keys.insert(key.clone()),
                    "{name} insert of live key {key:?}"
                );
                if deleted.entry(name).or_default().contains(&key) {
                    reinserted.insert(name);
                }
            }
            Op::Update => assert!(keys.contains(&key), "{name} update of missing key {key:?}"),
            Op::Delete => {
                assert!(keys.remove(&key), "{name} delete of missing key {key:?}");
                deleted.entry(name).or_default().insert(key);
            }
            Op::Read => panic!("the generator does not snapshot"),
        }
    }
    assert_eq!(reinserted.len(), 3, "deleted keys come back in every table");
}

#[test]
fn small_stream_exercises_everything() {
    let txs = transactions(&mut bounded(2, 300));
    let changes: Vec<&Change> = txs.iter().flat_map(|tx| &tx.changes).collect();
    for table in [CUSTOMERS, ORDERS, ORDER_ITEMS] {
        for op in [Op::Insert, Op::Update, Op::Delete] {
            assert!(
                changes.iter().any(|c| c.table.name == table && c.op == op),
                "no {op:?} in {table}"
            );
        }
    }
    let spanning = txs
        .iter()
        .filter(|tx| {
            tx.changes
                .iter()
                .map(|c| &c.table.name)
                .collect::<HashSet<_>>()
                .len()
                > 1
        })
        .count();
    assert!(spanning > 10, "{spanning} multi-table transactions");
    let deletes_carry_keys_only = changes.iter().filter(|c| c.op == Op::Delete).all(|c| {
        c.values
            .iter()
            .enumerate()
            .all(|(i, v)| c.table.key.contains(&i) != (*v == Value::Null))
    });
    assert!(deletes_carry_keys_only);

    // Nulls in every nullable column of live rows, and no null where the schema forbids it.
    let live: Vec<&Change> = changes
        .iter()
        .copied()
        .filter(|c| c.op != Op::Delete)
        .collect();
    for table in shop_tables() {
        for (i, column) in table.columns.iter().enumerate() {
            let nulls = live
                .iter()
                .filter(|c| c.table.name == table.name && c.values[i] == Value::Null)
                .count();
            assert_eq!(column.nullable, nulls > 0, "{}.{}", table.name, column.name);
        }
    }
    let text = |c: &&Change| {
        c.values
            .iter()
            .any(|v| matches!(v, Value::Utf8(s) if !s.is_ascii()))
    };
    assert!(live.iter().any(text), "unicode text");
    assert!(
        live.iter().any(|c| c
            .values
            .iter()
            .any(|v| matches!(v, Value::Decimal128(d) if *d < 0))),
        "negative decimals"
    );
}

#[test]
fn a_million_changes_simulate_quickly() {
    let started = Instant::now();
    let state = expected_state(1, 1_000_000);
    let elapsed = started.elapsed();
    eprintln!(
        "expected_state(1, 1_000_000): {elapsed:?}, {} rows",
        state.rows()
    );
    assert!(state.tables.values().all(|rows| !rows.is_empty()));
}
