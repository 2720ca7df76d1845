//! The chaos run (docs/cluster.md, "Chaos run"): three `weir serve` hosts
//! on one etcd run several paced generator pipelines into the positioned
//! fixture while a seeded schedule of faults hits them: a host killed
//! (SIGKILL, then a fresh host with the same name), stopped for a blip or
//! past its lease (SIGSTOP, then SIGCONT), terminated (SIGTERM, then
//! started again), and etcd stopped for a while. After each fault every
//! pipeline must commit again; at the end the pace is lifted, every stream
//! runs to its end, and every destination is compared with the generator's
//! oracle: nothing lost, nothing twice.
//!
//! Bounded under `cargo test` (about seven faults); scripts/cluster-chaos
//! runs it as long as asked: `scripts/cluster-chaos --faults 100 --seed 7`.
//! Each host fault hits a host that holds a pipeline; a fault that could
//! not be made (no host held one, the signal did not land) is reported and
//! not counted; a run that made fewer host faults
//! than asked, without a time budget stopping it, is inconclusive and fails.

mod report;

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::common;
use crate::test_cluster::{Cluster, LEASE_TTL_S, T};
use common::etcd::{Watch, is_stopped};
use common::*;

const HOSTS: usize = 3;
/// One change every 2 ms per pipeline: commits every few hundred
/// milliseconds, so a fault finds work under way, and streams that outlast
/// a long run stay short enough to check at the end.
const PACE_US: u64 = 2_000;
/// What the stream length allows per fault: a fault and its recovery take
/// about five seconds on average, a stop well past the lease up to ten.
const SECONDS_PER_FAULT: u64 = 10;
/// How long every pipeline may take to commit again after a fault.
const RECOVERY_BOUND: Duration = Duration::from_secs(120);
/// How often the destinations are looked at.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// What to run, from the environment (scripts/cluster-chaos sets it); the
/// defaults are the bounded run `cargo test` makes.
struct Spec {
    /// Host faults (kills, stops, terms) that must be made; etcd stops come
    /// on top.
    host_faults: usize,
    pipelines: usize,
    /// Stop making faults after this long (those made are checked).
    budget: Option<Duration>,
    report: Option<PathBuf>,
}

impl Spec {
    fn from_env() -> Spec {
        let number = |name: &str| -> Option<u64> {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| {
                    v.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("{name}={v}: not a whole number"))
                })
        };
        let host_faults = number("WEIR_CHAOS_FAULTS").map_or(depth(7, 100), |n| n as usize);
        assert!(host_faults > 0, "WEIR_CHAOS_FAULTS: at least one fault");
        Spec {
            host_faults,
            pipelines: number("WEIR_CHAOS_PIPELINES").map_or(depth(4, 6), |n| n as usize),
            budget: number("WEIR_CHAOS_BUDGET_SECS").map(Duration::from_secs),
            report: std::env::var_os("WEIR_CHAOS_REPORT").map(PathBuf::from),
        }
    }

    /// Changes per stream: enough for the faults at one change per
    /// `PACE_US`, with room to spare, so that no stream ends mid-run.
    fn changes(&self) -> u64 {
        let by_faults = self.host_faults as u64 * SECONDS_PER_FAULT;
        let seconds = self
            .budget
            .map_or(by_faults, |budget| budget.as_secs().min(by_faults))
            + 60;
        seconds * 1_000_000 / PACE_US
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL, then a fresh host with the same name and shared folder.
    Kill,
    /// SIGSTOP shorter than the lease's commit bound, then SIGCONT: the
    /// host keeps its lease and its pipelines.
    StopBlip,
    /// SIGSTOP past the lease, then SIGCONT: the lease runs out while it
    /// sleeps, its pipelines move (past the placement delay) or it claims
    /// them again on a new lease; awake, it must land nothing stale.
    StopPastLease,
    /// SIGTERM (a hand-over), then the host started again.
    Term,
    /// SIGSTOP of etcd, then SIGCONT: every host must stop committing
    /// within the lease and resume.
    EtcdStop,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Kill,
        FaultKind::StopBlip,
        FaultKind::StopPastLease,
        FaultKind::Term,
        FaultKind::EtcdStop,
    ];
    /// How often each comes, in the order of [`FaultKind::ALL`].
    const WEIGHTS: [u32; 5] = [3, 2, 2, 2, 1];

    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Kill => "sigkill + fresh host",
            FaultKind::StopBlip => "sigstop blip",
            FaultKind::StopPastLease => "sigstop past lease",
            FaultKind::Term => "sigterm + restart",
            FaultKind::EtcdStop => "etcd sigstop",
        }
    }

    pub fn on_a_host(self) -> bool {
        self != FaultKind::EtcdStop
    }
}

/// A fault as the schedule drew it.
#[derive(Clone, Copy, Debug)]
struct Planned {
    kind: FaultKind,
    /// Picks the victim among the hosts that hold a pipeline when the
    /// fault is made (which hosts those are depends on timing).
    victim_draw: u64,
    /// How long a stop lasts.
    hold: Duration,
    /// How long after a kill or a term's exit the host starts again: at
    /// once (before its old lease ran out, so it keeps its placements) or
    /// after its pipelines moved.
    restart_after: Duration,
}

/// The seeded schedule: the first faults are every kind once, in a drawn
/// order (so that even the bounded run makes each), then kinds by weight.
struct Schedule {
    random: KillSchedule,
    first: Vec<FaultKind>,
}

impl Schedule {
    fn new(mut random: KillSchedule) -> Schedule {
        let mut first = FaultKind::ALL.to_vec();
        for i in (1..first.len()).rev() {
            let j = random.next_ms(0, i as u64 + 1) as usize;
            first.swap(i, j);
        }
        Schedule { random, first }
    }

    fn next(&mut self) -> Planned {
        let random = &mut self.random;
        let kind = self
            .first
            .pop()
            .unwrap_or_else(|| FaultKind::ALL[random.weighted(&FaultKind::WEIGHTS)]);
        let lease_ms = LEASE_TTL_S * 1000;
        let hold_ms = match kind {
            // Under the commit bound (three quarters of the lease).
            FaultKind::StopBlip => random.next_ms(200, lease_ms / 2),
            // From just past the lease (placements kept if it wakes within
            // the placement delay) to well past lease and delay.
            FaultKind::StopPastLease => random.next_ms(lease_ms, lease_ms * 3),
            // Sometimes past the lease, mostly not.
            FaultKind::EtcdStop => random.next_ms(300, lease_ms * 2),
            FaultKind::Kill | FaultKind::Term => 0,
        };
        Planned {
            kind,
            victim_draw: random.next_ms(0, u64::MAX),
            hold: Duration::from_millis(hold_ms),
            restart_after: Duration::from_millis(match kind {
                FaultKind::Kill => random.next_ms(0, lease_ms + 1500),
                FaultKind::Term => random.next_ms(0, 2000),
                _ => 0,
            }),
        }
    }
}

/// What became of one fault.
pub struct Outcome {
    pub number: usize,
    pub kind: FaultKind,
    pub victim: String,
    /// Why the fault could not be made, when it could not.
    pub not_made: Option<String>,
    /// From the fault to the moment every pipeline had committed after it.
    pub recovery: Option<Duration>,
    /// The cluster is in no state to go on (a host did not start again).
    halted: bool,
}

/// Each pipeline's commits as the destinations show them, sampled on a
/// thread of its own: every change of a pipeline's count, with when it was
/// seen.
struct Progress {
    seen: Mutex<Vec<Vec<(Instant, u64)>>>,
    stop: AtomicBool,
}

impl Progress {
    fn sample(&self, roots: &[PathBuf]) {
        let mut counters: Vec<PositionedCommits> =
            roots.iter().map(|r| PositionedCommits::new(r)).collect();
        while !self.stop.load(Ordering::Relaxed) {
            for (pipeline, counter) in counters.iter_mut().enumerate() {
                let count = counter.count();
                let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                if seen[pipeline].last().is_none_or(|(_, last)| *last != count) {
                    seen[pipeline].push((Instant::now(), count));
                }
            }
            std::thread::sleep(SAMPLE_EVERY);
        }
    }

    /// When every pipeline had committed past `baseline`, if all have.
    fn all_past(&self, baseline: &[u64]) -> Option<Instant> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.iter()
            .zip(baseline)
            .map(|(changes, base)| {
                changes
                    .iter()
                    .find(|(_, count)| count > base)
                    .map(|(at, _)| *at)
            })
            .try_fold(None, |latest: Option<Instant>, at| {
                at.map(|at| Some(latest.map_or(at, |l| l.max(at))))
            })
            .flatten()
    }
}

/// The weir_cluster_fenced_writes_total each host process showed last;
/// those of processes that ended are kept apart.
struct FencedWrites {
    current: Vec<u64>,
    ended: u64,
}

impl FencedWrites {
    fn read(&mut self, cluster: &Cluster, index: usize) {
        let host = &cluster.hosts[index];
        let reply = host.get_with("/metrics", host.operator_token());
        assert_eq!(
            reply.code, 200,
            "{}'s /metrics: {reply}",
            cluster.names[index]
        );
        self.current[index] = reply
            .body
            .lines()
            .find_map(|line| line.strip_prefix("weir_cluster_fenced_writes_total "))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .map_or(0, |n| n as u64);
    }

    /// Host `index`'s process ended: its last count is kept, and the next
    /// process starts from nothing.
    fn ended(&mut self, index: usize) {
        self.ended += std::mem::take(&mut self.current[index]);
    }

    fn total(&self) -> u64 {
        self.ended + self.current.iter().sum::<u64>()
    }
}

/// What the whole run found.
pub struct Findings {
    pub seed: u64,
    pub spec_faults: usize,
    pub pipelines: Vec<(String, u64)>,
    pub changes: u64,
    pub outcomes: Vec<Outcome>,
    pub claims: usize,
    pub moves: usize,
    pub fenced_writes: u64,
    pub differences: Vec<(String, OracleDifferences)>,
    pub stopped_early: Option<String>,
    pub notes: Vec<String>,
    pub problems: Vec<String>,
    pub wall: Duration,
}

#[test]
fn three_hosts_stay_exact_under_a_seeded_storm_of_kills_stops_terms_and_etcd_stalls() {
    let spec = Spec::from_env();
    let started = Instant::now();
    let random = KillSchedule::from_env_or_random();
    let seed = random.seed();
    let mut schedule = Schedule::new(random);
    let changes = spec.changes();
    let mut cluster = Cluster::start(HOSTS, LEASE_TTL_S).with_changes(changes);
    let assignments = cluster.etcd.watch(&format!("/weir/assignments/{T}/"));
    let names: Vec<String> = (0..spec.pipelines).map(|n| format!("c{n}")).collect();
    // Each stream its own seed, derived from the schedule's so that a
    // replay runs the same workload.
    let pipelines: Vec<(&str, u64)> = names
        .iter()
        .enumerate()
        .map(|(n, name)| {
            let offset = (n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (name.as_str(), seed.wrapping_add(offset) % 1_000_000_007)
        })
        .collect();
    println!(
        "cluster chaos: {HOSTS} hosts, {} pipelines of {changes} changes at one per {PACE_US} µs, \
         {} host faults wanted{}",
        pipelines.len(),
        spec.host_faults,
        spec.budget
            .map_or(String::new(), |b| format!(", at most {} s", b.as_secs()))
    );
    cluster.deploy(0, &pipelines, PACE_US);

    let progress = Progress {
        seen: Mutex::new(vec![Vec::new(); pipelines.len()]),
        stop: AtomicBool::new(false),
    };
    let roots: Vec<PathBuf> = names.iter().map(|n| cluster.sink_root(n)).collect();
    let mut findings = Findings {
        seed,
        spec_faults: spec.host_faults,
        pipelines: pipelines.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        changes,
        outcomes: Vec::new(),
        claims: 0,
        moves: 0,
        fenced_writes: 0,
        differences: Vec::new(),
        stopped_early: None,
        notes: Vec::new(),
        problems: Vec::new(),
        wall: Duration::ZERO,
    };
    let mut fenced = FencedWrites {
        current: vec![0; HOSTS],
        ended: 0,
    };
    // Whether the cluster is still in a state to finish and be compared.
    let mut healthy = true;
    let mut budget_ran_out = false;
    std::thread::scope(|scope| {
        scope.spawn(|| progress.sample(&roots));
        let mut commits: Vec<PositionedCommits> =
            roots.iter().map(|r| PositionedCommits::new(r)).collect();
        // Every pipeline commits before the first fault, or a fault proves
        // nothing.
        let nothing = vec![0; pipelines.len()];
        if wait_until_all_past(&progress, &nothing, Duration::from_secs(60)).is_none() {
            findings.problems.push(format!(
                "not every pipeline committed within 60 s of the start; etcd: {:?}",
                cluster.etcd.list("/weir/assignments/")
            ));
            healthy = false;
            progress.stop.store(true, Ordering::Relaxed);
            return;
        }
        let mut number = 0;
        loop {
            let made = findings
                .outcomes
                .iter()
                .filter(|o| o.kind.on_a_host() && o.not_made.is_none())
                .count();
            if made >= spec.host_faults {
                break;
            }
            if let Some(budget) = spec.budget
                && started.elapsed() >= budget
            {
                budget_ran_out = true;
                findings.stopped_early = Some(format!(
                    "the {} s budget ran out after {made} of {} host faults",
                    budget.as_secs(),
                    spec.host_faults
                ));
                break;
            }
            let not_made = findings
                .outcomes
                .iter()
                .filter(|o| o.not_made.is_some())
                .count();
            if not_made > spec.host_faults {
                findings.stopped_early = Some(format!(
                    "{not_made} faults could not be made, more than were asked for"
                ));
                break;
            }
            if let Some(finished) = first_finished(&cluster, &names) {
                findings.stopped_early = Some(format!(
                    "{finished} ran to its end after {made} host faults: the streams were too \
                     short for this run"
                ));
                break;
            }
            revive_the_dead(&mut cluster, &mut fenced, &mut findings.problems);
            for index in 0..HOSTS {
                fenced.read(&cluster, index);
            }
            number += 1;
            let planned = schedule.next();
            let outcome = make(
                &mut cluster,
                number,
                planned,
                &progress,
                &mut commits,
                &mut fenced,
                &mut findings.problems,
            );
            println!(
                "fault {number}: {} on {}: {}",
                outcome.kind.label(),
                outcome.victim,
                match (&outcome.not_made, outcome.recovery) {
                    (Some(why), _) => format!("not made ({why})"),
                    (None, Some(took)) => format!(
                        "every pipeline committed again {:.2} s after it",
                        took.as_secs_f64()
                    ),
                    (None, None) => "the pipelines did not all commit again".into(),
                }
            );
            let stuck =
                outcome.halted || (outcome.not_made.is_none() && outcome.recovery.is_none());
            findings.outcomes.push(outcome);
            if stuck {
                healthy = false;
                break;
            }
        }
        progress.stop.store(true, Ordering::Relaxed);
    });
    if healthy {
        finish(&mut cluster, &pipelines, &mut fenced, &mut findings);
    }
    count_moves(&assignments, &mut findings);
    findings.fenced_writes = fenced.total();
    let made = findings
        .outcomes
        .iter()
        .filter(|o| o.kind.on_a_host() && o.not_made.is_none())
        .count();
    if made < spec.host_faults && !budget_ran_out {
        findings.problems.push(format!(
            "inconclusive: {made} of {} host faults were made",
            spec.host_faults
        ));
    }
    findings.wall = started.elapsed();
    let text = report::render(&findings);
    println!("{text}");
    if let Some(path) = &spec.report {
        std::fs::write(path, &text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
    assert!(
        findings.problems.is_empty(),
        "the chaos run failed (see the report above)"
    );
}

/// Makes one fault and waits until every pipeline committed after it.
#[allow(clippy::too_many_arguments)]
fn make(
    cluster: &mut Cluster,
    number: usize,
    planned: Planned,
    progress: &Progress,
    commits: &mut [PositionedCommits],
    fenced: &mut FencedWrites,
    problems: &mut Vec<String>,
) -> Outcome {
    let holders = holders(cluster);
    let victim = holders
        .get((planned.victim_draw % holders.len().max(1) as u64) as usize)
        .copied();
    let mut outcome = Outcome {
        number,
        kind: planned.kind,
        victim: match victim {
            _ if !planned.kind.on_a_host() => "etcd".into(),
            Some(index) => cluster.names[index].clone(),
            None => "no host".into(),
        },
        not_made: None,
        recovery: None,
        halted: false,
    };
    let victim = match victim {
        Some(index) => index,
        None if planned.kind.on_a_host() => {
            outcome.not_made = Some("no host ran a pipeline".into());
            return outcome;
        }
        None => 0, // etcd's fault; no host is touched
    };
    let fault = Instant::now();
    // After `quiet`, whatever the destinations gain was committed by a host
    // that the fault left able to: the baseline is read then.
    let mut restart_at = None;
    match planned.kind {
        FaultKind::Kill => {
            let host = &mut cluster.hosts[victim];
            host.sigkill();
            let status = host.wait_exit(Duration::ZERO);
            fenced.ended(victim);
            if status.and_then(|s| s.signal()) != Some(libc::SIGKILL) {
                problems.push(format!(
                    "fault {number}: {} had ended before the SIGKILL: {status:?}",
                    outcome.victim
                ));
                outcome.not_made = Some("the host had ended already".into());
                cluster.restart(victim);
                return outcome;
            }
            restart_at = Some(Instant::now() + planned.restart_after);
        }
        FaultKind::StopBlip | FaultKind::StopPastLease => {
            let pid = cluster.hosts[victim].pid();
            cluster.hosts[victim].sigstop();
            if !became_stopped(pid) {
                cluster.hosts[victim].sigcont();
                outcome.not_made = Some("SIGSTOP did not stop it within a second".into());
                return outcome;
            }
        }
        FaultKind::Term => {
            cluster.hosts[victim].sigterm();
            let status = cluster.hosts[victim].wait_exit(Duration::from_secs(20));
            fenced.ended(victim);
            if !status.is_some_and(|s| s.success()) {
                problems.push(format!(
                    "fault {number}: {} did not exit cleanly within 20 s of SIGTERM: {status:?}",
                    outcome.victim
                ));
            }
            restart_at = Some(Instant::now() + planned.restart_after);
        }
        FaultKind::EtcdStop => {
            cluster.etcd.pause();
            if !became_stopped(cluster.etcd.pid()) {
                cluster.etcd.resume();
                outcome.not_made = Some("SIGSTOP did not stop etcd within a second".into());
                return outcome;
            }
            std::thread::sleep(planned.hold);
            cluster.etcd.resume();
        }
    }
    let baseline: Vec<u64> = commits.iter_mut().map(|c| c.count()).collect();
    let cluster_ref: &Cluster = cluster;
    let recovered = std::thread::scope(|scope| {
        // The restarted host starts beside the wait, so a slow start does
        // not hide when the others took over.
        let fresh = restart_at.map(|at| {
            scope.spawn(move || {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                cluster_ref.fresh_host(victim)
            })
        });
        if matches!(planned.kind, FaultKind::StopBlip | FaultKind::StopPastLease) {
            std::thread::sleep(planned.hold);
            cluster_ref.hosts[victim].sigcont();
        }
        let recovered = wait_until_all_past(progress, &baseline, RECOVERY_BOUND);
        (recovered, fresh.map(|thread| thread.join()))
    });
    let (recovered, fresh) = recovered;
    match fresh {
        Some(Ok(host)) => cluster.hosts[victim] = host,
        Some(Err(_)) => {
            problems.push(format!(
                "fault {number}: {} did not start again (its log is above)",
                outcome.victim
            ));
            outcome.halted = true;
        }
        None => {}
    }
    match recovered {
        Some(at) => outcome.recovery = Some(at.saturating_duration_since(fault)),
        None => problems.push(format!(
            "fault {number} ({} on {}): not every pipeline committed again within {} s; \
             assignments: {:?}",
            planned.kind.label(),
            outcome.victim,
            RECOVERY_BOUND.as_secs(),
            cluster.etcd.list("/weir/assignments/")
        )),
    }
    outcome
}

/// The hosts etcd says hold a pipeline now.
fn holders(cluster: &Cluster) -> Vec<usize> {
    let owners = cluster.etcd.list(&format!("/weir/assignments/{T}/"));
    (0..HOSTS)
        .filter(|index| {
            owners
                .iter()
                .any(|(_, owner)| *owner == cluster.names[*index])
        })
        .collect()
}

/// Waits up to a second until every thread of `pid` is stopped.
fn became_stopped(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if is_stopped(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn wait_until_all_past(progress: &Progress, baseline: &[u64], bound: Duration) -> Option<Instant> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(at) = progress.all_past(baseline) {
            return Some(at);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
}

/// A host that ended without a fault is a finding; it is started again so
/// the run goes on with three.
fn revive_the_dead(cluster: &mut Cluster, fenced: &mut FencedWrites, problems: &mut Vec<String>) {
    for index in 0..HOSTS {
        if let Some(status) = cluster.hosts[index].wait_exit(Duration::ZERO) {
            problems.push(format!(
                "{} ended on its own ({status}):\n{}",
                cluster.names[index],
                cluster.hosts[index].log_tail(30)
            ));
            fenced.ended(index);
            cluster.restart(index);
        }
    }
}

/// The first pipeline whose stream ended, if any.
fn first_finished(cluster: &Cluster, names: &[String]) -> Option<String> {
    let owners = cluster.etcd.list(&format!("/weir/assignments/{T}/"));
    names
        .iter()
        .find(|name| {
            let key = format!("/weir/assignments/{T}/{name}");
            owners
                .iter()
                .find(|(k, _)| *k == key)
                .and_then(|(_, owner)| cluster.names.iter().position(|n| n == owner))
                .is_some_and(|index| {
                    let host = &cluster.hosts[index];
                    host.status(T, name, host.operator_token())["state"] == "finished"
                })
        })
        .cloned()
}

/// Lifts the pace, lets every stream end, and compares each destination
/// with the oracle.
fn finish(
    cluster: &mut Cluster,
    pipelines: &[(&str, u64)],
    fenced: &mut FencedWrites,
    findings: &mut Findings,
) {
    let unfinished = cluster.lift_pace_and_finish(0, pipelines, Duration::from_secs(300));
    if !unfinished.is_empty() {
        findings.problems.push(format!(
            "{unfinished:?} did not finish within 300 s once the pace was lifted; assignments: {:?}",
            cluster.etcd.list("/weir/assignments/")
        ));
    }
    for index in 0..HOSTS {
        fenced.read(cluster, index);
    }
    for (name, seed) in pipelines {
        let found = positioned_differences(
            &cluster.sink_root(name),
            &expected_state(*seed, cluster.changes()),
        );
        if !found.none() {
            findings.problems.push(format!(
                "{name}'s destination differs from the oracle: {found:?}"
            ));
        }
        findings.differences.push((name.to_string(), found));
    }
}

/// Claims and moves, from every change of an assignment etcd made: a claim
/// is each new owner written, a move a claim by another host than the
/// pipeline's last owner.
fn count_moves(assignments: &Watch, findings: &mut Findings) {
    let mut last: std::collections::BTreeMap<String, String> = Default::default();
    for event in assignments.events() {
        let Some(owner) = event.value else {
            continue; // released or expired: the next claim says who took it
        };
        findings.claims += 1;
        if last.get(&event.key).is_some_and(|before| *before != owner) {
            findings.moves += 1;
        }
        last.insert(event.key, owner);
    }
    if assignments.ended() {
        findings.notes.push(
            "the watch on the assignments ended during the run: claims and moves are undercounted"
                .into(),
        );
    }
}
