//! From the Arrow schema of a batch to an Iceberg schema, and back.
//!
//! The `iceberg` crate converts Arrow schemas only when they already carry
//! Iceberg field ids, and it has no "evolve towards this schema" step; both
//! are small and written here. Everything else (field ids, identifier
//! fields, the Arrow form of a table schema) is the crate's.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_schema::{DataType, Schema as ArrowSchema, SchemaRef as ArrowSchemaRef, TimeUnit};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

/// The Iceberg type a source column of this Arrow type is stored as.
pub fn iceberg_type(data_type: &DataType) -> Result<PrimitiveType, String> {
    Ok(match data_type {
        DataType::Boolean => PrimitiveType::Boolean,
        DataType::Int8 | DataType::Int16 | DataType::Int32 => PrimitiveType::Int,
        DataType::UInt8 | DataType::UInt16 => PrimitiveType::Int,
        DataType::Int64 | DataType::UInt32 => PrimitiveType::Long,
        DataType::Float16 | DataType::Float32 => PrimitiveType::Float,
        DataType::Float64 => PrimitiveType::Double,
        DataType::Decimal128(p, s) if *s >= 0 && *p <= 38 => PrimitiveType::Decimal {
            precision: u32::from(*p),
            scale: *s as u32,
        },
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => PrimitiveType::String,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => PrimitiveType::Binary,
        DataType::Date32 => PrimitiveType::Date,
        DataType::Time64(TimeUnit::Microsecond) => PrimitiveType::Time,
        DataType::Timestamp(TimeUnit::Microsecond, None) => PrimitiveType::Timestamp,
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => PrimitiveType::Timestamptz,
        other => return Err(format!("Arrow type {other} has no Iceberg equivalent here")),
    })
}

/// The schema of a new table: one field per column in batch order, ids
/// counting from one. With `keys`, the key columns are required identifier
/// fields (what equality deletes match on); every other column is optional,
/// since delete rows carry nulls.
pub fn new_schema(data: &ArrowSchema, keys: &[String]) -> Result<Schema, String> {
    let mut fields = Vec::new();
    let mut identifiers = Vec::new();
    for (i, field) in data.fields().iter().enumerate() {
        let id = i as i32 + 1;
        let ty = Type::Primitive(
            iceberg_type(field.data_type()).map_err(|e| format!("column {}: {e}", field.name()))?,
        );
        if keys.iter().any(|k| k == field.name()) {
            if matches!(
                ty,
                Type::Primitive(PrimitiveType::Float | PrimitiveType::Double)
            ) {
                return Err(format!(
                    "key column {} is floating point: Iceberg cannot match deletes on it",
                    field.name()
                ));
            }
            identifiers.push(id);
            fields.push(Arc::new(NestedField::required(id, field.name(), ty)));
        } else {
            fields.push(Arc::new(NestedField::optional(id, field.name(), ty)));
        }
    }
    for key in keys {
        if data.field_with_name(key).is_err() {
            return Err(format!("key column {key} is not in the batch"));
        }
    }
    Schema::builder()
        .with_schema_id(0)
        .with_fields(fields)
        .with_identifier_field_ids(identifiers)
        .build()
        .map_err(|e| e.to_string())
}

/// Whether Iceberg allows promoting a column of type `from` to `to`.
fn widens(from: &PrimitiveType, to: &PrimitiveType) -> bool {
    match (from, to) {
        (PrimitiveType::Int, PrimitiveType::Long) => true,
        (PrimitiveType::Float, PrimitiveType::Double) => true,
        (
            PrimitiveType::Decimal {
                precision: p1,
                scale: s1,
            },
            PrimitiveType::Decimal {
                precision: p2,
                scale: s2,
            },
        ) => s1 == s2 && p2 > p1,
        _ => false,
    }
}

/// The table schema that can hold `data`, or `None` when `current` already
/// can. New columns are added as optional fields with fresh ids; a column
/// whose type got wider is promoted where Iceberg allows it. Anything else
/// (a narrower or unrelated type, a key column that changed) is an error the
/// sink reports as a poison batch.
pub fn evolve(current: &Schema, data: &ArrowSchema) -> Result<Option<Schema>, String> {
    let mut fields: Vec<NestedField> = current
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut next_id = current.highest_field_id() + 1;
    let mut changed = false;
    let identifiers: Vec<i32> = current.identifier_field_ids().collect();
    for field in data.fields() {
        let incoming =
            iceberg_type(field.data_type()).map_err(|e| format!("column {}: {e}", field.name()))?;
        match fields.iter_mut().find(|f| f.name == *field.name()) {
            Some(existing) => {
                let Type::Primitive(have) = existing.field_type.as_ref() else {
                    return Err(format!("column {} is not a primitive column", field.name()));
                };
                if *have == incoming || widens(&incoming, have) {
                    continue;
                }
                if widens(have, &incoming) {
                    if identifiers.contains(&existing.id) {
                        return Err(format!(
                            "key column {} changed type from {have} to {incoming}; \
                             a key column's type cannot change",
                            field.name()
                        ));
                    }
                    *existing.field_type = Type::Primitive(incoming);
                    changed = true;
                    continue;
                }
                return Err(format!(
                    "column {} changed type from {have} to {incoming}, which Iceberg cannot \
                     promote (allowed: int to long, float to double, a decimal's precision up)",
                    field.name()
                ));
            }
            None => {
                fields.push(NestedField::optional(
                    next_id,
                    field.name(),
                    Type::Primitive(incoming),
                ));
                next_id += 1;
                changed = true;
            }
        }
    }
    if !changed {
        return Ok(None);
    }
    Schema::builder()
        .with_schema_id(current.schema_id() + 1)
        .with_fields(fields.into_iter().map(Arc::new))
        .with_identifier_field_ids(identifiers)
        .build()
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The Arrow schema the crate's writers expect for `schema` (with field ids).
pub fn arrow_schema(schema: &Schema) -> Result<ArrowSchemaRef, String> {
    schema_to_arrow_schema(schema)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Rebuilds `data` in the table's Arrow schema: columns by name, cast to the
/// table's types, nulls for table columns the batch does not have.
pub fn conform(data: &RecordBatch, target: &ArrowSchemaRef) -> Result<RecordBatch, String> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for field in target.fields() {
        let column = match data.column_by_name(field.name()) {
            Some(column) if column.data_type() == field.data_type() => column.clone(),
            Some(column) => arrow_cast::cast(column, field.data_type()).map_err(|e| {
                format!(
                    "column {}: cannot store {} as {}: {e}",
                    field.name(),
                    column.data_type(),
                    field.data_type()
                )
            })?,
            None if field.is_nullable() => new_null_array(field.data_type(), data.num_rows()),
            None => {
                return Err(format!(
                    "the batch has no column {}, which the table requires",
                    field.name()
                ));
            }
        };
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(format!(
                "column {} holds nulls, but it is a key column of the table",
                field.name()
            ));
        }
        columns.push(column);
    }
    RecordBatch::try_new(target.clone(), columns).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use arrow_schema::Field;

    use super::*;

    fn arrow(fields: &[(&str, DataType)]) -> ArrowSchema {
        ArrowSchema::new(
            fields
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn new_schema_marks_keys() {
        let s = new_schema(
            &arrow(&[("id", DataType::Int64), ("name", DataType::Utf8)]),
            &["id".into()],
        )
        .unwrap();
        assert_eq!(s.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        assert!(s.field_by_name("id").unwrap().required);
        assert!(!s.field_by_name("name").unwrap().required);
        assert!(new_schema(&arrow(&[("x", DataType::Float64)]), &["x".into()]).is_err());
        assert!(new_schema(&arrow(&[("x", DataType::Int64)]), &["y".into()]).is_err());
    }

    #[test]
    fn evolution_adds_columns_and_widens() {
        let s = new_schema(
            &arrow(&[
                ("id", DataType::Int64),
                ("n", DataType::Int32),
                ("d", DataType::Decimal128(10, 2)),
            ]),
            &["id".into()],
        )
        .unwrap();
        // Same or narrower incoming types need nothing.
        assert!(
            evolve(
                &s,
                &arrow(&[("id", DataType::Int64), ("n", DataType::Int16)])
            )
            .unwrap()
            .is_none()
        );
        let e = evolve(
            &s,
            &arrow(&[
                ("id", DataType::Int64),
                ("n", DataType::Int64),
                ("d", DataType::Decimal128(12, 2)),
                ("new", DataType::Utf8),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.schema_id(), 1);
        assert_eq!(
            *e.field_by_name("n").unwrap().field_type,
            Type::Primitive(PrimitiveType::Long)
        );
        let new = e.field_by_name("new").unwrap();
        assert_eq!(new.id, 4);
        assert!(!new.required);
        assert_eq!(e.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        // Not promotable.
        for bad in [
            arrow(&[("n", DataType::Utf8)]),
            arrow(&[("d", DataType::Decimal128(12, 3))]),
            arrow(&[("id", DataType::Int32), ("n", DataType::Float64)]),
            arrow(&[("x", DataType::Duration(TimeUnit::Second))]),
        ] {
            assert!(evolve(&s, &bad).is_err(), "{bad:?}");
        }
    }
}
