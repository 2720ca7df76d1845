//! What the commands print: one line per fact for people, or JSON with
//! `--json` for scripts.

use serde::Serialize;
use serde_json::Value;

use weir_pipeline::RunReport;
use weir_pipeline::status::Status;
use weir_runtime::PluginInfo;

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
                "  {:<24} {:>16}  from {:<5}  lag {}{}",
                t.table,
                t.position.as_deref().unwrap_or("-"),
                t.source,
                t.lag_transactions
                    .map_or("-".to_string(), |l| format!("{l} transactions")),
                t.store_position
                    .as_deref()
                    .map(|s| format!("  (store says {s})"))
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
        .map(|kind| format!("{kind} (needs grants.{kind} in the sink's entry)"))
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

// What `weir serve` answers. Its replies are read as loose JSON, not typed:
// while a pipeline starts any field may be missing or null, and a server of
// another version may add or change some; show what is there, never fail.
// Each reply is first laid out as lines, so the layout can be tested.

/// A reply printed as the server sent it, made pretty.
pub fn server_json(value: &Value) {
    json(value);
}

/// A reply that is text (metrics, readiness, or an unexpected body).
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
pub fn pipeline_list(reply: &Value) {
    match pipeline_list_lines(reply) {
        Some(lines) => print_lines(lines),
        None => json(reply),
    }
}

/// A pipeline was applied, steered or deleted.
pub fn pipeline_changed(name: &impl std::fmt::Display, done: &str, reply: &Value) {
    println!("{}", pipeline_changed_line(&name.to_string(), done, reply));
}

/// A plugin replaced or rolled back.
pub fn swap(name: &impl std::fmt::Display, sink: &str, done: &str, reply: &Value) {
    println!("{}", swap_line(&name.to_string(), sink, done, reply));
}

/// `GET /ready`: ready, or which pipelines do not run and which files were
/// refused.
pub fn readiness(reply: &Value) {
    match readiness_lines(reply) {
        Some(lines) => print_lines(lines),
        None => json(reply),
    }
}

/// `GET /v1/pipelines/{tenant}/{pipeline}`.
pub fn server_status(reply: &Value) {
    match server_status_lines(reply) {
        Some(lines) => print_lines(lines),
        None => json(reply),
    }
}

/// The field, unless it is missing or null.
fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.get(key).filter(|v| !v.is_null())
}

/// A scalar as a person reads it: strings without quotes.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

fn text_field(value: &Value, key: &str) -> Option<String> {
    field(value, key).map(shown)
}

/// A digest cut to what a person compares at a glance.
fn short_digest(value: &Value, key: &str) -> Option<String> {
    text_field(value, key).map(|d| d.chars().take(12).collect())
}

fn millis(value: &Value, key: &str) -> Option<String> {
    match field(value, key)? {
        Value::Number(n) => n.as_f64().map(|ms| format!("{ms:.1} ms")),
        other => Some(shown(other)),
    }
}

fn pipeline_list_lines(reply: &Value) -> Option<Vec<String>> {
    let pipelines = field(reply, "pipelines")?.as_array()?;
    if pipelines.is_empty() {
        return Some(vec![
            "no pipelines (none exists, or none this token reaches)".into(),
        ]);
    }
    let rows: Vec<(String, String, String)> = pipelines
        .iter()
        .map(|p| {
            let name = format!(
                "{}/{}",
                text_field(p, "tenant").unwrap_or_else(|| "?".into()),
                text_field(p, "pipeline").unwrap_or_else(|| "?".into())
            );
            let state = text_field(p, "state").unwrap_or_else(|| "-".into());
            (name, state, text_field(p, "reason").unwrap_or_default())
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
    Some(lines)
}

/// Says what was done, and the pipeline's state if the reply carries one.
fn pipeline_changed_line(name: &str, done: &str, reply: &Value) -> String {
    let mut line = format!("{name}: {done}");
    if field(reply, "changed").and_then(Value::as_bool) == Some(false) {
        line.push_str(" (the same definition: nothing changed)");
    }
    if let Some(state) = text_field(reply, "state") {
        line.push_str(&format!("; now {state}"));
    }
    if let Some(reason) = text_field(reply, "reason") {
        line.push_str(&format!(" ({reason})"));
    }
    line
}

fn swap_line(name: &str, sink: &str, done: &str, reply: &Value) -> String {
    let sink = text_field(reply, "sink").unwrap_or_else(|| sink.to_string());
    let mut line = format!("{name}: sink `{sink}` {done}");
    if let Some(digest) = short_digest(reply, "sha256") {
        line.push_str(&format!(", now plugin {digest}"));
    }
    if let Some(previous) = short_digest(reply, "previous_sha256") {
        line.push_str(&format!(" (was {previous})"));
    }
    if let Some(pause) = millis(reply, "pause_ms") {
        line.push_str(&format!("; the pipeline paused {pause}"));
    }
    if let Some(at) = text_field(reply, "at") {
        line.push_str(&format!(", the new version took over at {at}"));
    }
    line
}

fn readiness_lines(reply: &Value) -> Option<Vec<String>> {
    let ready = field(reply, "ready")?.as_bool()?;
    if ready {
        return Some(vec!["ready: every pipeline that should run runs".into()]);
    }
    let mut lines = vec!["not ready:".to_string()];
    let listed = |key| {
        field(reply, key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    };
    for pipeline in listed("not_running") {
        let mut line = format!(
            "  {}: {}",
            text_field(pipeline, "pipeline").unwrap_or_else(|| "?".into()),
            text_field(pipeline, "state").unwrap_or_else(|| "?".into())
        );
        if let Some(reason) = text_field(pipeline, "reason") {
            line.push_str(&format!(" ({reason})"));
        }
        lines.push(line);
    }
    for file in listed("rejected") {
        lines.push(format!(
            "  {} refused: {}",
            text_field(file, "file").unwrap_or_else(|| "?".into()),
            text_field(file, "error").unwrap_or_else(|| "?".into())
        ));
    }
    Some(lines)
}

/// How many swap events `weir ctl status` shows; `--json` has them all.
const RECENT_SWAPS: usize = 5;

/// State, then per sink its plugin and per table its position and where
/// that came from, then the last swaps. `None` when the reply is not an
/// object at all.
fn server_status_lines(reply: &Value) -> Option<Vec<String>> {
    reply.as_object()?;
    let mut lines = Vec::new();
    let name = format!(
        "{}/{}",
        text_field(reply, "tenant").unwrap_or_else(|| "?".into()),
        text_field(reply, "pipeline").unwrap_or_else(|| "?".into())
    );
    let state = text_field(reply, "state").unwrap_or_else(|| "unknown".into());
    let mut head = format!("pipeline {name}: {state}");
    if let Some(reason) = text_field(reply, "reason") {
        head.push_str(&format!(" ({reason})"));
    }
    if let Some(failures) = field(reply, "failures").and_then(Value::as_u64)
        && failures > 0
    {
        head.push_str(&format!(", {failures} failures in a row"));
    }
    lines.push(head);
    if let Some(file) = text_field(reply, "file") {
        lines.push(format!("  file {file}"));
    }

    let live = field(reply, "live").filter(|l| l.is_object());
    match live {
        Some(live) => {
            let count = |key| text_field(live, key).unwrap_or_else(|| "-".into());
            lines.push(format!(
                "  epoch {}: {} changes in {} transactions, {} batches committed, checkpoint {}",
                count("epoch"),
                count("changes"),
                count("transactions"),
                count("batches_committed"),
                text_field(live, "checkpoint").unwrap_or_else(|| "(none)".into())
            ));
            let seconds = match field(live, "lag_seconds") {
                Some(Value::Number(n)) => n.as_f64().map(|s| format!("{s:.1} s")),
                other => other.map(shown),
            };
            let bytes = text_field(live, "lag_bytes").map(|b| format!(", {b} bytes of source log"));
            if seconds.is_some() || bytes.is_some() {
                lines.push(format!(
                    "  lag {}{}",
                    seconds.unwrap_or_else(|| "-".into()),
                    bytes.unwrap_or_default()
                ));
            }
        }
        None => lines.push("  not running: no live figures".into()),
    }

    // Every sink named by the plugins the server holds or by the live run.
    let plugins = field(reply, "plugins").and_then(Value::as_object);
    let live_sinks = live
        .and_then(|l| field(l, "sinks"))
        .and_then(Value::as_object);
    let mut sinks: Vec<&String> = plugins.into_iter().flat_map(|p| p.keys()).collect();
    sinks.extend(live_sinks.into_iter().flat_map(|s| s.keys()));
    sinks.sort();
    sinks.dedup();
    let nothing = Value::Null;
    for sink in sinks {
        let plugin = plugins.and_then(|p| p.get(sink.as_str()));
        let running = live_sinks.and_then(|s| s.get(sink.as_str()));
        sink_lines(
            &mut lines,
            sink,
            plugin.unwrap_or(&nothing),
            running.unwrap_or(&nothing),
        );
    }

    if let Some(swaps) = field(reply, "swaps").and_then(Value::as_array)
        && !swaps.is_empty()
    {
        let first_shown = swaps.len().saturating_sub(RECENT_SWAPS);
        lines.push(match first_shown {
            0 => format!("swaps ({}):", swaps.len()),
            _ => format!("swaps ({}, the last {RECENT_SWAPS}):", swaps.len()),
        });
        for event in &swaps[first_shown..] {
            let outcome = text_field(event, "outcome").map(|o| o.replace('_', " "));
            let mut line = format!(
                "  sink `{}` {}",
                text_field(event, "sink").unwrap_or_else(|| "?".into()),
                outcome.unwrap_or_else(|| "?".into())
            );
            if let Some(digest) = short_digest(event, "sha256") {
                line.push_str(&format!(" plugin {digest}"));
            }
            if let Some(at) = text_field(event, "at") {
                line.push_str(&format!(" at {at}"));
            }
            if let Some(pause) = millis(event, "pause_ms") {
                line.push_str(&format!(", paused {pause}"));
            }
            if let Some(reason) = text_field(event, "reason") {
                line.push_str(&format!(": {reason}"));
            }
            lines.push(line);
        }
    }
    Some(lines)
}

fn sink_lines(lines: &mut Vec<String>, sink: &str, plugin: &Value, running: &Value) {
    let mut facts = Vec::new();
    match field(running, "required").and_then(Value::as_bool) {
        Some(true) => facts.push("required".to_string()),
        Some(false) => facts.push("optional".to_string()),
        None => {}
    }
    match field(running, "positioned").and_then(Value::as_bool) {
        Some(true) => facts.push("exactly-once".to_string()),
        Some(false) => facts.push("at-least-once".to_string()),
        None => {}
    }
    if let Some(digest) = short_digest(plugin, "sha256") {
        facts.push(format!("plugin {digest}"));
    }
    if let Some(swaps) = text_field(plugin, "swaps") {
        facts.push(format!("{swaps} swaps"));
    }
    if let Some(previous) = short_digest(plugin, "previous_sha256") {
        facts.push(format!("previous {previous}"));
    }
    let facts = match facts.is_empty() {
        true => String::new(),
        false => format!(" ({})", facts.join(", ")),
    };
    let disabled = match field(running, "disabled") {
        Some(Value::Bool(false)) | None => String::new(),
        Some(Value::Bool(true)) => " DISABLED".to_string(),
        Some(reason) => format!(" DISABLED: {}", shown(reason)),
    };
    lines.push(format!("sink `{sink}`{facts}{disabled}"));
    if let Some(path) = text_field(plugin, "path") {
        lines.push(format!("  plugin file {path}"));
    }
    let Some(tables) = field(running, "tables").and_then(Value::as_object) else {
        return;
    };
    let width = tables.keys().map(String::len).max().unwrap_or(0).max(16);
    for (table, at) in tables {
        lines.push(format!(
            "  {table:<width$}  {:>16}  from {}",
            text_field(at, "position").unwrap_or_else(|| "-".into()),
            text_field(at, "from").unwrap_or_else(|| "-".into())
        ));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn full_status() -> Value {
        json!({
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
        })
    }

    #[test]
    fn a_full_status_shows_state_plugins_positions_lag_and_swaps() {
        let lines = server_status_lines(&full_status()).expect("an object");
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
            json!({"live": {"sinks": {"lake": null}}, "plugins": {"lake": 7}}),
            json!({"live": "odd", "plugins": [1, 2], "swaps": {"not": "a list"}, "failures": "x"}),
            json!({"live": {"sinks": {"lake": {"tables": {"t": 5}, "disabled": true}}}}),
        ] {
            let lines = server_status_lines(&reply).expect("an object");
            assert!(lines[0].starts_with("pipeline "), "{reply}: {lines:?}");
        }
        let starting = server_status_lines(&json!({"tenant": "acme", "pipeline": "orders",
                                                    "state": "starting"}))
        .unwrap();
        assert_eq!(
            starting,
            [
                "pipeline acme/orders: starting",
                "  not running: no live figures"
            ]
        );
        assert!(
            server_status_lines(&json!([1, 2])).is_none(),
            "not an object"
        );
    }

    #[test]
    fn a_parked_pipeline_says_why_and_how_often_it_failed() {
        let reply = json!({"tenant": "acme", "pipeline": "orders", "state": "parked",
                           "reason": "sink `lake` failed to open", "failures": 5});
        let lines = server_status_lines(&reply).unwrap();
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
        let lines = server_status_lines(&json!({ "swaps": swaps })).unwrap();
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
        let lines = pipeline_list_lines(&reply).unwrap();
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
            pipeline_list_lines(&json!({"pipelines": []}))
                .unwrap()
                .len(),
            1,
            "says there are none"
        );
        assert!(pipeline_list_lines(&json!({"other": 1})).is_none());
    }

    #[test]
    fn a_swap_reply_says_what_runs_now_and_what_ran_before() {
        let reply = json!({"sink": "lake", "sha256": "aaaaaaaaaaaaaaaa", "previous_sha256": "bbbbbbbbbbbbbbbb",
                           "pause_ms": 3.0, "at": "0/10"});
        assert_eq!(
            swap_line("acme/orders", "lake", "replaced", &reply),
            "acme/orders: sink `lake` replaced, now plugin aaaaaaaaaaaa (was bbbbbbbbbbbb); \
             the pipeline paused 3.0 ms, the new version took over at 0/10"
        );
        assert_eq!(
            swap_line("acme/orders", "lake", "rolled back", &Value::Null),
            "acme/orders: sink `lake` rolled back"
        );
    }

    #[test]
    fn readiness_names_what_does_not_run() {
        assert_eq!(
            readiness_lines(&json!({"ready": true, "not_running": [], "rejected": []})).unwrap(),
            ["ready: every pipeline that should run runs"]
        );
        let reply = json!({"ready": false,
            "not_running": [{"pipeline": "acme/orders", "state": "parked", "reason": "open failed"}],
            "rejected": [{"file": "pipelines/acme/bad.yaml", "error": "unknown key `sinkz`"}]});
        assert_eq!(
            readiness_lines(&reply).unwrap(),
            [
                "not ready:",
                "  acme/orders: parked (open failed)",
                "  pipelines/acme/bad.yaml refused: unknown key `sinkz`",
            ]
        );
        assert!(readiness_lines(&json!("ok")).is_none());
    }

    #[test]
    fn applying_the_same_file_again_says_nothing_changed() {
        assert_eq!(
            pipeline_changed_line("acme/orders", "applied", &json!({"changed": false})),
            "acme/orders: applied (the same definition: nothing changed)"
        );
        assert_eq!(
            pipeline_changed_line("acme/orders", "applied", &json!({"changed": true})),
            "acme/orders: applied"
        );
    }

    #[test]
    fn a_steered_pipeline_says_its_new_state_when_told() {
        assert_eq!(
            pipeline_changed_line("acme/orders", "paused", &json!({"state": "paused"})),
            "acme/orders: paused; now paused"
        );
        assert_eq!(
            pipeline_changed_line("acme/orders", "deleted", &json!({})),
            "acme/orders: deleted"
        );
    }
}
