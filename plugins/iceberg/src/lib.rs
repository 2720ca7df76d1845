//! weir's Iceberg sink: every table a pipeline maps to it becomes an Iceberg
//! format v2 table, written exactly once.
//!
//! - Storage is the host's scoped blob store, behind the `iceberg` crate's
//!   storage trait ([`storage`]). The operator says under which URL readers
//!   see that store (`warehouse`), because Iceberg metadata holds absolute
//!   locations.
//! - The catalog is a file-system catalog on the same store (a commit is one
//!   atomic `put_if_absent` of the next `vN.metadata.json`), or an Iceberg
//!   REST catalog ([`catalog`]).
//! - A table is created from its first batch: the batch's columns, the
//!   pipeline's key columns as identifier fields. `append` tables get one row
//!   per change; `upsert` tables mirror the source. By default a commit
//!   deletes the old row of every changed key by position, found through a
//!   key index ([`index`]); with `delete_mode: equality` it writes equality
//!   deletes on the key instead ([`commit`]).
//! - Exactly-once: the commit's high position, pipeline, source table and
//!   epoch go into the summary of the snapshot that adds the files, in the
//!   same metadata commit; [`Positions::committed`] reads them back.
//!
//! Configuration (the sink's `config:` map):
//!
//! | key | meaning |
//! | --- | --- |
//! | `warehouse` | required: the URL readers reach the blob store root at, e.g. `file:///srv/lake`, `s3://bucket/lake` |
//! | `catalog` | `filesystem` (the default: metadata files in the blob store) or `rest` (an Iceberg REST catalog, [`catalog::rest`]) |
//! | `catalog_uri` | with `rest`, required: the catalog's base URL (its routes are under `/v1/`); its host must be in the sink's `grants.http` |
//! | `catalog_prefix`, `catalog_warehouse` | with `rest`: the route prefix (else the one `/v1/config` gives) and the warehouse to ask `/v1/config` for |
//! | `catalog_token` or `catalog_credential` | with `rest`: a bearer token, or OAuth2 client credentials `client_id:client_secret` (with `catalog_oauth2_uri`, default `<catalog_uri>/v1/oauth/tokens`, and `catalog_scope`, default `catalog`) |
//! | `catalog_header.<name>` | with `rest`: an extra header sent with every catalog request |
//! | `catalog_table_location` | with `rest`: where a new table goes, `catalog` (the default: where the catalog puts it) or `warehouse` (at `<warehouse>/<namespace>/<table>`) |
//! | `catalog_timeout_ms` | with `rest`: bound on each catalog request (default 30000) |
//! | `target_file_size_mb` | data files roll over at this size (default 128) |
//! | `delete_mode` | upsert tables: `position` (default) or `equality` |
//! | `index_checkpoint_commits` | store the key index every this many commits (default 50) |
//! | `partition.<namespace>.<table>` | the partition spec a new destination table gets, e.g. `day(created_at), bucket(16, id)` ([`partition`]) |
//! | `compact_min_files`, `compact_target_file_size_mb`, `compact_max_input_mb`, `expire_snapshots_older_than`, `keep_snapshots` | maintenance at commit boundaries ([`maintenance`], docs/maintenance.md) |

use std::collections::{HashMap, HashSet};

use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use weir_sdk::blob::{self, BlobError};
use weir_sdk::{Batch, CommitRequest, Committed, Config, Positions, Result, Sink, SinkError};

// As a component, the sink's Rust allocations go to talc instead of the C
// library's dlmalloc, which took about a fifth of the sink's time there
// (natively, glibc's malloc serves them). zstd's C code keeps using the C
// library's malloc: talc takes new memory with `memory.grow` and starts a
// new heap where the C library grew the memory in between, and dlmalloc
// does the same.
#[cfg(all(not(target_feature = "atomics"), target_family = "wasm"))]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

// Only `catalog: rest` reaches the network: a sink on the file-system
// catalog loads without `grants.http`.
weir_sdk::optional_network!("http");

mod avro_names;
pub mod catalog;
pub mod commit;
pub mod files;
pub mod index;
pub mod maintenance;
pub mod partition;
pub mod schema;
pub mod storage;
mod table_commit;

use catalog::rest::{Auth, RestSettings};
use catalog::{Catalog, FsCatalog, Loaded, RestCatalog};
use storage::Warehouse;
use table_commit::TableCommit;

/// Snapshot summary key: hex of the commit's high position.
pub const POSITION_KEY: &str = "weir.position";
/// Snapshot summary key: the commit's fencing epoch, in decimal.
pub const EPOCH_KEY: &str = "weir.epoch";
/// Snapshot summary key: the pipeline that committed.
pub const PIPELINE_KEY: &str = "weir.pipeline";
/// Snapshot summary key: the source table the commit was for.
pub const TABLE_KEY: &str = "weir.table";

/// How often a commit that lost the race for the next metadata version is
/// rebuilt on the winner's version before the host is asked to retry.
const COMMIT_ATTEMPTS: usize = 5;

/// The sink. One instance per loaded plugin.
#[derive(Default)]
pub struct IcebergSink {
    settings: Option<Settings>,
    runtime: Option<tokio::runtime::Runtime>,
    /// Batches written and not committed, per source table.
    staged: HashMap<String, Vec<Batch>>,
    /// The last description the host gave of each source table, so a
    /// commit with nothing staged still knows its destination.
    described: HashMap<String, weir_sdk::Table>,
    /// What we know of each destination table, by its blob path.
    tables: HashMap<String, Option<Loaded>>,
    /// Source tables whose destination index entry this instance wrote.
    indexed: HashSet<String>,
    /// The key index of each upsert table written in position mode, by its
    /// blob path; kept across commits, dropped on any failed commit.
    key_indexes: HashMap<String, index::Index>,
    /// Compaction and snapshot expiry ([`maintenance`]).
    maintenance: maintenance::Maintenance,
    /// Tables whose partition spec was compared with the config.
    specs_checked: HashSet<String>,
}

/// How an upsert commit removes the older rows of the keys it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteMode {
    /// Position deletes against the files the key index points to: every
    /// engine reads them.
    Position,
    /// Equality deletes on the key: no index, but readers apply every one
    /// to every older file, and some (pyiceberg 0.12) refuse them.
    Equality,
}

struct Settings {
    pipeline: String,
    file_io: FileIO,
    /// The catalog the config names (`catalog`).
    catalog: Box<dyn Catalog>,
    target_file_size: usize,
    delete_mode: DeleteMode,
    checkpoint_every: u64,
    /// The configured partition spec of destination tables, by blob path.
    partitions: HashMap<String, ConfiguredSpec>,
}

/// A partition spec from the config.
struct ConfiguredSpec {
    /// The config key it came from, for messages.
    key: String,
    terms: Vec<partition::Term>,
}

/// The `catalog_*` keys of a sink on a REST catalog.
fn rest_settings(config: &Config) -> Result<RestSettings> {
    // An empty value is unset, so that a pipeline file can leave an
    // optional key to an environment variable (`${CATALOG_TOKEN:-}`).
    let get = |key: &str| config.get(key).filter(|v| !v.trim().is_empty());

    let uri = get("catalog_uri")
        .ok_or_else(|| {
            SinkError::Fatal(
                "config key `catalog_uri` is required with `catalog: rest` (the catalog's base \
                 URL, such as https://catalog.example.com/api/catalog; requests go to its /v1/ \
                 routes)"
                    .into(),
            )
        })?
        .trim_end_matches('/')
        .to_string();
    let token = get("catalog_token");
    let credential = get("catalog_credential");
    let auth = match (token, credential) {
        (Some(_), Some(_)) => {
            return Err(SinkError::Fatal(
                "config keys `catalog_token` and `catalog_credential` are both set: use one \
                 (a fixed bearer token, or OAuth2 client credentials `client_id:client_secret`)"
                    .into(),
            ));
        }
        (Some(token), None) => Auth::Bearer(token.to_string()),
        (None, Some(credential)) => {
            let (client_id, client_secret) = credential.split_once(':').ok_or_else(|| {
                SinkError::Fatal(
                    "config key `catalog_credential`: write it as `client_id:client_secret`".into(),
                )
            })?;
            Auth::ClientCredentials {
                endpoint: get("catalog_oauth2_uri").map(str::to_string),
                client_id: client_id.to_string(),
                client_secret: client_secret.to_string(),
                scope: get("catalog_scope").unwrap_or("catalog").to_string(),
            }
        }
        (None, None) => Auth::None,
    };
    if get("catalog_oauth2_uri").is_some() && !matches!(auth, Auth::ClientCredentials { .. }) {
        return Err(SinkError::Fatal(
            "config key `catalog_oauth2_uri` is set without `catalog_credential`".into(),
        ));
    }
    let headers = config
        .iter()
        .filter_map(|(key, value)| {
            key.strip_prefix("catalog_header.")
                .map(|name| (name.to_string(), value.to_string()))
        })
        .collect();
    let timeout_ms: u64 = config.parse("catalog_timeout_ms", 30_000)?;
    if timeout_ms == 0 {
        return Err(SinkError::Fatal(
            "config key `catalog_timeout_ms` must be at least 1".into(),
        ));
    }
    let place_in_warehouse = match get("catalog_table_location").unwrap_or("catalog") {
        "catalog" => false,
        "warehouse" => true,
        other => {
            return Err(SinkError::Fatal(format!(
                "config key `catalog_table_location`: {other:?} is neither `catalog` (the \
                 catalog places new tables) nor `warehouse` (under `warehouse`, at \
                 <namespace>/<table>)"
            )));
        }
    };
    let settings = RestSettings {
        place_in_warehouse,
        uri,
        prefix: get("catalog_prefix").map(str::to_string),
        warehouse: get("catalog_warehouse").map(str::to_string),
        auth,
        headers,
        timeout: std::time::Duration::from_millis(timeout_ms),
    };
    RestCatalog::validate(&settings).map_err(|e| {
        SinkError::Fatal(format!(
            "config key `catalog_uri` or a `catalog_header.*`: {e}"
        ))
    })?;
    Ok(settings)
}

/// The `partition.<namespace>.<table>` entries of the config, by table path.
fn configured_specs(config: &Config) -> Result<HashMap<String, ConfiguredSpec>> {
    let mut specs: HashMap<String, ConfiguredSpec> = HashMap::new();
    for (key, value) in config.iter() {
        let Some(destination) = key.strip_prefix(partition::CONFIG_PREFIX) else {
            continue;
        };
        let path = destination_path(destination)
            .map_err(|e| SinkError::Fatal(format!("config key `{key}`: {e}")))?;
        let terms = partition::parse(value)
            .map_err(|e| SinkError::Fatal(format!("config key `{key}`: {e}")))?;
        if let Some(other) = specs.get(&path) {
            return Err(SinkError::Fatal(format!(
                "config keys `{}` and `{key}` both give the partition spec of table {path}",
                other.key
            )));
        }
        specs.insert(
            path,
            ConfiguredSpec {
                key: key.to_string(),
                terms,
            },
        );
    }
    Ok(specs)
}

impl Sink for IcebergSink {
    fn open(&mut self, pipeline: &str, config: &Config) -> Result<()> {
        avro_names::install();
        let warehouse = Warehouse::new(config.require("warehouse")?)
            .map_err(|e| SinkError::Fatal(format!("config key `warehouse`: {e}")))?;
        let catalog = match config.get("catalog").unwrap_or("filesystem") {
            "filesystem" => {
                if let Some((key, _)) = config
                    .iter()
                    .find(|(k, v)| k.starts_with("catalog_") && !v.trim().is_empty())
                {
                    return Err(SinkError::Fatal(format!(
                        "config key `{key}` is for a REST catalog: set `catalog: rest`, or \
                         remove it"
                    )));
                }
                Box::new(FsCatalog::new(warehouse.clone())) as Box<dyn Catalog>
            }
            "rest" => Box::new(RestCatalog::new(rest_settings(config)?, warehouse.clone())),
            other => {
                return Err(SinkError::Fatal(format!(
                    "config key `catalog`: unknown catalog {other:?} (expected `filesystem` or \
                     `rest`)"
                )));
            }
        };
        let target_mb: usize = config.parse("target_file_size_mb", 128)?;
        if target_mb == 0 {
            return Err(SinkError::Fatal(
                "config key `target_file_size_mb` must be at least 1".into(),
            ));
        }
        let delete_mode = match config.get("delete_mode").unwrap_or("position") {
            "position" => DeleteMode::Position,
            "equality" => DeleteMode::Equality,
            other => {
                return Err(SinkError::Fatal(format!(
                    "config key `delete_mode`: unknown mode {other:?} (expected `position` or \
                     `equality`)"
                )));
            }
        };
        let checkpoint_every: u64 = config.parse("index_checkpoint_commits", 50)?;
        if checkpoint_every == 0 {
            return Err(SinkError::Fatal(
                "config key `index_checkpoint_commits` must be at least 1".into(),
            ));
        }
        let partitions = configured_specs(config)?;
        self.maintenance = maintenance::Maintenance::from_config(config, target_mb << 20)?;
        self.settings = Some(Settings {
            pipeline: pipeline.to_string(),
            file_io: warehouse.file_io(),
            catalog,
            target_file_size: target_mb << 20,
            delete_mode,
            checkpoint_every,
            partitions,
        });
        Ok(())
    }

    fn write(&mut self, batch: Batch) -> Result<()> {
        for field in batch.data().schema().fields() {
            schema::iceberg_type(field.data_type()).map_err(|e| {
                SinkError::Poison(format!(
                    "table {}, batch {}: column {}: {e}",
                    batch.table.name,
                    batch.id,
                    field.name()
                ))
            })?;
        }
        destination_path(&batch.table.destination)
            .map_err(|e| SinkError::Poison(format!("table {}: {e}", batch.table.name)))?;
        self.described
            .insert(batch.table.name.clone(), batch.table.clone());
        let staged = self.staged.entry(batch.table.name.clone()).or_default();
        // A write retried after its answer was lost brings the same batch
        // again: it replaces the staged copy instead of adding to it.
        staged.retain(|b| b.id != batch.id);
        staged.push(batch);
        Ok(())
    }

    fn commit(&mut self, request: CommitRequest) -> Result<()> {
        self.start_runtime()?;
        let runtime = self.runtime.as_ref().expect("started");
        let staged = self
            .staged
            .get(&request.table)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let described = staged
            .last()
            .map(|b| &b.table)
            .or_else(|| self.described.get(&request.table));
        let Some(table) = described.cloned() else {
            // The host stages a (possibly empty) batch before the first
            // commit of a table; without one we do not know its destination.
            return Err(SinkError::Fatal(format!(
                "table {}: a commit with nothing staged, before any batch of the table",
                request.table
            )));
        };
        let settings = self
            .settings
            .as_ref()
            .ok_or_else(|| SinkError::Fatal("the sink was not opened".into()))?;
        let path = destination_path(&table.destination)
            .map_err(|e| SinkError::Poison(format!("table {}: {e}", table.name)))?;
        if !self.indexed.contains(&table.name) {
            blob::put(
                &index_path(&settings.pipeline, &table.name),
                path.as_bytes(),
            )?;
            self.indexed.insert(table.name.clone());
        }
        let known = self.tables.get(&path).cloned();
        let mut key_index = self.key_indexes.remove(&path);
        let mut work = TableCommit {
            settings,
            request: &request,
            table: &table,
            path: &path,
            staged,
            key_index: &mut key_index,
        };
        storage::take_io_failure();
        let result = runtime.block_on(work.run(known));
        // A store failure deep inside a Parquet or Avro writer comes back
        // wrapped as the writer's own error, without its retryable mark;
        // the store told us it failed, so the commit is worth a retry.
        let result = result.map_err(|(error, reload)| match error {
            SinkError::Fatal(message) if storage::take_io_failure() => {
                (SinkError::Retryable(message), reload)
            }
            other => (other, reload),
        });
        match result {
            Ok(loaded) => {
                let loaded = self
                    .maintenance
                    .after_commit(settings, runtime, &path, loaded);
                if self.specs_checked.insert(path.clone()) {
                    warn_on_other_spec(settings, &table, &path, &loaded.metadata);
                }
                if let Some(key_index) = key_index {
                    self.key_indexes.insert(path.clone(), key_index);
                }
                self.tables.insert(path, Some(loaded));
                self.staged.remove(&request.table);
                Ok(())
            }
            // The index was left out of the map: after a failure it is
            // rebuilt from its checkpoint and the table, which hold the truth.
            Err((error, reload)) => {
                if reload {
                    self.tables.remove(&path);
                }
                Err(error)
            }
        }
    }

    fn abort(&mut self, table: &str) {
        self.staged.remove(table);
    }
}

impl Positions for IcebergSink {
    fn committed(&mut self, pipeline: &str, table: &str) -> Result<Option<Committed>> {
        let path = match blob::get(&index_path(pipeline, table)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(BlobError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let settings = self
            .settings
            .as_ref()
            .ok_or_else(|| SinkError::Fatal("the sink was not opened".into()))?;
        let loaded = settings
            .catalog
            .load(&path)
            .map_err(|e| iceberg_error(&format!("table {table}: cannot load {path}"), e))?;
        let found = loaded
            .as_ref()
            .and_then(|l| last_commit(&l.metadata, pipeline, table))
            .transpose()?;
        self.tables.insert(path, loaded);
        Ok(found)
    }
}

impl IcebergSink {
    fn start_runtime(&mut self) -> Result<()> {
        if self.runtime.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(|e| SinkError::Fatal(format!("cannot start the async runtime: {e}")))?;
            self.runtime = Some(runtime);
        }
        Ok(())
    }
}

/// An existing table keeps its partition spec: say so when the config asks
/// for another one.
fn warn_on_other_spec(
    settings: &Settings,
    table: &weir_sdk::Table,
    path: &str,
    metadata: &TableMetadata,
) {
    let Some(configured) = settings.partitions.get(path) else {
        return;
    };
    let spec = metadata.default_partition_spec();
    let schema = metadata.current_schema();
    if !partition::same(spec, schema, &configured.terms) {
        let wanted: Vec<String> = configured
            .terms
            .iter()
            .map(|t| partition::describe_term(&t.transform, &t.column))
            .collect();
        weir_sdk::log::warn(format!(
            "table {}: Iceberg table {path} exists with partition spec `{}`; config key `{}` \
             asks for `{}`, which applies only when the table is created; the table keeps its \
             spec",
            table.name,
            partition::describe(spec, schema),
            configured.key,
            wanted.join(", ")
        ));
    }
}

/// Where the destination of a source table is recorded, so that
/// `committed` can find it before any batch arrives.
fn index_path(pipeline: &str, table: &str) -> String {
    let clean = |s: &str| s.replace(['/', '\\'], "%2F");
    format!("_weir/{}/{}.destination", clean(pipeline), clean(table))
}

/// `sales.orders` -> `sales/orders`; a name without a namespace goes into
/// `default`.
pub fn destination_path(destination: &str) -> std::result::Result<String, String> {
    let parts: Vec<&str> = destination.split('.').collect();
    for part in &parts {
        if part.is_empty()
            || part.starts_with('_')
            || part.contains(['/', '\\', '\0'])
            || *part == ".."
        {
            return Err(format!(
                "destination {destination:?} is not a usable Iceberg name (namespace.table, \
                 no empty parts, none starting with `_`)"
            ));
        }
    }
    Ok(if parts.len() == 1 {
        format!("default/{}", parts[0])
    } else {
        parts.join("/")
    })
}

/// The last commit of `pipeline` for source table `table` in the current
/// snapshot's history.
fn last_commit(metadata: &TableMetadata, pipeline: &str, table: &str) -> Option<Result<Committed>> {
    let mut snapshot = metadata.current_snapshot();
    while let Some(s) = snapshot {
        let props = &s.summary().additional_properties;
        if props.get(PIPELINE_KEY).map(String::as_str) == Some(pipeline)
            && props.get(TABLE_KEY).map(String::as_str) == Some(table)
        {
            let corrupt = |what: &str| {
                SinkError::Fatal(format!(
                    "table {table}: snapshot {} has a bad `{what}` in its summary",
                    s.snapshot_id()
                ))
            };
            let position = props
                .get(POSITION_KEY)
                .and_then(|h| hex::decode(h).ok())
                .ok_or_else(|| corrupt(POSITION_KEY));
            let epoch = props
                .get(EPOCH_KEY)
                .and_then(|e| e.parse().ok())
                .ok_or_else(|| corrupt(EPOCH_KEY));
            return Some(
                position.and_then(|position| epoch.map(|epoch| Committed { position, epoch })),
            );
        }
        snapshot = s
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
    }
    None
}

fn iceberg_error(context: &str, e: iceberg::Error) -> SinkError {
    let message = format!("{context}: {e}");
    if e.retryable() || storage::take_missing_file() {
        SinkError::Retryable(message)
    } else {
        SinkError::Fatal(message)
    }
}

#[cfg(test)]
mod tests;
