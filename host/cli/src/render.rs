//! What the commands print: one line per fact for people, or JSON with
//! `--json` for scripts.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use weir_pipeline::RunReport;
use weir_pipeline::status::{Status, TableShape};
use weir_runtime::PluginInfo;
use weir_serve::api::{
    Applied, LiveSink, PipelineList, PipelineStatus, PluginView, Readiness, State, Steered, Swapped,
};

fn json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("reports serialize")
    );
}

pub fn run_report(report: &RunReport, as_json: bool) {
    if as_json {
        json(report);
    } else {
        println!(
            "pipeline `{}` (epoch {}): {} changes in {} transactions, {} batches committed, checkpoint {}",
            report.pipeline,
            report.epoch,
            report.changes,
            report.transactions,
            report.batches_committed,
            report.checkpoint.as_deref().unwrap_or("(none)")
        );
    }
    for (sink, reason) in &report.disabled {
        eprintln!(
            "weir: optional sink `{sink}` was disabled and is behind: {reason}; \
             fix it and run again to catch it up"
        );
    }
}

pub fn tables(tables: &[TableShape], as_json: bool) {
    if as_json {
        return json(&tables);
    }
    for table in tables {
        let key = if table.key.is_empty() {
            "no key".to_string()
        } else {
            format!("key ({})", table.key.join(", "))
        };
        let destination = if table.destination == table.table {
            String::new()
        } else {
            format!(" into `{}`", table.destination)
        };
        println!(
            "table `{}`{destination}: {}, {key}",
            table.table, table.mode
        );
        let width = table
            .columns
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0);
        for column in &table.columns {
            let nulls = match column.role {
                "key" | "column" if column.nullable => "null",
                "key" | "column" => "not null",
                _ => "",
            };
            let line = format!(
                "  {:<width$}  {:<8}  {:<36} {nulls}",
                column.name, column.role, column.arrow_type
            );
            println!("{}", line.trim_end());
        }
    }
    println!(
        "Every batch's rows are changes (`__op`: insert, update, delete, read); a delete \
         carries the key, the other columns null. docs/sink-authors.md says what each type holds."
    );
}

pub fn status(status: &Status, as_json: bool) {
    if as_json {
        return json(status);
    }
    println!(
        "pipeline `{}`, epoch {}, source head {}",
        status.pipeline,
        status.epoch.map_or("-".to_string(), |e| e.to_string()),
        status.source_head.as_deref().unwrap_or("(unbounded)")
    );
    for sink in &status.sinks {
        let role = if sink.required {
            "required"
        } else {
            "optional"
        };
        let guarantee = if sink.positioned {
            "exactly-once: positions kept by the sink"
        } else {
            "at-least-once: positions kept by the host"
        };
        let error = sink
            .error
            .as_deref()
            .map(|e| format!(" error: {e}"))
            .unwrap_or_default();
        println!("sink `{}` ({role}, {guarantee}){error}", sink.sink);
        for t in &sink.tables {
            println!(
                "  {:<24} {:>16}  from {:<5}  lag {}{}{}",
                t.table,
                t.position.as_deref().unwrap_or("-"),
                t.source,
                t.lag_transactions
                    .map_or("-".to_string(), |l| format!("{l} transactions")),
                t.store_position
                    .as_deref()
                    .map(|s| format!("  (store says {s})"))
                    .unwrap_or_default(),
                t.dead_letter_rows
                    .map(|n| format!("  {n} row(s) set aside"))
                    .unwrap_or_default()
            );
        }
    }
}

pub fn plugin_info(info: &PluginInfo, as_json: bool) {
    if as_json {
        return json(info);
    }
    println!("plugin       {}", info.path.display());
    println!("sha256       {}", info.sha256);
    println!("size         {} bytes", info.size);
    println!("contract     weir:sink@{}", info.wit_version);
    let capabilities = if info.capabilities.is_empty() {
        "none (at-least-once: the host keeps positions)".to_string()
    } else {
        let names: Vec<&str> = info.capabilities.iter().map(|c| c.name()).collect();
        format!("{} (exactly-once)", names.join(", "))
    };
    println!("capabilities {capabilities}");
    let network: Vec<String> = info
        .network
        .iter()
        .map(|kind| match info.optional_network.contains(kind) {
            true => format!(
                "{kind} (optional: needs grants.{kind} only where its config makes it reach out)"
            ),
            false => format!("{kind} (needs grants.{kind} in the sink's entry)"),
        })
        .collect();
    match network.is_empty() {
        true => println!("network      none"),
        false => println!("network      {}", network.join("\n             ")),
    }
    println!("imports      {}", info.imports.join("\n             "));
    println!("exports      {}", info.exports.join("\n             "));
}

/// What `weir plugin test` found: a line per scenario, then the verdict.
pub fn plugin_test(report: &crate::conformance::Report, as_json: bool) {
    if as_json {
        return json(report);
    }
    print_lines(plugin_test_lines(report));
}

fn plugin_test_lines(report: &crate::conformance::Report) -> Vec<String> {
    use crate::conformance::Outcome;
    let mut lines = vec![
        format!("plugin     {}", report.plugin.display()),
        format!("sha256     {}", report.sha256),
        format!(
            "positions  {}",
            if report.positioned { "yes" } else { "no" }
        ),
        String::new(),
    ];
    let width = report
        .scenarios
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    for scenario in &report.scenarios {
        let outcome = match scenario.outcome {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::NotApplicable => "n/a",
            Outcome::Refused => "refused",
            Outcome::CannotVerify => "cannot verify",
        };
        lines.push(format!(
            "{:width$}  {outcome:13}  {} ({:.1}s)",
            scenario.name, scenario.detail, scenario.seconds
        ));
    }
    lines.push(String::new());
    lines.push(format!("verdict    {}", report.verdict));
    lines
}

// What `weir serve` answers, read into the admin API's own types
// (`weir_serve::api`). While a pipeline starts much of its status is not
// known yet, and a server of another version may leave fields out: show
// what is there. Each reply is first laid out as lines, so the layout can
// be tested.

/// A reply printed as the server sent it, made pretty.
pub fn server_json(value: &Value) {
    json(value);
}

/// A reply that is text (metrics, or a body that is not what was expected).
pub fn server_text(body: &str) {
    if body.ends_with('\n') {
        print!("{body}");
    } else {
        println!("{body}");
    }
}

fn print_lines(lines: Vec<String>) {
    for line in lines {
        println!("{line}");
    }
}

/// `GET /v1/pipelines`: one line per pipeline.
pub fn pipeline_list(reply: &PipelineList) {
    print_lines(pipeline_list_lines(reply));
}

/// A pipeline was deleted, or anything else whose reply says no more.
pub fn pipeline_done(name: &impl std::fmt::Display, done: &str) {
    println!("{}", done_line(&name.to_string(), done));
}

/// A pipeline file was applied.
pub fn applied(name: &impl std::fmt::Display, reply: &Applied) {
    println!("{}", applied_line(&name.to_string(), reply));
}

/// A plugin was uploaded for `weir ctl apply --plugin`.
pub fn uploaded(file: &Path, sinks: &[String], sha256: &str, size: u64, already_there: bool) {
    println!(
        "{}",
        uploaded_line(file, sinks, sha256, size, already_there)
    );
}

/// A pipeline was paused, resumed, stopped or started.
pub fn steered(name: &impl std::fmt::Display, done: &str, reply: &Steered) {
    println!("{}", steered_line(&name.to_string(), done, reply));
}

/// A plugin replaced or rolled back.
pub fn swap(name: &impl std::fmt::Display, sink: &str, done: &str, reply: &Swapped) {
    println!("{}", swap_line(&name.to_string(), sink, done, reply));
}

/// `GET /ready`: ready, or which pipelines do not run and which files were
/// refused.
pub fn readiness(reply: &Readiness) {
    print_lines(readiness_lines(reply));
}

/// `GET /v1/pipelines/{tenant}/{pipeline}`.
pub fn server_status(reply: &PipelineStatus) {
    print_lines(server_status_lines(reply));
}

/// A name the reply left out shows as `?`, so the line still lines up.
fn or_unknown(text: &str) -> &str {
    if text.is_empty() { "?" } else { text }
}

/// A digest cut to what a person compares at a glance.
fn abbreviated(digest: &str) -> String {
    digest.chars().take(12).collect()
}

fn pipeline_list_lines(reply: &PipelineList) -> Vec<String> {
    let refused = reply.rejected.iter().map(|file| {
        format!(
            "refused file {}: {}",
            or_unknown(&file.file),
            or_unknown(&file.error)
        )
    });
    if reply.pipelines.is_empty() {
        let mut lines = vec!["no pipelines (none exists, or none this token reaches)".to_string()];
        lines.extend(refused);
        return lines;
    }
    let rows: Vec<(String, &str, &str)> = reply
        .pipelines
        .iter()
        .map(|p| {
            let name = format!("{}/{}", or_unknown(&p.tenant), or_unknown(&p.pipeline));
            (
                name,
                p.state.as_str(),
                p.reason.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
    let state_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(5);
    let mut lines = vec![format!(
        "{:<name_width$}  {:<state_width$}  REASON",
        "PIPELINE", "STATE"
    )];
    for (name, state, reason) in rows {
        let line = format!("{name:<name_width$}  {state:<state_width$}  {reason}");
        // No trailing blanks on a line without a reason: they bother `diff`.
        lines.push(line.trim_end().to_string());
    }
    lines.extend(refused);
    lines
}

fn done_line(name: &str, done: &str) -> String {
    format!("{name}: {done}")
}

fn applied_line(name: &str, reply: &Applied) -> String {
    let mut line = done_line(name, "applied");
    if !reply.changed {
        line.push_str(" (the same definition: nothing changed)");
    }
    line
}

fn uploaded_line(
    file: &Path,
    sinks: &[String],
    sha256: &str,
    size: u64,
    already_there: bool,
) -> String {
    let sinks: Vec<String> = sinks.iter().map(|s| format!("`{s}`")).collect();
    let mut line = format!(
        "uploaded {}: {}, {} bytes, for sink{} {}",
        file.display(),
        weir_pipeline::plugin_ref::reference(sha256),
        size,
        if sinks.len() == 1 { "" } else { "s" },
        sinks.join(", ")
    );
    if already_there {
        line.push_str(" (the server had it already)");
    }
    line
}

/// Says what was done; or, where the pipeline is not there yet, what was
/// asked and where it stands: a pause or a stop lands at the next commit
/// boundary, so the reply may still name the state before it.
fn steered_line(name: &str, done: &str, reply: &Steered) -> String {
    let (verb, arrived): (&str, &[State]) = match done {
        "paused" => ("pause", &[State::Paused]),
        "resumed" => ("resume", &[State::Starting, State::Running]),
        "stopped" => ("stop", &[State::Stopped]),
        "started" => ("start", &[State::Starting, State::Running]),
        _ => (done, &[]),
    };
    let mut line = if reply.state == State::Unknown || arrived.contains(&reply.state) {
        done_line(name, done)
    } else {
        let lands = match verb {
            "pause" | "stop" => format!(", and {verb}s at its next commit boundary"),
            _ => String::new(),
        };
        format!(
            "{name}: asked to {verb}; it is {}{lands}",
            reply.state.as_str()
        )
    };
    if let Some(reason) = &reply.reason {
        line.push_str(&format!(" ({reason})"));
    }
    line
}

fn swap_line(name: &str, sink: &str, done: &str, reply: &Swapped) -> String {
    let sink = match reply.sink.is_empty() {
        true => sink,
        false => &reply.sink,
    };
    let mut line = format!("{name}: sink `{sink}` {done}");
    if !reply.sha256.is_empty() {
        line.push_str(&format!(", now plugin {}", abbreviated(&reply.sha256)));
    }
    if let Some(previous) = &reply.previous_sha256 {
        line.push_str(&format!(" (was {})", abbreviated(previous)));
    }
    if let Some(pause) = reply.pause_ms {
        line.push_str(&format!("; the pipeline paused {pause:.1} ms"));
    }
    if let Some(at) = &reply.at {
        line.push_str(&format!(", the new version took over at {at}"));
    }
    if reply.restarted {
        line.push_str("; the pipeline was parked and starts again with it");
    }
    line
}

fn readiness_lines(reply: &Readiness) -> Vec<String> {
    if reply.ready {
        return vec!["ready: every pipeline that should run runs".into()];
    }
    let mut lines = vec!["not ready:".to_string()];
    for pipeline in &reply.not_running {
        let mut line = format!(
            "  {}: {}",
            or_unknown(&pipeline.pipeline),
            pipeline.state.as_str()
        );
        if let Some(reason) = &pipeline.reason {
            line.push_str(&format!(" ({reason})"));
        }
        lines.push(line);
    }
    for file in &reply.rejected {
        lines.push(format!(
            "  {} refused: {}",
            or_unknown(&file.file),
            or_unknown(&file.error)
        ));
    }
    lines
}

/// How many swap events `weir ctl status` shows; `--json` has them all.
const RECENT_SWAPS: usize = 5;

/// State, then per sink its plugin and per table its position and where
/// that came from, then the last swaps.
fn server_status_lines(reply: &PipelineStatus) -> Vec<String> {
    let mut lines = Vec::new();
    let mut head = format!(
        "pipeline {}/{}: {}",
        or_unknown(&reply.tenant),
        or_unknown(&reply.pipeline),
        reply.state.as_str()
    );
    if let Some(reason) = &reply.reason {
        head.push_str(&format!(" ({reason})"));
    }
    if reply.failures > 0 {
        head.push_str(&format!(", {} failures in a row", reply.failures));
    }
    if let Some(host) = &reply.host {
        head.push_str(&format!(", on host `{host}`"));
    }
    lines.push(head);
    if !reply.file.is_empty() {
        lines.push(format!("  file {}", reply.file));
    }

    match &reply.live {
        Some(live) => {
            lines.push(format!(
                "  epoch {}: {} changes in {} transactions, {} batches committed, checkpoint {}",
                live.epoch,
                live.changes,
                live.transactions,
                live.batches_committed,
                live.checkpoint.as_deref().unwrap_or("(none)")
            ));
            let bytes = live
                .lag_bytes
                .map(|b| format!(", {b} bytes of source log"))
                .unwrap_or_default();
            lines.push(format!("  lag {:.1} s{bytes}", live.lag_seconds));
        }
        None => lines.push("  not running: no live figures".into()),
    }

    // Every sink named by the plugins the server holds or by the live run.
    let live_sinks = reply.live.as_ref().map(|l| &l.sinks);
    let mut sinks: Vec<&String> = reply.plugins.keys().collect();
    sinks.extend(live_sinks.into_iter().flat_map(|s| s.keys()));
    sinks.sort();
    sinks.dedup();
    for sink in sinks {
        let running = live_sinks.and_then(|s| s.get(sink));
        sink_lines(&mut lines, sink, reply.plugins.get(sink), running);
    }

    if !reply.swaps.is_empty() {
        let swaps = &reply.swaps;
        let first_shown = swaps.len().saturating_sub(RECENT_SWAPS);
        lines.push(match first_shown {
            0 => format!("swaps ({}):", swaps.len()),
            _ => format!("swaps ({}, the last {RECENT_SWAPS}):", swaps.len()),
        });
        for event in &swaps[first_shown..] {
            let mut line = format!(
                "  sink `{}` {}",
                or_unknown(&event.sink),
                or_unknown(&event.outcome.replace('_', " "))
            );
            if !event.sha256.is_empty() {
                line.push_str(&format!(" plugin {}", abbreviated(&event.sha256)));
            }
            if let Some(at) = &event.at {
                line.push_str(&format!(" at {at}"));
            }
            if let Some(pause) = event.pause_ms {
                line.push_str(&format!(", paused {pause:.1} ms"));
            }
            if let Some(reason) = &event.reason {
                line.push_str(&format!(": {reason}"));
            }
            lines.push(line);
        }
    }
    lines
}

fn sink_lines(
    lines: &mut Vec<String>,
    sink: &str,
    plugin: Option<&PluginView>,
    running: Option<&LiveSink>,
) {
    let mut facts = Vec::new();
    if let Some(running) = running {
        facts.push(
            if running.required {
                "required"
            } else {
                "optional"
            }
            .to_string(),
        );
        facts.push(
            if running.positioned {
                "exactly-once"
            } else {
                "at-least-once"
            }
            .to_string(),
        );
    }
    if let Some(plugin) = plugin {
        if !plugin.sha256.is_empty() {
            facts.push(format!("plugin {}", abbreviated(&plugin.sha256)));
        }
        facts.push(format!("{} swaps", plugin.swaps));
        if let Some(previous) = &plugin.previous_sha256 {
            facts.push(format!("previous {}", abbreviated(previous)));
        }
    }
    let facts = match facts.is_empty() {
        true => String::new(),
        false => format!(" ({})", facts.join(", ")),
    };
    let disabled = match running.and_then(|r| r.disabled.as_deref()) {
        Some(reason) => format!(" DISABLED: {reason}"),
        None => String::new(),
    };
    lines.push(format!("sink `{sink}`{facts}{disabled}"));
    if let Some(plugin) = plugin
        && !plugin.path.is_empty()
    {
        lines.push(format!("  plugin file {}", plugin.path));
    }
    let Some(running) = running else {
        return;
    };
    let tables = &running.tables;
    let width = tables.keys().map(String::len).max().unwrap_or(0).max(16);
    for (table, at) in tables {
        lines.push(format!(
            "  {table:<width$}  {:>16}  from {}",
            at.position.as_deref().unwrap_or("-"),
            at.from.as_deref().unwrap_or("-")
        ));
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::json;
    use weir_serve::api::Deleted;

    use super::*;

    /// A fixture written as the server's JSON, read as `weir ctl` reads it.
    fn read<T: DeserializeOwned>(reply: Value) -> T {
        serde_json::from_value(reply.clone()).unwrap_or_else(|e| panic!("{reply}: {e}"))
    }

    fn full_status() -> PipelineStatus {
        read(json!({
            "tenant": "acme", "pipeline": "orders", "state": "running", "reason": null,
            "failures": 0, "file": "pipelines/acme/orders.yaml",
            "plugins": {"lake": {"path": "pipelines/acme/lake.wasm",
                                 "sha256": "3f2a9c1b5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708",
                                 "previous_sha256": "77ab12cd00112233445566778899aabbccddeeff00112233445566778899aabb",
                                 "swaps": 2}},
            "live": {"epoch": 3, "transactions": 56, "changes": 1234, "batches_committed": 12,
                     "checkpoint": "0/16B3F28", "lag_seconds": 0.25, "lag_bytes": 4096,
                     "sinks": {"lake": {"required": true, "positioned": true, "disabled": null,
                                        "tables": {"orders": {"position": "0/16B3F28", "from": "sink"},
                                                   "customers": {"position": null, "from": null}}},
                               "audit": {"required": false, "positioned": false,
                                         "disabled": "open failed: bucket gone", "tables": {}}}},
            "swaps": [{"sink": "lake", "outcome": "swapped", "sha256": "3f2a9c1b5d6e7f80",
                       "pause_ms": 12.34, "at": "0/16B3F28", "reason": null},
                      {"sink": "lake", "outcome": "refused", "sha256": "deadbeefdeadbeef00",
                       "pause_ms": null, "at": "0/16B4000", "reason": "does not export positions"}]
        }))
    }

    #[test]
    fn a_full_status_shows_state_plugins_positions_lag_and_swaps() {
        let lines = server_status_lines(&full_status());
        let text = lines.join("\n");
        assert_eq!(lines[0], "pipeline acme/orders: running");
        assert!(text.contains("  file pipelines/acme/orders.yaml"), "{text}");
        assert!(
            text.contains("epoch 3: 1234 changes in 56 transactions, 12 batches committed, checkpoint 0/16B3F28"),
            "{text}"
        );
        assert!(text.contains("lag 0.2 s, 4096 bytes"), "{text}");
        assert!(
            text.contains(
                "sink `lake` (required, exactly-once, plugin 3f2a9c1b5d6e, 2 swaps, previous 77ab12cd0011)"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "sink `audit` (optional, at-least-once) DISABLED: open failed: bucket gone"
            ),
            "{text}"
        );
        let orders = lines
            .iter()
            .find(|l| l.contains("orders  "))
            .expect("orders row");
        assert!(
            orders.contains("0/16B3F28") && orders.ends_with("from sink"),
            "{orders}"
        );
        let customers = lines.iter().find(|l| l.contains("customers")).expect("row");
        assert!(customers.ends_with("-  from -"), "{customers}");
        assert!(text.contains("swaps (2):"), "{text}");
        assert!(
            text.contains(
                "  sink `lake` swapped plugin 3f2a9c1b5d6e at 0/16B3F28, paused 12.3 ms\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "  sink `lake` refused plugin deadbeefdead at 0/16B4000: does not export positions"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_starting_pipeline_with_nothing_known_still_renders() {
        for reply in [
            json!({}),
            json!({"tenant": "acme", "pipeline": "orders", "state": "starting", "live": null,
                   "plugins": null, "swaps": null}),
            json!({"live": {"sinks": {"lake": {}}}, "plugins": {"lake": {}}}),
            json!({"live": {"sinks": {"lake": {"tables": {"t": {}}, "disabled": "gone"}}}}),
        ] {
            let lines = server_status_lines(&read(reply.clone()));
            assert!(lines[0].starts_with("pipeline "), "{reply}: {lines:?}");
        }
        let starting = server_status_lines(&read(json!({"tenant": "acme", "pipeline": "orders",
                                                        "state": "starting"})));
        assert_eq!(
            starting,
            [
                "pipeline acme/orders: starting",
                "  not running: no live figures"
            ]
        );
        // In a cluster, the host whose view it is.
        let forwarded = server_status_lines(&read(json!({"tenant": "acme", "pipeline": "orders",
                                                         "state": "running", "host": "host-b"})));
        assert_eq!(
            forwarded[0],
            "pipeline acme/orders: running, on host `host-b`"
        );
    }

    #[test]
    fn a_status_of_another_shape_is_not_read() {
        // `weir ctl` says so and prints the body as it came.
        for reply in [
            json!([1, 2]),
            json!({"live": "odd"}),
            json!({"plugins": [1, 2]}),
            json!({"swaps": {"not": "a list"}}),
            json!({"failures": "x"}),
            json!({"live": {"sinks": {"lake": {"tables": {"t": 5}}}}}),
        ] {
            let read = serde_json::from_value::<PipelineStatus>(reply.clone());
            assert!(read.is_err(), "{reply}: {read:?}");
        }
    }

    #[test]
    fn a_parked_pipeline_says_why_and_how_often_it_failed() {
        let reply = json!({"tenant": "acme", "pipeline": "orders", "state": "parked",
                           "reason": "sink `lake` failed to open", "failures": 5});
        let lines = server_status_lines(&read(reply));
        assert_eq!(
            lines[0],
            "pipeline acme/orders: parked (sink `lake` failed to open), 5 failures in a row"
        );
    }

    #[test]
    fn only_the_last_swaps_are_listed() {
        let swaps: Vec<Value> = (0..8)
            .map(|i| json!({"sink": "lake", "outcome": "rolled_back", "at": format!("at-{i}")}))
            .collect();
        let lines = server_status_lines(&read(json!({ "swaps": swaps })));
        assert!(
            lines.contains(&format!("swaps (8, the last {RECENT_SWAPS}):")),
            "{lines:?}"
        );
        assert!(!lines.iter().any(|l| l.ends_with("at-2")), "{lines:?}");
        assert!(
            lines.iter().any(|l| l.ends_with("rolled back at at-3")),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.ends_with("at-7")), "{lines:?}");
    }

    #[test]
    fn the_list_is_a_table_without_trailing_blanks() {
        let reply = json!({"pipelines": [
            {"tenant": "acme", "pipeline": "orders", "state": "running", "reason": null},
            {"tenant": "globex", "pipeline": "payments-eu", "state": "parked",
             "reason": "5 failures in a row"},
            {"state": "starting"}
        ]});
        let lines = pipeline_list_lines(&read(reply));
        assert_eq!(
            lines,
            [
                "PIPELINE            STATE     REASON",
                "acme/orders         running",
                "globex/payments-eu  parked    5 failures in a row",
                "?/?                 starting",
            ]
        );
        assert_eq!(
            pipeline_list_lines(&read(json!({"pipelines": []}))).len(),
            1,
            "says there are none"
        );
        assert!(serde_json::from_value::<PipelineList>(json!({"other": 1})).is_err());
    }

    #[test]
    fn a_swap_reply_says_what_runs_now_and_what_ran_before() {
        let reply = json!({"sink": "lake", "sha256": "aaaaaaaaaaaaaaaa", "previous_sha256": "bbbbbbbbbbbbbbbb",
                           "pause_ms": 3.0, "at": "0/10"});
        assert_eq!(
            swap_line("acme/orders", "lake", "replaced", &read(reply)),
            "acme/orders: sink `lake` replaced, now plugin aaaaaaaaaaaa (was bbbbbbbbbbbb); \
             the pipeline paused 3.0 ms, the new version took over at 0/10"
        );
        assert_eq!(
            swap_line("acme/orders", "lake", "rolled back", &read(json!({}))),
            "acme/orders: sink `lake` rolled back"
        );
    }

    #[test]
    fn readiness_names_what_does_not_run() {
        assert_eq!(
            readiness_lines(&read(
                json!({"ready": true, "not_running": [], "rejected": []})
            )),
            ["ready: every pipeline that should run runs"]
        );
        let reply = json!({"ready": false,
            "not_running": [{"pipeline": "acme/orders", "state": "parked", "reason": "open failed"}],
            "rejected": [{"file": "pipelines/acme/bad.yaml", "error": "unknown key `sinkz`"}]});
        assert_eq!(
            readiness_lines(&read(reply)),
            [
                "not ready:",
                "  acme/orders: parked (open failed)",
                "  pipelines/acme/bad.yaml refused: unknown key `sinkz`",
            ]
        );
        assert!(serde_json::from_value::<Readiness>(json!("ok")).is_err());
    }

    #[test]
    fn applying_the_same_file_again_says_nothing_changed() {
        assert_eq!(
            applied_line("acme/orders", &read(json!({"changed": false}))),
            "acme/orders: applied (the same definition: nothing changed)"
        );
        assert_eq!(
            applied_line("acme/orders", &read(json!({"changed": true}))),
            "acme/orders: applied"
        );
    }

    #[test]
    fn an_upload_names_the_file_its_reference_its_size_and_its_sinks() {
        let digest = "ab".repeat(32);
        let file = Path::new("build/lake.wasm");
        assert_eq!(
            uploaded_line(file, &["lake".into(), "copy".into()], &digest, 1234, false),
            format!(
                "uploaded build/lake.wasm: sha256:{digest}, 1234 bytes, for sinks `lake`, `copy`"
            )
        );
        assert_eq!(
            uploaded_line(file, &["lake".into()], &digest, 1234, true),
            format!(
                "uploaded build/lake.wasm: sha256:{digest}, 1234 bytes, for sink `lake` (the \
                 server had it already)"
            )
        );
    }

    #[test]
    fn a_steered_pipeline_says_its_new_state_when_told() {
        assert_eq!(
            steered_line("acme/orders", "paused", &read(json!({"state": "paused"}))),
            "acme/orders: paused"
        );
        // Asked while it starts: it stops once it reaches a commit boundary.
        assert_eq!(
            steered_line(
                "acme/orders",
                "stopped",
                &read(json!({"state": "starting"}))
            ),
            "acme/orders: asked to stop; it is starting, and stops at its next commit boundary"
        );
        assert_eq!(
            steered_line("acme/orders", "started", &read(json!({}))),
            "acme/orders: started"
        );
        let _: Deleted = read(json!({}));
        assert_eq!(done_line("acme/orders", "deleted"), "acme/orders: deleted");
    }
}
