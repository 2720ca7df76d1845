//! What the commands print: one line per fact for people, or JSON with
//! `--json` for scripts.

use serde::Serialize;
use serde_json::Value;

use crate::pipeline::RunReport;
use crate::runtime::PluginInfo;
use crate::status::Status;

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
        format!("{} (exactly-once)", info.capabilities.join(", "))
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

// What `weir serve` answers. Its replies are read as loose JSON, not typed:
// while a pipeline starts any field may be missing or null, and a server of
// another version may add or change some; show what is there, never fail.

/// A reply printed as the server sent it, made pretty.
pub fn server_json(value: &serde_json::Value) {
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

/// `GET /v1/pipelines`: one line per pipeline.
pub fn pipeline_list(reply: &Value) {
    let Some(pipelines) = field(reply, "pipelines").and_then(Value::as_array) else {
        return json(reply);
    };
    if pipelines.is_empty() {
        println!("no pipelines (none exists, or none this token reaches)");
        return;
    }
    let rows: Vec<(String, String, String)> = pipelines
        .iter()
        .map(|p| {
            let name = format!(
                "{}/{}",
                text_field(p, "tenant").unwrap_or_default(),
                text_field(p, "pipeline").unwrap_or_default()
            );
            let state = text_field(p, "state").unwrap_or_else(|| "-".into());
            (name, state, text_field(p, "reason").unwrap_or_default())
        })
        .collect();
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
    let state_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(5);
    println!(
        "{:<name_width$}  {:<state_width$}  REASON",
        "PIPELINE", "STATE"
    );
    for (name, state, reason) in rows {
        let line = format!("{name:<name_width$}  {state:<state_width$}  {reason}");
        // No trailing blanks on a line without a reason: they bother `diff`.
        println!("{}", line.trim_end());
    }
}

/// A pipeline was applied, steered or deleted: say so, and its state if the
/// reply carries one.
pub fn pipeline_changed(name: &impl std::fmt::Display, done: &str, reply: &Value) {
    let mut line = format!("{name}: {done}");
    if let Some(state) = text_field(reply, "state") {
        line.push_str(&format!("; now {state}"));
    }
    if let Some(reason) = text_field(reply, "reason") {
        line.push_str(&format!(" ({reason})"));
    }
    println!("{line}");
}

/// A plugin replaced or rolled back.
pub fn swap(name: &impl std::fmt::Display, sink: &str, done: &str, reply: &Value) {
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
        line.push_str(&format!(", taking over at {at}"));
    }
    println!("{line}");
}

/// How many swap events `weir ctl status` shows; `--json` has them all.
const RECENT_SWAPS: usize = 5;

/// `GET /v1/pipelines/{tenant}/{pipeline}`: state, then per sink its plugin
/// and per table its position and where that came from.
pub fn server_status(reply: &Value) {
    if !reply.is_object() {
        return json(reply);
    }
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
    println!("{head}");
    if let Some(file) = text_field(reply, "file") {
        println!("  file {file}");
    }

    let live = field(reply, "live").filter(|l| l.is_object());
    match live {
        Some(live) => {
            let count = |key| text_field(live, key).unwrap_or_else(|| "-".into());
            println!(
                "  epoch {}: {} changes in {} transactions, {} batches committed, checkpoint {}",
                count("epoch"),
                count("changes"),
                count("transactions"),
                count("batches_committed"),
                text_field(live, "checkpoint").unwrap_or_else(|| "(none)".into())
            );
            let seconds = match field(live, "lag_seconds") {
                Some(Value::Number(n)) => n.as_f64().map(|s| format!("{s:.1} s")),
                other => other.map(shown),
            };
            let bytes = text_field(live, "lag_bytes").map(|b| format!(", {b} bytes of source log"));
            if seconds.is_some() || bytes.is_some() {
                println!(
                    "  lag {}{}",
                    seconds.unwrap_or_else(|| "-".into()),
                    bytes.unwrap_or_default()
                );
            }
        }
        None => println!("  not running: no live figures"),
    }

    // Sinks named by either the plugins the server holds or the live run.
    let plugins = field(reply, "plugins").and_then(Value::as_object);
    let live_sinks = live
        .and_then(|l| field(l, "sinks"))
        .and_then(Value::as_object);
    let mut sinks: Vec<&String> = plugins.into_iter().flat_map(|p| p.keys()).collect();
    sinks.extend(live_sinks.into_iter().flat_map(|s| s.keys()));
    sinks.sort();
    sinks.dedup();
    let empty = Value::Null;
    for sink in sinks {
        let plugin = plugins.and_then(|p| p.get(sink.as_str())).unwrap_or(&empty);
        let running = live_sinks
            .and_then(|s| s.get(sink.as_str()))
            .unwrap_or(&empty);
        sink_status(sink, plugin, running);
    }

    if let Some(swaps) = field(reply, "swaps").and_then(Value::as_array)
        && !swaps.is_empty()
    {
        let shown_from = swaps.len().saturating_sub(RECENT_SWAPS);
        println!(
            "swaps ({} in all{}):",
            swaps.len(),
            if shown_from > 0 {
                ", the last shown"
            } else {
                ""
            }
        );
        for event in &swaps[shown_from..] {
            let mut line = format!(
                "  {} sink `{}` {}",
                text_field(event, "at").unwrap_or_else(|| "-".into()),
                text_field(event, "sink").unwrap_or_else(|| "?".into()),
                text_field(event, "outcome").unwrap_or_else(|| "?".into())
            );
            if let Some(digest) = short_digest(event, "sha256") {
                line.push_str(&format!(" plugin {digest}"));
            }
            if let Some(pause) = millis(event, "pause_ms") {
                line.push_str(&format!(", paused {pause}"));
            }
            if let Some(reason) = text_field(event, "reason") {
                line.push_str(&format!(": {reason}"));
            }
            println!("{line}");
        }
    }
}

fn sink_status(sink: &str, plugin: &Value, running: &Value) {
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
    println!("sink `{sink}`{facts}{disabled}");
    if let Some(path) = text_field(plugin, "path") {
        println!("  plugin file {path}");
    }
    let Some(tables) = field(running, "tables").and_then(Value::as_object) else {
        return;
    };
    let width = tables.keys().map(String::len).max().unwrap_or(0).max(16);
    for (table, at) in tables {
        println!(
            "  {table:<width$}  {:>16}  from {}",
            text_field(at, "position").unwrap_or_else(|| "-".into()),
            text_field(at, "from").unwrap_or_else(|| "-".into())
        );
    }
}
