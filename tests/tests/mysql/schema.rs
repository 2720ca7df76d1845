//! Schema changes while the MySQL source streams: a column added at the end
//! reaches the sinks (rows from before it read null there, as MariaDB says),
//! whether it was added while weir ran or while it was stopped with changes
//! before and after it still to read; any other change of a table's shape
//! stops the run naming the table and the change, with nothing committed
//! past it.

use std::path::Path;
use std::time::Duration;

use crate::common::{text, weir};
use crate::mysql_support::*;

fn drain_ok(file: &Path) {
    let out = drain(file);
    assert!(
        out.status.success(),
        "the draining run failed: {}",
        text(&out)
    );
}

fn orders(db: &str, with_note: bool) -> MyTable {
    let mut columns = vec![
        ("id", Canon::Int),
        ("amount", Canon::Decimal(2)),
        ("status", Canon::Text),
    ];
    if with_note {
        columns.push(("note", Canon::Text));
        columns.push(("seen", Canon::DateTime));
    }
    MyTable::new(db, "orders", &columns, &[0])
}

#[test]
fn columns_added_at_the_end_reach_the_sinks_while_running_and_while_stopped() {
    let maria = server();
    let db = "weir_my_add_column";
    maria.fresh_db(db);
    maria.sql(
        db,
        "CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(8,2), status VARCHAR(10));\n\
         INSERT INTO orders SELECT seq, seq * 1.5, 'new' FROM seq_1_to_200;",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let file = MyPipeline::new(&maria, &[&format!("{db}.orders")], 5401).write(dir.path(), &root);
    let log = dir.path().join("weir.log");
    let mut child = spawn_weir(&file, &log);

    // While weir streams: changes, the ADD COLUMN, changes that set it.
    maria.sql(db, "UPDATE orders SET status = 'paid' WHERE id % 3 = 0;");
    maria.sql(db, "ALTER TABLE orders ADD COLUMN note VARCHAR(20);");
    maria.sql(
        db,
        "UPDATE orders SET note = CONCAT('n', id) WHERE id % 4 = 0;\n\
         INSERT INTO orders VALUES (1000, 1.25, 'new', 'added after');",
    );
    std::thread::sleep(Duration::from_millis(1500));
    interrupt(&mut child);
    assert!(
        child.wait().unwrap().success(),
        "the streaming run failed: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // While stopped: changes before another ADD COLUMN and after it, all
    // read by the next run with the table's shape of now.
    maria.sql(
        db,
        "UPDATE orders SET status = 'late' WHERE id % 5 = 0;\n\
         INSERT INTO orders VALUES (1001, 2.5, 'new', NULL);\n\
         ALTER TABLE orders ADD COLUMN seen DATETIME(6);\n\
         UPDATE orders SET seen = '2024-01-02 03:04:05.000006' WHERE id % 7 = 0;\n\
         DELETE FROM orders WHERE id = 14;",
    );
    drain_ok(&file);
    assert_sink_equals_server(&maria, &root, &[orders(db, true)]);
    let (rows, _) = orders(db, true).sink_rows(&root);
    assert_eq!(
        rows[&vec![Some("1000".to_string())]][3].as_deref(),
        Some("added after")
    );
}

#[test]
fn other_changes_of_shape_stop_the_run_naming_the_change() {
    let maria = server();
    // (case, DDL, what the stop says when weir streams, and when it was stopped)
    let cases: [(&str, &str, &[&str], &[&str]); 6] = [
        (
            "drop",
            "ALTER TABLE orders DROP COLUMN status",
            &["column `status` was dropped"],
            &["changed while weir was stopped", "status"],
        ),
        (
            "drop_last",
            "ALTER TABLE orders DROP COLUMN status",
            &["column `status` was dropped"],
            &["changed while weir was stopped", "status"],
        ),
        (
            "type",
            "ALTER TABLE orders MODIFY amount DECIMAL(10,3)",
            &["`amount`", "its type was changed"],
            &[
                "changed while weir was stopped",
                "Decimal { precision: 10, scale: 3 }",
            ],
        ),
        (
            "middle",
            "ALTER TABLE orders ADD COLUMN x INT AFTER id",
            &["(id, x, amount, status"],
            &["changed while weir was stopped", "x Int"],
        ),
        (
            "rename",
            "ALTER TABLE orders RENAME TO orders_old",
            &["RENAME TO orders_old", "skip_transaction_at"],
            &["matches no table"],
        ),
        (
            "drop_table",
            "DROP TABLE orders",
            &["DROP TABLE `orders`", "skip_transaction_at"],
            &["matches no table"],
        ),
    ];
    let mut server_id = 5410;
    for (case, ddl, streaming_says, stopped_says) in cases {
        for streaming in [true, false] {
            server_id += 1;
            let db = format!(
                "weir_my_shape_{case}_{}",
                if streaming { "live" } else { "later" }
            );
            maria.fresh_db(&db);
            let last = if case == "drop_last" {
                ""
            } else {
                ", extra INT"
            };
            maria.sql(
                &db,
                &format!(
                    "CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(8,2), status VARCHAR(10){last});\n\
                     INSERT INTO orders (id, amount, status) VALUES (1, 1.5, 'new'), (2, 2.5, 'new');"
                ),
            );
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("exact");
            let file = MyPipeline::new(&maria, &[&format!("{db}.orders")], server_id)
                .write(dir.path(), &root);
            drain_ok(&file);
            let log = dir.path().join("weir.log");
            let mut child = streaming.then(|| spawn_weir(&file, &log));
            if streaming {
                // Let it connect to the binlog first.
                std::thread::sleep(Duration::from_millis(700));
            }
            maria.sql(&db, &format!("{ddl};"));
            if !matches!(case, "rename" | "drop_table") {
                maria.sql(&db, "INSERT INTO orders (id, amount) VALUES (3, 3.5);");
            }
            let (said, says) = match child.as_mut() {
                Some(child) => {
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    while child.try_wait().unwrap().is_none()
                        && std::time::Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    interrupt(child);
                    let status = child.wait().unwrap();
                    let said = std::fs::read_to_string(&log).unwrap_or_default();
                    assert!(
                        !status.success(),
                        "{db}: `{ddl}` should stop the run: {said}"
                    );
                    (said, streaming_says)
                }
                None => {
                    let out = weir(
                        &["run", file.to_str().unwrap()],
                        &[("WEIR_MY_EXIT", "true")],
                    );
                    assert!(
                        !out.status.success(),
                        "{db}: `{ddl}` should stop the run: {}",
                        text(&out)
                    );
                    (text(&out), stopped_says)
                }
            };
            for part in says
                .iter()
                .copied()
                .chain([format!("{db}.orders").as_str()])
            {
                assert!(
                    said.contains(part),
                    "{db}: the stop should say {part:?}: {said}"
                );
            }
            let table = MyTable::new(&db, "orders", &[("id", Canon::Int)], &[0]);
            let (rows, _) = table.sink_rows(&root);
            assert_eq!(
                rows.len(),
                2,
                "{db}: nothing after the change may be committed"
            );
        }
    }
}
