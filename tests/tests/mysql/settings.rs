//! Server settings the MySQL source cannot work with, each refused with
//! the sentence that says what to set, and a binlog purged past the
//! committed position, which stops the run naming both rather than leave
//! a gap. These change the server's global settings and purge its binlog:
//! nextest runs this test alone (.config/nextest.toml).

use std::path::Path;

use crate::common::{text, weir};
use crate::mysql_support::*;

fn run(pipeline: &Path) -> std::process::Output {
    weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_MY_EXIT", "true")],
    )
}

/// Sets a global variable back when dropped, also when the test fails.
struct Restore<'a> {
    maria: &'a Maria,
    statement: String,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        self.maria.sql("", &self.statement);
    }
}

#[test]
fn settings_it_cannot_work_with_are_refused_and_a_purged_binlog_stops_the_run() {
    let maria = server();
    let db = "weir_my_settings";
    maria.fresh_db(db);
    maria.sql(
        db,
        "CREATE TABLE t (id INT PRIMARY KEY, v INT); INSERT INTO t VALUES (1, 1);",
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let file = MyPipeline::new(&maria, &[&format!("{db}.t")], 5301).write(dir.path(), &root);
    let out = run(&file);
    assert!(out.status.success(), "the first run: {}", text(&out));

    let cases = [
        (
            "binlog_format",
            "STATEMENT",
            "ROW",
            "binlog_format is STATEMENT",
        ),
        (
            "binlog_row_image",
            "MINIMAL",
            "FULL",
            "binlog_row_image is MINIMAL",
        ),
        (
            "binlog_row_metadata",
            "MINIMAL",
            "FULL",
            "binlog_row_metadata is MINIMAL",
        ),
    ];
    for (variable, wrong, right, says) in cases {
        maria.sql("", &format!("SET GLOBAL {variable} = '{wrong}'"));
        let restore = Restore {
            maria: &maria,
            statement: format!("SET GLOBAL {variable} = '{right}'"),
        };
        let out = run(&file);
        assert!(
            !out.status.success(),
            "{variable}={wrong} should be refused: {}",
            text(&out)
        );
        assert!(
            text(&out).contains(says),
            "the refusal should say {says:?}: {}",
            text(&out)
        );
        drop(restore);
    }

    // A change the sink has not committed, then its binlog file purged.
    maria.sql(db, "INSERT INTO t VALUES (2, 2);");
    let (before, _) = maria.master_status();
    maria.sql("", "FLUSH BINARY LOGS; FLUSH BINARY LOGS;");
    let (now, _) = maria.master_status();
    // The server keeps a file until its binlog checkpoint has passed it,
    // which happens a moment after the rotation.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        maria.sql("", &format!("PURGE BINARY LOGS TO '{now}'"));
        let oldest = maria.rows("", "SHOW BINARY LOGS")[0][0].clone().unwrap();
        if oldest == now {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server kept {oldest} (purging to {now})"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = run(&file);
    assert!(
        !out.status.success(),
        "a purged binlog should stop the run: {}",
        text(&out)
    );
    let said = text(&out);
    assert!(
        said.contains("no longer on the server") && said.contains(&now),
        "the stop should name the missing file's number and the oldest left ({now}): {said}"
    );
    let number = before.rsplit('.').next().unwrap().trim_start_matches('0');
    assert!(
        said.contains(&format!("numbered {number} ")),
        "the stop should name file {before}: {said}"
    );
    let table = MyTable::new(db, "t", &[("id", Canon::Int), ("v", Canon::Int)], &[0]);
    let (rows, _) = table.sink_rows(&root);
    assert_eq!(rows.len(), 1, "nothing may be committed past the stop");
}
