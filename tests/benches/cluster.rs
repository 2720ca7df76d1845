//! What a cluster of `weir serve` hosts on etcd costs and how fast it heals
//! (docs/cluster.md, "Benchmark"). Not a pass/fail test (the machines are
//! shared); it prints, with the targets beside them:
//!
//! - **failover**: three hosts with a 10 s lease and the default placement
//!   delay (3 s) run six paced pipelines; the host holding the most is
//!   killed (SIGKILL) `WEIR_BENCH_KILLS` times (default 8), started again
//!   with the same name once its pipelines moved. For each pipeline it
//!   held: the time from the SIGKILL to the first commit object the
//!   positioned sink wrote for it afterwards (by another host: the killed
//!   one is gone), polled every 10 ms; p50/p99/max over all of them, and
//!   the steps seen in etcd on the way (the assignment gone with the
//!   lease, the claim by another host). Target: under lease + 5 s. At the
//!   end the streams run to their end and each destination is checked
//!   against the generator's oracle.
//! - **throughput**: one unpaced pipeline (generator, `WEIR_BENCH_CHANGES`
//!   changes, default 3000000, into the positioned fixture) on a cluster
//!   host against a lone `weir serve` (no `cluster:`), alternating, 3 runs
//!   each; the ratio of the medians. Each run is timed from the first
//!   status that says "running" to the first that says "finished" (polled
//!   every 5 ms on the host that runs it), so start-up, placement, the
//!   claim and recovery are outside the clock; every commit's check of the
//!   lease and the position writes to etcd are inside it. Target: at least
//!   0.9x. Each destination is checked against the oracle. Measured twice:
//!   with `batch.record_positioned_ms: 1000` (the positioned sink's
//!   positions copied to the store once a second, the default) and with 0
//!   (at each commit), both sides alike.
//! - **etcd requests per commit**: during each cluster run, the requests
//!   etcd received (its own `grpc_server_msg_received_total`, by method:
//!   every unary call and every message on a stream), divided by the
//!   batches the run committed; and the same less the background (every
//!   host's agent reading the cluster four times a second, lease
//!   renewals), measured over an idle window of 5 s before each run.
//!
//! Every folder (the hosts' state, the shared data, etcd's) is on tmpfs
//! (`/dev/shm`, or `WEIR_BENCH_DIR`), so the two sides compare code, not
//! the disk; the test etcd runs with `--unsafe-no-fsync`, so a production
//! etcd's fsync per write is not in these numbers.
//!
//! `scripts/bench-cluster` (after scripts/build-plugins): it builds with
//! the tests' features, so nothing is built twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir_test_support::etcd::Etcd;
use weir_test_support::{
    PipelineBuilder, PositionedCommits, ServeHost, SinkBuilder, Tenant, assert_positioned_exact,
    expected_state, plugin,
};

const TENANT: &str = "bench";
const SINK: &str = "lake";
const HOSTS: usize = 3;
const LEASE_TTL_S: u64 = 10;
/// The host file's default `placement_delay_ms`, which this bench leaves
/// unset.
const DEFAULT_PLACEMENT_DELAY_S: u64 = 3;
const FAILOVER_PIPELINES: usize = 6;
const FAILOVER_PACE_US: u64 = 2_000;
const ROUNDS: usize = 3;
const IDLE_WINDOW: Duration = Duration::from_secs(5);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cluster_host(etcd: &Etcd, shared: &Path, name: &str) -> ServeHost {
    ServeHost::builder()
        .tenant(Tenant::new(TENANT).max_pipelines(8))
        .cluster(&etcd.endpoint(), name)
        .cluster_setting("lease_ttl_s", LEASE_TTL_S)
        .shared(shared)
        .log("warn")
        .start()
}

fn paced(name: &str, seed: u64, changes: u64, pace_us: u64) -> PipelineBuilder {
    PipelineBuilder::generator(seed, changes)
        .name(name)
        .pace_us(pace_us)
        .max_rows(500)
        .linger_ms(200)
        .heartbeat_ms(200)
        .sink(SinkBuilder::new(SINK, plugin("weir-fixture-positioned")).limits(64, 30_000))
}

/// `record_ms`: the pipeline's `batch.record_positioned_ms` (0: each commit).
fn unpaced(name: &str, seed: u64, changes: u64, record_ms: u64) -> PipelineBuilder {
    PipelineBuilder::generator(seed, changes)
        .name(name)
        .max_rows(1000)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(SinkBuilder::new(SINK, plugin("weir-fixture-positioned")).limits(128, 30_000))
        .record_positioned_ms(record_ms)
}

/// The cluster: etcd, its hosts, the folder they share.
struct Cluster {
    hosts: Vec<ServeHost>,
    names: Vec<String>,
    etcd: Etcd,
    shared: PathBuf,
}

impl Cluster {
    fn owners(&self) -> BTreeMap<String, usize> {
        let prefix = format!("/weir/assignments/{TENANT}/");
        self.etcd
            .list(&prefix)
            .into_iter()
            .filter_map(|(key, owner)| {
                let pipeline = key.strip_prefix(&prefix)?.to_string();
                Some((pipeline, self.names.iter().position(|n| *n == owner)?))
            })
            .collect()
    }

    fn owner(&self, pipeline: &str) -> Option<usize> {
        self.owners().get(pipeline).copied()
    }

    fn sink_root(&self, pipeline: &str) -> PathBuf {
        self.shared
            .join("data")
            .join(TENANT)
            .join(pipeline)
            .join(SINK)
    }

    fn deploy(&self, pipeline: &PipelineBuilder) {
        let host = &self.hosts[0];
        let reply = host.deploy(TENANT, pipeline, host.token(TENANT));
        assert!(reply.is_success(), "deploying: {reply}");
    }

    fn delete(&self, pipeline: &str) {
        let host = &self.hosts[0];
        let reply = host.delete(TENANT, pipeline, host.token(TENANT));
        assert!(reply.is_success(), "deleting {pipeline}: {reply}");
    }
}

fn state(host: &ServeHost, pipeline: &str) -> String {
    let status = host.status(TENANT, pipeline, host.operator_token());
    status["state"].as_str().unwrap_or_default().to_string()
}

/// Polls until the pipeline's state is `wanted`; the moment it was seen.
fn wait_for(host: &ServeHost, pipeline: &str, wanted: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if state(host, pipeline) == wanted {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{pipeline} never became {wanted}\n{}",
            host.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted `values`.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn spread(label: &str, mut values: Vec<f64>) -> String {
    if values.is_empty() {
        return format!("{label}: none");
    }
    values.sort_by(f64::total_cmp);
    format!(
        "{label}: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        percentile(&values, 50.0),
        percentile(&values, 99.0),
        values[values.len() - 1]
    )
}

/// One pipeline a killed host held, and when each step of its failover
/// was seen, in seconds after the SIGKILL.
struct Failover {
    lease_gone: Option<f64>,
    claimed: Option<f64>,
    first_commit: f64,
}

fn failover(cluster: &mut Cluster, kills: u64) {
    let changes = (kills * 30 + 120) * 1_000_000 / FAILOVER_PACE_US;
    let pipelines: Vec<(String, u64)> = (0..FAILOVER_PIPELINES)
        .map(|n| (format!("f{n}"), 500 + n as u64))
        .collect();
    for (name, seed) in &pipelines {
        cluster.deploy(&paced(name, *seed, changes, FAILOVER_PACE_US));
    }
    let assignments = cluster.etcd.watch(&format!("/weir/assignments/{TENANT}/"));
    let mut counters: BTreeMap<String, PositionedCommits> = pipelines
        .iter()
        .map(|(name, _)| {
            (
                name.clone(),
                PositionedCommits::new(&cluster.sink_root(name)),
            )
        })
        .collect();
    let mut samples: Vec<Failover> = Vec::new();
    for kill in 1..=kills {
        // Settled: no owner changed for 3 s (a host that came back may take
        // pipelines to even the load), every pipeline has one and commits.
        let mut owners = cluster.owners();
        let mut steady_since = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(180);
        while steady_since.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(250));
            let now = cluster.owners();
            if now != owners {
                owners = now;
                steady_since = Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "the owners kept changing before kill {kill}"
            );
        }
        let before: BTreeMap<String, u64> = counters
            .iter_mut()
            .map(|(name, counter)| (name.clone(), counter.count()))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let owners = cluster.owners();
            let all_owned = pipelines.iter().all(|(n, _)| owners.contains_key(n));
            let all_commit = counters
                .iter_mut()
                .all(|(name, counter)| counter.count() > before[name]);
            if all_owned && all_commit {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle before kill {kill}: {owners:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let owners = cluster.owners();
        let victim = (0..HOSTS)
            .max_by_key(|h| owners.values().filter(|o| *o == h).count())
            .expect("a host");
        let held: Vec<String> = owners
            .iter()
            .filter(|(_, o)| **o == victim)
            .map(|(p, _)| p.clone())
            .collect();
        let baseline: BTreeMap<String, u64> = held
            .iter()
            .map(|p| (p.clone(), counters.get_mut(p).unwrap().count()))
            .collect();
        let killed = Instant::now();
        cluster.hosts[victim].sigkill();
        let mut first_commit: BTreeMap<String, f64> = BTreeMap::new();
        let deadline = killed + Duration::from_secs(120);
        while first_commit.len() < held.len() {
            for pipeline in &held {
                if !first_commit.contains_key(pipeline)
                    && counters.get_mut(pipeline).unwrap().count() > baseline[pipeline]
                {
                    first_commit.insert(pipeline.clone(), killed.elapsed().as_secs_f64());
                }
            }
            assert!(
                Instant::now() < deadline,
                "kill {kill}: {:?} of {held:?} committed again within 120 s",
                first_commit.keys()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let events = assignments.events();
        for pipeline in &held {
            let key = format!("/weir/assignments/{TENANT}/{pipeline}");
            let after: Vec<_> = events
                .iter()
                .filter(|e| e.key == key && e.seen >= killed)
                .collect();
            let since = |e: &&weir_test_support::etcd::WatchEvent| {
                e.seen.duration_since(killed).as_secs_f64()
            };
            samples.push(Failover {
                lease_gone: after.iter().find(|e| e.value.is_none()).map(since),
                claimed: after.iter().find(|e| e.value.is_some()).map(since),
                first_commit: first_commit[pipeline],
            });
        }
        println!(
            "kill {kill}: {} held {held:?}; first commits elsewhere after {}",
            cluster.names[victim],
            held.iter()
                .map(|p| format!("{:.2} s", first_commit[p]))
                .collect::<Vec<_>>()
                .join(", ")
        );
        cluster.hosts[victim] =
            cluster_host(&cluster.etcd, &cluster.shared, &cluster.names[victim]);
    }
    let target = (LEASE_TTL_S + 5) as f64;
    println!(
        "failover, {} pipelines over {kills} kills (lease {LEASE_TTL_S} s, placement delay \
         {DEFAULT_PLACEMENT_DELAY_S} s, target under {target:.0} s):",
        samples.len()
    );
    println!(
        "  {}",
        spread(
            "SIGKILL to the first commit elsewhere",
            samples.iter().map(|s| s.first_commit).collect()
        )
    );
    println!(
        "  {}",
        spread(
            "  on the way, SIGKILL to the assignment gone with the lease",
            samples.iter().filter_map(|s| s.lease_gone).collect()
        )
    );
    println!(
        "  {}",
        spread(
            "  on the way, SIGKILL to the claim by another host",
            samples.iter().filter_map(|s| s.claimed).collect()
        )
    );
    let mut firsts: Vec<f64> = samples.iter().map(|s| s.first_commit).collect();
    firsts.sort_by(f64::total_cmp);
    println!(
        "  p99 {:.2} s is {} the target of {target:.0} s",
        percentile(&firsts, 99.0),
        if percentile(&firsts, 99.0) < target {
            "under"
        } else {
            "NOT under"
        }
    );
    // Every stream to its end, checked: the failovers lost nothing and
    // wrote nothing twice.
    for (name, seed) in &pipelines {
        cluster.deploy(&paced(name, *seed, changes, 0));
    }
    for (name, seed) in &pipelines {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let finished = cluster
                .owner(name)
                .is_some_and(|o| state(&cluster.hosts[o], name) == "finished");
            if finished {
                break;
            }
            assert!(Instant::now() < deadline, "{name} did not finish");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_positioned_exact(&cluster.sink_root(name), &expected_state(*seed, changes));
        cluster.delete(name);
    }
    println!("  every failover pipeline ran to its end, exact against the oracle");
}

/// The requests etcd received between two readings, by method.
fn requests_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(method, n)| (method.clone(), n - before.get(method).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// One cluster run: its changes per second, batches committed, and the
/// requests etcd received during it and during an idle window before it.
/// CPU seconds a process has used so far (user and system, from
/// /proc/PID/stat, in clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line, the 12th and 13th after it.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The CPU seconds of every process of the bench: the cluster's hosts,
/// the lone host, etcd.
fn cpu_of(cluster: &Cluster, lone: &ServeHost) -> Vec<f64> {
    let mut pids: Vec<u32> = cluster.hosts.iter().map(|h| h.pid()).collect();
    pids.push(lone.pid());
    pids.push(cluster.etcd.pid());
    pids.into_iter().map(cpu_seconds).collect()
}

/// The CPU seconds each process used between two [`cpu_of`] readings.
fn cpu_between(before: &[f64], after: &[f64]) -> Vec<f64> {
    before.iter().zip(after).map(|(b, a)| a - b).collect()
}

/// Who used how much CPU, from [`cpu_between`].
fn cpu_used(cluster: &Cluster, used: &[f64]) -> String {
    let names = cluster
        .names
        .iter()
        .map(String::as_str)
        .chain(["lone", "etcd"]);
    names
        .zip(used)
        .map(|(name, used)| format!("{name} {used:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct ClusterRun {
    rate: f64,
    batches: u64,
    seconds: f64,
    during: BTreeMap<String, u64>,
    idle_per_second: BTreeMap<String, f64>,
}

fn cluster_run(
    cluster: &Cluster,
    name: &str,
    seed: u64,
    changes: u64,
    record_ms: u64,
) -> ClusterRun {
    let idle_from = cluster.etcd.requests_received();
    std::thread::sleep(IDLE_WINDOW);
    let idle = requests_between(&idle_from, &cluster.etcd.requests_received());
    let idle_per_second = idle
        .into_iter()
        .map(|(m, n)| (m, n as f64 / IDLE_WINDOW.as_secs_f64()))
        .collect();
    cluster.deploy(&unpaced(name, seed, changes, record_ms));
    let deadline = Instant::now() + Duration::from_secs(60);
    let owner = loop {
        if let Some(owner) = cluster.owner(name) {
            break owner;
        }
        assert!(Instant::now() < deadline, "{name} was not claimed");
        std::thread::sleep(Duration::from_millis(5));
    };
    let host = &cluster.hosts[owner];
    let running = wait_for(host, name, "running");
    let from = cluster.etcd.requests_received();
    let finished = wait_for(host, name, "finished");
    let during = requests_between(&from, &cluster.etcd.requests_received());
    let status = host.status(TENANT, name, host.operator_token());
    let batches = status["live"]["batches_committed"].as_u64().unwrap_or(0);
    assert_positioned_exact(&cluster.sink_root(name), &expected_state(seed, changes));
    cluster.delete(name);
    let seconds = (finished - running).as_secs_f64();
    ClusterRun {
        rate: changes as f64 / seconds,
        batches,
        seconds,
        during,
        idle_per_second,
    }
}

fn lone_run(host: &ServeHost, name: &str, seed: u64, changes: u64, record_ms: u64) -> f64 {
    let pipeline = unpaced(name, seed, changes, record_ms);
    let reply = host.deploy(TENANT, &pipeline, host.token(TENANT));
    assert!(reply.is_success(), "creating {name}: {reply}");
    let running = wait_for(host, name, "running");
    let finished = wait_for(host, name, "finished");
    assert_positioned_exact(
        &host.sink_root(TENANT, name, SINK),
        &expected_state(seed, changes),
    );
    let reply = host.delete(TENANT, name, host.token(TENANT));
    assert!(reply.is_success(), "deleting {name}: {reply}");
    changes as f64 / (finished - running).as_secs_f64()
}

/// The throughput runs of one setting of `batch.record_positioned_ms`.
fn throughput_and_requests(cluster: &Cluster, lone: &ServeHost, changes: u64, record_ms: u64) {
    const SEED: u64 = 41;
    let setting = match record_ms {
        0 => "positions copied to the store at each commit (record_positioned_ms: 0)".to_string(),
        ms => format!("positions copied to the store every {ms} ms"),
    };
    println!("{setting}:");
    let tag = record_ms.to_string();
    let mut on_cluster = Vec::new();
    let mut alone = Vec::new();
    let (mut cpu_on_cluster, mut cpu_alone, mut cpu_of_etcd) = (Vec::new(), Vec::new(), Vec::new());
    let mut runs = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("cluster-{tag}-{round}");
        let cpu = cpu_of(cluster, lone);
        let run = cluster_run(cluster, &name, SEED, changes, record_ms);
        let used = cpu_between(&cpu, &cpu_of(cluster, lone));
        println!(
            "{name}: {changes} changes in {:.2} s = {:.0} changes/s, {} batches; CPU s from \
             its deployment to its deletion (with a 5 s idle window): {}",
            run.seconds,
            run.rate,
            run.batches,
            cpu_used(cluster, &used)
        );
        // The owner is the host that used the most; etcd works for it.
        let owner = used[..HOSTS].iter().copied().fold(0.0, f64::max);
        cpu_on_cluster.push(owner);
        cpu_of_etcd.push(used[HOSTS + 1]);
        on_cluster.push(run.rate);
        runs.push(run);
        let name = format!("lone-{tag}-{round}");
        let cpu = cpu_of(cluster, lone);
        let rate = lone_run(lone, &name, SEED, changes, record_ms);
        let used = cpu_between(&cpu, &cpu_of(cluster, lone));
        println!(
            "{name}: {rate:.0} changes/s; CPU s: {}",
            cpu_used(cluster, &used)
        );
        cpu_alone.push(used[HOSTS]);
        alone.push(rate);
    }
    let (clustered, alone) = (median(on_cluster), median(alone));
    println!(
        "throughput, median of {ROUNDS}: {clustered:.0} changes/s on a cluster host, {alone:.0} \
         changes/s on a lone host: ratio {:.3} (target at least 0.9)",
        clustered / alone
    );
    let (cpu_clustered, cpu_alone, cpu_etcd) = (
        median(cpu_on_cluster),
        median(cpu_alone),
        median(cpu_of_etcd),
    );
    println!(
        "  CPU of the host that ran it, median: {cpu_clustered:.2} s on a cluster host (etcd \
         {cpu_etcd:.2} s beside it), {cpu_alone:.2} s on a lone host: the lone host's CPU over \
         the cluster host's {:.3} (the cluster host's includes its claim and recovery)",
        cpu_alone / cpu_clustered
    );
    let batches_per_run = runs.iter().map(|r| r.batches).sum::<u64>() as f64 / runs.len() as f64;
    println!(
        "  the cluster host's extra time per committed batch: {:.3} ms (from the medians; \
         {batches_per_run:.0} batches a run)",
        (changes as f64 / clustered - changes as f64 / alone) * 1000.0 / batches_per_run
    );
    let mut per_batch: BTreeMap<String, f64> = BTreeMap::new();
    let mut background_per_batch: BTreeMap<String, f64> = BTreeMap::new();
    let batches: u64 = runs.iter().map(|r| r.batches).sum();
    for run in &runs {
        for (method, n) in &run.during {
            *per_batch.entry(method.clone()).or_default() += *n as f64;
        }
        for (method, rate) in &run.idle_per_second {
            *background_per_batch.entry(method.clone()).or_default() += rate * run.seconds;
        }
    }
    let total: f64 = per_batch.values().sum::<f64>() / batches as f64;
    let background: f64 = background_per_batch.values().sum::<f64>() / batches as f64;
    println!(
        "etcd requests per committed batch, over the {ROUNDS} cluster runs ({batches} batches): \
         {total:.2} in all, {:.2} beyond the background",
        total - background
    );
    for (method, n) in &per_batch {
        let idle = background_per_batch.get(method).copied().unwrap_or(0.0);
        println!(
            "  {method:<16} {:>7.3} per batch ({:.3} of them the background's)",
            n / batches as f64,
            idle / batches as f64
        );
    }
    let idle_rate: f64 = runs
        .iter()
        .map(|r| r.idle_per_second.values().sum::<f64>())
        .sum::<f64>()
        / runs.len() as f64;
    println!(
        "  background, {HOSTS} idle hosts: {idle_rate:.1} requests/s (agents reading the \
         cluster, campaigns, lease renewals)"
    );
}

fn main() {
    let scratch = std::env::var_os("WEIR_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm
            } else {
                std::env::temp_dir()
            }
        });
    // SAFETY: set before this program starts any thread or process; every
    // temporary folder after this (hosts' state, etcd's data) lands there.
    unsafe { std::env::set_var("TMPDIR", &scratch) };
    let kills = env_or("WEIR_BENCH_KILLS", 8);
    let changes = env_or("WEIR_BENCH_CHANGES", 3_000_000);
    let shared = tempfile::tempdir().expect("a shared folder");
    let etcd = Etcd::start();
    let names: Vec<String> = (0..HOSTS).map(|n| format!("host-{n}")).collect();
    let hosts = names
        .iter()
        .map(|name| cluster_host(&etcd, shared.path(), name))
        .collect();
    let mut cluster = Cluster {
        hosts,
        names,
        etcd,
        shared: shared.path().to_path_buf(),
    };
    let lone = ServeHost::builder()
        .tenant(Tenant::new(TENANT).max_memory_mb(1024))
        .log("warn")
        .start();
    println!(
        "cluster bench: {HOSTS} hosts on one etcd and one lone host, folders under {}",
        scratch.display()
    );
    if kills > 0 {
        failover(&mut cluster, kills);
    }
    // Copied once a second first, then each commit recorded (the default:
    // the cost of a store round trip per commit).
    throughput_and_requests(&cluster, &lone, changes, 1_000);
    throughput_and_requests(&cluster, &lone, changes, 0);
}
