//! Row values: a pure function of the seed, the planned write and where it
//! happened, so the final state can be recomputed without replaying every
//! write. The text is deliberately awkward (accents, scripts, emoji,
//! quotes, control characters) and the numbers reach their types' limits.

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::simulator::{Planned, REFUNDED, Table, Write};
use crate::change::{Op, Value};

/// 2024-01-01T00:00:00Z; transaction `n` commits `n` milliseconds later.
pub(super) const BASE_COMMIT_MICROS: i64 = 1_704_067_200_000_000;

const FIRST_NAMES: &[&str] = &[
    "Ada",
    "Zoë",
    "José",
    "Łukasz",
    "Søren",
    "Aoife",
    "Mei",
    "Иван",
    "Fatima",
    "Ngozi",
    "Björk",
    "Ana-María",
    "Siobhán",
    "Kenji",
    "Noor",
    "Émile",
];
const LAST_NAMES: &[&str] = &[
    "Lovelace",
    "Ångström",
    "Núñez",
    "Wójcik",
    "O'Brien",
    "Nguyễn",
    "李",
    "Петрова",
    "Al-Hassan",
    "Okafor",
    "Guðmundsdóttir",
    "Müller",
    "Tanaka",
    "van der Berg",
    "Smith",
    "🦀 Crab",
];
const DOMAINS: &[&str] = &["example.com", "example.org", "exämple.de", "例え.jp"];
const TIERS: &[&str] = &["bronze", "silver", "gold", "platinum"];
/// Indexed by [`super::simulator::Status`].
pub(super) const STATUSES: &[&str] = &[
    "pending",
    "paid",
    "shipped",
    "delivered",
    "cancelled",
    "refunded",
];
const NOTES: &[&str] = &[
    "",
    "leave at the door 🚪",
    "Größe: XL",
    "gift wrap, please",
    "配達前に電話してください",
    "line one\nline two",
    "quote \"this\", then 'that'",
    "tab\tseparated",
    "  padded  ",
];
const SKU_PREFIXES: &[&str] = &["SKU", "ÄPFEL", "BOOK", "TEE", "ЧАЙ", "MUG"];
/// The largest unscaled values of Decimal128(12, 2) and Decimal128(10, 2).
const MAX_BALANCE: i128 = 999_999_999_999;
const MAX_UNIT_PRICE: i128 = 9_999_999_999;

/// When transaction `tx` committed.
pub(super) fn commit_ts(tx: u64) -> i64 {
    BASE_COMMIT_MICROS + tx as i64 * 1_000
}

/// A generator of its own for one row, keyed by everything its values depend
/// on: ChaCha keys are independent streams, so no two rows (and no two
/// writes of a row) share randomness. `at` is None for the facts a row keeps
/// across updates (a customer keeps their name).
fn row_rng(seed: u64, planned: &Planned, at: Option<Write>) -> ChaCha8Rng {
    let row =
        ((planned.table as u64) << 40) | (u64::from(planned.line) << 32) | u64::from(planned.id);
    let (tx, ordinal) = at.map_or((0, 0), |w| (w.tx, u64::from(w.ordinal) + 1));
    let mut key = [0u8; 32];
    for (chunk, word) in key.chunks_exact_mut(8).zip([seed, row, tx, ordinal]) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

fn chance(rng: &mut ChaCha8Rng, percent: u32) -> bool {
    rng.random_ratio(percent, 100)
}

fn pick<'a>(rng: &mut ChaCha8Rng, items: &[&'a str]) -> &'a str {
    items.choose(rng).expect("word lists are not empty")
}

/// The values of one written row, in the table's column order.
pub(super) fn row(seed: u64, planned: &Planned, at: Write) -> Vec<Value> {
    use Value::*;
    let id = Int64(planned.id.into());
    let deleted = |key: Vec<Value>, columns: usize| {
        let nulls = columns - key.len();
        key.into_iter()
            .chain(std::iter::repeat_n(Null, nulls))
            .collect()
    };
    let mut stable = row_rng(seed, planned, None);
    let mut rng = row_rng(seed, planned, Some(at));
    match (planned.table, planned.op) {
        (Table::Customers, Op::Delete) => deleted(vec![id], 8),
        (Table::Orders, Op::Delete) => deleted(vec![id], 7),
        (Table::Items, Op::Delete) => deleted(vec![id, Int32(planned.line.into())], 5),
        (Table::Customers, _) => {
            let first = pick(&mut stable, FIRST_NAMES);
            let last = pick(&mut stable, LAST_NAMES);
            let domain = pick(&mut stable, DOMAINS);
            let signup_days = if chance(&mut stable, 3) {
                -stable.random_range(0..20_000) // before 1970
            } else {
                stable.random_range(15_000..20_000)
            };
            let email = if chance(&mut rng, 15) {
                Null
            } else {
                Utf8(format!("{}.{}@{domain}", first.to_lowercase(), planned.id))
            };
            let tier = if chance(&mut rng, 30) {
                Null
            } else {
                Utf8(pick(&mut rng, TIERS).to_string())
            };
            let balance = match rng.random_range(0..100) {
                0..20 => Null,
                20 => Decimal128(MAX_BALANCE),
                21 => Decimal128(-MAX_BALANCE),
                _ => Decimal128(rng.random_range(-5_000_000..25_000_000)),
            };
            vec![
                id,
                Utf8(format!("{first} {last}")),
                email,
                tier,
                balance,
                Bool(!chance(&mut rng, 15)),
                Date32(signup_days),
                TimestampMicros(commit_ts(at.tx)),
            ]
        }
        (Table::Orders, _) => {
            let order = planned.order;
            let cents: i64 = rng.random_range(100..500_100);
            let cents = if order.status == REFUNDED {
                -cents
            } else {
                cents
            };
            let note = if chance(&mut rng, 60) {
                Null
            } else {
                Utf8(pick(&mut rng, NOTES).to_string())
            };
            let payload = if chance(&mut rng, 50) {
                Null
            } else {
                let len = rng.random_range(0..25);
                Binary((0..len).map(|_| rng.random()).collect())
            };
            vec![
                id,
                Int64(order.customer.into()),
                Utf8(STATUSES[order.status as usize].to_string()),
                Float64(cents as f64 / 100.0),
                note,
                TimestampMicros(commit_ts(order.placed_tx)),
                payload,
            ]
        }
        (Table::Items, _) => {
            let sku = format!(
                "{}-{:05}",
                pick(&mut stable, SKU_PREFIXES),
                stable.random_range(0..100_000)
            );
            let qty = match rng.random_range(0..100) {
                0..5 => -rng.random_range(1..=3), // a return
                5..7 => 0,
                _ => rng.random_range(1..=12),
            };
            let unit_price = match rng.random_range(0..100) {
                0..3 => 0,
                3..6 => -rng.random_range(0..10_000), // a discount line
                6 => MAX_UNIT_PRICE,
                _ => rng.random_range(1..100_000),
            };
            vec![
                id,
                Int32(planned.line.into()),
                Utf8(sku),
                Int32(qty),
                Decimal128(unit_price),
            ]
        }
    }
}
