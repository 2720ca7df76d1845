//! The report of a run, built in one place from the facts each part of the
//! run owns: the commit core holds the epoch, the checkpoint, how many
//! batches were committed and which sinks are out of the run and why (the
//! sinks setup could not start among them: recovery hands those to the
//! core); the run loop counts what it read; recovery says where the source
//! resumed. No part keeps a copy of another's facts, so the report cannot
//! drift from them.
//!
//! The live status a running pipeline shows is this same report with where
//! each sink stands, so the report a run ends with is the last status it
//! showed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Instant;

use weir_core::commit::{Core, Origin};
use weir_core::position::Position;
use weir_source::commit_order::describe;

use crate::control::Control;

/// What a run did, for the command line to print.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    pub pipeline: String,
    pub epoch: u64,
    pub resumed_after: Option<String>,
    pub transactions: u64,
    pub changes: u64,
    pub batches_committed: u64,
    pub checkpoint: Option<String>,
    /// Optional sinks that failed and were disabled, with the reason.
    pub disabled: BTreeMap<String, String>,
}

/// What the run loop has read from the source.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReadCounts {
    /// Source transactions with changes; the pieces of a big one count once.
    pub(crate) transactions: u64,
    pub(crate) changes: u64,
}

impl RunReport {
    /// Where the run stands: the core's facts, what the loop has `read`,
    /// and the position recovery resumed the source after.
    pub(crate) fn of(core: &Core, read: ReadCounts, resumed_after: Option<&Position>) -> RunReport {
        RunReport {
            pipeline: core.pipeline().to_string(),
            epoch: core.epoch(),
            resumed_after: resumed_after.map(describe),
            transactions: read.transactions,
            changes: read.changes,
            batches_committed: core.batches_committed(),
            checkpoint: core.checkpoint().map(describe),
            disabled: core
                .disabled_sinks()
                .map(|(sink, reason)| (sink.to_string(), reason.to_string()))
                .collect(),
        }
    }

    /// Shows this report as the run's live status, with where each sink
    /// stands for each table, and the lag in the metrics too. `lag_bytes`:
    /// what the source says it holds past its acknowledgement; `read_since`:
    /// when the oldest change of the commit just made was read (how far the
    /// sinks lag the source, in time).
    pub(crate) fn publish(
        &self,
        core: &Core,
        tables: &[String],
        control: &Control,
        lag_bytes: Option<u64>,
        read_since: Option<Instant>,
    ) {
        let lag_seconds = read_since.map_or(0.0, |since| since.elapsed().as_secs_f64());
        control.metrics.source_lag(lag_bytes, Some(lag_seconds));
        control.update_live(|live| {
            live.epoch = self.epoch;
            live.transactions = self.transactions;
            live.changes = self.changes;
            live.batches_committed = self.batches_committed;
            live.checkpoint = self.checkpoint.clone();
            live.lag_seconds = lag_seconds;
            live.lag_bytes = lag_bytes;
            for sink in 0..core.sink_count() {
                let spec = core.sink_spec(sink);
                let entry = live.sinks.entry(spec.name.clone()).or_default();
                entry.required = spec.required;
                entry.positioned = spec.positioned;
                entry.disabled = self.disabled.get(&spec.name).cloned();
                for table in tables {
                    let at = entry.tables.entry(table.clone()).or_default();
                    if let Some((position, origin)) = core.committed(sink, table) {
                        at.position = Some(describe(position));
                        at.from = Some(Cow::Borrowed(match origin {
                            Origin::Sink => "sink",
                            Origin::Store => "store",
                            Origin::ThisRun => "this-run",
                        }));
                    }
                }
            }
        });
    }
}
