//! The batch encoding: one Arrow record batch as an Arrow IPC stream.

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;

/// Encodes one record batch as the Arrow IPC stream a sink's `write` gets.
pub fn encode(batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema())?;
    writer.write(batch)?;
    writer.into_inner()
}
