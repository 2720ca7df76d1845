//! The Redis sink against a real redis-server, through the native runner.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use weir_sdk::arrow_array::types::Int32Type;
use weir_sdk::arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, ListArray, StringArray, TimestampMicrosecondArray,
};
use weir_sdk::{Committed, MetadataColumn, SinkError};

const ORDERS: &str = "public.orders";

fn ids(values: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(values.to_vec()))
}

fn names(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

fn orders(id: &[i64], name: &[Option<&str>], ops: &[&str]) -> weir_sdk::RecordBatch {
    rows(vec![("id", ids(id)), ("name", names(name))], ops)
}

fn at(position: u8, epoch: u64) -> Committed {
    Committed {
        position: vec![position],
        epoch,
    }
}

#[test]
fn upserts_replace_the_hash_and_deletes_remove_it() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let table = upsert_table(ORDERS, &["id"]);

    write(
        &mut sink,
        &table,
        "b1",
        &orders(&[1, 2], &[Some("ann"), Some("bob")], &["insert", "read"]),
    )
    .unwrap();
    // Nothing is visible before the commit.
    assert!(keys(&mut con).is_empty());
    commit(&mut sink, ORDERS, &[1], 1).unwrap();
    assert_eq!(
        hash(&mut con, "weir:public.orders:1"),
        map(&[("id", "1"), ("name", "ann")])
    );
    assert_eq!(
        hash(&mut con, "weir:public.orders:2"),
        map(&[("id", "2"), ("name", "bob")])
    );

    // An update whose column became null drops the old field; a delete
    // removes the hash; deleting a key that is not there is fine.
    write(
        &mut sink,
        &table,
        "b2",
        &orders(
            &[1, 2, 3],
            &[None, None, None],
            &["update", "delete", "delete"],
        ),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[2], 1).unwrap();
    assert_eq!(hash(&mut con, "weir:public.orders:1"), map(&[("id", "1")]));
    assert_eq!(
        keys(&mut con),
        ["weir:__weir:p1:public.orders", "weir:public.orders:1"]
    );

    // Two batches before one commit: the later change of a key wins.
    write(
        &mut sink,
        &table,
        "b3",
        &orders(&[4], &[Some("first")], &["insert"]),
    )
    .unwrap();
    write(
        &mut sink,
        &table,
        "b4",
        &orders(&[4, 1], &[Some("second"), None], &["update", "delete"]),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[3], 1).unwrap();
    assert_eq!(
        hash(&mut con, "weir:public.orders:4"),
        map(&[("id", "4"), ("name", "second")])
    );
    assert_eq!(
        keys(&mut con),
        ["weir:__weir:p1:public.orders", "weir:public.orders:4"]
    );

    // Abort drops what was staged.
    write(
        &mut sink,
        &table,
        "b5",
        &orders(&[5], &[Some("never")], &["insert"]),
    )
    .unwrap();
    sink.abort(ORDERS);
    commit(&mut sink, ORDERS, &[4], 1).unwrap();
    assert!(hash(&mut con, "weir:public.orders:5").is_empty());
}

#[test]
fn values_are_rendered_as_documented_and_control_columns_are_not_stored() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let mut table = upsert_table("shop.items", &["sku"]);
    table.destination = "sales.items".into();
    table.metadata = vec![MetadataColumn {
        source: "op".into(),
        name: "change_op".into(),
    }];
    let list: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>([Some(
        vec![Some(1), None, Some(3)],
    )]));
    let batch = rows(
        vec![
            ("sku", Arc::new(Int32Array::from(vec![7])) as ArrayRef),
            ("in_stock", Arc::new(BooleanArray::from(vec![true]))),
            (
                "price",
                Arc::new(
                    Decimal128Array::from(vec![1990])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ),
            ("weight", Arc::new(Float64Array::from(vec![0.1]))),
            ("added", Arc::new(Date32Array::from(vec![19_723]))),
            (
                "seen",
                Arc::new(
                    TimestampMicrosecondArray::from(vec![1_704_164_645_123_456])
                        .with_timezone("UTC"),
                ),
            ),
            (
                "photo",
                Arc::new(BinaryArray::from_iter_values([[0xca, 0xfe]])),
            ),
            ("sizes", list),
            ("note", names(&[None])),
            ("change_op", names(&[Some("insert")])),
        ],
        &["insert"],
    );
    write(&mut sink, &table, "b1", &batch).unwrap();
    commit(&mut sink, "shop.items", &[1], 1).unwrap();
    assert_eq!(
        hash(&mut con, "weir:sales.items:7"),
        map(&[
            ("sku", "7"),
            ("in_stock", "true"),
            ("price", "19.90"),
            ("weight", "0.1"),
            ("added", "2024-01-01"),
            ("seen", "2024-01-02T03:04:05.123456Z"),
            ("photo", "cafe"),
            ("sizes", "[1,null,3]"),
            ("change_op", "insert"),
        ])
    );
    // The position is kept under the source table's name.
    assert_eq!(sink.committed("p1", "shop.items").unwrap(), Some(at(1, 1)));
}

#[test]
fn positions_round_trip_and_empty_commits_advance() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let table = upsert_table(ORDERS, &["id"]);
    assert_eq!(sink.committed("p1", ORDERS).unwrap(), None);

    write(
        &mut sink,
        &table,
        "b1",
        &orders(&[1], &[Some("a")], &["insert"]),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[0xab, 0x01], 3).unwrap();
    let expected = Committed {
        position: vec![0xab, 0x01],
        epoch: 3,
    };
    assert_eq!(
        sink.committed("p1", ORDERS).unwrap(),
        Some(expected.clone())
    );
    assert_eq!(
        hash(&mut con, "weir:__weir:p1:public.orders"),
        map(&[("epoch", "3"), ("position", "ab01")])
    );

    // A fresh instance (a restarted host) reads the same.
    let mut fresh = common::sink(&server);
    assert_eq!(fresh.committed("p1", ORDERS).unwrap(), Some(expected));
    // Other pipelines and tables stand nowhere.
    assert_eq!(fresh.committed("p2", ORDERS).unwrap(), None);
    assert_eq!(fresh.committed("p1", "public.other").unwrap(), None);

    // A commit with nothing staged still moves the position.
    commit(&mut fresh, ORDERS, &[0xab, 0x02], 3).unwrap();
    assert_eq!(
        sink.committed("p1", ORDERS).unwrap(),
        Some(Committed {
            position: vec![0xab, 0x02],
            epoch: 3
        })
    );
    // An idle table's first commit records it too.
    commit(&mut fresh, "public.idle", &[0x07], 3).unwrap();
    assert_eq!(sink.committed("p1", "public.idle").unwrap(), Some(at(7, 3)));
    assert_eq!(keys(&mut con).len(), 3, "{:?}", keys(&mut con));

    // A damaged position hash is reported, not guessed at.
    redis::cmd("HSET")
        .arg("weir:__weir:p1:public.idle")
        .arg("epoch")
        .arg("x")
        .exec(&mut con)
        .unwrap();
    match sink.committed("p1", "public.idle") {
        Err(SinkError::Fatal(m)) => {
            assert!(m.contains("epoch") && m.contains("public.idle"), "{m}")
        }
        other => panic!("expected fatal, got {other:?}"),
    }
    match commit(&mut sink, "public.idle", &[0x08], 3) {
        Err(SinkError::Fatal(m)) => assert!(m.contains("position hash"), "{m}"),
        other => panic!("expected fatal, got {other:?}"),
    }
}

#[test]
fn an_older_epoch_is_fenced_and_leaves_data_untouched() {
    let server = RedisServer::start();
    let mut con = server.client();
    let table = upsert_table(ORDERS, &["id"]);
    let mut zombie = sink(&server);
    write(
        &mut zombie,
        &table,
        "z1",
        &orders(&[1], &[Some("old")], &["insert"]),
    )
    .unwrap();
    commit(&mut zombie, ORDERS, &[1], 1).unwrap();

    let mut newer = sink(&server);
    write(
        &mut newer,
        &table,
        "n1",
        &orders(&[1], &[Some("new")], &["update"]),
    )
    .unwrap();
    commit(&mut newer, ORDERS, &[2], 2).unwrap();

    write(
        &mut zombie,
        &table,
        "z2",
        &orders(
            &[1, 9],
            &[Some("zombie"), Some("zombie")],
            &["update", "insert"],
        ),
    )
    .unwrap();
    match commit(&mut zombie, ORDERS, &[3], 1) {
        Err(SinkError::Fenced(m)) => assert!(m.contains("epoch 2") && m.contains(ORDERS), "{m}"),
        other => panic!("expected fenced, got {other:?}"),
    }
    assert_eq!(
        hash(&mut con, "weir:public.orders:1"),
        map(&[("id", "1"), ("name", "new")])
    );
    assert!(hash(&mut con, "weir:public.orders:9").is_empty());
    assert_eq!(newer.committed("p1", ORDERS).unwrap(), Some(at(2, 2)));
    // Also for a position the zombie could think is a replay.
    assert!(matches!(
        commit(&mut zombie, ORDERS, &[1], 1),
        Err(SinkError::Fenced(_))
    ));

    // The owner goes on.
    commit(&mut newer, ORDERS, &[3], 2).unwrap();
    assert_eq!(newer.committed("p1", ORDERS).unwrap(), Some(at(3, 2)));
}

/// An older host frozen inside a commit wakes after a newer one read where
/// the table stood and staged the changes after it.
#[test]
fn a_commit_landing_inside_the_staged_changes_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let mut con = server.client();
    let table = upsert_table(ORDERS, &["id"]);
    let mut heir = sink(&server);
    let mut zombie = sink(&server);
    let both = orders(&[1, 2], &[Some("a"), Some("b")], &["insert", "insert"]);
    write_from(&mut zombie, &table, "z", &both, &[1]).unwrap();
    let all = orders(
        &[1, 2, 3],
        &[Some("a"), Some("b"), Some("c")],
        &["insert", "insert", "insert"],
    );
    write_from(&mut heir, &table, "h", &all, &[1]).unwrap();
    commit(&mut zombie, ORDERS, &[2], 1).unwrap();
    match commit(&mut heir, ORDERS, &[3], 2) {
        Err(SinkError::Fatal(m)) => assert!(m.contains("inside the staged changes"), "{m}"),
        other => panic!("expected the commit refused, got {other:?}"),
    }
    assert!(hash(&mut con, "weir:public.orders:3").is_empty());
    assert_eq!(heir.committed("p1", ORDERS).unwrap(), Some(at(2, 1)));
    // Recovered from where Redis stands, the heir stages what follows.
    let mut recovered = sink(&server);
    let rest = orders(&[3], &[Some("c")], &["insert"]);
    write_from(&mut recovered, &table, "r", &rest, &[3]).unwrap();
    commit(&mut recovered, ORDERS, &[3], 2).unwrap();
    assert_eq!(
        hash(&mut con, "weir:public.orders:3"),
        map(&[("id", "3"), ("name", "c")])
    );
}

#[test]
fn epochs_compare_exactly_beyond_what_a_lua_number_holds() {
    // 2^53 + 1 and 2^53 are the same Lua (double) number.
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let big = (1u64 << 53) + 1;
    commit(&mut sink, ORDERS, &[1], big).unwrap();
    assert!(matches!(
        commit(&mut sink, ORDERS, &[2], big - 1),
        Err(SinkError::Fenced(_))
    ));
    commit(&mut sink, ORDERS, &[2], u64::MAX).unwrap();
    assert_eq!(sink.committed("p1", ORDERS).unwrap(), Some(at(2, u64::MAX)));
    assert!(matches!(
        commit(&mut sink, ORDERS, &[3], big),
        Err(SinkError::Fenced(_))
    ));
}

#[test]
fn a_replayed_commit_is_applied_once() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let upserts = upsert_table(ORDERS, &["id"]);
    let log = append_table("public.log");
    let first = orders(&[1], &[Some("v1")], &["insert"]);
    let entry = rows(vec![("line", names(&[Some("hello")]))], &["insert"]);

    write(&mut sink, &upserts, "b1", &first).unwrap();
    commit(&mut sink, ORDERS, &[5], 1).unwrap();
    write(
        &mut sink,
        &upserts,
        "b2",
        &orders(&[1], &[Some("v2")], &["update"]),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[6], 1).unwrap();
    // The host (or a retry after a lost reply) sends b1 again: it must not
    // bring v1 back.
    write(&mut sink, &upserts, "b1", &first).unwrap();
    commit(&mut sink, ORDERS, &[5], 1).unwrap();
    assert_eq!(
        hash(&mut con, "weir:public.orders:1"),
        map(&[("id", "1"), ("name", "v2")])
    );
    assert_eq!(sink.committed("p1", ORDERS).unwrap(), Some(at(6, 1)));

    for _ in 0..3 {
        write(&mut sink, &log, "l1", &entry).unwrap();
        commit(&mut sink, "public.log", &[9], 1).unwrap();
    }
    assert_eq!(stream(&mut con, "weir:public.log").len(), 1);

    // A newer host replaying the stored position takes the table over
    // without writing anything.
    write(&mut sink, &log, "l1", &entry).unwrap();
    commit(&mut sink, "public.log", &[9], 2).unwrap();
    assert_eq!(stream(&mut con, "weir:public.log").len(), 1);
    assert_eq!(sink.committed("p1", "public.log").unwrap(), Some(at(9, 2)));
    assert!(matches!(
        commit(&mut sink, "public.log", &[10], 1),
        Err(SinkError::Fenced(_))
    ));
}

#[test]
fn append_tables_keep_every_change_in_a_stream() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let mut log = append_table("public.events");
    log.metadata = vec![MetadataColumn {
        source: "op".into(),
        name: "op".into(),
    }];
    let batch = rows(
        vec![
            ("id", ids(&[1, 1, 1])),
            ("what", names(&[Some("made"), Some("changed"), None])),
            (
                "op",
                names(&[Some("insert"), Some("update"), Some("delete")]),
            ),
        ],
        &["insert", "update", "delete"],
    );
    write(&mut sink, &log, "e1", &batch).unwrap();
    commit(&mut sink, "public.events", &[1], 1).unwrap();
    // A table in upsert mode without a key is appended too; a change with
    // no value at all still leaves an entry.
    let mut keyless = upsert_table("public.keyless", &[]);
    keyless.destination = "raw:keyless".into();
    write(
        &mut sink,
        &keyless,
        "k1",
        &rows(
            vec![("x", names(&[Some("a"), None]))],
            &["insert", "insert"],
        ),
    )
    .unwrap();
    commit(&mut sink, "public.keyless", &[1], 1).unwrap();
    write(&mut sink, &log, "e2", &batch.slice(0, 1)).unwrap();
    commit(&mut sink, "public.events", &[2], 1).unwrap();

    let entry = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        stream(&mut con, "weir:public.events"),
        [
            entry(&[("id", "1"), ("what", "made"), ("op", "insert")]),
            entry(&[("id", "1"), ("what", "changed"), ("op", "update")]),
            entry(&[("id", "1"), ("op", "delete")]),
            entry(&[("id", "1"), ("what", "made"), ("op", "insert")]),
        ]
    );
    assert_eq!(
        stream(&mut con, r"weir:raw\:keyless"),
        [entry(&[("x", "a")]), entry(&[("__empty", "")])]
    );
}

#[test]
fn keys_with_separators_do_not_collide() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let table = upsert_table("t", &["a", "b"]);
    let batch = rows(
        vec![
            ("a", names(&[Some("x:y"), Some("x"), Some(r"x\"), Some("")])),
            ("b", names(&[Some("z"), Some("y:z"), Some(":z"), Some("")])),
        ],
        &["insert", "insert", "insert", "insert"],
    );
    write(&mut sink, &table, "b1", &batch).unwrap();
    commit(&mut sink, "t", &[1], 1).unwrap();
    assert_eq!(
        keys(&mut con),
        [
            "weir:__weir:p1:t",
            "weir:t::",
            r"weir:t:x:y\:z",
            r"weir:t:x\:y:z",
            r"weir:t:x\\:\:z"
        ]
    );
    assert_eq!(
        hash(&mut con, r"weir:t:x\:y:z"),
        map(&[("a", "x:y"), ("b", "z")])
    );
    assert_eq!(
        hash(&mut con, r"weir:t:x:y\:z"),
        map(&[("a", "x"), ("b", "y:z")])
    );

    // A null key cannot name a row.
    let null_key = rows(
        vec![("a", names(&[None])), ("b", names(&[Some("z")]))],
        &["insert"],
    );
    match write(&mut sink, &table, "b2", &null_key) {
        Err(SinkError::Poison(m)) => assert!(m.contains("`a` is null") && m.contains("b2"), "{m}"),
        other => panic!("expected poison, got {other:?}"),
    }
}

#[test]
fn prefix_database_and_password_are_used() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"], Some("s3cret"));
    let config = [
        ("prefix", "app:cdc"),
        ("database", "2"),
        ("password", "s3cret"),
    ];
    let mut sink = open_sink(&server, &config).unwrap();
    let table = upsert_table(ORDERS, &["id"]);
    write(
        &mut sink,
        &table,
        "b1",
        &orders(&[1], &[Some("a")], &["insert"]),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[1], 1).unwrap();
    assert!(keys(&mut server.client_on(0)).is_empty());
    assert_eq!(
        keys(&mut server.client_on(2)),
        ["app:cdc:__weir:p1:public.orders", "app:cdc:public.orders:1"]
    );
    // The two-argument AUTH (ACL user) works as well.
    let mut named = open_sink(
        &server,
        &[
            ("database", "2"),
            ("username", "default"),
            ("password", "s3cret"),
        ],
    )
    .unwrap();
    assert_eq!(
        named.committed("p1", ORDERS).unwrap(),
        None,
        "another prefix, another position"
    );
}

#[test]
fn bad_config_is_fatal_naming_the_key() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"], Some("s3cret"));
    let fatal_naming = |result: weir_sdk::Result<_>, key: &str| match result {
        Err(SinkError::Fatal(m)) => assert!(m.contains(&format!("`{key}`")), "{key}: {m}"),
        Err(other) => panic!("{key}: expected fatal, got {other:?}"),
        Ok(_) => panic!("{key}: expected fatal, the sink opened"),
    };
    let mut bare =
        weir_sdk::native::NativeSink::new(weir_redis_sink::RedisSink::default(), "/nonexistent");
    fatal_naming(bare.open("p1", &[]).map(|_| ()), "address");
    fatal_naming(
        open_sink(&server, &[("address", "localhost")]).map(|_| ()),
        "address",
    );
    fatal_naming(
        open_sink(&server, &[("databse", "1")]).map(|_| ()),
        "databse",
    );
    fatal_naming(
        open_sink(&server, &[("username", "u")]).map(|_| ()),
        "password",
    );
    // What only the server can tell: a wrong password, none at all, a
    // database it does not have.
    fatal_naming(
        open_sink(&server, &[("password", "wrong")]).map(|_| ()),
        "password",
    );
    fatal_naming(open_sink(&server, &[]).map(|_| ()), "password");
    fatal_naming(
        open_sink(&server, &[("password", "s3cret"), ("database", "99")]).map(|_| ()),
        "database",
    );
    // Waiting for the AOF needs Redis 7.2 and an AOF; this server has none.
    fatal_naming(
        open_sink(&server, &[("password", "s3cret"), ("wait_aof", "true")]).map(|_| ()),
        "wait_aof",
    );
}

#[test]
fn wait_aof_waits_where_the_server_can() {
    let server =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"], None);
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.client())
        .unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("INFO has redis_version")
        .to_string();
    let parts: Vec<u32> = version
        .split('.')
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    let opened = open_sink(&server, &[("wait_aof", "true")]);
    if parts.as_slice() < [7, 2].as_slice() {
        // No WAITAOF before 7.2: refused up front, not after a commit.
        assert!(
            matches!(opened, Err(SinkError::Fatal(ref m)) if m.contains("`wait_aof`")),
            "{opened:?}"
        );
        eprintln!("redis {version} has no WAITAOF: only its refusal was tested");
        return;
    }
    let mut sink = opened.unwrap();
    write(
        &mut sink,
        &upsert_table(ORDERS, &["id"]),
        "b1",
        &orders(&[1], &[Some("a")], &["insert"]),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[1], 1).unwrap();
    assert_eq!(sink.committed("p1", ORDERS).unwrap(), Some(at(1, 1)));
}

#[test]
fn redis_down_is_retryable_then_the_sink_recovers() {
    let mut server = RedisServer::start();
    let table = upsert_table(ORDERS, &["id"]);
    let mut sink = sink(&server);
    write(
        &mut sink,
        &table,
        "b1",
        &orders(&[1], &[Some("a")], &["insert"]),
    )
    .unwrap();
    commit(&mut sink, ORDERS, &[1], 1).unwrap();

    server.stop();
    write(
        &mut sink,
        &table,
        "b2",
        &orders(&[2], &[Some("b")], &["insert"]),
    )
    .unwrap();
    for _ in 0..2 {
        match commit(&mut sink, ORDERS, &[2], 1) {
            Err(SinkError::Retryable(m)) => assert!(m.contains(&server.address()), "{m}"),
            other => panic!("expected retryable, got {other:?}"),
        }
    }
    assert!(matches!(
        sink.committed("p1", ORDERS),
        Err(SinkError::Retryable(_))
    ));
    // A sink opened while the server is down waits for it too.
    let mut early = open_sink(&server, &[]).expect("open does not need the server up");

    server.restart(); // empty: this server keeps nothing
    commit(&mut sink, ORDERS, &[2], 1).unwrap();
    let mut con = server.client();
    assert_eq!(
        hash(&mut con, "weir:public.orders:2"),
        map(&[("id", "2"), ("name", "b")])
    );
    assert_eq!(early.committed("p1", ORDERS).unwrap(), Some(at(2, 1)));

    // A server that forgot the script (restart, SCRIPT FLUSH) gets it again.
    redis::cmd("SCRIPT").arg("FLUSH").exec(&mut con).unwrap();
    commit(&mut sink, ORDERS, &[3], 1).unwrap();
    assert_eq!(sink.committed("p1", ORDERS).unwrap(), Some(at(3, 1)));
}

#[test]
fn a_silent_server_times_out_as_retryable_and_the_late_commit_is_not_doubled() {
    let server = RedisServer::start();
    let mut sink = open_sink(&server, &[("timeout_ms", "300")]).unwrap();
    let log = append_table("public.log");
    let entry = rows(vec![("line", names(&[Some("once")]))], &["insert"]);
    write(&mut sink, &log, "l1", &entry).unwrap();

    server.freeze();
    let started = Instant::now();
    let outcome = commit(&mut sink, "public.log", &[1], 1);
    let waited = started.elapsed();
    server.thaw();
    match outcome {
        Err(SinkError::Retryable(m)) => assert!(m.contains(&server.address()), "{m}"),
        other => panic!("expected retryable, got {other:?}"),
    }
    assert!(
        waited < Duration::from_secs(5),
        "waited {waited:?} for a 300 ms timeout"
    );

    // The frozen server may still run the first attempt once it wakes up
    // (its reply is what got lost): the retry must not add the entry again.
    commit(&mut sink, "public.log", &[1], 1).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut con = server.client();
    assert_eq!(stream(&mut con, "weir:public.log").len(), 1);
    assert_eq!(sink.committed("p1", "public.log").unwrap(), Some(at(1, 1)));
}

#[test]
fn a_key_of_another_type_is_poison_and_nothing_is_written() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    redis::cmd("SET")
        .arg("weir:public.orders:2")
        .arg("someone else's")
        .exec(&mut con)
        .unwrap();
    let table = upsert_table(ORDERS, &["id"]);
    write(
        &mut sink,
        &table,
        "b1",
        &orders(&[1, 2], &[Some("a"), Some("b")], &["insert", "insert"]),
    )
    .unwrap();
    match commit(&mut sink, ORDERS, &[1], 1) {
        Err(SinkError::Poison(m)) => assert!(
            m.contains("weir:public.orders:2") && m.contains("string"),
            "{m}"
        ),
        other => panic!("expected poison, got {other:?}"),
    }
    // All or nothing: row 1 (before the bad key) is not there, and the
    // position did not move.
    assert_eq!(keys(&mut con), ["weir:public.orders:2"]);
    assert_eq!(sink.committed("p1", ORDERS).unwrap(), None);
}

#[test]
fn what_redis_cannot_take_is_poison_at_write() {
    let server = RedisServer::start();
    let mut sink = open_sink(&server, &[("max_commit_mb", "1")]).unwrap();
    let table = upsert_table(ORDERS, &["id"]);
    let big = "x".repeat(700 * 1024);
    write(
        &mut sink,
        &table,
        "b1",
        &orders(&[1], &[Some(big.as_str())], &["insert"]),
    )
    .unwrap();
    match write(
        &mut sink,
        &table,
        "b2",
        &orders(&[2], &[Some(big.as_str())], &["insert"]),
    ) {
        Err(SinkError::Poison(m)) => {
            assert!(m.contains("`max_commit_mb`") && m.contains("b2"), "{m}")
        }
        other => panic!("expected poison, got {other:?}"),
    }
    // The first batch is still staged and commits.
    commit(&mut sink, ORDERS, &[1], 1).unwrap();
    assert_eq!(
        hash(&mut server.client(), "weir:public.orders:1")["name"].len(),
        big.len()
    );

    let durations = rows(
        vec![
            ("id", ids(&[3])),
            (
                "wait",
                Arc::new(weir_sdk::arrow_array::DurationSecondArray::from(vec![5])) as ArrayRef,
            ),
        ],
        &["insert"],
    );
    match write(&mut sink, &table, "b3", &durations) {
        Err(SinkError::Poison(m)) => assert!(m.contains("`wait`") && m.contains("Duration"), "{m}"),
        other => panic!("expected poison, got {other:?}"),
    }
    let mut reserved = upsert_table(ORDERS, &["id"]);
    reserved.destination = "__weir".into();
    assert!(matches!(
        write(&mut sink, &reserved, "b4", &orders(&[1], &[None], &["insert"])),
        Err(SinkError::Poison(m)) if m.contains("reserved")
    ));
    let missing_key = upsert_table(ORDERS, &["order_id"]);
    assert!(matches!(
        write(&mut sink, &missing_key, "b5", &orders(&[1], &[None], &["insert"])),
        Err(SinkError::Poison(m)) if m.contains("`order_id` is not in the batch")
    ));
}

#[test]
fn wide_rows_fit_in_one_script() {
    // Lua's unpack holds a few thousand values: hashes go in slices, and
    // stream entries are capped below that.
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let wide = |columns: usize| {
        let mut all: Vec<(String, ArrayRef)> = vec![("id".to_string(), ids(&[1]))];
        all.extend((1..columns).map(|c| {
            (
                format!("c{c}"),
                Arc::new(Int32Array::from(vec![c as i32])) as ArrayRef,
            )
        }));
        rows(
            all.iter().map(|(n, a)| (n.as_str(), a.clone())).collect(),
            &["insert"],
        )
    };
    write(
        &mut sink,
        &upsert_table("wide", &["id"]),
        "w1",
        &wide(2_500),
    )
    .unwrap();
    commit(&mut sink, "wide", &[1], 1).unwrap();
    let fields: usize = redis::cmd("HLEN")
        .arg("weir:wide:1")
        .query(&mut con)
        .unwrap();
    assert_eq!(fields, 2_500);

    write(&mut sink, &append_table("widelog"), "w1", &wide(3_000)).unwrap();
    commit(&mut sink, "widelog", &[1], 1).unwrap();
    assert_eq!(stream(&mut con, "weir:widelog")[0].len(), 3_000);
    assert!(matches!(
        write(&mut sink, &append_table("widelog"), "w2", &wide(3_001)),
        Err(SinkError::Poison(m)) if m.contains("3001 columns")
    ));
}

#[test]
fn a_large_commit_is_one_step() {
    let server = RedisServer::start();
    let mut sink = sink(&server);
    let mut con = server.client();
    let table = upsert_table(ORDERS, &["id"]);
    let count = 50_000;
    let id: Vec<i64> = (0..count).collect();
    let name: Vec<Option<String>> = id.iter().map(|i| Some(format!("customer {i}"))).collect();
    let name: Vec<Option<&str>> = name.iter().map(|n| n.as_deref()).collect();
    let ops = vec!["insert"; count as usize];
    let batch = orders(&id, &name, &ops);
    let started = Instant::now();
    write(&mut sink, &table, "big", &batch).unwrap();
    let staged = started.elapsed();
    commit(&mut sink, ORDERS, &[1], 1).unwrap();
    let total = started.elapsed();
    let size: i64 = redis::cmd("DBSIZE").query(&mut con).unwrap();
    assert_eq!(size, count + 1);
    // How long Redis itself ran the script, that is, was blocked by it.
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .unwrap();
    let script = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or("no evalsha stats");
    let net: String = redis::cmd("INFO").arg("stats").query(&mut con).unwrap();
    let received = net
        .lines()
        .find(|l| l.starts_with("total_net_input_bytes:"))
        .unwrap_or("");
    eprintln!("{count} rows: write {staged:?}, write + commit {total:?}; {script}; {received}");
    // One script run, not refused first for a script Redis did not know yet
    // (which would send every change twice).
    assert!(
        script.contains("calls=1,") && script.contains("failed_calls=0"),
        "{script}"
    );
}
