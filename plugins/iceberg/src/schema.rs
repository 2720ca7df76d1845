//! From the Arrow schema of a batch to an Iceberg schema, and back.
//!
//! The `iceberg` crate converts Arrow schemas only when they already carry
//! Iceberg field ids, and it has no "evolve towards this schema" step; both
//! are small and written here. Everything else (identifier fields, the Arrow
//! form of a table schema) is the crate's.
//!
//! Lists, structs and maps are carried as Iceberg lists, structs and maps:
//! every nested field gets its own id, and an element, map value or struct
//! field is required only where the Arrow field is not nullable. A 16-byte
//! fixed binary marked with Arrow's canonical `arrow.uuid` extension is an
//! Iceberg `uuid`; any other fixed binary is a `fixed`.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, MapArray, RecordBatch, StructArray, new_null_array};
use arrow_schema::{
    DataType, Field, FieldRef, Fields, Schema as ArrowSchema, SchemaRef as ArrowSchemaRef, TimeUnit,
};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, Schema, StructType, Type};

/// Arrow's extension-name metadata key and its canonical name of a uuid.
const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
const UUID_EXTENSION: &str = "arrow.uuid";

/// The Iceberg type a source column of this Arrow type is stored as, nested
/// types included (their field ids are placeholders: see [`new_schema`] and
/// [`evolve`] for the ids a table gets). Without the column's field there is
/// no extension to read, so a 16-byte fixed binary is a `fixed` here; use
/// [`field_type`] for the column's own type.
pub fn iceberg_type(data_type: &DataType) -> Result<Type, String> {
    convert(data_type, false, &mut 0)
}

/// The Iceberg type of a batch's field, a uuid recognised by its extension.
pub fn field_type(field: &Field) -> Result<Type, String> {
    convert(field.data_type(), is_uuid(field), &mut 0)
}

fn is_uuid(field: &Field) -> bool {
    field.metadata().get(EXTENSION_NAME_KEY).map(String::as_str) == Some(UUID_EXTENSION)
}

fn primitive(data_type: &DataType, uuid: bool) -> Result<PrimitiveType, String> {
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
        DataType::FixedSizeBinary(16) if uuid => PrimitiveType::Uuid,
        DataType::FixedSizeBinary(width) if *width > 0 => PrimitiveType::Fixed(*width as u64),
        DataType::Date32 => PrimitiveType::Date,
        DataType::Time64(TimeUnit::Microsecond) => PrimitiveType::Time,
        DataType::Timestamp(TimeUnit::Microsecond, None) => PrimitiveType::Timestamp,
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => PrimitiveType::Timestamptz,
        other => return Err(format!("Arrow type {other} has no Iceberg equivalent here")),
    })
}

/// The nested field of Arrow field `field`, with id `id` and its own nested
/// ids taken from `next_id`.
fn nested_field(field: &Field, id: i32, next_id: &mut i32) -> Result<NestedField, String> {
    let ty = convert(field.data_type(), is_uuid(field), next_id)
        .map_err(|e| format!("{}: {e}", field.name()))?;
    Ok(NestedField::new(id, field.name(), ty, !field.is_nullable()))
}

fn take_id(next_id: &mut i32) -> i32 {
    let id = *next_id;
    *next_id += 1;
    id
}

/// Arrow to Iceberg, recursively. A nested type's own fields take their ids
/// first (in field order), then each of them converts its children: ids
/// count breadth-first within one column, as Iceberg assigns them.
fn convert(data_type: &DataType, uuid: bool, next_id: &mut i32) -> Result<Type, String> {
    Ok(match data_type {
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            let id = take_id(next_id);
            let element = convert(item.data_type(), is_uuid(item), next_id)
                .map_err(|e| format!("element: {e}"))?;
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                id,
                element,
                !item.is_nullable(),
            ))))
        }
        DataType::Struct(fields) => {
            if fields.is_empty() {
                return Err("a struct without fields has no Iceberg equivalent".into());
            }
            let ids: Vec<i32> = fields.iter().map(|_| take_id(next_id)).collect();
            let nested = fields
                .iter()
                .zip(ids)
                .map(|(f, id)| nested_field(f, id, next_id).map(Arc::new))
                .collect::<Result<Vec<_>, _>>()?;
            Type::Struct(StructType::new(nested))
        }
        DataType::Map(entries, _) => {
            let (key, value) = map_entries(entries)?;
            let (key_id, value_id) = (take_id(next_id), take_id(next_id));
            let key_type =
                convert(key.data_type(), is_uuid(key), next_id).map_err(|e| format!("key: {e}"))?;
            let value_type = convert(value.data_type(), is_uuid(value), next_id)
                .map_err(|e| format!("value: {e}"))?;
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(key_id, key_type)),
                Arc::new(NestedField::map_value_element(
                    value_id,
                    value_type,
                    !value.is_nullable(),
                )),
            ))
        }
        other => Type::Primitive(primitive(other, uuid)?),
    })
}

/// A map's key and value fields (Arrow names them freely; they are the two
/// fields of its entries, in that order).
fn map_entries(entries: &Field) -> Result<(&FieldRef, &FieldRef), String> {
    match entries.data_type() {
        DataType::Struct(fields) if fields.len() == 2 => Ok((&fields[0], &fields[1])),
        other => Err(format!(
            "a map's entries must be a struct of key and value, not {other}"
        )),
    }
}

/// The schema of a new table: one field per column in batch order, ids
/// counting from one, then the ids of nested fields. With `keys`, the key
/// columns are required identifier fields (what deletes match on); every
/// other column is optional, since delete rows carry nulls.
pub fn new_schema(data: &ArrowSchema, keys: &[String]) -> Result<Schema, String> {
    let mut fields = Vec::new();
    let mut identifiers = Vec::new();
    let mut next_id = data.fields().len() as i32 + 1;
    for (i, field) in data.fields().iter().enumerate() {
        let id = i as i32 + 1;
        let ty = convert(field.data_type(), is_uuid(field), &mut next_id)
            .map_err(|e| format!("column {}: {e}", field.name()))?;
        if keys.iter().any(|k| k == field.name()) {
            match &ty {
                Type::Primitive(PrimitiveType::Float | PrimitiveType::Double) => {
                    return Err(format!(
                        "key column {} is floating point: Iceberg cannot match deletes on it",
                        field.name()
                    ));
                }
                Type::Primitive(_) => {}
                nested => {
                    return Err(format!(
                        "key column {} is a {nested}: an Iceberg key column is a primitive",
                        field.name()
                    ));
                }
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
/// can. New columns (and new fields of a struct column) are added as
/// optional fields with fresh ids; a type that got wider is promoted where
/// Iceberg allows it, at any depth; a nested field that became nullable
/// becomes optional. Anything else (a narrower or unrelated type, a list
/// that became a string, a key column that changed) is an error naming the
/// column, which the sink reports as a poison batch.
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
        match fields.iter_mut().find(|f| f.name == *field.name()) {
            Some(existing) => {
                let key = identifiers.contains(&existing.id);
                changed |= reconcile(
                    &mut existing.field_type,
                    field,
                    field.name(),
                    key,
                    &mut next_id,
                )?;
            }
            None => {
                let id = take_id(&mut next_id);
                let mut added =
                    nested_field(field, id, &mut next_id).map_err(|e| format!("column {e}"))?;
                added.required = false;
                fields.push(added);
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

/// Grows `have` (the table's type of the column or nested field at `path`)
/// to hold `incoming`; true when it changed.
fn reconcile(
    have: &mut Type,
    incoming: &Field,
    path: &str,
    key: bool,
    next_id: &mut i32,
) -> Result<bool, String> {
    let refuse = |have: &Type, why: &str| {
        let incoming = field_type(incoming)
            .map(|t| shown(&t))
            .unwrap_or_else(|_| incoming.data_type().to_string());
        Err(format!(
            "column {path} changed type from {} to {incoming}, which {why}",
            shown(have)
        ))
    };
    const NOT_PROMOTABLE: &str = "Iceberg cannot promote (allowed: int to long, float to \
                                  double, a decimal's precision up, new struct fields)";
    match (have, incoming.data_type()) {
        (
            Type::List(list),
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _),
        ) => {
            let mut element = list.element_field.as_ref().clone();
            let changed =
                reconcile_nested(&mut element, item, &format!("{path}.element"), next_id)?;
            if changed {
                list.element_field = Arc::new(element);
            }
            Ok(changed)
        }
        (Type::Struct(have_struct), DataType::Struct(incoming_fields)) => {
            let mut fields: Vec<NestedField> = have_struct
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            let mut changed = false;
            for sub in incoming_fields {
                let sub_path = format!("{path}.{}", sub.name());
                match fields.iter_mut().find(|f| f.name == *sub.name()) {
                    Some(existing) => {
                        changed |= reconcile_nested(existing, sub, &sub_path, next_id)?;
                    }
                    None => {
                        let id = take_id(next_id);
                        let mut added = nested_field(sub, id, next_id)
                            .map_err(|e| format!("column {path}.{e}"))?;
                        added.required = false;
                        fields.push(added);
                        changed = true;
                    }
                }
            }
            if changed {
                *have_struct = StructType::new(fields.into_iter().map(Arc::new).collect());
            }
            Ok(changed)
        }
        (Type::Map(map), DataType::Map(entries, _)) => {
            let (key_field, value_field) =
                map_entries(entries).map_err(|e| format!("column {path}: {e}"))?;
            let mut map_key = map.key_field.as_ref().clone();
            let before = map_key.clone();
            reconcile_nested(&mut map_key, key_field, &format!("{path}.key"), next_id)?;
            // A map key cannot change: the entries are found by it.
            map_key.required = true;
            if map_key != before {
                return Err(format!(
                    "column {path}: the map's key type changed from {} to {}; a map key's type \
                     cannot change",
                    shown(&before.field_type),
                    shown(&map_key.field_type)
                ));
            }
            let mut value = map.value_field.as_ref().clone();
            let changed =
                reconcile_nested(&mut value, value_field, &format!("{path}.value"), next_id)?;
            if changed {
                map.value_field = Arc::new(value);
            }
            Ok(changed)
        }
        (Type::Primitive(have_primitive), data_type) if !data_type.is_nested() => {
            let incoming_primitive = primitive(data_type, is_uuid(incoming))
                .map_err(|e| format!("column {path}: {e}"))?;
            if *have_primitive == incoming_primitive || widens(&incoming_primitive, have_primitive)
            {
                return Ok(false);
            }
            if widens(have_primitive, &incoming_primitive) {
                if key {
                    return Err(format!(
                        "key column {path} changed type from {have_primitive} to \
                         {incoming_primitive}; a key column's type cannot change"
                    ));
                }
                *have_primitive = incoming_primitive;
                return Ok(true);
            }
            refuse(&Type::Primitive(have_primitive.clone()), NOT_PROMOTABLE)
        }
        (have, _) => refuse(have, "is a different shape Iceberg cannot evolve into"),
    }
}

/// A type as a message shows it, nested types with their contents.
fn shown(ty: &Type) -> String {
    match ty {
        Type::Primitive(p) => p.to_string(),
        Type::List(list) => format!("list<{}>", shown(&list.element_field.field_type)),
        Type::Map(map) => format!(
            "map<{}, {}>",
            shown(&map.key_field.field_type),
            shown(&map.value_field.field_type)
        ),
        Type::Struct(st) => format!(
            "struct<{}>",
            st.fields()
                .iter()
                .map(|f| format!("{}: {}", f.name, shown(&f.field_type)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// [`reconcile`] for a list element, map key or value, or struct field: its
/// type, and its nullability (required becomes optional when the incoming
/// field holds nulls; Iceberg allows that).
fn reconcile_nested(
    have: &mut NestedField,
    incoming: &Field,
    path: &str,
    next_id: &mut i32,
) -> Result<bool, String> {
    let mut changed = reconcile(&mut have.field_type, incoming, path, false, next_id)?;
    if have.required && incoming.is_nullable() {
        have.required = false;
        changed = true;
    }
    Ok(changed)
}

/// The Arrow schema the crate's writers expect for `schema` (with field ids).
pub fn arrow_schema(schema: &Schema) -> Result<ArrowSchemaRef, String> {
    schema_to_arrow_schema(schema)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Rebuilds `data` in the table's Arrow schema: columns by name (struct
/// fields too), cast to the table's types, nulls for table columns and
/// struct fields the batch does not have.
pub fn conform(data: &RecordBatch, target: &ArrowSchemaRef) -> Result<RecordBatch, String> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(target.fields().len());
    for field in target.fields() {
        let column = match data.column_by_name(field.name()) {
            Some(column) => conform_array(column, field, field.name())?,
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

/// One array in the type of `target` (the table's, with field ids at every
/// depth), rebuilt around conformed children where the type is nested.
fn conform_array(array: &ArrayRef, target: &Field, path: &str) -> Result<ArrayRef, String> {
    if array.data_type() == target.data_type() {
        return Ok(array.clone());
    }
    let mismatch = |e: &dyn std::fmt::Display| {
        format!(
            "column {path}: cannot store {} as {}: {e}",
            array.data_type(),
            target.data_type()
        )
    };
    match target.data_type() {
        DataType::List(element) => {
            // Other list layouts become a plain list first, elements as they are.
            let list = match array.data_type() {
                DataType::List(_) => array.clone(),
                DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
                    arrow_cast::cast(array, &DataType::List(item.clone()))
                        .map_err(|e| mismatch(&e))?
                }
                _ => return Err(mismatch(&"not a list")),
            };
            let list = list.as_list::<i32>();
            let values = conform_array(list.values(), element, &format!("{path}.element"))?;
            if !element.is_nullable() && values.null_count() > 0 {
                return Err(format!(
                    "column {path}: a list holds null elements, but the table's elements are required"
                ));
            }
            Ok(Arc::new(
                ListArray::try_new(
                    element.clone(),
                    list.offsets().clone(),
                    values,
                    list.nulls().cloned(),
                )
                .map_err(|e| mismatch(&e))?,
            ))
        }
        DataType::Struct(fields) => {
            let Some(incoming) = array.as_struct_opt() else {
                return Err(mismatch(&"not a struct"));
            };
            let children = conform_children(incoming, fields, path)?;
            Ok(Arc::new(
                StructArray::try_new(fields.clone(), children, incoming.nulls().cloned())
                    .map_err(|e| mismatch(&e))?,
            ))
        }
        DataType::Map(entries_field, ordered) => {
            let Some(map) = array.as_map_opt() else {
                return Err(mismatch(&"not a map"));
            };
            let DataType::Struct(target_entries) = entries_field.data_type() else {
                return Err(mismatch(&"the table's map has no entries struct"));
            };
            // Key and value by position: Arrow writers name them freely.
            let entries = map.entries();
            let mut children = Vec::with_capacity(2);
            for (i, (field, part)) in target_entries.iter().zip(["key", "value"]).enumerate() {
                let child = conform_array(entries.column(i), field, &format!("{path}.{part}"))?;
                if !field.is_nullable() && child.null_count() > 0 {
                    return Err(format!(
                        "column {path}: a map holds null {part}s, but the table's are required"
                    ));
                }
                children.push(child);
            }
            let entries = StructArray::try_new(target_entries.clone(), children, None)
                .map_err(|e| mismatch(&e))?;
            Ok(Arc::new(
                MapArray::try_new(
                    entries_field.clone(),
                    map.offsets().clone(),
                    entries,
                    map.nulls().cloned(),
                    *ordered,
                )
                .map_err(|e| mismatch(&e))?,
            ))
        }
        to => arrow_cast::cast(array, to).map_err(|e| mismatch(&e)),
    }
}

/// A struct's children in the order of `fields`, by name; nulls for fields
/// the incoming struct does not have.
fn conform_children(
    incoming: &StructArray,
    fields: &Fields,
    path: &str,
) -> Result<Vec<ArrayRef>, String> {
    fields
        .iter()
        .map(|field| {
            let sub_path = format!("{path}.{}", field.name());
            let child = match incoming.column_by_name(field.name()) {
                Some(child) => conform_array(child, field, &sub_path)?,
                None if field.is_nullable() => new_null_array(field.data_type(), incoming.len()),
                None => {
                    return Err(format!(
                        "column {sub_path} is missing, and the table requires it"
                    ));
                }
            };
            if !field.is_nullable() && child.logical_null_count() > 0 {
                // Nulls under a null struct row are fine; the rest are not.
                let parent_nulls = incoming.nulls();
                let stray = (0..child.len())
                    .any(|i| child.is_null(i) && parent_nulls.is_none_or(|n| n.is_valid(i)));
                if stray {
                    return Err(format!(
                        "column {sub_path} holds nulls, but the table requires it"
                    ));
                }
            }
            Ok(child)
        })
        .collect()
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

    fn uuid_field(name: &str, nullable: bool) -> Field {
        Field::new(name, DataType::FixedSizeBinary(16), nullable)
            .with_metadata([(EXTENSION_NAME_KEY.to_string(), UUID_EXTENSION.to_string())].into())
    }

    fn list_of(item: Field) -> DataType {
        DataType::List(Arc::new(item))
    }

    /// `id bigint, tags list<string?>, point struct<x: int, y: double?>,
    /// attrs map<string, uuid?>, uid uuid, fixed fixed[16], at time`.
    fn nested() -> ArrowSchema {
        ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "tags",
                list_of(Field::new("item", DataType::Utf8, true)),
                true,
            ),
            Field::new(
                "point",
                DataType::Struct(Fields::from(vec![
                    Field::new("x", DataType::Int32, false),
                    Field::new("y", DataType::Float64, true),
                ])),
                true,
            ),
            Field::new_map(
                "attrs",
                "entries",
                Field::new("keys", DataType::Utf8, false),
                uuid_field("values", true),
                false,
                true,
            ),
            uuid_field("uid", true),
            Field::new("fixed", DataType::FixedSizeBinary(16), true),
            Field::new("at", DataType::Time64(TimeUnit::Microsecond), true),
        ])
    }

    #[test]
    fn nested_columns_get_their_own_ids_and_nullability() {
        let s = new_schema(&nested(), &["id".into()]).unwrap();
        let ty = |name: &str| s.field_by_name(name).unwrap().field_type.as_ref().clone();
        // Top-level columns keep ids 1..=7; nested fields count on from 8.
        assert_eq!(s.field_by_name("uid").unwrap().id, 5);
        let Type::List(tags) = ty("tags") else {
            panic!("tags: {}", ty("tags"))
        };
        assert_eq!(tags.element_field.id, 8);
        assert!(!tags.element_field.required);
        let Type::Struct(point) = ty("point") else {
            panic!()
        };
        let x = point.field_by_name("x").unwrap();
        let y = point.field_by_name("y").unwrap();
        assert_eq!((x.id, x.required, y.id, y.required), (9, true, 10, false));
        let Type::Map(attrs) = ty("attrs") else {
            panic!()
        };
        assert_eq!((attrs.key_field.id, attrs.value_field.id), (11, 12));
        assert_eq!(
            *attrs.value_field.field_type,
            Type::Primitive(PrimitiveType::Uuid)
        );
        assert!(!attrs.value_field.required);
        assert_eq!(ty("uid"), Type::Primitive(PrimitiveType::Uuid));
        assert_eq!(ty("fixed"), Type::Primitive(PrimitiveType::Fixed(16)));
        assert_eq!(ty("at"), Type::Primitive(PrimitiveType::Time));
        assert_eq!(s.highest_field_id(), 12);
        // The crate's Arrow form of it carries an id on every field.
        let arrow = arrow_schema(&s).unwrap();
        let DataType::List(element) = arrow.field_with_name("tags").unwrap().data_type() else {
            panic!()
        };
        assert_eq!(
            element
                .metadata()
                .get("PARQUET:field_id")
                .map(String::as_str),
            Some("8")
        );
        // A nested key column is refused with its name.
        let said = new_schema(&nested(), &["tags".into()]).unwrap_err();
        assert!(said.contains("key column tags"), "{said}");
    }

    #[test]
    fn nested_columns_evolve_and_refuse_what_iceberg_cannot() {
        let s = new_schema(&nested(), &["id".into()]).unwrap();
        assert!(evolve(&s, &nested()).unwrap().is_none());
        // A new list column, a new struct field, a promoted element and
        // a required field that turned nullable.
        let grown = ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "point",
                DataType::Struct(Fields::from(vec![
                    Field::new("x", DataType::Int64, true),
                    Field::new(
                        "z",
                        list_of(Field::new("item", DataType::Int32, false)),
                        true,
                    ),
                ])),
                true,
            ),
            Field::new(
                "scores",
                list_of(Field::new("item", DataType::Int32, true)),
                true,
            ),
        ]);
        let e = evolve(&s, &grown).unwrap().unwrap();
        let Type::Struct(point) = e
            .field_by_name("point")
            .unwrap()
            .field_type
            .as_ref()
            .clone()
        else {
            panic!()
        };
        let x = point.field_by_name("x").unwrap();
        assert_eq!(*x.field_type, Type::Primitive(PrimitiveType::Long));
        assert!(!x.required);
        let z = point.field_by_name("z").unwrap();
        assert_eq!((z.id, z.required), (13, false));
        let Type::List(z_list) = z.field_type.as_ref() else {
            panic!()
        };
        assert_eq!(z_list.element_field.id, 14);
        assert!(z_list.element_field.required);
        let scores = e.field_by_name("scores").unwrap();
        assert_eq!(scores.id, 15);
        assert!(!scores.required);
        assert_eq!(e.highest_field_id(), 16);
        for (bad, named) in [
            (
                ArrowSchema::new(vec![Field::new("tags", DataType::Utf8, true)]),
                "column tags changed type from list<string> to string",
            ),
            (
                ArrowSchema::new(vec![Field::new(
                    "tags",
                    list_of(Field::new("item", DataType::Int64, true)),
                    true,
                )]),
                "column tags.element changed type from string to long",
            ),
            (
                ArrowSchema::new(vec![Field::new(
                    "point",
                    DataType::Struct(Fields::from(vec![Field::new("y", DataType::Utf8, true)])),
                    true,
                )]),
                "column point.y changed type from double to string",
            ),
            (
                ArrowSchema::new(vec![Field::new("uid", DataType::Utf8, true)]),
                "column uid changed type from uuid to string",
            ),
            (
                ArrowSchema::new(vec![
                    Field::new("fixed", DataType::FixedSizeBinary(16), true)
                        .with_metadata(uuid_field("u", true).metadata().clone()),
                ]),
                "column fixed changed type from fixed(16) to uuid",
            ),
        ] {
            let said = evolve(&s, &bad).unwrap_err();
            assert!(said.contains(named), "wanted {named:?} in: {said}");
        }
    }

    #[test]
    fn nested_batches_conform_to_the_tables_arrow_schema() {
        use arrow_array::builder::{
            FixedSizeBinaryBuilder, ListBuilder, MapBuilder, MapFieldNames, StringBuilder,
        };
        use arrow_array::{Float64Array, Int32Array, Int64Array};

        let data_schema = Arc::new(nested());
        let s = new_schema(&data_schema, &["id".into()]).unwrap();
        let target = arrow_schema(&s).unwrap();
        let mut tags = ListBuilder::new(StringBuilder::new());
        tags.values().append_value("a");
        tags.values().append_null();
        tags.append(true);
        tags.append(true); // empty
        tags.append(false); // null
        let point = StructArray::try_new(
            match data_schema.field_with_name("point").unwrap().data_type() {
                DataType::Struct(fields) => fields.clone(),
                _ => unreachable!(),
            },
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 0])),
                Arc::new(Float64Array::from(vec![Some(0.5), None, None])),
            ],
            Some(vec![true, true, false].into()),
        )
        .unwrap();
        let names = MapFieldNames {
            entry: "entries".into(),
            key: "keys".into(),
            value: "values".into(),
        };
        let mut attrs = MapBuilder::new(
            Some(names),
            StringBuilder::new(),
            FixedSizeBinaryBuilder::new(16),
        )
        .with_values_field(Arc::new(uuid_field("values", true)));
        attrs.keys().append_value("k");
        attrs.values().append_value([7u8; 16]).unwrap();
        attrs.append(true).unwrap();
        attrs.append(true).unwrap();
        attrs.append(false).unwrap();
        let mut uid = FixedSizeBinaryBuilder::new(16);
        uid.append_value([1u8; 16]).unwrap();
        uid.append_null();
        uid.append_null();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(tags.finish()),
            Arc::new(point),
            Arc::new(attrs.finish()),
            Arc::new(uid.finish()),
            new_null_array(&DataType::FixedSizeBinary(16), 3),
            new_null_array(&DataType::Time64(TimeUnit::Microsecond), 3),
        ];
        let batch = RecordBatch::try_new(data_schema, columns).unwrap();
        let conformed = conform(&batch, &target).unwrap();
        assert_eq!(conformed.schema(), target);
        let tags = conformed.column_by_name("tags").unwrap().as_list::<i32>();
        assert_eq!(tags.value_offsets(), &[0, 2, 2, 2]);
        assert!(tags.is_null(2) && !tags.is_null(1));
        assert!(tags.value(0).is_null(1));
        let point = conformed.column_by_name("point").unwrap().as_struct();
        assert!(point.is_null(2));
        let attrs = conformed.column_by_name("attrs").unwrap().as_map();
        assert_eq!(attrs.value_length(0), 1);
        assert_eq!(attrs.values().as_fixed_size_binary().value(0), [7u8; 16]);

        // A null element where the table's elements are required is named.
        let required = ArrowSchema::new(vec![Field::new(
            "tags",
            list_of(Field::new("item", DataType::Utf8, false)),
            true,
        )]);
        let strict = arrow_schema(&new_schema(&required, &[]).unwrap()).unwrap();
        let mut tags = ListBuilder::new(StringBuilder::new());
        tags.values().append_null();
        tags.append(true);
        let loose = RecordBatch::try_new(
            Arc::new(ArrowSchema::new(vec![Field::new(
                "tags",
                list_of(Field::new("item", DataType::Utf8, true)),
                true,
            )])),
            vec![Arc::new(tags.finish())],
        )
        .unwrap();
        let said = conform(&loose, &strict).unwrap_err();
        assert!(
            said.contains("column tags: a list holds null elements"),
            "{said}"
        );
    }
}
