//! Hot swap under `weir serve`: while a generator pipeline streams into the
//! positioned fixture, its plugin is replaced 20 times through the admin
//! API, with refusals and a rollback among the replacements. The
//! destination must still equal the generator's oracle exactly, every
//! replaced instance must have stopped committing, and every refusal must
//! say why.
//!
//! The positioned fixture records in each commit object the random number
//! its instance drew at `open` (`weir.instance`), so the commit objects,
//! read in sequence order, show which instance committed what.
//!
//! The new versions are compiled before the pipeline starts (swapped into a
//! finished warm-up pipeline, which loads them into the host's component
//! cache): compiling one takes seconds, and the test is about the swaps
//! under load, not about how long the stream must be to outlast compiling.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const TENANT: &str = "acme";
const PIPELINE: &str = "orders";
const SINK: &str = "lake";
const SEED: u64 = 31;
/// With the pace below, about 50 s of changes on the reference machine
/// (the pace is slept, so a loaded machine is slower, not faster): the 20
/// swaps take 15 to 30 s of it, and up to 65 s on a machine busy building
/// beside the tests.
const CHANGES: u64 = 60_000;
const PACE_US: u64 = 1_000;
/// Between two swaps, so every instance commits many times (a flush is
/// every few tens of milliseconds).
const SWAP_SPACING: Duration = Duration::from_millis(500);
/// The sink's memory limit; the oversized version holds more at instantiation.
const MEMORY_MB: u64 = 64;
/// Schema metadata key the positioned fixture records its instance under.
const INSTANCE_KEY: &str = "weir.instance";

/// One replacement asked of the host.
#[derive(Clone, Debug)]
enum Swap {
    /// A new version of the fixture (a custom section more), optionally
    /// pinned by its own correct digest.
    Version { number: u32, pinned: bool },
    /// The fixture cut in half: a component header, then bytes that do
    /// not compile.
    Garbage,
    /// A plugin importing wasi:sockets; the tenant has no TCP grant.
    NetProbe,
    /// The fixture with two 40 MiB memories more than its 64 MiB allow.
    OverMemory,
    /// A new version whose `?sha256=` names other bytes.
    WrongDigest,
    /// Back to the version before the current one.
    Rollback,
}

/// The 20 replacements: 15 accepted versions, 4 refusals, 1 rollback.
fn schedule() -> Vec<Swap> {
    let version = |number| Swap::Version {
        number,
        pinned: number % 4 == 0,
    };
    vec![
        version(1),
        version(2),
        Swap::Garbage,
        version(3),
        version(4),
        Swap::NetProbe,
        version(5),
        version(6),
        Swap::OverMemory,
        version(7),
        Swap::Rollback,
        version(8),
        Swap::WrongDigest,
        version(9),
        version(10),
        version(11),
        version(12),
        version(13),
        version(14),
        version(15),
    ]
}

/// The accepted new versions, by number.
const VERSIONS: std::ops::RangeInclusive<u32> = 1..=15;

/// The fixture under a new digest: same code, one custom section more.
fn version_of(honest: &[u8], number: u32) -> Vec<u8> {
    with_custom_section(honest, "weir-test-version", number.to_string().as_bytes())
}

/// Which plugin versions the sink should run now and before (for rollback).
struct Versions {
    current: String,
    previous: Option<String>,
}

impl Versions {
    fn swapped_to(&mut self, sha256: String) {
        self.previous = Some(std::mem::replace(&mut self.current, sha256));
    }
}

/// Asserts that a refused replacement is a 422 whose error contains
/// `because`, and that the old version still runs.
fn assert_refused(host: &ServeHost, what: &str, reply: &Reply, because: &str, versions: &Versions) {
    assert_eq!(reply.code, 422, "{what}: expected a refusal, got {reply}");
    let error = reply.error();
    assert!(
        error.contains(because),
        "{what}: the refusal does not say {because:?}: {error}"
    );
    let status = host.status(TENANT, PIPELINE, host.token(TENANT));
    assert_eq!(
        status["state"], "running",
        "{what}: the pipeline stopped after a refused swap: {status}"
    );
    assert_eq!(
        status["plugins"][SINK]["sha256"], versions.current,
        "{what}: the running version changed after a refused swap: {status}"
    );
}

/// Asserts an accepted replacement: the version it names, and a pause
/// measured at a commit boundary of the running pipeline.
fn assert_swapped(what: &str, reply: &Reply, to: &str, from: &str) {
    assert_eq!(reply.code, 200, "{what}: {reply}");
    let swapped = reply.json();
    assert_eq!(swapped["sha256"], to, "{what}: {reply}");
    assert_eq!(swapped["previous_sha256"], from, "{what}: {reply}");
    assert!(
        swapped["pause_ms"].is_number(),
        "{what}: no pause_ms, so the pipeline was not running when the swap landed (it ends too \
         soon for this test: raise CHANGES or PACE_US): {reply}"
    );
}

/// The `weir.instance` of every commit object of `table`, in sequence order.
fn instances_in_order(root: &Path, table: &str) -> Vec<String> {
    let dir = root.join(table);
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => return Vec::new(),
    };
    files.retain(|p| p.extension().is_some_and(|e| e == "arrow"));
    // Names are 20-digit sequence numbers: the name order is commit order.
    files.sort();
    files
        .iter()
        .map(|file| {
            let reader =
                arrow_ipc::reader::FileReader::try_new(std::fs::File::open(file).unwrap(), None)
                    .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            reader
                .schema()
                .metadata()
                .get(INSTANCE_KEY)
                .unwrap_or_else(|| panic!("{}: no `{INSTANCE_KEY}`", file.display()))
                .clone()
        })
        .collect()
}

/// Collapses consecutive equal instances into runs.
fn runs(instances: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for instance in instances {
        if out.last() != Some(instance) {
            out.push(instance.clone());
        }
    }
    out
}

/// Checks that, in every table, each instance committed in one unbroken
/// run, and that all tables saw the instances in the same order. Returns
/// how many instances committed.
fn assert_instances_never_interleave(root: &Path) -> usize {
    let mut seen = BTreeSet::new();
    // (earlier, later) pairs over all tables: both orders of one pair
    // would mean an instance committed after its successor did.
    let mut before: BTreeMap<(String, String), String> = BTreeMap::new();
    for table in shop_tables() {
        let order = runs(&instances_in_order(root, &table.name));
        let mut in_table = BTreeSet::new();
        for instance in &order {
            assert!(
                in_table.insert(instance.clone()),
                "table {}: instance {instance} committed again after another instance took \
                 over; runs in commit order: {order:?}",
                table.name
            );
        }
        for (i, earlier) in order.iter().enumerate() {
            for later in &order[i + 1..] {
                let pair = (later.clone(), earlier.clone());
                if let Some(other) = before.get(&pair) {
                    panic!(
                        "instance {earlier} committed before {later} in table {}, but after it \
                         in table {other}",
                        table.name
                    );
                }
                before.insert((earlier.clone(), later.clone()), table.name.clone());
            }
        }
        seen.extend(order);
    }
    seen.len()
}

#[test]
fn twenty_replacements_under_load_keep_the_destination_exact() {
    let mut host = ServeHost::builder()
        .tenant(Tenant::new(TENANT).max_memory_mb(512))
        .start();
    let token = host.token(TENANT).to_string();
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let netprobe = std::fs::read(plugin("weir-fixture-netprobe")).unwrap();

    let pipeline = PipelineBuilder::generator(SEED, CHANGES)
        .name(PIPELINE)
        .pace_us(PACE_US)
        .max_rows(200)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(
            SinkBuilder::new(SINK, plugin("weir-fixture-positioned"))
                .limits(MEMORY_MB, 30_000)
                .retries(1),
        );

    // Compile every version into the component cache: swapped into a
    // pipeline that is not running, a version is loaded (and compiled) and
    // taken at its next start, with no pause.
    let warm_up = PipelineBuilder::generator(SEED, 1)
        .name("warm-up")
        .sink(SinkBuilder::new(SINK, plugin("weir-fixture-positioned")).limits(MEMORY_MB, 30_000));
    let reply = host.deploy(TENANT, &warm_up, &token);
    assert!(reply.is_success(), "creating the warm-up pipeline: {reply}");
    host.wait_for_state(TENANT, "warm-up", "finished", Duration::from_secs(120));
    let compiling = Instant::now();
    for number in VERSIONS {
        let reply = host.replace_plugin(
            TENANT,
            "warm-up",
            SINK,
            &version_of(&honest, number),
            None,
            &token,
        );
        assert_eq!(reply.code, 200, "warming up version {number}: {reply}");
        assert!(reply.json()["pause_ms"].is_null(), "{reply}");
    }
    println!(
        "{} versions compiled in {:?}",
        VERSIONS.count(),
        compiling.elapsed()
    );
    let reply = host.delete(TENANT, "warm-up", &token);
    assert!(reply.is_success(), "deleting the warm-up pipeline: {reply}");

    let reply = host.deploy(TENANT, &pipeline, &token);
    assert!(reply.is_success(), "creating the pipeline: {reply}");
    host.wait_for_state(TENANT, PIPELINE, "running", Duration::from_secs(60));

    let mut versions = Versions {
        current: sha256_hex(&honest),
        previous: None,
    };
    let mut accepted = 0;
    let mut rolled_back = 0;
    let mut pauses = Vec::new();
    let started = Instant::now();
    for (i, swap) in schedule().into_iter().enumerate() {
        std::thread::sleep(SWAP_SPACING);
        let what = format!("swap {} ({swap:?})", i + 1);
        match swap {
            Swap::Version { number, pinned } => {
                let wasm = version_of(&honest, number);
                let sha256 = sha256_hex(&wasm);
                let pin = pinned.then_some(sha256.as_str());
                let reply = host.replace_plugin(TENANT, PIPELINE, SINK, &wasm, pin, &token);
                assert_swapped(&what, &reply, &sha256, &versions.current);
                pauses.push(reply.json()["pause_ms"].as_f64().unwrap());
                versions.swapped_to(sha256);
                accepted += 1;
            }
            Swap::Rollback => {
                let back_to = versions.previous.clone().expect("a version to go back to");
                let reply = host.rollback(TENANT, PIPELINE, SINK, &token);
                assert_swapped(&what, &reply, &back_to, &versions.current);
                pauses.push(reply.json()["pause_ms"].as_f64().unwrap());
                versions.swapped_to(back_to);
                rolled_back += 1;
            }
            Swap::Garbage => {
                let garbage = &honest[..honest.len() / 2];
                let reply = host.replace_plugin(TENANT, PIPELINE, SINK, garbage, None, &token);
                assert_refused(&host, &what, &reply, "cannot compile", &versions);
            }
            Swap::NetProbe => {
                // It imports wasi:http and wasi:sockets; the first refused
                // import is named.
                let reply = host.replace_plugin(TENANT, PIPELINE, SINK, &netprobe, None, &token);
                assert_refused(&host, &what, &reply, "has no `grants.", &versions);
            }
            Swap::OverMemory => {
                let wasm = with_extra_memories(&honest, 2, 40);
                let reply = host.replace_plugin(TENANT, PIPELINE, SINK, &wasm, None, &token);
                let because = format!("memory limit of {MEMORY_MB} MiB");
                assert_refused(&host, &what, &reply, &because, &versions);
            }
            Swap::WrongDigest => {
                let wasm = version_of(&honest, 1000);
                let other = sha256_hex(b"some other plugin");
                let reply =
                    host.replace_plugin(TENANT, PIPELINE, SINK, &wasm, Some(&other), &token);
                assert_refused(&host, &what, &reply, "sha256", &versions);
                assert!(
                    reply.error().contains(&other),
                    "{what}: the refusal does not name the pinned digest: {}",
                    reply.error()
                );
            }
        }
        let status = host.status(TENANT, PIPELINE, &token);
        assert_eq!(
            status["plugins"][SINK]["sha256"], versions.current,
            "{what}: the status names another version: {status}"
        );
    }
    let swapping = started.elapsed();
    let status = host.status(TENANT, PIPELINE, &token);
    assert_eq!(
        status["state"], "running",
        "the pipeline ended during the swaps ({swapping:?}): raise CHANGES or PACE_US; {status}"
    );
    assert_eq!((accepted, rolled_back), (VERSIONS.count(), 1));
    // Each outcome counted once, as it came: a rollback is not also a swap,
    // and the refusals made before the running pipeline saw them count.
    let page = host.get_with("/metrics", host.operator_token()).body;
    let swaps = |outcome: &str| -> f64 {
        let labels = [
            format!("pipeline=\"{PIPELINE}\""),
            format!("sink=\"{SINK}\""),
            format!("outcome=\"{outcome}\""),
        ];
        let line = page
            .lines()
            .find(|l| {
                l.starts_with("weir_plugin_swaps_total{") && labels.iter().all(|x| l.contains(x))
            })
            .unwrap_or_else(|| panic!("no weir_plugin_swaps_total for {outcome}:\n{page}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(
        (swaps("swapped"), swaps("refused"), swaps("rolled_back")),
        (accepted as f64, 4.0, rolled_back as f64),
        "weir_plugin_swaps_total by outcome (swapped, refused, rolled_back)"
    );

    let finished = host.wait_for_state(TENANT, PIPELINE, "finished", Duration::from_secs(300));
    pauses.sort_by(f64::total_cmp);
    println!(
        "20 replacements in {swapping:?}; pauses (ms): min {:.1}, median {:.1}, max {:.1}; \
         {} batches committed",
        pauses[0],
        pauses[pauses.len() / 2],
        pauses[pauses.len() - 1],
        finished["live"]["batches_committed"]
    );

    let root = host.sink_root(TENANT, PIPELINE, SINK);
    assert_positioned_exact(&root, &expected_state(SEED, CHANGES));
    let instances = assert_instances_never_interleave(&root);
    assert_eq!(
        instances,
        1 + accepted + rolled_back,
        "instances that committed: the first, one per accepted version, one per rollback, and \
         no other"
    );

    host.sigterm();
    let exit = host.wait_exit(Duration::from_secs(15));
    assert!(
        exit.is_some_and(|e| e.success()),
        "weir serve did not exit cleanly on SIGTERM: {exit:?}\n{}",
        host.log_tail(20)
    );
}

/// Deploys `name`, a paced generator pipeline into the Parquet sink, and
/// once it runs swaps in a bad release: the poison fixture, which opens
/// and then refuses every batch.
fn swap_a_bad_release_into_a_running_lake(host: &ServeHost, name: &str, changes: u64) {
    let token = host.token(TENANT).to_string();
    let pipeline = PipelineBuilder::generator(SEED, changes)
        .name(name)
        .pace_us(2_000)
        .max_rows(200)
        .linger_ms(50)
        .sink(SinkBuilder::new(SINK, plugin("weir-parquet-sink")).retries(1));
    let reply = host.deploy(TENANT, &pipeline, &token);
    assert!(reply.is_success(), "creating the pipeline: {reply}");
    host.wait_for_state(TENANT, name, "running", Duration::from_secs(60));
    let poison = std::fs::read(plugin("weir-fixture-poison")).unwrap();
    let reply = host.replace_plugin(TENANT, name, SINK, &poison, None, &token);
    assert_eq!(reply.code, 200, "swapping in the poison fixture: {reply}");
    assert!(
        reply.json()["pause_ms"].is_number(),
        "INCONCLUSIVE: the pipeline was no longer running at the swap: {reply}"
    );
}

/// A release that opens and then refuses every batch (the poison fixture)
/// parks the pipeline on its first batch; rolling it back starts the
/// pipeline again with the version before, which writes the batch the bad
/// one refused and every later one: the Parquet lake ends complete.
#[test]
fn rolling_back_the_version_that_parked_a_pipeline_runs_it_again() {
    const NAME: &str = "lake";
    const CHANGES: u64 = 4_000;
    let host = ServeHost::builder().tenant(Tenant::new(TENANT)).start();
    let token = host.token(TENANT).to_string();
    swap_a_bad_release_into_a_running_lake(&host, NAME, CHANGES);
    let parked = host.wait_for_state(TENANT, NAME, "parked", Duration::from_secs(60));
    assert!(
        parked["reason"]
            .as_str()
            .is_some_and(|r| r.contains("fixture refuses")),
        "parked for another reason: {parked}"
    );

    let reply = host.rollback(TENANT, NAME, SINK, &token);
    assert_eq!(reply.code, 200, "rolling back: {reply}");
    assert_eq!(reply.json()["restarted"], true, "{reply}");
    let finished = host.wait_for_state(TENANT, NAME, "finished", Duration::from_secs(120));
    assert_eq!(finished["failures"], 0, "{finished}");
    let duplicates = assert_parquet_complete(
        &host.sink_root(TENANT, NAME, SINK),
        &expected_state(SEED, CHANGES),
    );
    println!("rolled back from parked; the lake is complete ({duplicates} replayed changes)");
}

/// With `restart.rollback_within_commits`, the same bad release is rolled
/// back on its own: the pipeline never parks, the swap list says why, and
/// the lake ends complete.
#[test]
fn a_version_failing_within_its_trial_commits_is_rolled_back_on_its_own() {
    const NAME: &str = "trial";
    const CHANGES: u64 = 4_000;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT))
        .rollback_within_commits(50)
        .start();
    let good = sha256_hex(&std::fs::read(plugin("weir-parquet-sink")).unwrap());
    swap_a_bad_release_into_a_running_lake(&host, NAME, CHANGES);
    let finished = host.wait_for_state(TENANT, NAME, "finished", Duration::from_secs(120));
    assert_eq!(finished["plugins"][SINK]["sha256"], good, "{finished}");
    let swaps = finished["swaps"].as_array().expect("the swap list");
    let last = swaps.last().expect("a swap");
    assert_eq!(last["outcome"], "rolled_back", "{finished}");
    assert_eq!(last["sha256"], good, "{finished}");
    let why = last["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("rolled back on its own") && why.contains("fixture refuses"),
        "the rollback's reason: {why}"
    );
    assert_parquet_complete(
        &host.sink_root(TENANT, NAME, SINK),
        &expected_state(SEED, CHANGES),
    );
    let page = host.get_with("/metrics", host.operator_token()).body;
    assert!(
        page.lines()
            .any(|l| l.starts_with("weir_plugin_swaps_total{")
                && l.contains(&format!("pipeline=\"{NAME}\""))
                && l.contains("outcome=\"rolled_back\"")
                && l.ends_with(" 1")),
        "no rolled_back swap counted:\n{page}"
    );
}

/// Writes commit objects as the positioned fixture does (only the metadata
/// the check reads): `tables[t]` lists table `t`'s committing instances in
/// sequence order.
fn fake_commits(root: &Path, tables: &[&[&str]]) {
    let names: Vec<String> = shop_tables().iter().map(|t| t.name.clone()).collect();
    for (table, instances) in names.iter().zip(tables) {
        let dir = root.join(table);
        std::fs::create_dir_all(&dir).unwrap();
        for (seq, instance) in instances.iter().enumerate() {
            let metadata = [(INSTANCE_KEY.to_string(), instance.to_string())].into();
            let schema = arrow_schema::Schema::new_with_metadata(
                Vec::<arrow_schema::Field>::new(),
                metadata,
            );
            let file = std::fs::File::create(dir.join(format!("{:020}.arrow", seq + 1))).unwrap();
            arrow_ipc::writer::FileWriter::try_new(file, &schema)
                .unwrap()
                .finish()
                .unwrap();
        }
    }
}

#[test]
fn the_instance_check_counts_runs_that_do_not_interleave() {
    let dir = tempfile::tempdir().unwrap();
    fake_commits(
        dir.path(),
        &[&["a", "a", "b", "c"], &["a", "b", "b"], &["b", "c"]],
    );
    assert_eq!(assert_instances_never_interleave(dir.path()), 3);
}

#[test]
#[should_panic(expected = "instance a committed again after another instance took over")]
fn the_instance_check_catches_a_replaced_instance_committing() {
    let dir = tempfile::tempdir().unwrap();
    fake_commits(dir.path(), &[&["a", "b", "a"], &[], &[]]);
    assert_instances_never_interleave(dir.path());
}

#[test]
#[should_panic(expected = "committed before")]
fn the_instance_check_catches_tables_that_disagree_on_the_order() {
    let dir = tempfile::tempdir().unwrap();
    fake_commits(dir.path(), &[&["a", "b"], &["b", "a"], &[]]);
    assert_instances_never_interleave(dir.path());
}
