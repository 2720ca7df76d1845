//! The chaos run's verdict table.

use std::fmt::Write as _;
use std::time::Duration;

use super::{FaultKind, Findings, Outcome};
use crate::test_cluster::{LEASE_TTL_S, PLACEMENT_DELAY_MS};

/// The nearest-rank percentile `p` (0..=100) of sorted `values`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn seconds(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// One row of the faults table: made, not made, recovery p50/p99/max.
fn fault_row(out: &mut String, label: &str, outcomes: &[&Outcome]) {
    let made: Vec<&&Outcome> = outcomes.iter().filter(|o| o.not_made.is_none()).collect();
    let mut times: Vec<Duration> = made.iter().filter_map(|o| o.recovery).collect();
    times.sort();
    let (p50, p99, max) = if times.is_empty() {
        ("-".to_string(), "-".to_string(), "-".to_string())
    } else {
        (
            seconds(percentile(&times, 50.0)),
            seconds(percentile(&times, 99.0)),
            seconds(times[times.len() - 1]),
        )
    };
    writeln!(
        out,
        "  {:<22} {:>5} {:>9} {:>12} {:>12} {:>8}",
        label,
        made.len(),
        outcomes.len() - made.len(),
        p50,
        p99,
        max
    )
    .unwrap();
}

pub fn render(findings: &Findings) -> String {
    let mut out = String::new();
    writeln!(
        out,
        "== cluster chaos: seed {}, 3 hosts on one etcd, {} pipelines of {} changes each \
         (positioned sink), lease {LEASE_TTL_S} s, placement delay {PLACEMENT_DELAY_MS} ms, \
         {} host faults wanted, {:.0} s wall",
        findings.seed,
        findings.pipelines.len(),
        findings.changes,
        findings.spec_faults,
        findings.wall.as_secs_f64()
    )
    .unwrap();
    writeln!(
        out,
        "   replay: scripts/cluster-chaos --seed {} --faults {} --pipelines {} (the schedule \
         replays; the timing around it does not)",
        findings.seed,
        findings.spec_faults,
        findings.pipelines.len()
    )
    .unwrap();
    writeln!(
        out,
        "   recovery: from the signal to the moment every pipeline had committed after the \
         fault (after SIGCONT for etcd)"
    )
    .unwrap();
    writeln!(
        out,
        "\n  {:<22} {:>5} {:>9} {:>12} {:>12} {:>8}",
        "fault", "made", "not made", "recover p50", "recover p99", "max"
    )
    .unwrap();
    for kind in FaultKind::ALL {
        let of_kind: Vec<&Outcome> = findings
            .outcomes
            .iter()
            .filter(|o| o.kind == kind)
            .collect();
        fault_row(&mut out, kind.label(), &of_kind);
    }
    let on_hosts: Vec<&Outcome> = findings
        .outcomes
        .iter()
        .filter(|o| o.kind.on_a_host())
        .collect();
    fault_row(&mut out, "all host faults", &on_hosts);
    for outcome in findings
        .outcomes
        .iter()
        .filter(|o| o.not_made.is_some())
        .take(6)
    {
        writeln!(
            out,
            "  not made: fault {} ({} on {}): {}",
            outcome.number,
            outcome.kind.label(),
            outcome.victim,
            outcome.not_made.as_deref().unwrap_or_default()
        )
        .unwrap();
    }
    if let Some(why) = &findings.stopped_early {
        writeln!(out, "  stopped early: {why}").unwrap();
    }
    writeln!(
        out,
        "\n  moves (a pipeline claimed by another host than its last owner): {}",
        findings.moves
    )
    .unwrap();
    writeln!(
        out,
        "  claims (every owner written to /weir/assignments/): {}",
        findings.claims
    )
    .unwrap();
    writeln!(
        out,
        "  fenced writes (weir_cluster_fenced_writes_total, summed over every host process): {}",
        findings.fenced_writes
    )
    .unwrap();
    writeln!(
        out,
        "\n  {:<9} {:>11} {:>11} {:>5} {:>6} {:>10}",
        "pipeline", "seed", "duplicates", "gaps", "extra", "differing"
    )
    .unwrap();
    let mut total = weir_test_support::OracleDifferences::default();
    for ((name, seed), (_, found)) in findings.pipelines.iter().zip(&findings.differences) {
        writeln!(
            out,
            "  {:<9} {:>11} {:>11} {:>5} {:>6} {:>10}",
            name, seed, found.duplicates, found.missing, found.extra, found.differing
        )
        .unwrap();
        total.duplicates += found.duplicates;
        total.missing += found.missing;
        total.extra += found.extra;
        total.differing += found.differing;
    }
    if findings.differences.is_empty() {
        writeln!(out, "  (not compared: the run failed before the end)").unwrap();
    } else {
        writeln!(
            out,
            "  {:<9} {:>11} {:>11} {:>5} {:>6} {:>10}",
            "total", "", total.duplicates, total.missing, total.extra, total.differing
        )
        .unwrap();
    }
    writeln!(
        out,
        "  (duplicates: changes held twice; gaps: keys the oracle has and the destination \
         lacks; extra: keys it should not hold; differing: keys with another value)"
    )
    .unwrap();
    for note in &findings.notes {
        writeln!(out, "  note: {note}").unwrap();
    }
    if findings.problems.is_empty() {
        writeln!(out, "\nverdict: PASS").unwrap();
    } else {
        writeln!(out, "\nverdict: FAIL").unwrap();
        for problem in findings.problems.iter().take(8) {
            let clipped: String = problem.chars().take(600).collect();
            writeln!(out, "  - {clipped}").unwrap();
        }
    }
    out
}
