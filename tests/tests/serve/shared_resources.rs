//! Tenant M against what the host shares between tenants, while tenant V
//! streams a paced generator pipeline from the first attempt to the last:
//!
//! - socket bombs: sinks of M make thousands of UDP sockets and unconnected
//!   TCP sockets straight through `wasi:sockets` and hold them. UDP sockets
//!   are refused when made; TCP sockets stop at M's `max_sockets` over all
//!   its sinks, and the host's open descriptors show it;
//! - instance slots and threads: a sink of M stuck in `open` where the CPU
//!   deadline cannot reach it is resumed again and again. Each given-up
//!   worker holds its slot and thread until it really ends, so M stops at
//!   its `max_instances` instead of piling up threads; once the stuck
//!   workers end, M may start again; and V starts new pipelines throughout.
//!
//! V's destination must end equal to the generator's oracle.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

const M: &str = "M";
const V: &str = "V";

const V_PIPELINE: &str = "orders";
const V_SINK: &str = "v-lake";
const V_SEED: u64 = 43;
const V_CHANGES: u64 = 20_000;
/// About 100 changes a second: V outlasts M's attempts; the test lifts the
/// pace once M is done.
const V_PACE_US: u64 = 10_000;

/// M's share of sockets, less than two sinks' own default of 16 each.
const M_MAX_SOCKETS: usize = 24;
/// M's share of instance slots (one per sink instance of a Rust plugin).
const M_MAX_INSTANCES: usize = 3;
/// What a bomb asks for: far beyond every bound.
const BOMB: usize = 3_000;
/// Descriptors the host may open beside the ones counted, while M's bombs
/// hold theirs: plugin files, state stores, log, admin connections.
const DESCRIPTOR_SLACK: usize = 48;
/// Threads the host may start beside M's stuck workers: M's pipeline's own,
/// the admin API's blocking pool, compiling.
const THREAD_SLACK: usize = 10;

fn v_pipeline(pace_us: u64) -> PipelineBuilder {
    paced_positioned(V_PIPELINE, V_SINK, V_SEED, V_CHANGES, pace_us)
}

/// One of M's pipelines: a slow endless generator into `sink`, so the sink
/// lives (and holds what it took) until the pipeline is deleted.
fn m_pipeline(name: &str, sink: SinkBuilder) -> PipelineBuilder {
    PipelineBuilder::generator(7, 1_000_000)
        .name(name)
        .pace_us(2_000)
        .max_rows(50)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(sink)
}

/// A short well-behaved pipeline: the generator's `changes` into the
/// positioned fixture at `lake`, to run to its end.
fn short_pipeline(name: &str, seed: u64, changes: u64) -> PipelineBuilder {
    PipelineBuilder::generator(seed, changes)
        .name(name)
        .max_rows(100)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(
            SinkBuilder::new("lake", plugin("weir-fixture-positioned"))
                .limits(64, 30_000)
                .retries(0),
        )
}

/// A sink of M that makes `BOMB` sockets of `kind` and holds them.
fn bomb(kind: &str) -> SinkBuilder {
    SinkBuilder::new("probe", plugin("weir-fixture-netprobe"))
        .limits(64, 30_000)
        .retries(0)
        // The fixture imports both kinds of network access; it uses TCP.
        .grant_http("http://127.0.0.1:9")
        .grant_tcp("127.0.0.1:9")
        .config("probe", "socket-bomb")
        .config("kind", kind)
        .config("count", &BOMB.to_string())
}

fn start_host(m: Tenant) -> ServeHost {
    let host = ServeHost::builder()
        .tenant(m)
        .tenant(Tenant::new(V))
        .restart(200, 1_000, 2)
        .start();
    let reply = host.deploy(V, &v_pipeline(V_PACE_US), host.token(V));
    assert!(reply.is_success(), "deploying V/{V_PIPELINE}: {reply}");
    host.wait_for_state(V, V_PIPELINE, "running", Duration::from_secs(60));
    host
}

/// V takes changes: more than `seen`, within a few seconds; the new count.
fn v_moves(host: &ServeHost, seen: u64, after: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = host.status(V, V_PIPELINE, host.operator_token());
        assert_eq!(
            status["state"], "running",
            "after {after}: V is not running: {status}"
        );
        let changes = status["live"]["changes"].as_u64().unwrap_or(0);
        if changes > seen {
            return changes;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}: V took no change in 15 s ({changes} in all)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// V's stream, unpaced, to its end, checked against the oracle.
fn v_finishes_exact(host: &ServeHost) {
    let reply = host.deploy(V, &v_pipeline(0), host.token(V));
    assert!(reply.is_success(), "lifting V's pace: {reply}");
    let finished = host.wait_for_state(V, V_PIPELINE, "finished", Duration::from_secs(180));
    assert!(
        finished["reason"].is_null(),
        "V finished with a reason: {finished}"
    );
    assert_positioned_exact(
        &host.sink_root(V, V_PIPELINE, V_SINK),
        &expected_state(V_SEED, V_CHANGES),
    );
}

/// The descriptors process `pid` holds open now.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the host's descriptors")
        .count()
}

/// The threads of process `pid` now.
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the host's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("a Threads: line")
}

/// What M's bomb in pipeline `pipeline` reports: `held N[, then <error>]`.
fn bomb_result(host: &ServeHost, pipeline: &str) -> String {
    let file = host.sink_root(M, pipeline, "probe").join("probe/result");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(result) = std::fs::read_to_string(&file) {
            return result;
        }
        let status = host.status(M, pipeline, host.operator_token());
        assert_ne!(
            status["state"], "parked",
            "M/{pipeline} was parked before its bomb reported: {status}"
        );
        assert!(
            Instant::now() < deadline,
            "M/{pipeline}: no probe result in 90 s; log tail:\n{}",
            host.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `N` of `held N...`.
fn held(result: &str) -> usize {
    result
        .strip_prefix("held ")
        .and_then(|rest| rest.split(',').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("not a bomb result: {result:?}"))
}

#[test]
fn socket_bombs_are_held_to_the_tenant_share_while_another_tenant_runs_exact() {
    let host = start_host(
        Tenant::new(M)
            .max_sockets(M_MAX_SOCKETS)
            .grant_http("http://127.0.0.1:9")
            .grant_tcp("127.0.0.1:9"),
    );
    let pid = host.pid();
    let seen = v_moves(&host, 0, "the start");
    let descriptors_before = open_descriptors(pid);

    // A file asking more of one sink than the tenant's whole share is
    // wrong where it says so.
    let greedy = m_pipeline("greedy", bomb("tcp").limit("max_tcp_connections", 65_536));
    let reply = host.deploy(M, &greedy, host.token(M));
    assert_eq!(reply.code, 400, "deploying M/greedy: {reply}");
    for needle in [
        "sinks[0].limits.max_tcp_connections",
        "65536",
        "tenants.M.max_sockets",
    ] {
        assert!(
            reply.error().contains(needle),
            "the refusal of M/greedy does not say {needle:?}: {reply}"
        );
    }

    for pipeline in ["udp", "tcp-1", "tcp-2"] {
        let kind = pipeline.split('-').next().unwrap();
        let reply = host.deploy(M, &m_pipeline(pipeline, bomb(kind)), host.token(M));
        assert!(reply.is_success(), "deploying M/{pipeline}: {reply}");
    }
    let udp = bomb_result(&host, "udp");
    assert_eq!(held(&udp), 0, "M made UDP sockets: {udp}");
    let tcp: Vec<String> = ["tcp-1", "tcp-2"]
        .iter()
        .map(|pipeline| bomb_result(&host, pipeline))
        .collect();
    let per_sink = weir_runtime::network::NetworkLimits::default().max_tcp_connections;
    for result in &tcp {
        assert!(
            held(result) <= per_sink,
            "one sink held more than its own limit of {per_sink}: {result}"
        );
    }
    let total: usize = tcp.iter().map(|result| held(result)).sum();
    assert_eq!(
        total, M_MAX_SOCKETS,
        "M's sinks held {total} TCP sockets together ({tcp:?}), not its max_sockets"
    );
    // What the host really holds, while the bombs hold theirs: the
    // process's own descriptors, not the host's counters.
    let descriptors = open_descriptors(pid);
    assert!(
        descriptors <= descriptors_before + M_MAX_SOCKETS + DESCRIPTOR_SLACK,
        "the host holds {descriptors} descriptors, {descriptors_before} before M's bombs"
    );
    println!(
        "UDP bomb: {udp}; TCP bombs: {tcp:?}; the host's descriptors: {descriptors_before} \
         before, {descriptors} while M's bombs hold theirs"
    );
    let log = host.log();
    for needle in [
        "UDP socket refused: sinks may not use UDP",
        "(tenants.M.max_sockets)",
    ] {
        assert!(log.contains(needle), "the host's log lacks {needle:?}");
    }
    v_moves(&host, seen, "M's socket bombs");

    // Deleted, M's pipelines give every socket back.
    for pipeline in ["udp", "tcp-1", "tcp-2"] {
        let reply = host.delete(M, pipeline, host.token(M));
        assert!(reply.is_success(), "deleting M/{pipeline}: {reply}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while open_descriptors(pid) > descriptors_before + DESCRIPTOR_SLACK / 2 {
        assert!(
            Instant::now() < deadline,
            "the host still holds {} descriptors 30 s after M's pipelines were deleted \
             ({descriptors_before} before)",
            open_descriptors(pid)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    v_finishes_exact(&host);
}

/// How long M's stuck sink sleeps in `open`: well past its call bound and
/// the resumes, and short enough that its workers end within the test.
const STUCK_SLEEP: Duration = Duration::from_secs(25);

#[test]
fn stuck_workers_count_against_their_tenant_until_they_end() {
    let host = start_host(Tenant::new(M).max_instances(M_MAX_INSTANCES));
    let pid = host.pid();
    let mut seen = v_moves(&host, 0, "the start");
    let threads_before = threads(pid);

    let stuck = m_pipeline(
        "stuck",
        SinkBuilder::new("stuck", plugin("weir-fixture-stall"))
            .limits(64, 200)
            .retries(0)
            .config("mode", "sleep-in-open")
            .config("sleep_ms", &STUCK_SLEEP.as_millis().to_string()),
    );
    let reply = host.deploy(M, &stuck, host.token(M));
    assert!(reply.is_success(), "deploying M/stuck: {reply}");
    // Every park is followed by a start, as a tenant's script would: each
    // start tries twice (the host's restart) before it is parked again.
    let resumes = 4 * M_MAX_INSTANCES;
    let resumed_at = Instant::now();
    for round in 0..resumes {
        host.wait_for_state(M, "stuck", "parked", Duration::from_secs(60));
        let reply = host.start(M, "stuck", host.token(M));
        assert!(
            reply.is_success(),
            "starting M/stuck, round {round}: {reply}"
        );
    }
    host.wait_for_state(M, "stuck", "parked", Duration::from_secs(60));
    let rounds_done = Instant::now();
    let threads_stuck = threads(pid);
    println!(
        "{resumes} resumes in {:?}: the host's threads {threads_before} before, \
         {threads_stuck} after",
        rounds_done - resumed_at
    );
    assert!(
        threads_stuck <= threads_before + M_MAX_INSTANCES + THREAD_SLACK,
        "{threads_stuck} threads after {resumes} resumes of a stuck sink, {threads_before} before"
    );
    // Had a stuck worker woken before the count, the count would say less
    // than the host would have held.
    assert!(
        rounds_done - resumed_at < STUCK_SLEEP,
        "inconclusive: the resumes took {:?}, longer than a stuck worker sleeps",
        rounds_done - resumed_at
    );
    let log = host.log();
    assert!(
        log.contains("no instance slot for sink `stuck` of tenant `M`")
            && log.contains("(tenants.M.max_instances)"),
        "no refusal names M's max_instances; log tail:\n{}",
        host.log_tail(40)
    );
    seen = v_moves(&host, seen, "M's stuck workers");

    // Deleted, M's pipeline leaves its stuck workers behind; V starts
    // pipelines of its own beside them.
    let reply = host.delete(M, "stuck", host.token(M));
    assert!(reply.is_success(), "deleting M/stuck: {reply}");
    for n in 0..2 {
        let name = format!("extra-{n}");
        let extra = short_pipeline(&name, 11 + n, 500);
        let reply = host.deploy(V, &extra, host.token(V));
        assert!(reply.is_success(), "deploying V/{name}: {reply}");
        host.wait_for_state(V, &name, "finished", Duration::from_secs(60));
        assert_positioned_exact(
            &host.sink_root(V, &name, "lake"),
            &expected_state(11 + n, 500),
        );
    }
    v_moves(&host, seen, "V's new pipelines");

    // Once the stuck workers wake and end, their slots come back: M runs
    // a well-behaved pipeline to its end. The last of them started before
    // the last park.
    let all_awake = rounds_done + STUCK_SLEEP + Duration::from_secs(2);
    std::thread::sleep(all_awake.saturating_duration_since(Instant::now()));
    let fine = short_pipeline("fine", 5, 300);
    let reply = host.deploy(M, &fine, host.token(M));
    assert!(reply.is_success(), "deploying M/fine: {reply}");
    host.wait_for_state(M, "fine", "finished", Duration::from_secs(90));
    assert_positioned_exact(&host.sink_root(M, "fine", "lake"), &expected_state(5, 300));
    v_finishes_exact(&host);
}
