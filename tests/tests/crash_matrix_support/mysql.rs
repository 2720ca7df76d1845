//! The matrix's MySQL side, against the private MariaDB (scripts/mariadb):
//! pg.rs's schema in MariaDB's types (no floats, no JSON; every column has
//! one canonical text form in MariaDB and in every reader), a seeded
//! workload of inserts, updates, key changes and deletes in transactions
//! of several statements, now and then one bigger than any batch, and
//! MariaDB's own rows as the truth.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::holdings::{Row, TableShape, Truth};
use crate::common;
use crate::mysql_support::{Maria, PASSWORD, USER};
use crate::postgres_support::Rng;

/// The matrix's database: its own, so the MySQL tests beside it on the
/// same server (scripts/test runs them at once) touch none of its tables.
pub const DB: &str = "weir_matrix";

/// `lines` is a reserved word in MariaDB: the third table is
/// `transfer_lines`.
pub const SCHEMA: &str = "
CREATE TABLE accounts (
    id bigint PRIMARY KEY,
    name varchar(64) NOT NULL,
    balance decimal(12,2),
    active boolean,
    updated_at datetime(6)
) ENGINE=InnoDB;
CREATE TABLE transfers (
    id bigint PRIMARY KEY,
    account_id bigint NOT NULL,
    amount decimal(10,2) NOT NULL,
    note varchar(100)
) ENGINE=InnoDB;
CREATE TABLE transfer_lines (
    transfer_id bigint,
    line int,
    qty int NOT NULL,
    PRIMARY KEY (transfer_id, line)
) ENGINE=InnoDB;
";

/// The tables as the sinks name them (`db.table`), in name order.
pub const TABLES: [&str; 3] = [
    "weir_matrix.accounts",
    "weir_matrix.transfer_lines",
    "weir_matrix.transfers",
];

/// Rows a transaction bigger than any batch changes (the matrix's batches
/// hold 50 to 400 rows).
pub const BIG_TRANSACTION_ROWS: u64 = 600;

/// Each table's columns as the source delivers them, and SQL that reads a
/// column in the readers' canonical form (holdings.rs): integers and
/// decimals as MariaDB prints them (a decimal with every digit of its
/// scale), a `datetime(6)` as its microseconds since 1970 on the wall
/// clock (the source's Timestamp without a zone), a boolean as the
/// `tinyint(1)` it is (Int32).
fn columns(table: &str) -> (&'static [(&'static str, &'static str)], Vec<usize>) {
    const MICROS: &str =
        "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', updated_at) AS CHAR)";
    match table {
        "weir_matrix.accounts" => (
            &[
                ("id", "CAST(id AS CHAR)"),
                ("name", "name"),
                ("balance", "CAST(balance AS CHAR)"),
                ("active", "CAST(active AS CHAR)"),
                ("updated_at", MICROS),
            ],
            vec![0],
        ),
        "weir_matrix.transfers" => (
            &[
                ("id", "CAST(id AS CHAR)"),
                ("account_id", "CAST(account_id AS CHAR)"),
                ("amount", "CAST(amount AS CHAR)"),
                ("note", "note"),
            ],
            vec![0],
        ),
        "weir_matrix.transfer_lines" => (
            &[
                ("transfer_id", "CAST(transfer_id AS CHAR)"),
                ("line", "CAST(line AS CHAR)"),
                ("qty", "CAST(qty AS CHAR)"),
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

/// MariaDB's rows of every matrix table, in canonical form. (No value of
/// the workload is the text `NULL`, which the client prints as it prints
/// a null.)
pub fn truth(maria: &Maria) -> BTreeMap<String, Truth> {
    shapes()
        .into_iter()
        .map(|shape| {
            let (cols, _) = columns(&shape.name);
            let select: Vec<&str> = cols.iter().map(|(_, sql)| *sql).collect();
            let table = shape.name.split_once('.').unwrap().1;
            let sql = format!("SELECT {} FROM `{table}`", select.join(", "));
            let mut truth = Truth::default();
            for row in maria.rows(DB, &sql) {
                let row: Row = row;
                assert_eq!(
                    row.len(),
                    cols.len(),
                    "{}: a row of {} columns",
                    shape.name,
                    row.len()
                );
                truth.state.insert(shape.key_of(&row), row);
            }
            (shape.name, truth)
        })
        .collect()
}

/// The rows the backfill reads: `accounts` accounts, as many transfers with
/// two lines each (MariaDB's sequence engine counts).
pub fn initial_load(accounts: u64) -> String {
    format!(
        "INSERT INTO accounts SELECT seq, CONCAT('account ', seq), (seq % 5000) - 2500.25, seq % 3 = 0, \
         TIMESTAMP'2024-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_1_to_{accounts};\n\
         INSERT INTO transfers SELECT seq, 1 + seq % {accounts}, (seq % 900) + 0.5, CONCAT('transfer ', seq) \
         FROM seq_1_to_{accounts};\n\
         INSERT INTO transfer_lines SELECT t.seq, l.seq, l.seq FROM seq_1_to_{accounts} t, seq_1_to_2 l;\n"
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
                            "INSERT INTO accounts VALUES ({id}, 'new {id}', {}.{:02}, {}, NOW(6));\n\
                             INSERT INTO transfers VALUES ({id}, {existing}, {}.25, NULL);\n\
                             INSERT INTO transfer_lines VALUES ({id}, 1, {}), ({id}, 2, 1);\n",
                            self.rng.below(9000),
                            self.rng.below(100),
                            self.rng.chance(50),
                            self.rng.below(900),
                            self.rng.below(50)
                        )
                    }
                    2 => format!(
                        "UPDATE accounts SET balance = balance + 1, active = NOT active, updated_at = NOW(6) WHERE id = {existing};\n"
                    ),
                    3 => format!(
                        "UPDATE transfers SET amount = amount + 0.5, note = 'changed {}' WHERE id = {existing};\n",
                        self.rng.below(1000)
                    ),
                    4 => format!(
                        "UPDATE accounts SET name = 'renamed {}', balance = NULL WHERE id = {existing};\n",
                        self.rng.below(1000)
                    ),
                    5 => format!(
                        "DELETE FROM transfer_lines WHERE transfer_id = {existing};\n\
                         DELETE FROM transfers WHERE id = {existing};\n"
                    ),
                    6 => format!("DELETE FROM accounts WHERE id = {existing};\n"),
                    // A key change: the line moves to another number.
                    _ => format!(
                        "UPDATE transfer_lines SET line = line + 100, qty = qty + 1 WHERE transfer_id = {existing} AND line = 1;\n"
                    ),
                };
                sql.push_str(&statement);
            }
            sql.push_str("COMMIT;\n");
        }
        sql
    }

    /// One transaction bigger than any batch: an update of a run of
    /// [`BIG_TRANSACTION_ROWS`] account ids (fewer where some were
    /// deleted) and an insert, which the source hands on in pieces.
    pub fn big_transaction(&mut self) -> String {
        let span = self.next_id.saturating_sub(BIG_TRANSACTION_ROWS).max(1);
        let first = 1 + self.rng.below(span);
        let last = first + BIG_TRANSACTION_ROWS - 1;
        let id = self.next_id;
        self.next_id += 1;
        format!(
            "BEGIN;\n\
             UPDATE accounts SET balance = balance + 1, updated_at = NOW(6) WHERE id BETWEEN {first} AND {last};\n\
             INSERT INTO accounts VALUES ({id}, 'big {id}', 1.00, TRUE, NOW(6));\n\
             COMMIT;\n"
        )
    }
}

/// Writes the pipeline file of the MySQL source: the positioned fixture as
/// `exact` into `exact_root`, then `extra_sinks` (YAML list items);
/// `exit_when_caught_up` comes from WEIR_MY_EXIT (default false), so one
/// file serves the killed runs and the restarts that catch up.
pub fn pipeline(
    maria: &Maria,
    server_id: u32,
    dir: &Path,
    exact_root: &Path,
    extra_sinks: &str,
    max_rows: usize,
) -> PathBuf {
    let yaml = format!(
        "pipeline: matrix\nstate_dir: state\nsource:\n  mysql:\n    host: 127.0.0.1\n    port: {}\n    user: {USER}\n    password: {PASSWORD}\n    server_id: {server_id}\n    tables: [\"{DB}.*\"]\n    chunk_rows: 100\n    heartbeat_ms: 500\n    reconnect_timeout_ms: 30000\n    exit_when_caught_up: ${{WEIR_MY_EXIT:-false}}\nbatch: {{ max_rows: {max_rows}, linger_ms: 50, heartbeat_ms: 300 }}\nsinks:\n  - name: exact\n    plugin: {}\n    blob_store: {{ url: {} }}\n    retries: 1\n{extra_sinks}",
        maria.port,
        common::plugin("weir-fixture-positioned").display(),
        exact_root.display(),
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}
