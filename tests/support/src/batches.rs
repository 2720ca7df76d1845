//! Record batches as the host hands them to a sink: the table's columns,
//! then the control columns (`__op`, `__pos`). For tests that feed a sink
//! directly rather than through a pipeline.

use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray};
use weir_contract::{OP_COLUMN, Op, POS_COLUMN};

/// Builds a change batch column by column; columns with nulls are nullable.
#[derive(Clone, Debug, Default)]
pub struct BatchBuilder {
    columns: Vec<(String, ArrayRef)>,
}

impl BatchBuilder {
    /// A batch without columns yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds any column.
    pub fn column(mut self, name: &str, array: ArrayRef) -> Self {
        self.columns.push((name.into(), array));
        self
    }

    /// Adds an int64 column.
    pub fn int64(self, name: &str, values: impl IntoIterator<Item = i64>) -> Self {
        let array = Int64Array::from_iter_values(values);
        self.column(name, Arc::new(array))
    }

    /// Adds an int32 column.
    pub fn int32(self, name: &str, values: impl IntoIterator<Item = i32>) -> Self {
        let array = Int32Array::from_iter_values(values);
        self.column(name, Arc::new(array))
    }

    /// Adds a utf8 column; `None` is null.
    pub fn utf8<'a>(self, name: &str, values: impl IntoIterator<Item = Option<&'a str>>) -> Self {
        let array: StringArray = values.into_iter().collect();
        self.column(name, Arc::new(array))
    }

    /// Adds the control columns: each row's operation and position.
    pub fn changes<P: AsRef<[u8]>>(
        self,
        ops: impl IntoIterator<Item = Op>,
        positions: impl IntoIterator<Item = P>,
    ) -> Self {
        let ops = StringArray::from_iter_values(ops.into_iter().map(Op::as_str));
        let positions = BinaryArray::from_iter_values(positions);
        self.column(OP_COLUMN, Arc::new(ops))
            .column(POS_COLUMN, Arc::new(positions))
    }

    /// The batch; panics when the columns differ in length.
    pub fn build(self) -> RecordBatch {
        RecordBatch::try_from_iter(self.columns).expect("columns of equal length")
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;

    use super::*;

    #[test]
    fn builds_data_then_control_columns() {
        let batch = BatchBuilder::new()
            .int64("id", [1, 2])
            .utf8("name", [Some("a"), None])
            .changes([Op::Insert, Op::Delete], [[1u8], [2]])
            .build();
        let names: Vec<&str> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names, ["id", "name", OP_COLUMN, POS_COLUMN]);
        assert!(batch.schema_ref().field(1).is_nullable());
        assert!(!batch.schema_ref().field(0).is_nullable());
        assert_eq!(batch.column(2).as_string::<i32>().value(1), "delete");
        assert_eq!(batch.column(3).as_binary::<i32>().value(0), [1u8]);
    }
}
