//! What replacing a plugin costs a running pipeline under `weir serve`.
//! Not a pass/fail test (the machines are shared); it prints:
//!
//! - **the pause of a swap**: the `pause_ms` each replace reply carries
//!   (how long the pipeline stood still at the commit boundary while the
//!   new instance took over, as the host measures it), p50/p99/max over 100
//!   swaps into a pipeline streaming the generator at full speed into the
//!   positioned fixture;
//! - **throughput with and without swaps**: the same pipeline (generator,
//!   `WEIR_BENCH_CHANGES` changes, default 500000, unpaced, into the
//!   positioned fixture) run to its end, once left alone and once with a
//!   plugin replaced every 200 ms, the two alternating, 3 runs each; the
//!   ratio of the medians, from this one run. The swaps stop once the
//!   source has read 95% of the changes, so that no swap is still waiting
//!   for a commit boundary when the stream ends.
//!
//! What the clock includes: each run is timed from the first status that
//! says "running" to the first that says "finished" (polled every 5 ms),
//! so process start-up, recovery and the first instance's start are
//! outside it. The plugin versions (the fixture with one custom section
//! more: new digests, the same code) are compiled once before anything is
//! timed, by swapping each into a warm-up pipeline, so the swaps inside
//! the clock load them from the component cache; instantiating and opening
//! the new instance beside the old one is inside it, as it is in
//! production. Every run's destination is checked against the generator's
//! oracle, so both sides did the same, correct work.
//!
//! `cargo bench -p weir-tests --bench serve_swap` after scripts/build-plugins
//! and `cargo build --release -p weir`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weir_test_support::{
    PipelineBuilder, ServeHost, SinkBuilder, Tenant, assert_positioned_exact, expected_state,
    plugin, sha256_hex, with_custom_section,
};

const TENANT: &str = "bench";
const SINK: &str = "lake";
const SEED: u64 = 41;
/// Distinct versions swapped in turn, so no swap asks for the running one.
const VERSIONS: u32 = 4;
const PAUSE_SAMPLES: usize = 100;
const ROUNDS: usize = 3;
const SWAP_EVERY: Duration = Duration::from_millis(200);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pipeline(name: &str, changes: u64) -> PipelineBuilder {
    PipelineBuilder::generator(SEED, changes)
        .name(name)
        .max_rows(1000)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(SinkBuilder::new(SINK, plugin("weir-fixture-positioned")).limits(128, 30_000))
}

/// The plugin versions swapped in turn.
struct Rotation {
    versions: Vec<Vec<u8>>,
    next: usize,
}

impl Rotation {
    /// Replaces the sink's plugin with the next version; the reply's
    /// `pause_ms`, or `None` when the pipeline was not running (then the
    /// version is taken at its next start).
    fn swap(&mut self, host: &ServeHost, pipeline: &str) -> Option<f64> {
        let wasm = &self.versions[self.next % self.versions.len()];
        self.next += 1;
        let token = host.token(TENANT);
        let reply = host.replace_plugin(TENANT, pipeline, SINK, wasm, None, token);
        assert_eq!(
            reply.code, 200,
            "replacing the plugin of {pipeline}: {reply}"
        );
        reply.json()["pause_ms"].as_f64()
    }
}

fn state(host: &ServeHost, pipeline: &str) -> String {
    let status = host.status(TENANT, pipeline, host.token(TENANT));
    status["state"].as_str().unwrap_or_default().to_string()
}

/// Polls until the pipeline's state is `wanted`; the moment it was seen.
fn wait_for(host: &ServeHost, pipeline: &str, wanted: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let now = state(host, pipeline);
        if now == wanted {
            return Instant::now();
        }
        assert!(
            matches!(now.as_str(), "starting" | "running" | "paused"),
            "{pipeline} is {now}, waiting for {wanted}\n{}",
            host.log_tail(40)
        );
        assert!(
            Instant::now() < deadline,
            "{pipeline} never became {wanted}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the run has read 95% of its changes (or ended).
fn near_the_end(host: &ServeHost, pipeline: &str, changes: u64) -> bool {
    let status = host.status(TENANT, pipeline, host.token(TENANT));
    let read = status["live"]["changes"].as_u64().unwrap_or(0);
    status["state"] != "running" || read >= changes / 20 * 19
}

/// One run to the end: the time from "running" to "finished" and the
/// pauses of the swaps made during it (every `SWAP_EVERY` when `swaps`).
fn timed_run(
    host: &ServeHost,
    name: &str,
    changes: u64,
    rotation: &mut Rotation,
    swaps: bool,
) -> (Duration, Vec<f64>) {
    let token = host.token(TENANT);
    let reply = host.deploy(TENANT, &pipeline(name, changes), token);
    assert!(reply.is_success(), "creating {name}: {reply}");
    let running = wait_for(host, name, "running");
    let done = AtomicBool::new(false);
    let (finished, pauses) = std::thread::scope(|scope| {
        let swapper = scope.spawn(|| {
            let mut pauses = Vec::new();
            if !swaps {
                return pauses;
            }
            loop {
                std::thread::sleep(SWAP_EVERY);
                if done.load(Ordering::Relaxed) || near_the_end(host, name, changes) {
                    return pauses;
                }
                match rotation.swap(host, name) {
                    Some(pause) => pauses.push(pause),
                    // It ended between the check and the swap.
                    None => return pauses,
                }
            }
        });
        let finished = wait_for(host, name, "finished");
        done.store(true, Ordering::Relaxed);
        (finished, swapper.join().expect("the swapping thread"))
    });
    assert_positioned_exact(
        &host.sink_root(TENANT, name, SINK),
        &expected_state(SEED, changes),
    );
    let reply = host.delete(TENANT, name, token);
    assert!(reply.is_success(), "deleting {name}: {reply}");
    (finished - running, pauses)
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

fn main() {
    let changes = env_or("WEIR_BENCH_CHANGES", 500_000);
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT).max_memory_mb(1024))
        .log("warn")
        .start();
    let token = host.token(TENANT);
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let versions: Vec<Vec<u8>> = (1..=VERSIONS)
        .map(|n| with_custom_section(&honest, "weir-bench-version", n.to_string().as_bytes()))
        .collect();
    for version in &versions {
        assert_ne!(sha256_hex(version), sha256_hex(&honest));
    }
    let mut rotation = Rotation { versions, next: 0 };

    // A pipeline that outlasts the swaps (it is deleted after them).
    let streaming = "pauses";
    let reply = host.deploy(TENANT, &pipeline(streaming, 10_000_000), token);
    assert!(reply.is_success(), "creating {streaming}: {reply}");
    wait_for(&host, streaming, "running");
    let compiling = Instant::now();
    for _ in 0..VERSIONS {
        rotation
            .swap(&host, streaming)
            .expect("the streaming pipeline runs");
    }
    println!(
        "warm-up: {VERSIONS} versions compiled and swapped in {:.1} s (not measured)",
        compiling.elapsed().as_secs_f64()
    );
    let mut pauses: Vec<f64> = (0..PAUSE_SAMPLES)
        .map(|_| {
            rotation
                .swap(&host, streaming)
                .expect("the streaming pipeline runs")
        })
        .collect();
    let reply = host.delete(TENANT, streaming, token);
    assert!(reply.is_success(), "deleting {streaming}: {reply}");
    pauses.sort_by(f64::total_cmp);
    println!(
        "pause per swap, {PAUSE_SAMPLES} swaps into a pipeline at full speed: p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms",
        percentile(&pauses, 50.0),
        percentile(&pauses, 99.0),
        pauses[pauses.len() - 1]
    );

    let mut alone = Vec::new();
    let mut swapped = Vec::new();
    let mut swap_pauses = Vec::new();
    for round in 0..ROUNDS {
        for swaps in [false, true] {
            let name = format!("run-{round}-{}", if swaps { "swaps" } else { "alone" });
            let (took, pauses) = timed_run(&host, &name, changes, &mut rotation, swaps);
            let rate = changes as f64 / took.as_secs_f64();
            println!(
                "{name}: {changes} changes in {:.2} s = {rate:.0} changes/s, {} swaps",
                took.as_secs_f64(),
                pauses.len()
            );
            if swaps {
                swapped.push(rate);
                swap_pauses.extend(pauses);
            } else {
                alone.push(rate);
            }
        }
    }
    let (alone, swapped) = (median(alone), median(swapped));
    println!(
        "throughput, median of {ROUNDS}: {alone:.0} changes/s alone, {swapped:.0} changes/s with \
         a swap every {} ms ({} swaps, median pause {:.2} ms): ratio {:.3}",
        SWAP_EVERY.as_millis(),
        swap_pauses.len(),
        if swap_pauses.is_empty() {
            f64::NAN
        } else {
            median(swap_pauses)
        },
        swapped / alone
    );
}
