//! What the MySQL source refuses, each with the sentence that says what
//! to change: missing privileges, tables it cannot read, server settings it
//! cannot work with, a binlog purged past the committed position, and DDL
//! on a table read while streaming (with `skip_transaction_at` as the way
//! past it). Nothing is committed past what was before the stop.

use std::path::Path;

use crate::common::{text, weir};
use crate::mysql_support::*;

fn run(pipeline: &Path) -> std::process::Output {
    weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_MY_EXIT", "true")],
    )
}

fn assert_refused(out: &std::process::Output, says: &[&str]) {
    assert!(
        !out.status.success(),
        "the run should have been refused: {}",
        text(out)
    );
    let all = text(out);
    for part in says {
        assert!(all.contains(part), "the refusal should say {part:?}: {all}");
    }
}

#[test]
fn each_missing_privilege_is_named() {
    let maria = server();
    let db = "weir_my_grants";
    maria.fresh_db(db);
    maria.sql(
        db,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT); INSERT INTO t VALUES (1, 1);",
    );
    let cases: [(&str, &str, &[&str]); 3] = [
        (
            "weir_noslave",
            "REPLICATION CLIENT, SELECT",
            &["REPLICATION SLAVE"],
        ),
        (
            "weir_noclient",
            "REPLICATION SLAVE, SELECT",
            &["REPLICATION CLIENT"],
        ),
        (
            "weir_noselect",
            "REPLICATION SLAVE, REPLICATION CLIENT",
            &["SELECT", "weir_my_grants.t"],
        ),
    ];
    for (user, grants, says) in cases {
        maria.sql(
            "",
            &format!(
                "DROP USER IF EXISTS '{user}'@'127.0.0.1';\n\
                 CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{user}';\n\
                 GRANT {grants} ON *.* TO '{user}'@'127.0.0.1';"
            ),
        );
        let dir = tempfile::tempdir().unwrap();
        let mut pipeline = MyPipeline::new(&maria, &[&format!("{db}.t")], 5201);
        pipeline.user = user.into();
        let file = pipeline.write(dir.path(), &dir.path().join("exact"));
        assert_refused(&run(&file), says);
    }
}

#[test]
fn tables_it_cannot_read_are_refused_naming_table_and_column() {
    let maria = server();
    let db = "weir_my_refusals";
    maria.fresh_db(db);
    maria.sql(
        db,
        "CREATE TABLE keyless (a INT, b INT);\n\
         CREATE TABLE nullable_unique (a INT, b INT, UNIQUE KEY (a));\n\
         CREATE TABLE places (id INT PRIMARY KEY, at POINT);\n\
         INSERT INTO keyless VALUES (1, 2), (3, 4);",
    );
    let refused = [
        (
            "keyless",
            vec!["keyless", "no primary key", "source.mysql.keys"],
        ),
        ("nullable_unique", vec!["nullable_unique", "no primary key"]),
        ("places", vec!["places", "`at`", "spatial"]),
        ("missing", vec!["tables[0]", "matches no table"]),
    ];
    for (table, says) in refused {
        let dir = tempfile::tempdir().unwrap();
        let pipeline = MyPipeline::new(&maria, &[&format!("{db}.{table}")], 5202);
        let file = pipeline.write(dir.path(), &dir.path().join("exact"));
        assert_refused(&run(&file), &says);
    }

    // A value the backfill cannot convert stops the run naming the table,
    // the column and the row's key (both key columns), and the sink holds
    // nothing of the chunk it was in.
    maria.sql(
        db,
        "SET SESSION sql_mode = '';\n\
         CREATE TABLE zero_dates (id INT, code VARCHAR(8), at DATETIME NOT NULL, \
           PRIMARY KEY (id, code));\n\
         INSERT INTO zero_dates VALUES (1, 'a', '2024-01-01 00:00:00'), \
           (2, 'b\\'q', '0000-00-00 00:00:00');",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = MyPipeline::new(&maria, &[&format!("{db}.zero_dates")], 5205);
    let file = pipeline.write(dir.path(), &root);
    assert_refused(
        &run(&file),
        &[
            &format!("{db}.zero_dates, column `at`, backfill row with key 2, 'b'q'"),
            "zero date",
        ],
    );
    let empty = MyTable::new(
        db,
        "zero_dates",
        &[
            ("id", Canon::Int),
            ("code", Canon::Text),
            ("at", Canon::DateTime),
        ],
        &[0, 1],
    );
    assert!(
        empty.sink_rows(&root).0.is_empty(),
        "the sink holds rows of the refused chunk"
    );

    // Named key columns let the keyless table in.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut pipeline = MyPipeline::new(&maria, &[&format!("{db}.keyless")], 5203);
    pipeline.extra_source = format!("    keys: {{ {db}.keyless: [a] }}\n");
    let file = pipeline.write(dir.path(), &root);
    let out = run(&file);
    assert!(out.status.success(), "with keys named: {}", text(&out));
    let keyless = MyTable::new(db, "keyless", &[("a", Canon::Int), ("b", Canon::Int)], &[0]);
    assert_sink_equals_server(&maria, &root, &[keyless]);
}

#[test]
fn ddl_on_a_table_read_stops_the_run_and_skip_transaction_at_goes_past_it() {
    let maria = server();
    let db = "weir_my_ddl";
    maria.fresh_db(db);
    maria.sql(
        db,
        "CREATE TABLE orders (id INT PRIMARY KEY, amount INT);\n\
         CREATE TABLE other (id INT PRIMARY KEY);\n\
         INSERT INTO orders VALUES (1, 10), (2, 20);",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut pipeline = MyPipeline::new(&maria, &[&format!("{db}.orders")], 5204);
    let file = pipeline.write(dir.path(), &root);
    let out = run(&file);
    assert!(out.status.success(), "the first run: {}", text(&out));

    // DDL on a table not read passes; on a table read, it stops the run.
    maria.sql(
        db,
        "ALTER TABLE other ADD COLUMN x INT; INSERT INTO orders VALUES (3, 30);",
    );
    let (file_name, truncate_at) = maria.master_status();
    maria.sql(
        db,
        "TRUNCATE TABLE orders; INSERT INTO orders VALUES (4, 40);",
    );
    let out = run(&file);
    assert_refused(
        &out,
        &[
            "TRUNCATE TABLE orders",
            "weir_my_ddl.orders",
            "(GTID 0-1-",
            "skip_transaction_at",
        ],
    );
    // The stop names where the TRUNCATE starts, as skip_transaction_at
    // takes it (other tests write to the same binlog meanwhile: at or
    // after where it stood before the statement).
    let said = text(&out);
    let at = said
        .split("skip_transaction_at: \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a position to skip at")
        .to_string();
    let (named_file, offset) = at.rsplit_once(':').unwrap();
    assert!(
        named_file > file_name.as_str()
            || (named_file == file_name && offset.parse::<u64>().unwrap() >= truncate_at),
        "{at} lies before the TRUNCATE ({file_name}:{truncate_at})"
    );
    let orders = MyTable::new(
        db,
        "orders",
        &[("id", Canon::Int), ("amount", Canon::Int)],
        &[0],
    );
    let (before, _) = orders.sink_rows(&root);
    assert!(
        !before.contains_key(&vec![Some("4".to_string())]),
        "nothing after the TRUNCATE may be committed"
    );

    // Skipped: the TRUNCATE reaches no sink (the rows before it stay
    // there until the operator removes them by hand), what follows does.
    pipeline.extra_source = format!("    skip_transaction_at: \"{at}\"\n");
    let file = pipeline.write(dir.path(), &root);
    let out = run(&file);
    assert!(
        out.status.success(),
        "the run past the TRUNCATE: {}",
        text(&out)
    );
    let (after, duplicates) = orders.sink_rows(&root);
    assert_eq!(duplicates, 0);
    let keys: Vec<String> = after.keys().map(|k| k[0].clone().unwrap()).collect();
    assert_eq!(keys, ["1", "2", "3", "4"]);
}
