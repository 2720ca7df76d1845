//! The MySQL source against a real MariaDB (scripts/mariadb): a seeded,
//! typed load is backfilled, a workload of inserts, updates, deletes, key
//! changes, multi-table and big transactions is streamed, the run is
//! stopped, more is written, and a draining run catches up; then the
//! positioned sink must equal the tables row by row, as MariaDB itself
//! prints them, with no change twice.

use std::time::Duration;

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::text;
use crate::mysql_support::*;

pub const SCHEMA: &str = r#"
CREATE TABLE customers (
    id BIGINT PRIMARY KEY,
    name VARCHAR(60) NOT NULL,
    email VARCHAR(80) CHARACTER SET latin1,
    balance DECIMAL(12,2),
    tiny TINYINT UNSIGNED,
    small SMALLINT,
    medium MEDIUMINT UNSIGNED,
    int_u INT UNSIGNED,
    big_u BIGINT UNSIGNED,
    ratio DOUBLE,
    score FLOAT,
    born DATE,
    seen_at DATETIME(6),
    updated_at TIMESTAMP(3) NULL DEFAULT NULL,
    wake TIME(2),
    since YEAR,
    kind ENUM('basic','pro','it''s'),
    flags SET('a','b','c'),
    active BIT(1),
    mask BIT(12),
    avatar BLOB,
    code BINARY(4),
    prefs JSON,
    note TEXT
);
CREATE TABLE items (
    order_id BIGINT,
    sku VARCHAR(20) NOT NULL,
    qty INT NOT NULL,
    PRIMARY KEY (order_id, sku)
);
"#;

pub fn tables(db: &str) -> Vec<MyTable> {
    use Canon::*;
    vec![
        MyTable::new(
            db,
            "customers",
            &[
                ("id", Int),
                ("name", Text),
                ("email", Text),
                ("balance", Decimal(2)),
                ("tiny", Int),
                ("small", Int),
                ("medium", Int),
                ("int_u", Int),
                ("big_u", Int),
                ("ratio", Float64),
                ("score", Float32),
                ("born", Date),
                ("seen_at", DateTime),
                ("updated_at", DateTime),
                ("wake", Time),
                ("since", Int),
                ("kind", Text),
                ("flags", Text),
                ("active", Bits),
                ("mask", Bits),
                ("avatar", Hex),
                ("code", Hex),
                ("prefs", Text),
                ("note", Text),
            ],
            &[0],
        ),
        MyTable::new(
            db,
            "items",
            &[("order_id", Int), ("sku", Text), ("qty", Int)],
            &[0, 1],
        ),
    ]
}

/// A seeded random stream: the same seed gives the same workload.
pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n.max(1))
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A customers row's values as SQL literals (after the id), some NULL.
fn customer_values(rng: &mut Rng) -> String {
    let mut v: Vec<String> = Vec::new();
    let names = [
        "ada",
        "grace",
        "o'brien",
        "zoë 😀",
        "tab\there",
        "line\nbreak",
        "back\\slash",
    ];
    v.push(sql_text(names[rng.below(names.len() as u64) as usize]));
    let emails = ["a@b.example", "café@ü.example", "€uro@x.example", "plain"];
    let email = emails[rng.below(4) as usize];
    v.push(maybe(sql_text(email), rng));
    let balance = format!(
        "{}.{:02}",
        rng.below(2_000_000_000) as i64 - 1_000_000_000,
        rng.below(100)
    );
    v.push(maybe(balance, rng));
    v.push(maybe(rng.below(256).to_string(), rng));
    v.push(maybe((rng.below(65_536) as i64 - 32_768).to_string(), rng));
    v.push(maybe(rng.below(16_777_216).to_string(), rng));
    v.push(maybe(rng.below(4_294_967_296).to_string(), rng));
    let big_u = if rng.chance(20) {
        u64::MAX
    } else {
        rng.0.random::<u64>()
    };
    v.push(maybe(big_u.to_string(), rng));
    v.push(maybe(
        format!("{:e}", rng.0.random::<f64>() * 1e6 - 5e5),
        rng,
    ));
    v.push(maybe(
        format!("{}", (rng.below(100_000) as f32) / 64.0),
        rng,
    ));
    let day = |rng: &mut Rng| {
        format!(
            "{:04}-{:02}-{:02}",
            1000 + rng.below(8999),
            1 + rng.below(12),
            1 + rng.below(28)
        )
    };
    let born = day(rng);
    v.push(maybe(format!("'{born}'"), rng));
    let seen = format!(
        "'{} {:02}:{:02}:{:02}.{:06}'",
        day(rng),
        rng.below(24),
        rng.below(60),
        rng.below(60),
        rng.below(1_000_000)
    );
    v.push(maybe(seen, rng));
    // TIMESTAMP's range: 1970-01-01 00:00:01 to 2038-01-19.
    let updated = format!(
        "'{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}'",
        1971 + rng.below(66),
        1 + rng.below(12),
        1 + rng.below(28),
        rng.below(24),
        rng.below(60),
        rng.below(60),
        rng.below(1000)
    );
    v.push(maybe(updated, rng));
    v.push(maybe(
        format!(
            "'{:02}:{:02}:{:02}.{:02}'",
            rng.below(24),
            rng.below(60),
            rng.below(60),
            rng.below(100)
        ),
        rng,
    ));
    v.push(maybe((1901 + rng.below(254)).to_string(), rng));
    let kinds = ["'basic'", "'pro'", "'it''s'"];
    v.push(maybe(kinds[rng.below(3) as usize].into(), rng));
    let sets = ["''", "'a'", "'b,c'", "'a,b,c'"];
    v.push(maybe(sets[rng.below(4) as usize].into(), rng));
    v.push(maybe(format!("b'{}'", rng.below(2)), rng));
    v.push(maybe(rng.below(4096).to_string(), rng));
    let blob: String = (0..rng.below(40))
        .map(|_| format!("{:02x}", rng.below(256)))
        .collect();
    v.push(maybe(format!("x'{blob}'"), rng));
    let code: String = (0..1 + rng.below(4))
        .map(|_| format!("{:02x}", rng.below(256)))
        .collect();
    v.push(maybe(format!("x'{code}'"), rng));
    v.push(maybe(
        sql_text(&format!("{{\"k\": {}, \"s\": \"é\"}}", rng.below(1000))),
        rng,
    ));
    let note: String = "note ".repeat(1 + rng.below(50) as usize);
    v.push(maybe(sql_text(&note), rng));
    v.join(", ")
}

/// `value`, or NULL now and then.
fn maybe(value: String, rng: &mut Rng) -> String {
    if rng.chance(15) { "NULL".into() } else { value }
}

fn sql_text(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

pub fn insert_customer(id: u64, rng: &mut Rng) -> String {
    format!(
        "INSERT INTO customers VALUES ({id}, {});\n",
        customer_values(rng)
    )
}

/// `customers` rows `0..n` and `items` for some of them.
pub fn initial_load(customers: u64, rng: &mut Rng) -> String {
    let mut sql = String::from("BEGIN;\n");
    for id in 0..customers {
        sql.push_str(&insert_customer(id, rng));
        if rng.chance(30) {
            sql.push_str(&format!(
                "INSERT INTO items VALUES ({id}, 'sku-{}', {});\n",
                rng.below(5),
                rng.below(100)
            ));
        }
    }
    sql.push_str("COMMIT;\n");
    sql
}

/// `ops` transactions of one to four statements each, ids from `next_id`.
pub fn workload(rng: &mut Rng, ops: u64, next_id: &mut u64) -> String {
    let mut sql = String::new();
    for _ in 0..ops {
        sql.push_str("BEGIN;\n");
        for _ in 0..1 + rng.below(4) {
            let target = rng.below(*next_id);
            match rng.below(10) {
                0..=2 => {
                    sql.push_str(&insert_customer(*next_id, rng));
                    *next_id += 1;
                }
                3..=5 => {
                    let values = customer_values(rng);
                    let columns = "name, email, balance, tiny, small, medium, int_u, big_u, ratio, score, born, seen_at, updated_at, wake, since, kind, flags, active, mask, avatar, code, prefs, note";
                    let sets: Vec<String> = columns
                        .split(", ")
                        .zip(split_values(&values))
                        .map(|(c, v)| format!("{c} = {v}"))
                        .collect();
                    sql.push_str(&format!("UPDATE customers SET {} WHERE id = {target};\n", sets.join(", ")));
                }
                6 => sql.push_str(&format!("DELETE FROM customers WHERE id = {target};\n")),
                7 => {
                    // A key change: the row leaves its old key.
                    sql.push_str(&format!(
                        "UPDATE IGNORE customers SET id = {} WHERE id = {target};\n",
                        *next_id
                    ));
                    *next_id += 1;
                }
                8 => sql.push_str(&format!(
                    "INSERT INTO items VALUES ({target}, 'sku-{}', {}) ON DUPLICATE KEY UPDATE qty = qty + 1;\n",
                    rng.below(5),
                    rng.below(100)
                )),
                _ => sql.push_str(&format!(
                    "UPDATE items SET sku = CONCAT(sku, 'x') WHERE order_id = {target} LIMIT 1;\n"
                )),
            }
        }
        sql.push_str("COMMIT;\n");
    }
    sql
}

/// The comma-separated SQL literals of [`customer_values`], split
/// (commas inside quotes kept).
fn split_values(values: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut chars = values.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                current.push(c);
                if let Some(n) = chars.next() {
                    current.push(n);
                }
            }
            '\'' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => {
                out.push(current.trim().to_string());
                current.clear();
            }
            _ => current.push(c),
        }
    }
    out.push(current.trim().to_string());
    out
}

#[test]
fn a_typed_workload_reaches_the_sink_equal_to_mariadb_row_by_row() {
    let maria = server();
    let db = "weir_my_cdc";
    maria.fresh_db(db);
    maria.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0x5eed_4d61_7269_0001);
    maria.sql(db, &initial_load(400, &mut rng));
    let mut next_id = 400;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut pipeline = MyPipeline::new(&maria, &[&format!("{db}.*")], 5101);
    pipeline.chunk_rows = 150;
    pipeline.max_rows = 300;
    let file = pipeline.write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&file, &log);

    maria.sql(db, &workload(&mut rng, 300, &mut next_id));
    // A transaction bigger than a batch: handed on in pieces.
    let mut big = String::from("BEGIN;\n");
    for i in 0..1_200u64 {
        big.push_str(&format!(
            "INSERT INTO items VALUES ({}, 'bulk', {i});\n",
            1_000_000 + i
        ));
    }
    big.push_str("UPDATE customers SET note = 'in the big one' WHERE id < 50;\nCOMMIT;\n");
    maria.sql(db, &big);
    std::thread::sleep(Duration::from_millis(1500));
    interrupt(&mut child);
    assert!(
        child.wait().unwrap().success(),
        "the streaming run failed: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // The run streamed: what it committed last is a binlog position.
    let status = crate::common::status(&file);
    let positions = crate::common::positions_of(&status, "exact");
    let streamed = positions
        .values()
        .flatten()
        .filter(|p| p.first() == Some(&1))
        .count();
    assert_eq!(
        streamed, 2,
        "both tables should stand at a binlog position after streaming: {positions:?}"
    );

    // More while weir is stopped, then a run that drains to the binlog's end.
    maria.sql(db, &workload(&mut rng, 150, &mut next_id));
    let out = drain(&file);
    assert!(
        out.status.success(),
        "the draining run failed: {}",
        text(&out)
    );
    assert_sink_equals_server(&maria, &root, &tables(db));
}
