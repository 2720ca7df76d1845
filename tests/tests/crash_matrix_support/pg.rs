//! The matrix's Postgres side: a small schema whose every column has one
//! canonical text form in Postgres and in every reader (no arrays, no
//! floats), a seeded workload of inserts, updates, key changes and deletes,
//! and Postgres' own rows as the truth.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use weir_source::postgres::decode::copy_fields;

use super::holdings::{Row, TableShape, Truth};
use crate::postgres_support::{Pg, Rng};

pub const SCHEMA: &str = "
CREATE SCHEMA mx;
CREATE TABLE mx.accounts (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    balance numeric(12,2),
    active boolean,
    updated_at timestamptz
);
CREATE TABLE mx.transfers (
    id bigint PRIMARY KEY,
    account_id bigint NOT NULL,
    amount numeric(10,2) NOT NULL,
    note text
);
CREATE TABLE mx.lines (
    transfer_id bigint,
    line int4,
    qty int4 NOT NULL,
    PRIMARY KEY (transfer_id, line)
);
";

pub const TABLES: [&str; 3] = ["mx.accounts", "mx.lines", "mx.transfers"];

/// Each table's columns as the source delivers them, and SQL that reads a
/// column in the readers' canonical form.
fn columns(table: &str) -> (&'static [(&'static str, &'static str)], Vec<usize>) {
    match table {
        "mx.accounts" => (
            &[
                ("id", "id::text"),
                ("name", "name"),
                ("balance", "balance::text"),
                ("active", "active::text"),
                (
                    "updated_at",
                    "(extract(epoch from updated_at) * 1000000)::bigint::text",
                ),
            ],
            vec![0],
        ),
        "mx.transfers" => (
            &[
                ("id", "id::text"),
                ("account_id", "account_id::text"),
                ("amount", "amount::text"),
                ("note", "note"),
            ],
            vec![0],
        ),
        "mx.lines" => (
            &[
                ("transfer_id", "transfer_id::text"),
                ("line", "line::text"),
                ("qty", "qty::text"),
            ],
            vec![0, 1],
        ),
        other => panic!("no table {other} in the matrix schema"),
    }
}

pub fn shapes() -> Vec<TableShape> {
    TABLES
        .iter()
        .map(|t| {
            let (cols, key) = columns(t);
            TableShape {
                name: t.to_string(),
                columns: cols.iter().map(|(n, _)| n.to_string()).collect(),
                key,
            }
        })
        .collect()
}

/// Postgres' rows of every matrix table, in canonical form.
pub fn truth(pg: &Pg, db: &str) -> BTreeMap<String, Truth> {
    shapes()
        .into_iter()
        .map(|shape| {
            let (cols, _) = columns(&shape.name);
            let select: Vec<&str> = cols.iter().map(|(_, sql)| *sql).collect();
            let sql = format!(
                "COPY (SELECT {} FROM {}) TO STDOUT",
                select.join(", "),
                shape.name
            );
            let out = Command::new("psql")
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &pg.dsn(db), "-c", &sql])
                .env("PGOPTIONS", "-c TimeZone=UTC")
                .stderr(Stdio::inherit())
                .output()
                .expect("psql runs");
            assert!(out.status.success(), "reading {} failed", shape.name);
            let mut truth = Truth::default();
            for line in out.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let row: Row = copy_fields(line)
                    .unwrap_or_else(|e| panic!("{}: {e}", shape.name))
                    .into_iter()
                    .collect();
                truth.state.insert(shape.key_of(&row), row);
            }
            (shape.name, truth)
        })
        .collect()
}

/// The rows the backfill reads: `accounts` accounts, as many transfers with
/// two lines each.
pub fn initial_load(accounts: u64) -> String {
    format!(
        "INSERT INTO mx.accounts SELECT g, 'account ' || g, (g % 5000) - 2500.25, g % 3 = 0, \
         timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' FROM generate_series(1, {accounts}) g;\n\
         INSERT INTO mx.transfers SELECT g, 1 + g % {accounts}, (g % 900) + 0.5, 'transfer ' || g \
         FROM generate_series(1, {accounts}) g;\n\
         INSERT INTO mx.lines SELECT t, l, l FROM generate_series(1, {accounts}) t, generate_series(1, 2) l;\n"
    )
}

/// Writes seeded transactions; ids above `accounts` are new.
pub struct Workload {
    rng: Rng,
    next_id: u64,
}

impl Workload {
    pub fn new(seed: u64, accounts: u64) -> Self {
        Workload {
            rng: Rng::seeded(seed),
            next_id: accounts + 1,
        }
    }

    /// `n` transactions of one to four statements each.
    pub fn transactions(&mut self, n: usize) -> String {
        let mut sql = String::new();
        for _ in 0..n {
            sql.push_str("BEGIN;\n");
            for _ in 0..1 + self.rng.below(4) {
                let existing = 1 + self.rng.below(self.next_id - 1);
                let statement = match self.rng.below(8) {
                    0 | 1 => {
                        let id = self.next_id;
                        self.next_id += 1;
                        format!(
                            "INSERT INTO mx.accounts VALUES ({id}, 'new {id}', {}.{:02}, {}, now());\n\
                             INSERT INTO mx.transfers VALUES ({id}, {existing}, {}.25, NULL);\n\
                             INSERT INTO mx.lines VALUES ({id}, 1, {}), ({id}, 2, 1);\n",
                            self.rng.below(9000),
                            self.rng.below(100),
                            self.rng.chance(50),
                            self.rng.below(900),
                            self.rng.below(50)
                        )
                    }
                    2 => format!(
                        "UPDATE mx.accounts SET balance = balance + 1, active = NOT active, updated_at = now() WHERE id = {existing};\n"
                    ),
                    3 => format!(
                        "UPDATE mx.transfers SET amount = amount + 0.5, note = 'changed {}' WHERE id = {existing};\n",
                        self.rng.below(1000)
                    ),
                    4 => format!(
                        "UPDATE mx.accounts SET name = 'renamed {}', balance = NULL WHERE id = {existing};\n",
                        self.rng.below(1000)
                    ),
                    5 => format!(
                        "DELETE FROM mx.lines WHERE transfer_id = {existing};\n\
                         DELETE FROM mx.transfers WHERE id = {existing};\n"
                    ),
                    6 => format!("DELETE FROM mx.accounts WHERE id = {existing};\n"),
                    // A key change: the line moves to another number.
                    _ => format!(
                        "UPDATE mx.lines SET line = line + 100, qty = qty + 1 WHERE transfer_id = {existing} AND line = 1;\n"
                    ),
                };
                sql.push_str(&statement);
            }
            sql.push_str("COMMIT;\n");
        }
        sql
    }
}
