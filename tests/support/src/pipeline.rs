//! Test pipelines built as values and written out with serde, so a test
//! states what it runs rather than assembling YAML text. The file is JSON,
//! which is valid YAML: `weir` reads it like any pipeline file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// A pipeline over the built-in generator, with its sinks.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineBuilder {
    pipeline: String,
    /// Unset under `weir serve`, which keeps every pipeline's state itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    state_dir: Option<String>,
    source: Source,
    batch: Batch,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    metadata: Vec<Metadata>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tables: BTreeMap<String, Table>,
    sinks: Vec<SinkBuilder>,
}

#[derive(Clone, Debug, Serialize)]
struct Source {
    generator: Generator,
}

#[derive(Clone, Debug, Serialize)]
struct Generator {
    seed: u64,
    max_changes: u64,
    pace_us: u64,
}

/// Unset limits take the host's defaults.
#[derive(Clone, Debug, Default, Serialize)]
struct Batch {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rows: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    linger_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    heartbeat_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    record_positioned_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
struct Metadata {
    from: String,
    #[serde(rename = "as")]
    name: String,
}

#[derive(Clone, Debug, Serialize)]
struct Table {
    mode: TableMode,
    #[serde(rename = "as")]
    destination: String,
}

/// How a table is mapped onto the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TableMode {
    /// The destination mirrors the source table.
    Upsert,
    /// Every change becomes a row.
    Append,
}

impl PipelineBuilder {
    /// A pipeline named `test`, keeping its state in `state` beside the
    /// file, reading the bounded generator stream `(seed, max_changes)`.
    pub fn generator(seed: u64, max_changes: u64) -> Self {
        PipelineBuilder {
            pipeline: "test".into(),
            state_dir: Some("state".into()),
            source: Source {
                generator: Generator {
                    seed,
                    max_changes,
                    pace_us: 0,
                },
            },
            batch: Batch::default(),
            metadata: Vec::new(),
            tables: BTreeMap::new(),
            sinks: Vec::new(),
        }
    }

    /// The pipeline's name; it also names the file [`Self::write_in`] writes.
    pub fn name(mut self, name: &str) -> Self {
        self.pipeline = name.into();
        self
    }

    /// Where the host keeps its state, relative to the pipeline file.
    pub fn state_dir(mut self, dir: &str) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// The same pipeline as `weir serve` takes it (docs/serve.md): no
    /// `state_dir`; each sink's plugin named by its file name alone, which
    /// the host looks up in `<pipelines_dir>/<tenant>/` (see
    /// [`Self::plugins`] for the files to put there); and each sink's blob
    /// store a path relative to `<tenant root>/<pipeline>/`: the one set
    /// with [`SinkBuilder::blob_store_url`], else the sink's name (an
    /// absolute root set with [`SinkBuilder::blob_store`] is replaced).
    pub fn for_serve(mut self) -> Self {
        self.state_dir = None;
        for sink in &mut self.sinks {
            if let Some(file_name) = sink.plugin.file_name() {
                sink.plugin = PathBuf::from(file_name);
            }
            let relative = sink
                .blob_store
                .as_ref()
                .is_some_and(|b| Path::new(&b.url).is_relative());
            if !relative {
                sink.blob_store = Some(BlobStore {
                    url: sink.name.clone(),
                });
            }
        }
        self
    }

    /// The plugin file of every sink, as given to [`SinkBuilder::new`].
    pub fn plugins(&self) -> Vec<&Path> {
        self.sinks.iter().map(|s| s.plugin.as_path()).collect()
    }

    /// The pipeline's name.
    pub fn pipeline_name(&self) -> &str {
        &self.pipeline
    }

    /// A pause between generated transactions, so a backlog outlasts kills.
    pub fn pace_us(mut self, pace_us: u64) -> Self {
        self.source.generator.pace_us = pace_us;
        self
    }

    /// The most rows one batch holds.
    pub fn max_rows(mut self, max_rows: usize) -> Self {
        self.batch.max_rows = Some(max_rows);
        self
    }

    /// How long a batch waits for more changes.
    pub fn linger_ms(mut self, linger_ms: u64) -> Self {
        self.batch.linger_ms = Some(linger_ms);
        self
    }

    /// How often idle tables advance.
    pub fn heartbeat_ms(mut self, heartbeat_ms: u64) -> Self {
        self.batch.heartbeat_ms = Some(heartbeat_ms);
        self
    }

    /// How often positioned sinks' commits are recorded in the host's
    /// store (0: with every commit).
    pub fn record_positioned_ms(mut self, record_positioned_ms: u64) -> Self {
        self.batch.record_positioned_ms = Some(record_positioned_ms);
        self
    }

    /// Delivers the context field `from` as the column `name`.
    pub fn metadata(mut self, from: &str, name: &str) -> Self {
        self.metadata.push(Metadata {
            from: from.into(),
            name: name.into(),
        });
        self
    }

    /// Maps source table `table` onto `destination` in `mode`.
    pub fn table(mut self, table: &str, mode: TableMode, destination: &str) -> Self {
        let mapping = Table {
            mode,
            destination: destination.into(),
        };
        self.tables.insert(table.into(), mapping);
        self
    }

    /// Adds a sink.
    pub fn sink(mut self, sink: SinkBuilder) -> Self {
        self.sinks.push(sink);
        self
    }

    /// The generator's seed.
    pub fn seed(&self) -> u64 {
        self.source.generator.seed
    }

    /// The generator's bound.
    pub fn max_changes(&self) -> u64 {
        self.source.generator.max_changes
    }

    /// The pipeline file's text.
    pub fn text(&self) -> String {
        serde_json::to_string_pretty(self).expect("a pipeline serializes")
    }

    /// Writes the pipeline to `path` and returns it.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.text())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path.to_path_buf()
    }

    /// Writes the pipeline to `<dir>/<name>.yaml` and returns its path.
    pub fn write_in(&self, dir: &Path) -> PathBuf {
        self.write(&dir.join(format!("{}.yaml", self.pipeline)))
    }
}

/// One sink of a test pipeline: required, with the host's default limits
/// and retries unless set.
#[derive(Clone, Debug, Serialize)]
pub struct SinkBuilder {
    name: String,
    plugin: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    blob_store: Option<BlobStore>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    config: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retries: Option<u32>,
    #[serde(skip_serializing_if = "Grants::is_empty")]
    grants: Grants,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_letter: Option<DeadLetter>,
}

#[derive(Clone, Debug, Serialize)]
struct DeadLetter {
    url: String,
    max_rows: u64,
    max_share: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
struct Grants {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    http: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tcp: Vec<String>,
}

impl Grants {
    fn is_empty(&self) -> bool {
        self.http.is_empty() && self.tcp.is_empty()
    }
}

#[derive(Clone, Debug, Serialize)]
struct BlobStore {
    url: String,
}

#[derive(Clone, Debug, Serialize)]
struct Limits {
    memory_mb: u64,
    call_timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_stored_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_object_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_list_entries: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_message_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_lines_per_second: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_burst: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compile_cpu_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compile_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_plugin_mb: Option<u64>,
    /// Any other limit, by its key (the network's, for instance).
    #[serde(flatten)]
    other: BTreeMap<String, u64>,
}

impl Default for Limits {
    /// The host's defaults for memory and call time; the rest unset.
    fn default() -> Self {
        Limits {
            memory_mb: 512,
            call_timeout_ms: 60_000,
            max_stored_mb: None,
            max_object_mb: None,
            max_list_entries: None,
            max_message_bytes: None,
            log_lines_per_second: None,
            log_burst: None,
            compile_cpu_ms: None,
            compile_timeout_ms: None,
            max_plugin_mb: None,
            other: BTreeMap::new(),
        }
    }
}

impl SinkBuilder {
    /// A required sink `name` running the component at `plugin`.
    pub fn new(name: &str, plugin: impl Into<PathBuf>) -> Self {
        SinkBuilder {
            name: name.into(),
            plugin: plugin.into(),
            sha256: None,
            required: true,
            blob_store: None,
            config: BTreeMap::new(),
            limits: None,
            retries: None,
            grants: Grants::default(),
            dead_letter: None,
        }
    }

    /// A dead-letter valve writing to `url`, setting aside at most
    /// `max_rows` rows and `max_share` of one batch.
    pub fn dead_letter(mut self, url: &str, max_rows: u64, max_share: f64) -> Self {
        self.dead_letter = Some(DeadLetter {
            url: url.into(),
            max_rows,
            max_share,
        });
        self
    }

    /// The blob store's root: a local directory.
    pub fn blob_store(mut self, root: &Path) -> Self {
        let url = root.to_str().expect("test paths are UTF-8").to_string();
        self.blob_store = Some(BlobStore { url });
        self
    }

    /// The blob store's `url` as written: under `weir serve`, a folder
    /// relative to `<tenant root>/<pipeline>/`.
    pub fn blob_store_url(mut self, url: &str) -> Self {
        self.blob_store = Some(BlobStore { url: url.into() });
        self
    }

    /// Whether the pipeline stops when this sink fails.
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// Memory and per-call time limits.
    pub fn limits(mut self, memory_mb: u64, call_timeout_ms: u64) -> Self {
        let limits = self.limits.get_or_insert_with(Limits::default);
        limits.memory_mb = memory_mb;
        limits.call_timeout_ms = call_timeout_ms;
        self
    }

    /// The most bytes the sink may keep under its root.
    pub fn max_stored_mb(mut self, mb: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .max_stored_mb = Some(mb);
        self
    }

    /// The largest single put or get.
    pub fn max_object_mb(mut self, mb: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .max_object_mb = Some(mb);
        self
    }

    /// The most entries one list returns.
    pub fn max_list_entries(mut self, entries: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .max_list_entries = Some(entries);
        self
    }

    /// The longest log or error message the host keeps.
    pub fn max_message_bytes(mut self, bytes: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .max_message_bytes = Some(bytes);
        self
    }

    /// How many log lines per second, and at once, the sink may write.
    pub fn log_rate(mut self, lines_per_second: u64, burst: u64) -> Self {
        let limits = self.limits.get_or_insert_with(Limits::default);
        limits.log_lines_per_second = Some(lines_per_second);
        limits.log_burst = Some(burst);
        self
    }

    /// The CPU time compiling the plugin may use.
    pub fn compile_cpu_ms(mut self, ms: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .compile_cpu_ms = Some(ms);
        self
    }

    /// How long compiling the plugin may take on the clock.
    pub fn compile_timeout_ms(mut self, ms: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .compile_timeout_ms = Some(ms);
        self
    }

    /// The largest plugin file the host loads.
    pub fn max_plugin_mb(mut self, mb: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .max_plugin_mb = Some(mb);
        self
    }

    /// Any limit by its key under `limits`, for example
    /// `http_first_byte_timeout_ms`.
    pub fn limit(mut self, key: &str, value: u64) -> Self {
        self.limits
            .get_or_insert_with(Limits::default)
            .other
            .insert(key.into(), value);
        self
    }

    /// Grants HTTP requests to `pattern` (`scheme://host[:port]`).
    pub fn grant_http(mut self, pattern: &str) -> Self {
        self.grants.http.push(pattern.into());
        self
    }

    /// Grants TCP connections to `pattern` (`host:port`).
    pub fn grant_tcp(mut self, pattern: &str) -> Self {
        self.grants.tcp.push(pattern.into());
        self
    }

    /// How often a transient failure is retried.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = Some(retries);
        self
    }

    /// One entry of the plugin's own configuration.
    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    /// Pins the plugin to a SHA-256 digest (hex).
    pub fn sha256(mut self, digest: &str) -> Self {
        self.sha256 = Some(digest.into());
        self
    }
}
