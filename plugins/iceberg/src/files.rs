//! Parquet data files, position-delete files and equality-delete files,
//! written by the `iceberg` crate's writers (zstd; data and equality deletes
//! roll over at the target file size).

use std::sync::Arc;

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use iceberg::arrow::{arrow_schema_to_schema, schema_to_arrow_schema};
use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, NestedField, PartitionKey, PartitionSpecRef,
    PrimitiveType, Schema, SchemaRef, Struct, Type,
};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::base_writer::equality_delete_writer::{
    EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig,
};
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, LocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Error, ErrorKind, Result};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::partition::{Partitioner, split};

/// Where and how files of one commit are written.
pub struct FileSpec<'a> {
    pub file_io: &'a FileIO,
    /// The table's absolute location; files go under its `data/`.
    pub table_location: &'a str,
    /// Unique per commit attempt, so files of a crashed attempt never clash.
    pub prefix: &'a str,
    pub target_file_size: usize,
}

fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build()
}

/// Every file goes straight into the table's `data/` folder, partitioned or
/// not: partition values (any string) never become path segments, and the
/// partition of a file is in its manifest entry, where readers look.
#[derive(Debug, Clone)]
struct FlatLocation {
    folder: String,
}

impl LocationGenerator for FlatLocation {
    fn generate_location(&self, _partition: Option<&PartitionKey>, file_name: &str) -> String {
        format!("{}/{file_name}", self.folder)
    }
}

fn rolling(
    spec: &FileSpec<'_>,
    parquet: ParquetWriterBuilder,
    kind: &str,
) -> RollingFileWriterBuilder<ParquetWriterBuilder, FlatLocation, DefaultFileNameGenerator> {
    RollingFileWriterBuilder::new(
        parquet,
        spec.target_file_size,
        spec.file_io.clone(),
        FlatLocation {
            folder: format!("{}/data", spec.table_location.trim_end_matches('/')),
        },
        DefaultFileNameGenerator::new(
            format!("{}-{kind}", spec.prefix),
            None,
            DataFileFormat::Parquet,
        ),
    )
}

/// Writes `batches` (in the table's Arrow schema) as data files. The files
/// come back in the order their rows were written: the rolling writer only
/// rolls between batches, so rows `0..n0` of the concatenated batches are
/// the first file's rows `0..n0`, the next `n1` the second file's, and so on.
pub async fn write_data(
    spec: &FileSpec<'_>,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    write_partition_data(spec, schema, None, 0, batches).await
}

/// [`write_data`] for a table partitioned by `partition_spec`: the rows are
/// split by partition and each partition gets its own files, carrying its
/// partition value (an unpartitioned spec writes as [`write_data`]).
pub async fn write_partitioned_data(
    spec: &FileSpec<'_>,
    schema: SchemaRef,
    partition_spec: PartitionSpecRef,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    let partitioner = Partitioner::new(partition_spec, schema.clone())?;
    let mut files = Vec::new();
    for (n, group) in split(partitioner.as_ref(), batches)?
        .into_iter()
        .enumerate()
    {
        let key = group
            .partition
            .zip(partitioner.as_ref())
            .map(|(value, p)| p.key(value));
        files.extend(write_partition_data(spec, schema.clone(), key, n, &group.batches).await?);
    }
    Ok(files)
}

/// [`write_data`] for the rows of one partition (`None`: unpartitioned);
/// `part` tells the file names of a commit's partitions apart.
pub async fn write_partition_data(
    spec: &FileSpec<'_>,
    schema: SchemaRef,
    partition: Option<PartitionKey>,
    part: usize,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Vec::new());
    }
    let parquet = ParquetWriterBuilder::new(properties(), schema);
    let kind = match partition {
        Some(_) => format!("p{part}-data"),
        None => "data".to_string(),
    };
    let mut writer = DataFileWriterBuilder::new(rolling(spec, parquet, &kind))
        .build(partition)
        .await?;
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        writer.write(batch.clone()).await?;
    }
    writer.close().await
}

/// Writes the key columns (`equality_ids`) of `batches` (in the table's Arrow
/// schema) as equality-delete files of one partition (`None`:
/// unpartitioned); `part` tells the file names of partitions apart.
pub async fn write_deletes(
    spec: &FileSpec<'_>,
    schema: SchemaRef,
    equality_ids: Vec<i32>,
    partition: Option<PartitionKey>,
    part: usize,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Vec::new());
    }
    let config = EqualityDeleteWriterConfig::new(equality_ids, schema)?;
    let delete_schema = arrow_schema_to_schema(config.projected_arrow_schema_ref())?;
    let parquet = ParquetWriterBuilder::new(properties(), Arc::new(delete_schema));
    let kind = match partition {
        Some(_) => format!("p{part}-eq-del"),
        None => "eq-del".to_string(),
    };
    let mut writer = EqualityDeleteFileWriterBuilder::new(rolling(spec, parquet, &kind), config)
        .build(partition)
        .await?;
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        writer.write(batch.clone()).await?;
    }
    let files = writer.close().await?;
    if files.is_empty() {
        return Err(Error::new(
            ErrorKind::Unexpected,
            "the equality-delete writer wrote no file",
        ));
    }
    Ok(files)
}

/// The partition a position-delete file belongs to: its data files'.
pub struct DeletePartition {
    pub value: Struct,
    pub spec_id: i32,
    /// Tells the file names of a commit's partitions apart.
    pub part: usize,
}

/// The rows of one data file a commit deletes: its path and row numbers.
pub type FileDeletes = (String, Vec<i64>);

/// Writes one position-delete file: every row of `deletes` once (a data
/// file named twice is merged), sorted by path and row as the spec asks. Every data file it names must be
/// of `partition` (`None`: an unpartitioned table).
pub async fn write_position_deletes(
    spec: &FileSpec<'_>,
    partition: Option<DeletePartition>,
    mut deletes: Vec<FileDeletes>,
) -> Result<Vec<DataFile>> {
    // Sorted by path then row, as the spec asks: the paths (one per data
    // file) once, then each file's rows as numbers.
    deletes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut files: Vec<FileDeletes> = Vec::with_capacity(deletes.len());
    for (path, rows) in deletes {
        match files.last_mut() {
            Some(last) if last.0 == path => last.1.extend(rows),
            _ => files.push((path, rows)),
        }
    }
    let mut count = 0usize;
    let mut path_bytes = 0usize;
    for (path, rows) in &mut files {
        rows.sort_unstable();
        rows.dedup();
        count += rows.len();
        path_bytes += path.len() * rows.len();
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    let schema = Arc::new(
        Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    crate::index::FILE_PATH_FIELD_ID,
                    "file_path",
                    Type::Primitive(PrimitiveType::String),
                )),
                Arc::new(NestedField::required(
                    crate::index::POS_FIELD_ID,
                    "pos",
                    Type::Primitive(PrimitiveType::Long),
                )),
            ])
            .build()?,
    );
    let arrow = Arc::new(schema_to_arrow_schema(&schema)?);
    let mut paths = StringBuilder::with_capacity(count, path_bytes);
    let mut positions = Int64Builder::with_capacity(count);
    for (path, rows) in &files {
        for &row in rows {
            paths.append_value(path);
            positions.append_value(row);
        }
    }
    let paths: ArrayRef = Arc::new(paths.finish());
    let rows: ArrayRef = Arc::new(positions.finish());
    let batch = RecordBatch::try_new(arrow, vec![paths, rows]).map_err(|e| {
        Error::new(
            ErrorKind::Unexpected,
            format!("cannot build the position deletes: {e}"),
        )
    })?;
    let part = match &partition {
        Some(p) => format!("-p{}", p.part),
        None => String::new(),
    };
    let location = format!(
        "{}/data/{}{part}-pos-del.parquet",
        spec.table_location.trim_end_matches('/'),
        spec.prefix
    );
    let mut writer = ParquetWriterBuilder::new(properties(), schema)
        .build(spec.file_io.new_output(&location)?)
        .await?;
    writer.write(&batch).await?;
    writer
        .close()
        .await?
        .into_iter()
        .map(|mut builder| {
            builder.content(DataContentType::PositionDeletes);
            if let Some(p) = &partition {
                builder.partition(p.value.clone());
                builder.partition_spec_id(p.spec_id);
            }
            builder.build().map_err(|e| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("cannot describe the position-delete file: {e}"),
                )
            })
        })
        .collect()
}
