//! Row images of a binlog rows event, decoded with what the table map
//! says of each column worked out once per map, not once per value: the
//! client library's own row reader builds a column description (with
//! copies of the schema, table and column names) for every value of every
//! row, which was most of the stream's CPU time (docs/mysql.md,
//! Performance). Each value is still read by the library's own decoder.

use mysql_async::Value as My;
use mysql_async::binlog::events::{OptionalMetadataField, RowsEventData, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_common::io::ParseBuf;

/// Each column of a table map: its binlog type, metadata and signedness.
#[derive(Clone, Debug, Default)]
pub(super) struct RowLayout {
    columns: Vec<(ColumnType, Vec<u8>, bool)>,
}

impl RowLayout {
    pub fn of(map: &TableMapEvent<'_>) -> Result<RowLayout, String> {
        let mut unsigned: Vec<bool> = Vec::new();
        for field in map.iter_optional_meta() {
            if let Ok(OptionalMetadataField::Signedness(bits)) = field {
                unsigned = bits.iter().map(|b| *b).collect();
            }
        }
        let mut numeric = 0;
        let mut columns = Vec::new();
        for i in 0..map.columns_count() as usize {
            let ty = match map.get_column_type(i) {
                Ok(Some(ty)) => ty,
                _ => return Err(format!("column {i} has no type in the table map")),
            };
            let meta = map.get_column_metadata(i).unwrap_or(&[]).to_vec();
            let is_unsigned = if ty.is_numeric_type() {
                numeric += 1;
                unsigned.get(numeric - 1).copied().unwrap_or(false)
            } else {
                false
            };
            columns.push((ty, meta, is_unsigned));
        }
        Ok(RowLayout { columns })
    }

    /// The rows of `event`: (before image, after image), each with one
    /// value per column of the map (a column left out of the image is
    /// None).
    pub fn rows(&self, event: &RowsEventData<'_>) -> Result<Vec<RowPair>, String> {
        if matches!(event, RowsEventData::PartialUpdateRowsEvent(_)) {
            return Err(
                "the binlog holds a partial JSON update: set binlog_row_value_options='' on the \
                 server"
                    .into(),
            );
        }
        let before_present: Option<Vec<bool>> = event
            .columns_before_image()
            .map(|b| b.iter().map(|x| *x).collect());
        let after_present: Option<Vec<bool>> = event
            .columns_after_image()
            .map(|b| b.iter().map(|x| *x).collect());
        let mut buf = ParseBuf(event.rows_data());
        let mut rows = Vec::new();
        while !buf.is_empty() {
            let before = match &before_present {
                Some(present) => Some(self.image(present, &mut buf)?),
                None => None,
            };
            let after = match &after_present {
                Some(present) => Some(self.image(present, &mut buf)?),
                None => None,
            };
            rows.push((before, after));
        }
        Ok(rows)
    }

    /// One image: a bitmap of which present columns are null, then the
    /// values of the others, in column order.
    fn image(&self, present: &[bool], buf: &mut ParseBuf<'_>) -> Result<Image, String> {
        let count = (0..self.columns.len())
            .filter(|&i| present.get(i).copied().unwrap_or(false))
            .count();
        let nulls: &[u8] = buf
            .parse(count.div_ceil(8))
            .map_err(|e| format!("a row's null bitmap: {e}"))?;
        let mut values = Vec::with_capacity(self.columns.len());
        let mut in_image = 0;
        for (i, (ty, meta, unsigned)) in self.columns.iter().enumerate() {
            if !present.get(i).copied().unwrap_or(false) {
                values.push(None);
                continue;
            }
            let is_null = nulls[in_image / 8] & (1 << (in_image % 8)) != 0;
            in_image += 1;
            if is_null {
                values.push(Some(My::NULL));
                continue;
            }
            // Read from a copy of the buffer, whose lifetime may be as short
            // as the metadata's; then move the buffer past what it read.
            let mut here = ParseBuf(buf.0);
            let value: BinlogValue<'_> = here
                .parse((*ty, meta.as_slice(), *unsigned, false))
                .map_err(|e| format!("column {i} ({ty:?}): {e}"))?;
            let read = buf.0.len() - here.0.len();
            buf.0 = &buf.0[read..];
            let value = match value {
                BinlogValue::Value(v) => v,
                json @ BinlogValue::Jsonb(_) => {
                    My::try_from(json).map_err(|e| format!("column {i}: JSON value: {e}"))?
                }
                BinlogValue::JsonDiff(_) => {
                    return Err(format!("column {i}: a partial JSON update"));
                }
            };
            values.push(Some(value));
        }
        Ok(values)
    }
}

/// One image's values, None where the image leaves a column out.
pub(super) type Image = Vec<Option<My>>;
/// A row's (before, after) images.
pub(super) type RowPair = (Option<Image>, Option<Image>);
