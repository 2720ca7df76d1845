//! Reading a cell of a batch back as a [`Value`]: the inverse of building
//! the batch, for tests that check round trips (here and in the
//! test-support crate). Not in the `weir` binary.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, Time64MicrosecondType,
    TimestampMicrosecondType,
};
use arrow_schema::DataType;

use crate::change::Value;

/// One cell as a [`Value`], by the array's own type (lists recursively).
pub fn value_at(array: &dyn Array, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(row)),
        DataType::Int32 => Value::Int32(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => Value::Int64(array.as_primitive::<Int64Type>().value(row)),
        DataType::Float64 => Value::Float64(array.as_primitive::<Float64Type>().value(row)),
        DataType::Decimal128(_, _) => {
            Value::Decimal128(array.as_primitive::<Decimal128Type>().value(row))
        }
        DataType::Utf8 => Value::Utf8(array.as_string::<i32>().value(row).to_string()),
        DataType::Binary => Value::Binary(array.as_binary::<i32>().value(row).to_vec()),
        DataType::FixedSizeBinary(_) => {
            Value::Binary(array.as_fixed_size_binary().value(row).to_vec())
        }
        DataType::Time64(_) => {
            Value::Int64(array.as_primitive::<Time64MicrosecondType>().value(row))
        }
        DataType::Date32 => Value::Date32(array.as_primitive::<Date32Type>().value(row)),
        DataType::Timestamp(_, _) => {
            Value::TimestampMicros(array.as_primitive::<TimestampMicrosecondType>().value(row))
        }
        DataType::List(_) => {
            let list = array.as_list::<i32>().value(row);
            Value::List(
                (0..list.len())
                    .map(|i| value_at(list.as_ref(), i))
                    .collect(),
            )
        }
        other => panic!("unexpected column type {other}"),
    }
}
