//! Partitioning: the partition spec a table is created with, read from the
//! sink's config (`partition.<namespace>.<table>`), and splitting a commit's
//! rows by partition.
//!
//! The syntax is a comma-separated list of transforms of top-level columns:
//! `identity(c)`, `bucket(N, c)`, `truncate(W, c)`, `year(c)`, `month(c)`,
//! `day(c)`, `hour(c)`. An upsert table may only be partitioned on key
//! columns: then a key always maps to the same partition, so the delete of
//! its older row lands in the partition of the file that holds that row.

use arrow_array::{RecordBatch, UInt32Array};
use iceberg::arrow::{PartitionValueCalculator, arrow_struct_to_literal};
use iceberg::spec::{
    Literal, PartitionKey, PartitionSpec, PartitionSpecRef, PrimitiveLiteral, Schema, SchemaRef,
    Struct, Transform, Type, UnboundPartitionSpec,
};
use iceberg::{Error, ErrorKind, Result};
use std::collections::HashMap;

/// Config keys that give a table's partition spec start with this.
pub const CONFIG_PREFIX: &str = "partition.";

/// One partition field as the config names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub transform: Transform,
    pub column: String,
}

/// Parses a spec such as `day(created_at), bucket(16, id)`. The error names
/// the bad term.
pub fn parse(text: &str) -> std::result::Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut pieces = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                pieces.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced parentheses in {text:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {text:?}"));
    }
    pieces.push(&text[start..]);
    for (n, piece) in pieces.iter().enumerate() {
        let term = piece.trim();
        terms.push(parse_term(term).map_err(|why| format!("term {} {term:?}: {why}", n + 1))?);
    }
    Ok(terms)
}

fn parse_term(term: &str) -> std::result::Result<Term, String> {
    const EXPECTED: &str = "expected identity(c), bucket(N, c), truncate(W, c), year(c), \
                            month(c), day(c) or hour(c)";
    if term.is_empty() {
        return Err(format!("empty; {EXPECTED}"));
    }
    let (name, rest) = term.split_once('(').ok_or_else(|| EXPECTED.to_string())?;
    let args = rest
        .strip_suffix(')')
        .ok_or_else(|| format!("does not end with `)`; {EXPECTED}"))?;
    let args: Vec<&str> = args.split(',').map(str::trim).collect();
    let column = |arg: &str| -> std::result::Result<String, String> {
        if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || "()\"'`".contains(c)) {
            return Err(format!("{arg:?} is not a column name"));
        }
        Ok(arg.to_string())
    };
    let width = |arg: &str, what: &str| -> std::result::Result<u32, String> {
        match arg.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "the {what} must be a positive integer, not {arg:?}"
            )),
        }
    };
    let (transform, column_arg) = match (name.trim(), args.as_slice()) {
        ("identity", [c]) => (Transform::Identity, *c),
        ("year", [c]) => (Transform::Year, *c),
        ("month", [c]) => (Transform::Month, *c),
        ("day", [c]) => (Transform::Day, *c),
        ("hour", [c]) => (Transform::Hour, *c),
        ("bucket", [n, c]) => (Transform::Bucket(width(n, "bucket count")?), *c),
        ("truncate", [w, c]) => (Transform::Truncate(width(w, "truncate width")?), *c),
        ("identity" | "year" | "month" | "day" | "hour", _) => {
            return Err(format!("`{}` takes one column", name.trim()));
        }
        ("bucket" | "truncate", _) => {
            return Err(format!("`{}` takes a number and a column", name.trim()));
        }
        (other, _) => return Err(format!("unknown transform {other:?}; {EXPECTED}")),
    };
    Ok(Term {
        transform,
        column: column(column_arg)?,
    })
}

/// How a term reads in the config syntax.
pub fn describe_term(transform: &Transform, column: &str) -> String {
    match transform {
        Transform::Bucket(n) => format!("bucket({n}, {column})"),
        Transform::Truncate(w) => format!("truncate({w}, {column})"),
        other => format!("{other}({column})"),
    }
}

/// A table's spec in the config syntax (`unpartitioned` for none).
pub fn describe(spec: &PartitionSpec, schema: &Schema) -> String {
    if spec.fields().is_empty() {
        return "unpartitioned".into();
    }
    spec.fields()
        .iter()
        .map(|f| {
            let column = schema
                .field_by_id(f.source_id)
                .map(|c| c.name.clone())
                .unwrap_or_else(|| format!("field {}", f.source_id));
            describe_term(&f.transform, &column)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `spec` partitions by the same transforms of the same columns as
/// `terms`.
pub fn same(spec: &PartitionSpec, schema: &Schema, terms: &[Term]) -> bool {
    spec.fields().len() == terms.len()
        && spec.fields().iter().zip(terms).all(|(f, t)| {
            f.transform == t.transform
                && schema
                    .field_by_id(f.source_id)
                    .is_some_and(|c| c.name == t.column)
        })
}

/// The spec for a new table of `schema`. `keys` are the key columns of an
/// upsert table (`None` for append): every partition column must be one.
pub fn unbound_spec(
    terms: &[Term],
    schema: &Schema,
    keys: Option<&[String]>,
) -> std::result::Result<UnboundPartitionSpec, String> {
    let mut builder = UnboundPartitionSpec::builder();
    let mut names: Vec<String> = Vec::new();
    for term in terms {
        let described = describe_term(&term.transform, &term.column);
        let field = schema
            .as_struct()
            .fields()
            .iter()
            .find(|f| f.name == term.column)
            .ok_or_else(|| {
                let columns: Vec<&str> = schema
                    .as_struct()
                    .fields()
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect();
                format!(
                    "{described}: column `{}` is not a top-level column of the table (its \
                     columns: {})",
                    term.column,
                    columns.join(", ")
                )
            })?;
        if let Some(keys) = keys
            && !keys.contains(&term.column)
        {
            return Err(format!(
                "{described}: column `{}` is not a key column (keys: {}); an upsert table can \
                 only be partitioned on its key columns, so that a key always stays in one \
                 partition",
                term.column,
                keys.join(", ")
            ));
        }
        if !matches!(*field.field_type, Type::Primitive(_))
            || term.transform.result_type(&field.field_type).is_err()
        {
            return Err(format!(
                "{described}: the transform does not apply to column `{}` of type {}",
                term.column, field.field_type
            ));
        }
        let name = match term.transform {
            Transform::Identity => term.column.clone(),
            Transform::Bucket(_) => format!("{}_bucket", term.column),
            Transform::Truncate(_) => format!("{}_trunc", term.column),
            other => format!("{}_{other}", term.column),
        };
        if names.contains(&name) {
            return Err(format!("{described}: partitions by `{name}` twice"));
        }
        names.push(name.clone());
        builder = builder
            .add_partition_field(field.id, name, term.transform)
            .map_err(|e| format!("{described}: {e}"))?;
    }
    Ok(builder.build())
}

/// Computes the partition of rows in a table's Arrow schema.
pub struct Partitioner {
    spec: PartitionSpecRef,
    schema: SchemaRef,
    calculator: PartitionValueCalculator,
}

impl Partitioner {
    /// `None` for an unpartitioned spec.
    pub fn new(spec: PartitionSpecRef, schema: SchemaRef) -> Result<Option<Self>> {
        if spec.is_unpartitioned() {
            return Ok(None);
        }
        let calculator = PartitionValueCalculator::try_new(&spec, &schema)?;
        Ok(Some(Partitioner {
            spec,
            schema,
            calculator,
        }))
    }

    /// The partition of every row of `batch`.
    pub fn values(&self, batch: &RecordBatch) -> Result<Vec<Struct>> {
        let array = self.calculator.calculate(batch)?;
        arrow_struct_to_literal(&array, self.calculator.partition_type())?
            .into_iter()
            .map(|value| match value {
                Some(Literal::Struct(s)) => Ok(s),
                _ => Err(Error::new(
                    ErrorKind::DataInvalid,
                    "a row's partition value is not a struct",
                )),
            })
            .collect()
    }

    /// The writer's key for a partition.
    pub fn key(&self, partition: Struct) -> PartitionKey {
        PartitionKey::new(self.spec.as_ref().clone(), self.schema.clone(), partition)
    }

    pub fn spec_id(&self) -> i32 {
        self.spec.spec_id()
    }

    /// The number of partition fields.
    pub fn arity(&self) -> usize {
        self.spec.fields().len()
    }
}

/// The rows of one partition.
pub struct Group {
    /// `None` for an unpartitioned table.
    pub partition: Option<Struct>,
    /// Their numbers among all rows of the split batches, ascending.
    pub rows: Vec<usize>,
    /// The rows themselves, in that order.
    pub batches: Vec<RecordBatch>,
}

/// Splits `batches` by partition, keeping row order within each partition;
/// groups come in the order their first row does.
pub fn split(partitioner: Option<&Partitioner>, batches: &[RecordBatch]) -> Result<Vec<Group>> {
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let Some(partitioner) = partitioner else {
        if total == 0 {
            return Ok(Vec::new());
        }
        return Ok(vec![Group {
            partition: None,
            rows: (0..total).collect(),
            batches: batches
                .iter()
                .filter(|b| b.num_rows() > 0)
                .cloned()
                .collect(),
        }]);
    };
    let mut numbers: HashMap<Struct, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut offset = 0usize;
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        let mut taken: Vec<Vec<u32>> = vec![Vec::new(); groups.len()];
        for (row, value) in partitioner.values(batch)?.into_iter().enumerate() {
            let n = match numbers.get(&value) {
                Some(&n) => n,
                None => {
                    numbers.insert(value.clone(), groups.len());
                    groups.push(Group {
                        partition: Some(value),
                        rows: Vec::new(),
                        batches: Vec::new(),
                    });
                    taken.push(Vec::new());
                    groups.len() - 1
                }
            };
            groups[n].rows.push(offset + row);
            taken[n].push(row as u32);
        }
        for (n, rows) in taken.into_iter().enumerate() {
            if !rows.is_empty() {
                let part = arrow_select::take::take_record_batch(batch, &UInt32Array::from(rows))
                    .map_err(|e| {
                    Error::new(
                        ErrorKind::Unexpected,
                        format!("cannot split rows by partition: {e}"),
                    )
                })?;
                groups[n].batches.push(part);
            }
        }
        offset += batch.num_rows();
    }
    Ok(groups)
}

/// A partition value as bytes, for the key index's checkpoint: per field a
/// tag and its value (an unpartitioned table's empty partition is empty).
pub fn encode(partition: &Struct) -> Vec<u8> {
    let mut out = Vec::new();
    for value in partition.iter() {
        let put = |out: &mut Vec<u8>, tag: u8, bytes: &[u8]| {
            out.push(tag);
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        };
        match value {
            None => put(&mut out, 0, &[]),
            Some(Literal::Primitive(p)) => match p {
                PrimitiveLiteral::Boolean(b) => put(&mut out, 1, &[u8::from(*b)]),
                PrimitiveLiteral::Int(v) => put(&mut out, 2, &v.to_le_bytes()),
                PrimitiveLiteral::Long(v) => put(&mut out, 3, &v.to_le_bytes()),
                PrimitiveLiteral::Float(v) => put(&mut out, 4, &v.0.to_le_bytes()),
                PrimitiveLiteral::Double(v) => put(&mut out, 5, &v.0.to_le_bytes()),
                PrimitiveLiteral::String(s) => put(&mut out, 6, s.as_bytes()),
                PrimitiveLiteral::Binary(b) => put(&mut out, 7, b),
                PrimitiveLiteral::Int128(v) => put(&mut out, 8, &v.to_le_bytes()),
                PrimitiveLiteral::UInt128(v) => put(&mut out, 9, &v.to_le_bytes()),
                PrimitiveLiteral::AboveMax => put(&mut out, 10, &[]),
                PrimitiveLiteral::BelowMin => put(&mut out, 11, &[]),
            },
            // Partition values are primitives; anything else cannot come
            // from a transform and is kept as "unknown" so decoding fails.
            Some(_) => put(&mut out, 255, &[]),
        }
    }
    out
}

/// Reads [`encode`]'s bytes back.
pub fn decode(mut bytes: &[u8]) -> std::result::Result<Struct, String> {
    let mut values = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 5 {
            return Err("truncated partition value".into());
        }
        let tag = bytes[0];
        let len = u32::from_le_bytes(bytes[1..5].try_into().expect("4 bytes")) as usize;
        let value = bytes.get(5..5 + len).ok_or("truncated partition value")?;
        bytes = &bytes[5 + len..];
        let fixed = |n: usize| -> std::result::Result<&[u8], String> {
            if value.len() == n {
                Ok(value)
            } else {
                Err(format!(
                    "a partition value of tag {tag} has {} bytes",
                    value.len()
                ))
            }
        };
        let primitive = match tag {
            0 => {
                values.push(None);
                continue;
            }
            1 => PrimitiveLiteral::Boolean(fixed(1)?[0] != 0),
            2 => PrimitiveLiteral::Int(i32::from_le_bytes(fixed(4)?.try_into().expect("4"))),
            3 => PrimitiveLiteral::Long(i64::from_le_bytes(fixed(8)?.try_into().expect("8"))),
            4 => {
                PrimitiveLiteral::Float(f32::from_le_bytes(fixed(4)?.try_into().expect("4")).into())
            }
            5 => PrimitiveLiteral::Double(
                f64::from_le_bytes(fixed(8)?.try_into().expect("8")).into(),
            ),
            6 => PrimitiveLiteral::String(
                String::from_utf8(value.to_vec()).map_err(|e| e.to_string())?,
            ),
            7 => PrimitiveLiteral::Binary(value.to_vec()),
            8 => PrimitiveLiteral::Int128(i128::from_le_bytes(fixed(16)?.try_into().expect("16"))),
            9 => PrimitiveLiteral::UInt128(u128::from_le_bytes(fixed(16)?.try_into().expect("16"))),
            10 => PrimitiveLiteral::AboveMax,
            11 => PrimitiveLiteral::BelowMin,
            other => return Err(format!("unknown partition value tag {other}")),
        };
        values.push(Some(Literal::Primitive(primitive)));
    }
    Ok(Struct::from_iter(values))
}
