//! Unchanged TOAST values against a real server (scripts/pg): pgoutput
//! leaves out a TOASTed column an update did not change, and the source
//! reads it by key after the transaction. The value must arrive whatever the
//! sessions' time zones, and a row that is gone by the time it is read must
//! never produce a change carrying a null that never existed.

use crate::common;
use crate::postgres_support;

use arrow_array::cast::AsArray;
use postgres_support::*;
use weir_source::change::Value;
use weir_source::postgres::decode::PgKind;

/// About 22 KB of text: stored out of line (the columns below are
/// `STORAGE EXTERNAL`), so pgoutput sends it as "unchanged" when an update
/// leaves it alone.
const BIG_BODY: &str =
    "(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 700) g)";

/// Every change the positioned sink received for `table`, in position
/// order: the operation and the values of `columns`.
fn change_log(root: &std::path::Path, table: &str, columns: &[&str]) -> Vec<(String, Vec<Value>)> {
    let mut log = Vec::new();
    for batch in common::read_positioned(root, table) {
        if batch.num_rows() == 0 {
            continue;
        }
        let ops = batch
            .column_by_name("__op")
            .expect("__op")
            .as_string::<i32>()
            .clone();
        let pos = batch
            .column_by_name("__pos")
            .expect("__pos")
            .as_binary::<i32>()
            .clone();
        for row in 0..batch.num_rows() {
            let values = columns
                .iter()
                .map(|c| common::value_at(batch.column_by_name(c).expect("column").as_ref(), row))
                .collect();
            log.push((pos.value(row).to_vec(), ops.value(row).to_string(), values));
        }
    }
    log.sort_by(|a, b| a.0.cmp(&b.0));
    log.into_iter().map(|(_, op, v)| (op, v)).collect()
}

/// Drops a test's database and slot when the test ends, passed or not: the
/// cluster has a fixed number of replication slots.
struct DropAfter<'a> {
    pg: &'a Pg,
    db: &'static str,
}

impl Drop for DropAfter<'_> {
    fn drop(&mut self) {
        let db = self.db;
        let _ = self.pg.try_sql(
            "weir",
            &format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = '{db}' AND active_pid IS NOT NULL;\n\
                 SELECT pg_sleep(0.5);\n\
                 SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{db}';\n\
                 DROP DATABASE IF EXISTS {db} WITH (FORCE);"
            ),
        );
    }
}

#[test]
fn a_timestamptz_key_in_a_non_utc_database_still_gets_its_unchanged_toast_value() {
    let pg = cluster();
    let db = "weir_toast_tz";
    pg.fresh_db(db);
    let _cleanup = DropAfter { pg: &pg, db };
    // Sessions that set nothing render timestamptz at +05:30 here; the
    // source's own sessions may pin another zone, and the DSN asks for a
    // third: the look-up must not depend on how a key is printed.
    pg.sql(
        "weir",
        &format!("ALTER DATABASE {db} SET timezone TO 'Asia/Kolkata';"),
    );
    pg.sql(
        db,
        &format!(
            "CREATE TABLE events (at timestamptz PRIMARY KEY, title text NOT NULL, body text);\n\
             ALTER TABLE events ALTER COLUMN body SET STORAGE EXTERNAL;\n\
             INSERT INTO events SELECT timestamptz '2024-03-01 00:00:00.123456+00' + g * interval '1 hour 7 minutes', \
             'title ' || g, {BIG_BODY} FROM generate_series(1, 20) g;"
        ),
    );
    let dsn = format!("{} options='-c TimeZone=America/St_Johns'", pg.dsn(db));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let pipeline = PgPipeline::new(&dsn, &["public.events"]).write(dir.path(), &root);
    drain(&pipeline);

    // Title-only updates: the body is left out of the stream.
    pg.sql(db, "UPDATE events SET title = title || ' changed';");
    pg.sql(
        db,
        "BEGIN; UPDATE events SET title = 'again' WHERE at = (SELECT min(at) FROM events); COMMIT;",
    );
    drain(&pipeline);

    let log = change_log(&root, "public.events", &["title", "body"]);
    let updates: Vec<_> = log.iter().filter(|(op, _)| op == "update").collect();
    // A batch may fold two updates of one key into the last.
    assert!(
        updates.len() >= 20,
        "every row's update reached the sink: {}",
        updates.len()
    );
    let nulls = updates.iter().filter(|(_, v)| v[1] == Value::Null).count();
    assert_eq!(
        nulls,
        0,
        "{nulls} of {} updates carried a null body that Postgres never held",
        updates.len()
    );
    let def = TableDef::new(
        "public.events",
        &[
            ("at", PgKind::TimestampTz),
            ("title", PgKind::Text),
            ("body", PgKind::Text),
        ],
        &[0],
    );
    assert_sink_equals_postgres(&pg, db, &root, &[def]);
}

#[test]
fn a_row_gone_before_its_toast_look_up_never_yields_a_null_that_never_existed() {
    let pg = cluster();
    let db = "weir_toast_gone";
    let dsn = pg.fresh_db(db);
    let _cleanup = DropAfter { pg: &pg, db };
    pg.sql(
        db,
        &format!(
            "CREATE TABLE docs (id int4 PRIMARY KEY, title text NOT NULL, body text);\n\
             ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;\n\
             INSERT INTO docs SELECT g, 'title ' || g, {BIG_BODY} FROM generate_series(1, 10) g;\n\
             CREATE TABLE notes (id int4 PRIMARY KEY, title text NOT NULL, body text);\n\
             ALTER TABLE notes ALTER COLUMN body SET STORAGE EXTERNAL;\n\
             INSERT INTO notes SELECT g, 'title ' || g, {BIG_BODY} FROM generate_series(1, 4) g;"
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("exact");
    let mut p = PgPipeline::new(&dsn, &["public.docs", "public.notes"]);
    p.extra_top = "tables:\n  public.notes: { mode: append }\n".into();
    // One change per batch: a batch folds an update into a later delete of
    // its key, which would hide the update's null from the change log.
    p.max_rows = 1;
    let pipeline = p.write(dir.path(), &root);
    drain(&pipeline);

    // weir is stopped (lagging): each row's body is left unchanged by an
    // update, then the row goes in a later transaction, before weir reads it.
    pg.sql(
        db,
        "UPDATE docs SET title = 'renamed ' || id WHERE id <= 6;\n\
         UPDATE notes SET title = 'renamed ' || id WHERE id <= 2;\n\
         DELETE FROM docs WHERE id IN (1, 2);\n\
         UPDATE docs SET id = id + 100, title = 'moved' WHERE id = 3;\n\
         BEGIN; UPDATE docs SET title = 'same transaction' WHERE id = 4; DELETE FROM docs WHERE id = 4; COMMIT;\n\
         DELETE FROM notes WHERE id = 1;\n\
         UPDATE notes SET id = 102 WHERE id = 2;",
    );
    let out = common::weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_PG_EXIT", "true"), ("WEIR_LOG", "info,weir=debug")],
    );
    let said = common::text(&out);
    assert!(out.status.success(), "the draining run failed: {said}");

    // Upsert table: no change carries a null body, and it ends equal.
    let log = change_log(&root, "public.docs", &["id", "title", "body"]);
    let nulled: Vec<_> = log
        .iter()
        .filter(|(op, v)| op != "delete" && v[2] == Value::Null)
        .map(|(op, v)| format!("{op} {:?} {:?}", v[0], v[1]))
        .collect();
    assert!(
        nulled.is_empty(),
        "changes with a null body Postgres never held: {nulled:?}"
    );
    let def = |name: &str| {
        TableDef::new(
            name,
            &[
                ("id", PgKind::Int32),
                ("title", PgKind::Text),
                ("body", PgKind::Text),
            ],
            &[0],
        )
    };
    assert_sink_equals_postgres(&pg, db, &root, &[def("public.docs")]);
    // The updates of rows still there (5, 6, 103) arrived with their bodies.
    let kept = log
        .iter()
        .filter(|(op, v)| op == "update" && v[2] != Value::Null)
        .count();
    assert!(kept >= 3, "updates of live rows arrived: {log:?}");
    assert!(
        said.contains("row gone before its TOAST look-up"),
        "the dropped updates are logged: {said}"
    );

    // Append table (a change log), as docs/postgres.md says: an update of
    // a row gone by its look-up is kept (the log records that it happened),
    // its left-out column null, and a warning says so. The update that moved
    // row 2 to key 102 found its row and carries the body.
    let notes = change_log(&root, "public.notes", &["id", "title", "body"]);
    let updates: Vec<(String, bool)> = notes
        .iter()
        .filter(|(op, _)| op == "update")
        .map(|(_, v)| (format!("{:?} {:?}", v[0], v[1]), v[2] == Value::Null))
        .collect();
    assert_eq!(
        updates,
        vec![
            (r#"Int32(1) Utf8("renamed 1")"#.to_string(), true),
            (r#"Int32(2) Utf8("renamed 2")"#.to_string(), true),
            (r#"Int32(102) Utf8("renamed 2")"#.to_string(), false),
        ],
        "{notes:?}"
    );
    assert!(
        said.contains("public.notes") && said.contains("left out as null"),
        "a warning names the table and the null: {said}"
    );
}
