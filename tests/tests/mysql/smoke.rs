//! The private server itself: it answers, logs rows in full, and text with
//! the characters the client escapes (and NULL) reads back as written.

use crate::mysql_support;

#[test]
fn the_private_server_answers_and_round_trips_text() {
    let maria = mysql_support::server();
    assert_eq!(
        maria.url(),
        format!("mysql://weir:weir@127.0.0.1:{}/", maria.port)
    );
    assert_eq!(
        maria.rows(
            "",
            "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata"
        ),
        vec![vec![
            Some("1".to_string()),
            Some("ROW".to_string()),
            Some("FULL".to_string()),
            Some("FULL".to_string()),
        ]]
    );

    let db = "weir_smoke";
    maria.fresh_db(db);
    let (file, before) = maria.master_status();
    maria.sql(
        db,
        "CREATE TABLE t (id INT PRIMARY KEY, body TEXT, note VARCHAR(20) NULL, raw VARBINARY(8));\n\
         INSERT INTO t VALUES (1, CONCAT('a', CHAR(9), 'b', CHAR(10), 'c\\\\d ✓ é'), NULL, X'00ff');\n\
         INSERT INTO t VALUES (2, '', 'plain', NULL);",
    );
    let rows = maria.rows(db, "SELECT id, body, note, HEX(raw) FROM t ORDER BY id");
    assert_eq!(
        rows,
        vec![
            vec![
                Some("1".to_string()),
                Some("a\tb\nc\\d ✓ é".to_string()),
                None,
                Some("00FF".to_string()),
            ],
            vec![
                Some("2".to_string()),
                Some(String::new()),
                Some("plain".to_string()),
                None,
            ],
        ]
    );
    assert_eq!(maria.value(db, "SELECT COUNT(*) FROM t"), "2");

    // The writes went into the binary log.
    let (file_after, after) = maria.master_status();
    assert!(
        file_after > file || after > before,
        "the binary log did not grow: {file}:{before} then {file_after}:{after}"
    );

    // A failing statement is an error, and the ones after it do not run.
    let err = maria
        .try_sql(
            db,
            "SELECT * FROM missing;\nINSERT INTO t VALUES (3, 'x', 'y', NULL);",
        )
        .unwrap_err();
    assert!(err.contains("missing"), "{err}");
    assert_eq!(maria.value(db, "SELECT COUNT(*) FROM t"), "2");
}
