//! What the commands print: one line per fact for people, or JSON with
//! `--json` for scripts.

use serde::Serialize;

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
