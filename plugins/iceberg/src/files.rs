//! Parquet data files and equality-delete files, written by the `iceberg`
//! crate's writers (rolling at the target file size, zstd).

use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::arrow::arrow_schema_to_schema;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, DataFileFormat, SchemaRef};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::base_writer::equality_delete_writer::{
    EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig,
};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Error, ErrorKind, Result};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

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

fn rolling(
    spec: &FileSpec<'_>,
    parquet: ParquetWriterBuilder,
    kind: &str,
) -> RollingFileWriterBuilder<
    ParquetWriterBuilder,
    DefaultLocationGenerator,
    DefaultFileNameGenerator,
> {
    RollingFileWriterBuilder::new(
        parquet,
        spec.target_file_size,
        spec.file_io.clone(),
        DefaultLocationGenerator::with_data_location(format!(
            "{}/data",
            spec.table_location.trim_end_matches('/')
        )),
        DefaultFileNameGenerator::new(
            format!("{}-{kind}", spec.prefix),
            None,
            DataFileFormat::Parquet,
        ),
    )
}

/// Writes `batches` (in the table's Arrow schema) as data files.
pub async fn write_data(
    spec: &FileSpec<'_>,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Vec::new());
    }
    let parquet = ParquetWriterBuilder::new(properties(), schema);
    let mut writer = DataFileWriterBuilder::new(rolling(spec, parquet, "data"))
        .build(None)
        .await?;
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        writer.write(batch.clone()).await?;
    }
    writer.close().await
}

/// Writes the key columns (`equality_ids`) of `batches` (in the table's Arrow
/// schema) as equality-delete files.
pub async fn write_deletes(
    spec: &FileSpec<'_>,
    schema: SchemaRef,
    equality_ids: Vec<i32>,
    batches: &[RecordBatch],
) -> Result<Vec<DataFile>> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(Vec::new());
    }
    let config = EqualityDeleteWriterConfig::new(equality_ids, schema)?;
    let delete_schema = arrow_schema_to_schema(config.projected_arrow_schema_ref())?;
    let parquet = ParquetWriterBuilder::new(properties(), Arc::new(delete_schema));
    let mut writer = EqualityDeleteFileWriterBuilder::new(rolling(spec, parquet, "eq-del"), config)
        .build(None)
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
