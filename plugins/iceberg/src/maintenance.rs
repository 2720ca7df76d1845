//! Table maintenance: compaction and snapshot expiry, run by the sink after
//! a commit (under the policy in its config) and on demand through
//! `weir maintain` ([`weir_sdk::Maintenance`]).
//!
//! - Compaction reads the live rows of the current snapshot's small data
//!   files (and of the files deletes apply to) with the `iceberg` crate's own
//!   scan, which applies position deletes by file and row and equality
//!   deletes by key and sequence number, writes them into fewer, larger
//!   files, and commits a `replace` snapshot that swaps them in and drops
//!   the delete files that applied to nothing else. The new files inherit
//!   the new snapshot's sequence number: higher than every delete already
//!   in the table, so none of those applies to the rewritten (already
//!   filtered) rows, and lower than every later commit's, whose deletes
//!   still apply. The snapshot carries the current snapshot's `weir.*`
//!   summary keys, so the pipeline's position is found at its head.
//! - Expiry drops the oldest ancestors of the current snapshot beyond the
//!   retention (always keeping the newest `keep_snapshots`, and the newest
//!   snapshot that records each pipeline's position for each table, with
//!   everything between it and the head), then deletes the manifest lists,
//!   manifests, data and delete files no remaining snapshot references, and
//!   the metadata files that fell out of the metadata log.
//!
//! Both commit through the catalog as the sink does (one `put_if_absent`
//! of the next metadata version on files, the REST commit with its
//! requirements on a REST catalog). A writer that got there first wins; maintenance then plans
//! again from the new version (on demand) or leaves it for the next commit
//! (at a commit boundary), and deletes only what it wrote itself. Nothing
//! is deleted before the metadata that stops referencing it is committed,
//! so a crash at any step leaves a readable, exact table. An expiry records
//! what it deletes right after its commit, and the next one finishes an
//! interrupted record; the files of a compaction that never committed stay
//! as unreferenced garbage (finding them would mean listing the folder,
//! where another writer's not yet committed files lie too).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use futures::TryStreamExt;
use iceberg::TableIdent;

use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataContentType, DataFile, MAIN_BRANCH, Manifest, ManifestFile, ManifestList,
    ManifestListWriter, ManifestWriterBuilder, Operation, Snapshot, SnapshotReference,
    SnapshotRetention, Summary, TableMetadata,
};
use iceberg::table::Table as IcebergTable;
use iceberg::{Error, ErrorKind, Runtime};
use weir_sdk::blob::{self, BlobError};
use weir_sdk::{Config, Result, SinkError};

use crate::catalog::{CommitError, Loaded, Next};
use crate::{IcebergSink, Settings, iceberg_error, index_path};

/// What to do, and how much, at commit boundaries and on demand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Compact at a commit boundary once a table has this many data files
    /// worth rewriting; 0 never compacts there.
    pub compact_min_files: usize,
    /// Rewritten files roll over at this size; a data file below 3/4 of it
    /// is small.
    pub compact_target_file_size: usize,
    /// The most bytes of data files one compaction round reads.
    pub compact_max_input: u64,
    /// Snapshots older than this may be expired; `None` keeps them all.
    pub expire_older_than: Option<Duration>,
    /// The newest snapshots of the current history always kept.
    pub keep_snapshots: usize,
}

/// Defaults: compact once 32 data files are worth it, 64 MiB per round;
/// expire snapshots older than a day beyond the newest 100.
impl Default for Policy {
    fn default() -> Self {
        Policy {
            compact_min_files: 32,
            compact_target_file_size: 128 << 20,
            compact_max_input: 64 << 20,
            expire_older_than: Some(Duration::from_secs(24 * 3600)),
            keep_snapshots: 100,
        }
    }
}

/// Expiry at a commit boundary waits until this many snapshots can go, so
/// that not every commit rewrites the metadata a second time.
const EXPIRE_BATCH: usize = 16;

/// On demand, the most compaction rounds (each bounded by
/// `compact_max_input`) one call runs, and the most races it loses in a row
/// before it gives up.
const MAX_ROUNDS: usize = 16;
const MAX_LOST_RACES: usize = 3;

/// The sink's maintenance: its policy and what it learnt about each table.
#[derive(Debug, Default)]
pub struct Maintenance {
    policy: Policy,
    /// Per table path: how many data files the last look found not worth
    /// rewriting, so the next look waits for enough new ones.
    settled_files: HashMap<String, u64>,
}

impl Maintenance {
    /// Reads the policy keys of the sink's config; `target_file_size` is the
    /// sink's own (the default compaction target).
    pub fn from_config(config: &Config, target_file_size: usize) -> Result<Maintenance> {
        let defaults = Policy::default();
        let target_mb: usize =
            config.parse("compact_target_file_size_mb", target_file_size >> 20)?;
        let max_input_mb: u64 =
            config.parse("compact_max_input_mb", defaults.compact_max_input >> 20)?;
        if target_mb == 0 || max_input_mb == 0 {
            return Err(SinkError::Fatal(
                "config keys `compact_target_file_size_mb` and `compact_max_input_mb` must be at \
                 least 1"
                    .into(),
            ));
        }
        let keep_snapshots: usize = config.parse("keep_snapshots", defaults.keep_snapshots)?;
        if keep_snapshots == 0 {
            return Err(SinkError::Fatal(
                "config key `keep_snapshots` must be at least 1 (the current snapshot is always \
                 kept)"
                    .into(),
            ));
        }
        let expire_older_than = match config.get("expire_snapshots_older_than") {
            None => defaults.expire_older_than,
            Some(text) => parse_retention(text).map_err(|e| {
                SinkError::Fatal(format!("config key `expire_snapshots_older_than`: {e}"))
            })?,
        };
        Ok(Maintenance {
            policy: Policy {
                compact_min_files: config.parse("compact_min_files", defaults.compact_min_files)?,
                compact_target_file_size: target_mb << 20,
                compact_max_input: max_input_mb << 20,
                expire_older_than,
                keep_snapshots,
            },
            settled_files: HashMap::new(),
        })
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Runs what the policy asks for after a successful commit of the table
    /// at `path`, and returns the table's newest known version. Never fails
    /// the commit it follows: a failure is logged and left for next time.
    pub(crate) fn after_commit(
        &mut self,
        settings: &Settings,
        runtime: &tokio::runtime::Runtime,
        path: &str,
        loaded: Loaded,
    ) -> Loaded {
        let compact = self.compaction_due(path, &loaded.metadata);
        let expire = expirable(&loaded.metadata, &self.policy, now_ms()).len() >= EXPIRE_BATCH;
        if !compact && !expire {
            return loaded;
        }
        let work = TableWork {
            settings,
            path,
            policy: &self.policy,
        };
        let mut latest = loaded;
        if compact {
            match runtime.block_on(work.compact_round(&latest, self.policy.compact_min_files)) {
                Ok(Round::Committed { loaded, report }) => {
                    weir_sdk::log::info(format!("{path}: {report}"));
                    self.settled_files.remove(path);
                    latest = *loaded;
                }
                Ok(Round::NothingToDo { settled }) => {
                    self.settled_files.insert(path.to_string(), settled);
                }
                Ok(Round::Lost) => {
                    // A newer commit will come back here.
                }
                Err(e) => {
                    weir_sdk::log::warn(format!("{path}: compaction skipped: {e}"));
                    return latest;
                }
            }
        }
        if expire {
            match runtime.block_on(work.expire(&latest)) {
                Ok(Expired::Committed { loaded, report }) => {
                    weir_sdk::log::info(format!("{path}: {report}"));
                    latest = *loaded;
                }
                Ok(Expired::NothingToDo { .. } | Expired::Lost) => {}
                Err(e) => weir_sdk::log::warn(format!("{path}: snapshot expiry skipped: {e}")),
            }
        }
        latest
    }

    /// Whether enough data files were added since the last look to make a
    /// compaction worth planning (planning reads every manifest).
    fn compaction_due(&self, path: &str, metadata: &TableMetadata) -> bool {
        if self.policy.compact_min_files == 0 {
            return false;
        }
        let Some(snapshot) = metadata.current_snapshot() else {
            return false;
        };
        let settled = self.settled_files.get(path).copied().unwrap_or(0);
        match summary_number(snapshot.summary(), "total-data-files") {
            Some(files) => files.saturating_sub(settled) >= self.policy.compact_min_files as u64,
            // Written elsewhere without totals: look.
            None => true,
        }
    }
}

/// `7d`, `12h`, `30m`, `45s` (or `0s`), or `never`.
pub fn parse_retention(text: &str) -> std::result::Result<Option<Duration>, String> {
    let text = text.trim();
    if text == "never" {
        return Ok(None);
    }
    let unit = text
        .chars()
        .last()
        .ok_or_else(|| "empty; use for example 7d, 12h, 30m, 45s or never".to_string())?;
    let seconds = match unit {
        'd' => 24 * 3600,
        'h' => 3600,
        'm' => 60,
        's' => 1,
        _ => {
            return Err(format!(
                "{text:?} has no unit; use for example 7d, 12h, 30m, 45s or never"
            ));
        }
    };
    let count: u64 = text[..text.len() - 1]
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number of d, h, m or s"))?;
    count
        .checked_mul(seconds)
        .map(|s| Some(Duration::from_secs(s)))
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// On demand: `weir maintain`.
impl weir_sdk::Maintenance for IcebergSink {
    fn maintain(&mut self, pipeline: &str, tables: &[String], what: &[String]) -> Result<String> {
        let (mut compact, mut expire) = (what.is_empty(), what.is_empty());
        for item in what {
            match item.as_str() {
                "compact" => compact = true,
                "expire" => expire = true,
                other => {
                    return Err(SinkError::Fatal(format!(
                        "unknown maintenance {other:?}: the Iceberg sink knows `compact` and \
                         `expire`"
                    )));
                }
            }
        }
        self.start_runtime()?;
        let runtime = self.runtime.as_ref().expect("started");
        let settings = self
            .settings
            .as_ref()
            .ok_or_else(|| SinkError::Fatal("the sink was not opened".into()))?;
        let destinations = destinations(pipeline, tables)?;
        if destinations.is_empty() {
            return Ok(format!(
                "pipeline {pipeline} has committed no table to this sink yet; nothing to do"
            ));
        }
        let mut lines = Vec::new();
        for (path, names) in destinations {
            let work = TableWork {
                settings,
                path: &path,
                policy: &self.maintenance.policy,
            };
            let label = format!("{path} (table {})", names.join(", "));
            let done = runtime.block_on(work.on_demand(compact, expire));
            // Whatever happened, the next commit reloads the table.
            self.tables.remove(&path);
            match done {
                Ok(report) => lines.push(format!("{label}: {report}")),
                Err(e) => {
                    let e = if crate::storage::take_io_failure() {
                        SinkError::Retryable(e.to_string())
                    } else {
                        iceberg_error(&format!("{label}: maintenance failed"), e)
                    };
                    return Err(e);
                }
            }
        }
        Ok(lines.join("\n"))
    }
}

/// The destination table paths of `pipeline`'s source tables (all it
/// recorded when `tables` is empty), each with the source tables that map
/// to it.
fn destinations(pipeline: &str, tables: &[String]) -> Result<BTreeMap<String, Vec<String>>> {
    let mut names: Vec<String> = tables.to_vec();
    if names.is_empty() {
        // `_weir/<pipeline>/<table>.destination`, as `index_path` names them.
        let prefix = index_path(pipeline, "");
        let folder = prefix.trim_end_matches(".destination");
        for object in blob::list(folder)? {
            if let Some(name) = object
                .path
                .strip_prefix(folder)
                .and_then(|n| n.strip_suffix(".destination"))
                .filter(|n| !n.is_empty() && !n.contains('/'))
            {
                names.push(name.replace("%2F", "/"));
            }
        }
    }
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in names {
        let path = match blob::get(&index_path(pipeline, &name)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(BlobError::NotFound(_)) if !tables.is_empty() => {
                return Err(SinkError::Fatal(format!(
                    "pipeline {pipeline} has committed nothing for table {name} to this sink"
                )));
            }
            Err(BlobError::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        crate::destination_path(&path.replace('/', "."))
            .map_err(|e| SinkError::Fatal(format!("table {name}: its recorded {e}")))?;
        out.entry(path).or_default().push(name);
    }
    Ok(out)
}

/// How one compaction round ended.
enum Round {
    Committed {
        loaded: Box<Loaded>,
        report: String,
    },
    /// Too few files worth rewriting; `settled` counts the others.
    NothingToDo {
        settled: u64,
    },
    /// Another writer committed first; what this round wrote was removed.
    Lost,
}

/// How an expiry ended.
enum Expired {
    Committed {
        loaded: Box<Loaded>,
        report: String,
    },
    /// Nothing expires; `finished` files an interrupted expiry left were
    /// deleted.
    NothingToDo {
        finished: usize,
    },
    Lost,
}

/// Maintenance of one table.
struct TableWork<'a> {
    settings: &'a Settings,
    path: &'a str,
    policy: &'a Policy,
}

impl TableWork<'_> {
    fn load(&self) -> iceberg::Result<Option<Loaded>> {
        self.settings.catalog.load(self.path)
    }

    /// Compaction rounds until nothing is left worth rewriting, then expiry.
    async fn on_demand(&self, compact: bool, expire: bool) -> iceberg::Result<String> {
        let Some(mut loaded) = self.load()? else {
            return Ok("no such table yet; nothing to do".into());
        };
        let mut done = Vec::new();
        if compact {
            let (mut rounds, mut lost) = (0, 0);
            while rounds < MAX_ROUNDS {
                match self.compact_round(&loaded, 1).await? {
                    Round::Committed {
                        loaded: next,
                        report,
                    } => {
                        // As it goes, for whoever watches a long run.
                        weir_sdk::log::info(format!("{}: {report}", self.path));
                        done.push(report);
                        loaded = *next;
                        rounds += 1;
                        lost = 0;
                    }
                    Round::NothingToDo { .. } => break,
                    Round::Lost => {
                        weir_sdk::log::info(format!(
                            "{}: another writer committed first; compacting again from its version",
                            self.path
                        ));
                        lost += 1;
                        if lost == MAX_LOST_RACES {
                            done.push(format!(
                                "compaction gave up: other writers committed first \
                                 {MAX_LOST_RACES} times in a row"
                            ));
                            break;
                        }
                        loaded = self.reload()?;
                    }
                }
            }
            if rounds == 0 && lost < MAX_LOST_RACES {
                done.push("no data files worth compacting".into());
            }
        }
        if expire {
            let mut lost = 0;
            loop {
                match self.expire(&loaded).await? {
                    Expired::Committed { report, .. } => {
                        weir_sdk::log::info(format!("{}: {report}", self.path));
                        done.push(report);
                        break;
                    }
                    Expired::NothingToDo { finished } => {
                        done.push(match self.policy.expire_older_than {
                            Some(_) => "no snapshot to expire".into(),
                            None => {
                                "no snapshot expires (expire_snapshots_older_than: never)".into()
                            }
                        });
                        if finished > 0 {
                            done.push(format!(
                                "deleted {finished} files an interrupted expiry left"
                            ));
                        }
                        break;
                    }
                    Expired::Lost => {
                        weir_sdk::log::info(format!(
                            "{}: another writer committed first; expiring again from its version",
                            self.path
                        ));
                        lost += 1;
                        if lost == MAX_LOST_RACES {
                            done.push(format!(
                                "expiry gave up: other writers committed first {MAX_LOST_RACES} \
                                 times in a row"
                            ));
                            break;
                        }
                        loaded = self.reload()?;
                    }
                }
            }
        }
        Ok(done.join("; "))
    }

    fn reload(&self) -> iceberg::Result<Loaded> {
        self.load()?.ok_or_else(|| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("table {} disappeared during maintenance", self.path),
            )
        })
    }

    /// One compaction of at most `compact_max_input` bytes, if at least
    /// `min_files` data files are small or have deletes against them.
    /// The table at `base` for the crate's scan and reader, and the scan's
    /// plan of `snapshot`: a task per data file, with the deletes that apply.
    async fn plan(
        &self,
        base: &Loaded,
        snapshot: &Snapshot,
    ) -> iceberg::Result<(IcebergTable, Vec<FileScanTask>)> {
        let table = IcebergTable::builder()
            .metadata(base.metadata.clone())
            .metadata_location(base.location.clone())
            .identifier(TableIdent::from_strs(self.path.split('/'))?)
            .file_io(self.settings.file_io.clone())
            .runtime(Runtime::try_current()?)
            .readonly(true)
            .disable_cache()
            .build()?;
        let tasks: Vec<FileScanTask> = table
            .scan()
            .snapshot_id(snapshot.snapshot_id())
            .select_all()
            .build()?
            .plan_files()
            .await?
            .try_collect()
            .await?;
        Ok((table, tasks))
    }

    /// One compaction of at most `compact_max_input` bytes, if at least
    /// `min_files` data files are small or have deletes against them.
    async fn compact_round(&self, base: &Loaded, min_files: usize) -> iceberg::Result<Round> {
        let Some(snapshot) = base.metadata.current_snapshot() else {
            return Ok(Round::NothingToDo { settled: 0 });
        };
        let (table, tasks) = self.plan(base, snapshot).await?;

        let applies = applies_of(&tasks);
        let small = (self.policy.compact_target_file_size as u64) * 3 / 4;
        // A rewrite writes each partition's rows to files of that
        // partition, so a small file alone in its partition would come back
        // as the same file: only files with deletes, and small files that
        // have another small one in their partition, are worth a rewrite.
        let mut small_in_partition: HashMap<Option<&iceberg::spec::Struct>, HashSet<&str>> =
            HashMap::new();
        for task in &tasks {
            if task.file_size_in_bytes < small {
                small_in_partition
                    .entry(task.partition.as_ref())
                    .or_default()
                    .insert(task.data_file_path.as_str());
            }
        }
        let mut candidates: Vec<&FileScanTask> = Vec::new();
        let mut seen = HashSet::new();
        for task in &tasks {
            let mergeable = task.file_size_in_bytes < small
                && small_in_partition[&task.partition.as_ref()].len() >= 2;
            if (mergeable || !task.deletes.is_empty()) && seen.insert(task.data_file_path.as_str())
            {
                candidates.push(task);
            }
        }
        let settled = tasks.len().saturating_sub(candidates.len()) as u64;
        let with_deletes = candidates.iter().any(|t| !t.deletes.is_empty());
        if candidates.len() < min_files.max(1) || (candidates.len() < 2 && !with_deletes) {
            return Ok(Round::NothingToDo { settled });
        }
        // Files with deletes first (every read pays for them), then the
        // smallest, up to the round's input bound.
        candidates.sort_by_key(|t| (t.deletes.is_empty(), t.file_size_in_bytes));
        let mut chosen: Vec<FileScanTask> = Vec::new();
        let mut input = 0u64;
        for task in candidates {
            if chosen.len() >= 2 && input + task.file_size_in_bytes > self.policy.compact_max_input
            {
                break;
            }
            input += task.file_size_in_bytes;
            chosen.push(task.clone());
        }
        self.rewrite(base, snapshot, &table, chosen, &applies).await
    }

    /// Test only: rewrites every data file of the current snapshot, as a
    /// rewrite by another engine (a sort, say) may, whatever its size.
    #[cfg(test)]
    pub(crate) async fn rewrite_every_file(&self, base: &Loaded) -> iceberg::Result<Round> {
        let snapshot = base.metadata.current_snapshot().expect("a snapshot");
        let (table, tasks) = self.plan(base, snapshot).await?;
        let applies = applies_of(&tasks);
        self.rewrite(base, snapshot, &table, tasks, &applies).await
    }

    /// Rewrites the live rows of `chosen` (every delete applied) into new
    /// files and commits the `replace` snapshot on `base`.
    async fn rewrite(
        &self,
        base: &Loaded,
        snapshot: &Snapshot,
        table: &IcebergTable,
        chosen: Vec<FileScanTask>,
        applies: &HashMap<String, HashSet<String>>,
    ) -> iceberg::Result<Round> {
        let metadata = &base.metadata;
        let rewritten: HashSet<String> = chosen.iter().map(|t| t.data_file_path.clone()).collect();

        // The live rows of the chosen files, every delete applied.
        let chosen_stream =
            futures::StreamExt::boxed(futures::stream::iter(chosen.into_iter().map(Ok)));
        let batches: Vec<arrow_array::RecordBatch> = table
            .reader_builder()
            .build()
            .read(chosen_stream)?
            .stream()
            .try_collect()
            .await?;
        let schema = metadata.current_schema().clone();
        let arrow = crate::schema::arrow_schema(&schema)
            .map_err(|e| Error::new(ErrorKind::DataInvalid, e))?;
        let mut conformed = Vec::with_capacity(batches.len());
        for batch in &batches {
            conformed.push(
                crate::schema::conform(batch, &arrow)
                    .map_err(|e| Error::new(ErrorKind::DataInvalid, e))?,
            );
        }
        drop(batches);

        let mut written: Vec<String> = Vec::new();
        let outcome = self
            .commit_rewrite(
                base,
                snapshot,
                &rewritten,
                applies,
                &conformed,
                &mut written,
            )
            .await;
        match outcome {
            Ok(Some(round)) => Ok(round),
            Ok(None) => {
                self.remove_quietly(&written).await;
                Ok(Round::Lost)
            }
            Err(e) => {
                // Unknown whether the metadata landed only when its own
                // write failed; files of a round that never reached it are
                // ours alone.
                if !matches!(e.kind(), ErrorKind::CatalogCommitConflicts) {
                    weir_sdk::log::warn(format!(
                        "{}: compaction failed; {} files it wrote stay unreferenced",
                        self.path,
                        written.len()
                    ));
                }
                Err(e)
            }
        }
    }

    /// Writes the rewritten rows, the manifests and the `replace` snapshot,
    /// and commits it. `Ok(None)` when another writer committed first.
    async fn commit_rewrite(
        &self,
        base: &Loaded,
        parent: &Snapshot,
        rewritten: &HashSet<String>,
        applies: &HashMap<String, HashSet<String>>,
        rows: &[arrow_array::RecordBatch],
        written: &mut Vec<String>,
    ) -> iceberg::Result<Option<Round>> {
        let metadata = &base.metadata;
        let file_io = &self.settings.file_io;
        let schema = metadata.current_schema().clone();
        let prefix = format!("compact-{}", uuid::Uuid::new_v4());
        let spec = crate::files::FileSpec {
            file_io,
            table_location: metadata.location(),
            prefix: &prefix,
            target_file_size: self.policy.compact_target_file_size,
        };
        // Rewritten rows go back into their partitions, under the current spec.
        let added = crate::files::write_partitioned_data(
            &spec,
            schema.clone(),
            metadata.default_partition_spec().clone(),
            rows,
        )
        .await?;
        written.extend(added.iter().map(|f| f.file_path().to_string()));

        let snapshot_id = crate::commit::new_snapshot_id(metadata);
        let sequence_number = metadata.next_sequence_number();
        let location = metadata.location().trim_end_matches('/');
        let commit_uuid = uuid::Uuid::new_v4();

        // The parent's manifests, their live entries minus the files that
        // go, merged into one manifest per kind and partition spec: a
        // compacted table is cheap to plan as well as to read.
        let list = ManifestList::parse_with_version(
            &file_io.new_input(parent.manifest_list())?.read().await?,
            metadata.format_version(),
        )?;
        let mut carried = crate::commit::LiveEntries::default();
        let mut removed_data: Vec<DataFile> = Vec::new();
        let mut removed_deletes: Vec<DataFile> = Vec::new();
        let mut live: Vec<DataFile> = Vec::new();
        for manifest_file in list.consume_entries() {
            let manifest: Manifest = manifest_file.load_manifest(file_io).await?;
            for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                let path = entry.file_path();
                let goes = match entry.content_type() {
                    DataContentType::Data => rewritten.contains(path),
                    // A delete file goes when every data file it applies to
                    // is rewritten (or it applies to none any more).
                    _ => applies
                        .get(path)
                        .is_none_or(|targets| targets.iter().all(|t| rewritten.contains(t))),
                };
                let file = entry.data_file().clone();
                if goes {
                    match file.content_type() {
                        DataContentType::Data => removed_data.push(file),
                        _ => removed_deletes.push(file),
                    }
                } else {
                    carried.push(&manifest_file, entry)?;
                    live.push(file);
                }
            }
        }
        let (mut manifests, paths) = carried
            .write(file_io, metadata, snapshot_id, schema.clone())
            .await?;
        written.extend(paths);
        if !added.is_empty() {
            let path = format!("{location}/metadata/{commit_uuid}-a.avro");
            let mut writer = ManifestWriterBuilder::new(
                file_io.new_output(&path)?,
                Some(snapshot_id),
                schema.clone(),
                metadata.default_partition_spec().as_ref().clone(),
            )
            .build_v2_data();
            for file in &added {
                // -1: the new snapshot's sequence number, above every delete
                // already in the table.
                writer.add_file(file.clone(), -1)?;
            }
            written.push(path);
            manifests.push(writer.write_manifest_file().await?);
        }
        live.extend(added.iter().cloned());

        let list_path =
            format!("{location}/metadata/snap-{snapshot_id}-{sequence_number}-{commit_uuid}.avro");
        let mut list_writer = ManifestListWriter::v2(
            file_io.new_output(&list_path)?.writer().await?,
            snapshot_id,
            Some(parent.snapshot_id()),
            sequence_number,
        );
        list_writer.add_manifests(manifests.into_iter())?;
        written.push(list_path.clone());
        list_writer.close().await?;

        let mut properties = replace_summary(&live, &added, &removed_data, &removed_deletes);
        // The pipeline's position stays at the head of the history.
        for (key, value) in &parent.summary().additional_properties {
            if key.starts_with("weir.") {
                properties.insert(key.clone(), value.clone());
            }
        }
        let snapshot = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(Some(parent.snapshot_id()))
            .with_sequence_number(sequence_number)
            .with_timestamp_ms(now_ms().max(metadata.last_updated_ms()))
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation: Operation::Replace,
                additional_properties: properties,
            })
            .with_schema_id(metadata.current_schema_id())
            .build();
        let next: Next = metadata
            .clone()
            .into_builder(Some(base.location.clone()))
            .add_snapshot(snapshot)?
            .set_ref(
                MAIN_BRANCH,
                SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
            )?
            .build()?
            .into();
        match self.settings.catalog.commit(self.path, base, next) {
            Ok(loaded) => Ok(Some(Round::Committed {
                loaded: Box::new(loaded),
                report: format!(
                    "compacted {} data files ({}) and {} delete files into {} ({})",
                    removed_data.len(),
                    size(&removed_data),
                    removed_deletes.len(),
                    match added.len() {
                        1 => "1 data file".to_string(),
                        n => format!("{n} data files"),
                    },
                    size(&added)
                ),
            })),
            Err(CommitError::Conflict) => Ok(None),
            Err(CommitError::Failed(e)) => Err(e),
        }
    }

    /// Drops the oldest snapshots beyond the retention, then the files only
    /// they referenced.
    async fn expire(&self, base: &Loaded) -> iceberg::Result<Expired> {
        let finished = self.finish_interrupted().await?;
        let metadata = &base.metadata;
        let removed = expirable(metadata, self.policy, now_ms());
        if removed.is_empty() {
            return Ok(Expired::NothingToDo { finished });
        }
        let file_io = &self.settings.file_io;
        let removed_ids: HashSet<i64> = removed.iter().copied().collect();
        let ancestry = ancestry(metadata);
        let oldest_kept = ancestry
            .iter()
            .rev()
            .find(|s| !removed_ids.contains(&s.snapshot_id()))
            .expect("the current snapshot is kept");

        // What stays referenced: the oldest kept ancestor's files (a file
        // live in a dropped ancestor and in a kept one is live in every
        // snapshot between), and those of every kept snapshot off the
        // current history.
        let mut kept_snapshots = vec![*oldest_kept];
        let on_history: HashSet<i64> = ancestry.iter().map(|s| s.snapshot_id()).collect();
        kept_snapshots.extend(
            metadata
                .snapshots()
                .filter(|s| !on_history.contains(&s.snapshot_id())),
        );
        let mut kept_manifests: HashSet<String> = HashSet::new();
        let mut kept_files: HashSet<String> = HashSet::new();
        for snapshot in kept_snapshots {
            let list = read_list(file_io, metadata, snapshot.manifest_list()).await?;
            for manifest_file in list {
                if !kept_manifests.insert(manifest_file.manifest_path.clone()) {
                    continue;
                }
                let manifest = manifest_file.load_manifest(file_io).await?;
                for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                    kept_files.insert(entry.file_path().to_string());
                }
            }
        }
        let mut lists = Vec::new();
        let mut manifests = HashSet::new();
        let mut files = HashSet::new();
        for id in &removed {
            let snapshot = metadata
                .snapshot_by_id(*id)
                .expect("an expirable snapshot exists");
            lists.push(snapshot.manifest_list().to_string());
            for manifest_file in read_list(file_io, metadata, snapshot.manifest_list()).await? {
                if kept_manifests.contains(&manifest_file.manifest_path)
                    || !manifests.insert(manifest_file.manifest_path.clone())
                {
                    continue;
                }
                let manifest = manifest_file.load_manifest(file_io).await?;
                for entry in manifest.entries() {
                    if !kept_files.contains(entry.file_path()) {
                        files.insert(entry.file_path().to_string());
                    }
                }
            }
        }

        let next: Next = metadata
            .clone()
            .into_builder(Some(base.location.clone()))
            .remove_snapshots(&removed)
            .build()?
            .into();
        let loaded = match self.settings.catalog.commit(self.path, base, next) {
            Ok(loaded) => loaded,
            Err(CommitError::Conflict) => return Ok(Expired::Lost),
            Err(CommitError::Failed(e)) => return Err(e),
        };
        // Committed: nothing below is referenced any more. Files first, then
        // the manifests and lists that named them, so that an interrupted
        // run never leaves a manifest naming a file that is gone. The record
        // is kept until every delete is done, so that the next expiry
        // finishes what a crash interrupted.
        let doomed: Vec<String> = files.into_iter().chain(manifests).chain(lists).collect();
        let record = format!("{}{}.list", self.interrupted_folder(), uuid::Uuid::new_v4());
        let recorded = blob::put(&record, doomed.join("\n").as_bytes()).is_ok();
        let mut failed = 0;
        let mut deleted = 0;
        for location in &doomed {
            match file_io.delete(location).await {
                Ok(()) => deleted += 1,
                Err(_) => failed += 1,
            }
        }
        if recorded && failed == 0 {
            let _ = blob::delete(&record);
        }
        let old_metadata = self
            .settings
            .catalog
            .remove_old_metadata(self.path, &loaded);
        let mut report = format!(
            "expired {} snapshots, deleted {deleted} files and {old_metadata} old metadata files",
            removed.len()
        );
        if finished > 0 {
            report.push_str(&format!(
                " (and {finished} files an interrupted expiry left)"
            ));
        }
        if failed > 0 {
            report.push_str(&format!(
                " ({failed} could not be deleted yet; the next expiry tries again)"
            ));
        }
        Ok(Expired::Committed {
            loaded: Box::new(loaded),
            report,
        })
    }

    /// Where an expiry records the files it is about to delete (outside the
    /// table's folder, where no reader looks).
    fn interrupted_folder(&self) -> String {
        format!("_weir/expired/{}/", self.path)
    }

    /// Deletes what an interrupted expiry recorded and did not finish: it
    /// recorded only files its committed metadata no longer referenced, and
    /// nothing ever references a file again. Returns how many it deleted.
    async fn finish_interrupted(&self) -> iceberg::Result<usize> {
        let folder = self.interrupted_folder();
        let records = blob::list(&folder).map_err(crate::storage::blob_error)?;
        let mut deleted = 0;
        for record in records.iter().filter(|r| r.path.ends_with(".list")) {
            let text = match blob::get(&record.path) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(BlobError::NotFound(_)) => continue,
                Err(e) => return Err(crate::storage::blob_error(e)),
            };
            for location in text.lines().filter(|l| !l.is_empty()) {
                self.settings.file_io.delete(location).await?;
                deleted += 1;
            }
            blob::delete(&record.path).map_err(crate::storage::blob_error)?;
        }
        Ok(deleted)
    }

    /// Deletes files a round wrote and never committed; what cannot be
    /// deleted stays unreferenced.
    async fn remove_quietly(&self, locations: &[String]) {
        for location in locations {
            let _ = self.settings.file_io.delete(location).await;
        }
    }
}

/// Which delete files apply to which data files, as the scan planned.
fn applies_of(tasks: &[FileScanTask]) -> HashMap<String, HashSet<String>> {
    let mut applies: HashMap<String, HashSet<String>> = HashMap::new();
    for task in tasks {
        for delete in &task.deletes {
            applies
                .entry(delete.file_path.clone())
                .or_default()
                .insert(task.data_file_path.clone());
        }
    }
    applies
}

async fn read_list(
    file_io: &iceberg::io::FileIO,
    metadata: &TableMetadata,
    location: &str,
) -> iceberg::Result<Vec<ManifestFile>> {
    let bytes = file_io.new_input(location)?.read().await?;
    Ok(
        ManifestList::parse_with_version(&bytes, metadata.format_version())?
            .consume_entries()
            .into_iter()
            .collect(),
    )
}

/// The current snapshot and its ancestors, newest first, as far as they
/// are in the metadata.
fn ancestry(metadata: &TableMetadata) -> Vec<&iceberg::spec::SnapshotRef> {
    let mut out = Vec::new();
    let mut next = metadata.current_snapshot();
    while let Some(snapshot) = next {
        out.push(snapshot);
        next = snapshot
            .parent_snapshot_id()
            .and_then(|id| metadata.snapshot_by_id(id));
    }
    out
}

/// The ancestors of the current snapshot that the policy lets go, oldest
/// last. Kept: the newest `keep_snapshots`, every one younger than the
/// retention, every one a reference (tag, branch) points at, and the
/// newest one recording each pipeline's position for each table, with all
/// between it and the head (the position is found by walking back from
/// the head). Snapshots off the current history are never expired.
fn expirable(metadata: &TableMetadata, policy: &Policy, now_ms: i64) -> Vec<i64> {
    let Some(retention) = policy.expire_older_than else {
        return Vec::new();
    };
    let cutoff = now_ms.saturating_sub(retention.as_millis().min(i64::MAX as u128) as i64);
    let history = ancestry(metadata);
    let mut keep = policy.keep_snapshots.max(1) - 1;
    let referenced = referenced_snapshots(metadata);
    let mut markers: HashSet<(String, String)> = HashSet::new();
    for (i, snapshot) in history.iter().enumerate() {
        if snapshot.timestamp_ms() >= cutoff || referenced.contains(&snapshot.snapshot_id()) {
            keep = keep.max(i);
        }
        let props = &snapshot.summary().additional_properties;
        if let (Some(pipeline), Some(table)) =
            (props.get(crate::PIPELINE_KEY), props.get(crate::TABLE_KEY))
            && markers.insert((pipeline.clone(), table.clone()))
        {
            keep = keep.max(i);
        }
    }
    history
        .iter()
        .skip(keep + 1)
        .map(|s| s.snapshot_id())
        .collect()
}

/// The snapshots any reference (branch or tag) points at.
fn referenced_snapshots(metadata: &TableMetadata) -> HashSet<i64> {
    // The crate keeps the references to itself; its JSON form has them.
    let json = serde_json::to_value(metadata).unwrap_or_default();
    let mut out: HashSet<i64> = json["refs"]
        .as_object()
        .map(|refs| {
            refs.values()
                .filter_map(|r| r["snapshot-id"].as_i64())
                .collect()
        })
        .unwrap_or_default();
    out.extend(metadata.current_snapshot_id());
    out
}

/// A `replace` snapshot's summary: what it added and removed, and totals
/// counted from the files that stay live.
fn replace_summary(
    live: &[DataFile],
    added: &[DataFile],
    removed_data: &[DataFile],
    removed_deletes: &[DataFile],
) -> HashMap<String, String> {
    let sum = |files: &[DataFile], f: fn(&DataFile) -> u64| -> u64 { files.iter().map(f).sum() };
    let of_kind = |kind: DataContentType| -> Vec<DataFile> {
        live.iter()
            .filter(|f| f.content_type() == kind)
            .cloned()
            .collect()
    };
    let data = of_kind(DataContentType::Data);
    let equality = of_kind(DataContentType::EqualityDeletes);
    let position = of_kind(DataContentType::PositionDeletes);
    let entries = [
        ("added-data-files", added.len() as u64),
        ("added-records", sum(added, DataFile::record_count)),
        ("added-files-size", sum(added, DataFile::file_size_in_bytes)),
        ("deleted-data-files", removed_data.len() as u64),
        ("deleted-records", sum(removed_data, DataFile::record_count)),
        ("removed-delete-files", removed_deletes.len() as u64),
        (
            "removed-files-size",
            sum(removed_data, DataFile::file_size_in_bytes)
                + sum(removed_deletes, DataFile::file_size_in_bytes),
        ),
        ("total-data-files", data.len() as u64),
        ("total-records", sum(&data, DataFile::record_count)),
        ("total-files-size", sum(live, DataFile::file_size_in_bytes)),
        (
            "total-delete-files",
            (equality.len() + position.len()) as u64,
        ),
        (
            "total-equality-deletes",
            sum(&equality, DataFile::record_count),
        ),
        (
            "total-position-deletes",
            sum(&position, DataFile::record_count),
        ),
    ];
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn size(files: &[DataFile]) -> String {
    let bytes: u64 = files.iter().map(DataFile::file_size_in_bytes).sum();
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

fn summary_number(summary: &Summary, key: &str) -> Option<u64> {
    summary
        .additional_properties
        .get(key)
        .and_then(|v| v.parse().ok())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "maintenance_tests.rs"]
mod maintenance_tests;
