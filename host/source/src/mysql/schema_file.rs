//! The shapes of the tables a pipeline read, kept in its state folder
//! (`mysql-<pipeline>-schema.json`), so that a change made while weir was
//! stopped is caught at the next start: the server's catalog then shows the
//! table as it is now, and the binlog's rows from after the change would
//! match it without a word. Columns added at the end are carried, as while
//! streaming; any other change stops the run naming it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::types::Kind;
use crate::SourceError;

#[derive(Clone, Debug)]
pub(super) struct SchemaFile(PathBuf);

#[derive(Serialize, Deserialize, Default)]
struct Recorded {
    /// By `db.table`: each column's name and kind, in order.
    tables: BTreeMap<String, Vec<(String, String)>>,
}

impl SchemaFile {
    pub fn new(state_dir: &Path, pipeline: &str) -> SchemaFile {
        SchemaFile(state_dir.join(format!("mysql-{pipeline}-schema.json")))
    }

    /// Checks each table against the shape the last run kept for it.
    pub fn check<'a>(
        &self,
        tables: impl IntoIterator<Item = (&'a str, Vec<(&'a str, &'a Kind)>)>,
    ) -> Result<(), SourceError> {
        let recorded = self.read()?;
        for (name, now) in tables {
            let Some(before) = recorded.tables.get(name) else {
                continue;
            };
            let carried = now.len() >= before.len()
                && before
                    .iter()
                    .zip(&now)
                    .all(|((old_name, old_kind), (new_name, new_kind))| {
                        old_name == new_name && same_kind(old_kind, new_kind)
                    });
            if !carried {
                let show_before: Vec<String> =
                    before.iter().map(|(n, k)| format!("{n} {k}")).collect();
                let show_now: Vec<String> = now
                    .iter()
                    .map(|(n, k)| format!("{n} {}", describe(k)))
                    .collect();
                return Err(SourceError::Config(format!(
                    "table {name} changed while weir was stopped (or behind): the last run read \
                     ({}), the server now has ({}); only columns added at the end can be \
                     carried. Bring the destination in line by hand and back the table up \
                     again under a new pipeline id",
                    show_before.join(", "),
                    show_now.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Keeps the tables' shapes for the next start.
    pub fn save<'a>(
        &self,
        tables: impl IntoIterator<Item = (&'a str, Vec<(&'a str, &'a Kind)>)>,
    ) -> Result<(), SourceError> {
        let mut recorded = self.read()?;
        for (name, columns) in tables {
            recorded.tables.insert(
                name.to_string(),
                columns
                    .into_iter()
                    .map(|(n, k)| (n.to_string(), describe(k)))
                    .collect(),
            );
        }
        let text = serde_json::to_string_pretty(&recorded).expect("shapes serialize");
        super::replace_durably(&self.0, text.as_bytes())
    }

    fn read(&self) -> Result<Recorded, SourceError> {
        match std::fs::read_to_string(&self.0) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                SourceError::Config(format!(
                    "{} cannot be read ({e}): remove it only with the sinks' data",
                    self.0.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Recorded::default()),
            Err(e) => Err(e.into()),
        }
    }
}

fn describe(kind: &Kind) -> String {
    format!("{kind:?}")
}

/// Whether a column recorded as `old` may be read as `new`: the same kind,
/// or an enum or set with members added at the end.
fn same_kind(old: &str, new: &Kind) -> bool {
    if old == describe(new) {
        return true;
    }
    match new {
        Kind::Enum(members) | Kind::Set(members) => (0..members.len()).any(|n| {
            let earlier = match new {
                Kind::Enum(_) => Kind::Enum(members[..n].to_vec()),
                _ => Kind::Set(members[..n].to_vec()),
            };
            describe(&earlier) == old
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::types::Charset;

    #[test]
    fn only_columns_added_at_the_end_pass_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = SchemaFile::new(dir.path(), "p");
        let int = Kind::Int {
            bytes: 4,
            unsigned: false,
        };
        let text = Kind::Text {
            charset: Charset::Utf8,
        };
        let colors = Kind::Enum(vec!["red".into()]);
        file.save([(
            "d.t",
            vec![("id", &int), ("name", &text), ("color", &colors)],
        )])
        .unwrap();
        let more_colors = Kind::Enum(vec!["red".into(), "blue".into()]);
        assert!(
            file.check([(
                "d.t",
                vec![("id", &int), ("name", &text), ("color", &colors)]
            )])
            .is_ok()
        );
        assert!(
            file.check([(
                "d.t",
                vec![
                    ("id", &int),
                    ("name", &text),
                    ("color", &more_colors),
                    ("x", &int)
                ]
            )])
            .is_ok()
        );
        assert!(file.check([("d.other", vec![("a", &text)])]).is_ok());
        let wider = Kind::Int {
            bytes: 8,
            unsigned: false,
        };
        for now in [
            vec![("id", &int), ("color", &colors)],
            vec![("id", &wider), ("name", &text), ("color", &colors)],
            vec![("id", &int), ("label", &text), ("color", &colors)],
            vec![
                ("id", &int),
                ("x", &int),
                ("name", &text),
                ("color", &colors),
            ],
            vec![
                ("id", &int),
                ("name", &text),
                ("color", &Kind::Enum(vec!["blue".into()])),
            ],
        ] {
            let said = file.check([("d.t", now.clone())]).unwrap_err().to_string();
            assert!(
                said.contains("table d.t changed while weir was stopped"),
                "{said}"
            );
        }
    }
}
