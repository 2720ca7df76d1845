//! Producing a snapshot that adds data files and delete files (position or
//! equality deletes), and the table metadata that makes it current.
//!
//! Hand-written because `iceberg` 0.10.1 has no row-delta action (its
//! `fast_append` refuses delete files) and its `TableCommit` cannot be built
//! outside the crate. Everything below the snapshot is the crate's own:
//! `ManifestWriterBuilder` (data and delete manifests), `ManifestListWriter`,
//! `Snapshot::builder`, `TableMetadataBuilder`, `SnapshotSummaryCollector`.
//! What is ours: carrying the parent's manifests forward, the summary totals
//! (the crate's `update_snapshot_summaries` is private), and the retry on a
//! lost race, which reuses the manifests already written.
//!
//! In equality mode sequence numbers do the upsert: an equality delete
//! applies to data files with a *smaller* data sequence number, so the
//! deletes of snapshot N remove the older rows of the keys it rewrites but
//! never the rows it adds. Position deletes name the file and row they
//! remove, so they need no such rule.

use std::collections::HashMap;

use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestEntry,
    ManifestFile, ManifestList, ManifestListWriter, ManifestWriterBuilder, Operation,
    PartitionSpec, Schema, SchemaRef, Snapshot, SnapshotReference, SnapshotRetention,
    SnapshotSummaryCollector, Summary, TableMetadata,
};
use iceberg::{Error, ErrorKind, Result};

use crate::catalog::Next;

/// What one commit adds to a table, written once and reused on retries.
#[derive(Debug, Clone)]
pub struct Delta {
    /// The snapshot id every new manifest was written for.
    pub snapshot_id: i64,
    /// The new manifests (a data one, a delete one, or neither).
    pub manifests: Vec<ManifestFile>,
    /// The files they hold, for the summary.
    pub files: Vec<DataFile>,
    /// The table schema the files were written with; made current when it is
    /// not yet in the table.
    pub schema: SchemaRef,
    /// Extra summary entries (the weir position, pipeline and epoch).
    pub properties: HashMap<String, String>,
}

/// A commit whose parent has this many manifests merges them first (see
/// [`merge_manifests`]): planning a scan opens every manifest, so their
/// number, not the table's size, would otherwise set the cost of a read.
pub const MERGE_MANIFESTS_AT: usize = 32;

/// Rewrites `manifests` (all with their sequence numbers assigned, i.e. of
/// committed snapshots) into one manifest per content kind and partition
/// spec, holding only their live entries, each with the snapshot and
/// sequence numbers it was added with (so which deletes apply to which
/// rows does not change). Entries already marked deleted are dropped: no
/// reader of the new snapshot needs them, and the snapshots that removed
/// those files still list them. A group of one manifest without deleted
/// entries is kept as it is.
pub async fn merge_manifests(
    file_io: &FileIO,
    metadata: &TableMetadata,
    manifests: Vec<ManifestFile>,
    snapshot_id: i64,
    schema: SchemaRef,
) -> Result<Vec<ManifestFile>> {
    let mut kept = Vec::new();
    let mut entries = LiveEntries::default();
    let mut groups: HashMap<(bool, i32), Vec<ManifestFile>> = HashMap::new();
    for manifest in manifests {
        let key = (
            manifest.content == ManifestContentType::Data,
            manifest.partition_spec_id,
        );
        groups.entry(key).or_default().push(manifest);
    }
    for (_, group) in groups {
        if group.len() == 1 && group[0].deleted_files_count.unwrap_or(0) == 0 {
            kept.extend(group);
            continue;
        }
        for manifest_file in &group {
            let manifest = manifest_file.load_manifest(file_io).await?;
            for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                entries.push(manifest_file, entry)?;
            }
        }
    }
    let (mut written, _) = entries
        .write(file_io, metadata, snapshot_id, schema)
        .await?;
    kept.append(&mut written);
    Ok(kept)
}

/// Live manifest entries gathered to be written into as few manifests as
/// possible: one per content kind and partition spec, each entry with the
/// snapshot and sequence numbers it was added with.
#[derive(Default)]
pub struct LiveEntries {
    /// By (is data, partition spec id).
    groups: HashMap<(bool, i32), Vec<CarriedFile>>,
}

/// A file carried into a new manifest: the file, the snapshot that added
/// it, its data sequence number and its file sequence number.
type CarriedFile = (DataFile, i64, i64, Option<i64>);

impl LiveEntries {
    /// Adds a live `entry` of `manifest_file`.
    pub fn push(&mut self, manifest_file: &ManifestFile, entry: &ManifestEntry) -> Result<()> {
        let missing = |what: &str| {
            Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "manifest {} has an entry without its {what}",
                    manifest_file.manifest_path
                ),
            )
        };
        let added_by = entry.snapshot_id().ok_or_else(|| missing("snapshot id"))?;
        let sequence = entry
            .sequence_number()
            .ok_or_else(|| missing("sequence number"))?;
        let key = (
            manifest_file.content == ManifestContentType::Data,
            manifest_file.partition_spec_id,
        );
        self.groups.entry(key).or_default().push((
            entry.data_file().clone(),
            added_by,
            sequence,
            entry.file_sequence_number,
        ));
        Ok(())
    }

    /// Writes the manifests for snapshot `snapshot_id`; returns them and
    /// their paths.
    pub async fn write(
        self,
        file_io: &FileIO,
        metadata: &TableMetadata,
        snapshot_id: i64,
        schema: SchemaRef,
    ) -> Result<(Vec<ManifestFile>, Vec<String>)> {
        let location = metadata.location().trim_end_matches('/');
        let merge_uuid = uuid::Uuid::new_v4();
        let (mut manifests, mut paths) = (Vec::new(), Vec::new());
        for (n, ((is_data, spec_id), files)) in self.groups.into_iter().enumerate() {
            if files.is_empty() {
                continue;
            }
            let spec = metadata.partition_spec_by_id(spec_id).ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("a manifest names partition spec {spec_id}, which the table lacks"),
                )
            })?;
            let path = format!("{location}/metadata/{merge_uuid}-merged{n}.avro");
            let builder = ManifestWriterBuilder::new(
                file_io.new_output(&path)?,
                Some(snapshot_id),
                schema.clone(),
                spec.as_ref().clone(),
            );
            let mut writer = if is_data {
                builder.build_v2_data()
            } else {
                builder.build_v2_deletes()
            };
            for (file, added_by, sequence, file_sequence) in files {
                writer.add_existing_file(file, added_by, sequence, file_sequence)?;
            }
            paths.push(path);
            manifests.push(writer.write_manifest_file().await?);
        }
        Ok((manifests, paths))
    }
}

/// A random positive snapshot id not used by `metadata`.
pub fn new_snapshot_id(metadata: &TableMetadata) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) & (i64::MAX as u64)) as i64;
        if id != 0 && metadata.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// Writes the manifests for `files` (data files, and delete files of either
/// kind in one delete manifest).
pub async fn write_manifests(
    file_io: &FileIO,
    metadata: &TableMetadata,
    schema: SchemaRef,
    files: Vec<DataFile>,
    snapshot_id: i64,
    properties: HashMap<String, String>,
) -> Result<Delta> {
    let spec: PartitionSpec = metadata.default_partition_spec().as_ref().clone();
    let commit_uuid = uuid::Uuid::new_v4();
    let (data, deletes): (Vec<&DataFile>, Vec<&DataFile>) = files
        .iter()
        .partition(|f| f.content_type() == DataContentType::Data);
    let mut manifests = Vec::new();
    for (n, group) in [data, deletes].into_iter().enumerate() {
        if group.is_empty() {
            continue;
        }
        let path = format!(
            "{}/metadata/{commit_uuid}-m{n}.avro",
            metadata.location().trim_end_matches('/')
        );
        let builder = ManifestWriterBuilder::new(
            file_io.new_output(&path)?,
            Some(snapshot_id),
            schema.clone(),
            spec.clone(),
        );
        let mut writer = if n == 0 {
            builder.build_v2_data()
        } else {
            builder.build_v2_deletes()
        };
        for file in group {
            // -1: the sequence number is inherited from the manifest list,
            // so a retry on a newer base can reuse this manifest.
            writer.add_file(file.clone(), -1)?;
        }
        manifests.push(writer.write_manifest_file().await?);
    }
    Ok(Delta {
        snapshot_id,
        manifests,
        files,
        schema,
        properties,
    })
}

/// Builds the metadata that follows `base` (stored at `base_location`) with
/// `delta` as its new current snapshot on `main`, and the changes that lead
/// there (what a REST catalog is sent).
pub async fn next_metadata(
    file_io: &FileIO,
    base: &TableMetadata,
    base_location: &str,
    delta: &Delta,
) -> Result<Next> {
    if base.format_version() != FormatVersion::V2 {
        return Err(Error::new(
            ErrorKind::FeatureUnsupported,
            "only Iceberg format v2 tables are written",
        ));
    }
    if base.snapshot_by_id(delta.snapshot_id).is_some() {
        return Err(Error::new(
            ErrorKind::CatalogCommitConflicts,
            format!("snapshot id {} is already taken", delta.snapshot_id),
        ));
    }
    let parent = base.current_snapshot();
    let sequence_number = base.next_sequence_number();

    let mut builder = base.clone().into_builder(Some(base_location.to_string()));
    let known = base
        .schemas_iter()
        .any(|s| s.schema_id() == delta.schema.schema_id() && s.as_ref() == delta.schema.as_ref());
    let schema_id = if known {
        delta.schema.schema_id()
    } else {
        builder = builder.add_current_schema(Schema::clone(&delta.schema))?;
        delta.schema.schema_id()
    };

    // The parent's manifests stay; the new ones join them. Every commit
    // adds one or two, and every reader opens each one to plan a scan, so
    // once there are many the parent's are merged into one per kind.
    let mut manifests: Vec<ManifestFile> = match parent {
        Some(parent) => {
            let bytes = file_io.new_input(parent.manifest_list())?.read().await?;
            ManifestList::parse_with_version(&bytes, FormatVersion::V2)?
                .consume_entries()
                .into_iter()
                .collect()
        }
        None => Vec::new(),
    };
    if manifests.len() >= MERGE_MANIFESTS_AT {
        manifests = merge_manifests(
            file_io,
            base,
            manifests,
            delta.snapshot_id,
            delta.schema.clone(),
        )
        .await?;
    }
    manifests.extend(delta.manifests.iter().cloned());
    let list_path = format!(
        "{}/metadata/snap-{}-{}-{}.avro",
        base.location().trim_end_matches('/'),
        delta.snapshot_id,
        sequence_number,
        uuid::Uuid::new_v4()
    );
    let mut list = ManifestListWriter::v2(
        file_io.new_output(&list_path)?.writer().await?,
        delta.snapshot_id,
        parent.map(|p| p.snapshot_id()),
        sequence_number,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await?;

    let summary = summary(
        &delta.files,
        &delta.schema,
        base,
        parent.map(|p| p.summary()),
        &delta.properties,
    );
    let snapshot = Snapshot::builder()
        .with_snapshot_id(delta.snapshot_id)
        .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(now_ms().max(base.last_updated_ms()))
        .with_manifest_list(list_path)
        .with_summary(summary)
        .with_schema_id(schema_id)
        .build();
    let built = builder
        .add_snapshot(snapshot)?
        .set_ref(
            MAIN_BRANCH,
            SnapshotReference::new(
                delta.snapshot_id,
                SnapshotRetention::branch(None, None, None),
            ),
        )?
        .build()?;
    Ok(built.into())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Totals carried from the parent's summary: (total key, added key, removed key).
const TOTALS: [(&str, &str, &str); 6] = [
    ("total-records", "added-records", "deleted-records"),
    ("total-files-size", "added-files-size", "removed-files-size"),
    ("total-data-files", "added-data-files", "deleted-data-files"),
    (
        "total-delete-files",
        "added-delete-files",
        "removed-delete-files",
    ),
    (
        "total-equality-deletes",
        "added-equality-deletes",
        "removed-equality-deletes",
    ),
    (
        "total-position-deletes",
        "added-position-deletes",
        "removed-position-deletes",
    ),
];

/// The snapshot summary: what was added (the crate's collector), running
/// totals over the parent's, and the caller's properties.
fn summary(
    files: &[DataFile],
    schema: &SchemaRef,
    base: &TableMetadata,
    parent: Option<&Summary>,
    properties: &HashMap<String, String>,
) -> Summary {
    let mut collector = SnapshotSummaryCollector::default();
    for file in files {
        collector.add_file(file, schema.clone(), base.default_partition_spec().clone());
    }
    let mut entries = properties.clone();
    entries.extend(collector.build());
    let number = |map: &HashMap<String, String>, key: &str| -> u64 {
        map.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    for (total, added, removed) in TOTALS {
        let before = match parent {
            Some(p) => match p.additional_properties.get(total) {
                Some(v) => v.parse::<u64>().ok(),
                // A parent without a total (written elsewhere): say nothing
                // rather than something wrong.
                None => None,
            },
            None => Some(0),
        };
        if let Some(before) = before {
            let after =
                (before + number(&entries, added)).saturating_sub(number(&entries, removed));
            entries.insert(total.to_string(), after.to_string());
        }
    }
    let has_deletes = files
        .iter()
        .any(|f| f.content_type() != DataContentType::Data);
    Summary {
        // Java's RowDelta calls a commit with deletes an overwrite.
        operation: if has_deletes {
            Operation::Overwrite
        } else {
            Operation::Append
        },
        additional_properties: entries,
    }
}
