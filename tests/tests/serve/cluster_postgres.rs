//! A Postgres pipeline moving between the hosts of a cluster. A stalled
//! owner's walsender still holds the replication slot; the new owner,
//! holding a fenced claim, ends it rather than waiting for the server to
//! time it out (`wal_sender_timeout`, 30 s in scripts/pg), and the sink
//! ends equal to Postgres, nothing twice, once the stalled owner wakes.

use std::time::{Duration, Instant};

use crate::common;
use crate::postgres_support::{
    Rng, SCHEMA, TABLES, cluster as postgres, initial_load, sink_rows, slot_of, table_defs,
    workload,
};
use common::etcd::Etcd;
use common::*;

const T: &str = "acme";
const PIPELINE: &str = "pg";

fn owner(etcd: &Etcd) -> Option<usize> {
    let name = etcd.get(&format!("/weir/assignments/{T}/{PIPELINE}"))?;
    name.strip_prefix("host-")?.parse().ok()
}

/// Waits until the sink under `root` holds what Postgres holds, nothing
/// twice; false if it did not by `deadline`.
fn caught_up(
    pg: &crate::postgres_support::Pg,
    db: &str,
    root: &std::path::Path,
    deadline: Instant,
) -> bool {
    loop {
        let equal = table_defs(false).iter().all(|table| {
            let (rows, duplicates) = sink_rows(root, table);
            assert_eq!(
                duplicates, 0,
                "{}: the sink holds changes twice",
                table.name
            );
            rows == pg.rows(db, table)
        });
        if equal {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_new_owner_takes_the_slot_from_a_stalled_owner_and_ends_equal_to_postgres() {
    let pg = postgres();
    let db = "cluster_takeover";
    let dsn = pg.fresh_db(db);
    pg.sql(db, SCHEMA);
    let mut rng = Rng::seeded(0x5107_0000_0000_0001);
    pg.sql(db, &initial_load(300, 300, 5, &mut rng));

    let etcd = Etcd::start();
    let shared = tempfile::tempdir().expect("a shared folder");
    let tenant = Tenant::new(T).grant_postgres(&format!("127.0.0.1:{}", pg.port));
    let hosts: Vec<ServeHost> = (0..2)
        .map(|n| {
            ServeHost::builder()
                .tenant(tenant.clone())
                .cluster(&etcd.endpoint(), &format!("host-{n}"))
                .cluster_setting("lease_ttl_s", 3)
                .cluster_setting("placement_delay_ms", 500)
                .cluster_setting("request_timeout_ms", 800)
                .shared(shared.path())
                .start()
        })
        .collect();
    let wasm = std::fs::read(plugin("weir-fixture-positioned")).expect("the positioned fixture");
    hosts[0].add_plugin(T, "positioned.wasm", &wasm);
    let yaml = format!(
        "pipeline: {PIPELINE}\nsource:\n  postgres:\n    dsn: \"{dsn}\"\n    publication: weir_pub\n    \
         slot: {slot}\n    create_publication_for: [{tables}]\n    status_interval_ms: 200\n    \
         heartbeat_ms: 500\n    reconnect_timeout_ms: 60000\nbatch: {{ max_rows: 500, linger_ms: 50, \
         heartbeat_ms: 300 }}\nsinks:\n  - name: exact\n    plugin: positioned.wasm\n    \
         blob_store: {{ url: exact }}\n    retries: 1\n",
        slot = slot_of(&dsn),
        tables = TABLES.join(", ")
    );
    let reply = hosts[0].put_pipeline(T, PIPELINE, &yaml, hosts[0].operator_token());
    assert!(reply.is_success(), "deploying {PIPELINE}: {reply}");
    let root = shared
        .path()
        .join("data")
        .join(T)
        .join(PIPELINE)
        .join("exact");

    // Backfilled and streaming on its first owner.
    pg.sql(db, &workload(&mut rng, 50, 1_000_000, false));
    assert!(
        caught_up(&pg, db, &root, Instant::now() + Duration::from_secs(90)),
        "the first owner did not catch up with Postgres"
    );
    let stalled = owner(&etcd).expect("the pipeline has an owner");
    let new_owner = 1 - stalled;

    // The owner stalls holding the slot; the database goes on changing.
    hosts[stalled].sigstop();
    let stopped = Instant::now();
    pg.sql(db, &workload(&mut rng, 50, 2_000_000, false));
    // Well before the server would end the stalled walsender itself.
    let taken_over = caught_up(&pg, db, &root, stopped + Duration::from_secs(22));
    let took = stopped.elapsed();
    assert_eq!(owner(&etcd), Some(new_owner), "the pipeline did not move");
    let log = hosts[new_owner].log();
    assert!(
        log.contains("ended the walsender an earlier owner of this pipeline left on the slot"),
        "the new owner did not end the stalled owner's walsender:\n{}",
        hosts[new_owner].log_tail(40)
    );
    assert!(
        taken_over,
        "the new owner did not catch up within {took:?} of the stall (wal_sender_timeout is 30 s)"
    );
    eprintln!(
        "caught up on the new owner {:.1} s after the stall",
        took.as_secs_f64()
    );

    // The stalled owner wakes: it gives the pipeline up and lands nothing.
    hosts[stalled].sigcont();
    hosts[stalled].wait_for_state(T, PIPELINE, "standby", Duration::from_secs(30));
    pg.sql(db, &workload(&mut rng, 50, 3_000_000, false));
    assert!(
        caught_up(&pg, db, &root, Instant::now() + Duration::from_secs(60)),
        "the new owner did not catch up after the stalled owner woke"
    );
    assert_eq!(
        owner(&etcd),
        Some(new_owner),
        "the woken owner took the pipeline back"
    );
}
