//! The matrix's one-screen report.

use std::fmt::Write as _;
use std::time::Duration;

use super::{Aim, Phase, SourceReport, Spec};

fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Median and worst of the restart-to-caught-up times.
fn recovery(report: &SourceReport) -> String {
    let mut times: Vec<Duration> = report.attempts.iter().filter_map(|a| a.recovery).collect();
    if times.is_empty() {
        return "-".into();
    }
    times.sort();
    format!(
        "{} / {}",
        seconds(times[times.len() / 2]),
        seconds(*times.last().unwrap())
    )
}

/// The report as text: per source, where the kills landed; per source and
/// sink, what the checks after every restart found.
pub fn render(spec: &Spec, reports: &[SourceReport]) -> String {
    let mut out = String::new();
    let sources: Vec<&str> = spec.sources.iter().map(|s| s.name()).collect();
    let sinks: Vec<&str> = spec.sinks.iter().map(|s| s.name()).collect();
    writeln!(
        out,
        "== crash matrix: seed {}, {} kills wanted, sources {}, sinks {}",
        spec.seed,
        spec.kills,
        sources.join(","),
        sinks.join(",")
    )
    .unwrap();
    writeln!(
        out,
        "   replay: WEIR_CRASH_SEED={} scripts/crash-matrix --source {} --sinks {} --kills {}",
        spec.seed,
        sources.join(","),
        sinks.join(","),
        spec.kills
    )
    .unwrap();
    writeln!(
        out,
        "   rule: a kill that did not land where aimed is inconclusive; a source fails when more than {}% \
         of its attempts are inconclusive, or (with 5+ kills) an aim never landed",
        spec.max_inconclusive_percent
    )
    .unwrap();
    for report in reports {
        let source = report.source.unwrap().name();
        writeln!(
            out,
            "\n{source}: {} attempts, {} landed, {} inconclusive, store deleted after {} kills, {} wall",
            report.attempts.len(),
            report.landed(),
            report.inconclusive(),
            report.attempts.iter().filter(|a| a.store_lost).count(),
            seconds(report.wall)
        )
        .unwrap();
        writeln!(
            out,
            "  {:<20} {:>5} {:>9} {:>7} {:>13}",
            "aimed at", "tried", "backfill", "stream", "inconclusive"
        )
        .unwrap();
        for aim in Aim::all() {
            let tried: Vec<_> = report.attempts.iter().filter(|a| a.aim == aim).collect();
            if tried.is_empty() {
                continue;
            }
            let landed = |phase| tried.iter().filter(|a| a.landed == Some(phase)).count();
            writeln!(
                out,
                "  {:<20} {:>5} {:>9} {:>7} {:>13}",
                aim.label(),
                tried.len(),
                landed(Phase::Backfill),
                landed(Phase::Stream),
                tried.iter().filter(|a| a.landed.is_none()).count()
            )
            .unwrap();
        }
        for attempt in report
            .attempts
            .iter()
            .filter(|a| a.landed.is_none())
            .take(4)
        {
            writeln!(
                out,
                "  inconclusive kill {} ({}, aimed at the {}): {}",
                attempt.number,
                attempt.aim.label(),
                attempt.aimed_phase.name(),
                attempt.inconclusive.as_deref().unwrap_or("")
            )
            .unwrap();
        }
        for line in report.boundary.iter().take(2) {
            writeln!(out, "  {line}").unwrap();
        }
        if let Some(why) = &report.stopped_early {
            writeln!(out, "  stopped aiming: {why}").unwrap();
        }
    }
    writeln!(
        out,
        "\n{:<10} {:<11} {:<14} {:>6} {:>6} {:>5} {:>11} {:>8} {:>14} {:>15}",
        "source",
        "sink",
        "guarantee",
        "checks",
        "dups",
        "gaps",
        "resurrected",
        "phantoms",
        "replays@loss",
        "recover med/max"
    )
    .unwrap();
    for report in reports {
        let source = report.source.unwrap().name();
        for (kind, tally) in &report.per_sink {
            writeln!(
                out,
                "{:<10} {:<11} {:<14} {:>6} {:>6} {:>5} {:>11} {:>8} {:>14} {:>15}",
                source,
                kind.name(),
                if kind.exactly_once() {
                    "exactly-once"
                } else {
                    "at-least-once"
                },
                tally.checks,
                tally.found.duplicates,
                tally.found.gaps,
                tally.found.resurrected,
                tally.found.phantoms,
                if report.attempts.iter().any(|a| a.store_lost) {
                    tally.replays_after_store_loss.to_string()
                } else {
                    "-".into()
                },
                recovery(report)
            )
            .unwrap();
        }
    }
    let problems: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.problems
                .iter()
                .map(move |p| format!("{}: {p}", r.source.unwrap().name()))
        })
        .collect();
    if problems.is_empty() {
        writeln!(out, "\nverdict: PASS").unwrap();
    } else {
        writeln!(out, "\nverdict: FAIL").unwrap();
        for p in problems.iter().take(8) {
            let clipped: String = p.chars().take(400).collect();
            writeln!(out, "  - {clipped}").unwrap();
        }
    }
    out
}

/// Prints the report (and writes it to `WEIR_MATRIX_REPORT` when set).
pub fn print_report(spec: &Spec, reports: &[SourceReport]) {
    let text = render(spec, reports);
    println!("{text}");
    if let Ok(path) = std::env::var("WEIR_MATRIX_REPORT") {
        std::fs::write(&path, &text).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    }
}
