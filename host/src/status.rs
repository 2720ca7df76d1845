//! `weir status`: where every sink stands for every table, where that answer
//! came from, and how far behind the source's head it is.

use serde::Serialize;

use crate::config::PipelineConfig;
use crate::pipeline::{self, RunError, RunOptions};
use crate::position::Position;
use crate::runtime::WasmEngine;
use crate::store::PositionStore;

#[derive(Debug, Serialize)]
pub struct Status {
    pub pipeline: String,
    pub epoch: Option<u64>,
    pub source_head: Option<String>,
    pub sinks: Vec<SinkStatus>,
}

#[derive(Debug, Serialize)]
pub struct SinkStatus {
    pub sink: String,
    pub positioned: bool,
    pub required: bool,
    /// Set when the sink could not be loaded to ask it.
    pub error: Option<String>,
    pub tables: Vec<TableStatus>,
}

#[derive(Debug, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub position: Option<String>,
    /// Raw position bytes, hex, for scripts.
    pub position_hex: Option<String>,
    /// `sink` (its own `positions` record), `store` (the host's), or `none`.
    pub source: &'static str,
    /// What the store says, when it differs from the sink.
    pub store_position: Option<String>,
    /// Source transactions between the committed position and the head.
    pub lag_transactions: Option<u64>,
}

pub fn status(config: &PipelineConfig) -> Result<Status, RunError> {
    let io = pipeline::io_runtime()?;
    let store = PositionStore::open(&config.store_path()).map_err(|e| {
        RunError::Setup(format!(
            "{e} (if `weir run` is running for this pipeline, it holds the store; stop it first)"
        ))
    })?;
    let engine = WasmEngine::new(&config.cache_dir())?;
    let source = pipeline::make_source(config, &RunOptions::default())?;
    let head = source.head();
    let tables = source.tables();
    let sinks = pipeline::start_sinks(config, &engine, io.handle());
    let mut out = Vec::new();
    let started = match sinks {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("{e}");
            None
        }
    };
    for (i, sink) in config.sinks.iter().enumerate() {
        let worker = started
            .as_ref()
            .and_then(|s| s.workers.get(i))
            .and_then(Option::as_ref);
        let positioned = worker.is_some_and(|w| w.info.positioned());
        let mut error = started
            .as_ref()
            .and_then(|s| s.failed_to_start.get(&sink.name).cloned());
        if started.is_none() {
            error = Some("could not load the sinks; run `weir run` to see why".into());
        }
        let mut rows = Vec::new();
        for table in &tables {
            let from_store = store.get(&config.pipeline, &sink.name, &table.name)?;
            let from_sink = match worker {
                Some(w) if positioned => match w.committed(&config.pipeline, &table.name).wait() {
                    Ok(p) => p.map(|c| Position::from_bytes(c.position)),
                    Err(e) => {
                        error = Some(e.to_string());
                        None
                    }
                },
                _ => None,
            };
            let (position, origin) = if positioned {
                (
                    from_sink.clone(),
                    if from_sink.is_some() { "sink" } else { "none" },
                )
            } else {
                (
                    from_store.clone(),
                    if from_store.is_some() {
                        "store"
                    } else {
                        "none"
                    },
                )
            };
            let lag = match (&head, &position) {
                (Some(h), Some(p)) => match (h.as_stream(), p.as_stream()) {
                    (Some((h, _)), Some((p, _))) => Some(h.saturating_sub(p)),
                    _ => None,
                },
                (Some(h), None) => h.as_stream().map(|(h, _)| h),
                _ => None,
            };
            rows.push(TableStatus {
                table: table.name.clone(),
                position_hex: position.as_ref().map(Position::to_hex),
                position: position.as_ref().map(ToString::to_string),
                source: origin,
                store_position: (positioned && from_store != from_sink)
                    .then(|| from_store.as_ref().map(ToString::to_string))
                    .flatten(),
                lag_transactions: lag,
            });
        }
        out.push(SinkStatus {
            sink: sink.name.clone(),
            positioned,
            required: sink.required,
            error,
            tables: rows,
        });
    }
    Ok(Status {
        pipeline: config.pipeline.clone(),
        epoch: store.current_epoch(&config.pipeline)?,
        source_head: head.as_ref().map(ToString::to_string),
        sinks: out,
    })
}
