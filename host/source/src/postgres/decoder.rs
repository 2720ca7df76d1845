//! Turns the replication stream's messages into changes, without I/O.
//!
//! The stream shell hands over Begin and Commit (parsed by the replication
//! client) and the raw pgoutput row messages; the decoder keeps the
//! relation descriptions and the open transaction. Two things need the
//! server and are left to the shell: the types of columns a Relation
//! message adds ([`PendingRelation`]), and unchanged TOAST values that the
//! old row does not carry ([`Pending::unchanged`], see `toast.rs`).
//!
//! A transaction is handed on in pieces ([`Piece`]) of a bounded size, so
//! memory does not grow with it: Begin carries the commit LSN, so every
//! change's position (commit LSN, ordinal) is known as it arrives.

use crate::commit_order::stream_position;
use std::collections::{BTreeSet, HashMap};

use super::Emitted;
use super::catalog::format_lsn;
use super::decode::decode;
use super::pgoutput::{self, Datum, Message, Relation, RelationColumn};
use super::table::{Table, Tables, ddl_error, identity_error};
use crate::SourceError;
use crate::change::{Change, Op, Transaction, Value};

/// Microseconds from the Unix epoch to Postgres' epoch (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Where a transaction is cut into pieces: a piece is sealed once it holds
/// this many changes, or this many bytes of row messages. The pipeline
/// sets its batch limits, so that a transaction that fits a batch is never
/// cut, and a big one costs about what one batch does.
#[derive(Clone, Copy, Debug)]
pub struct PieceLimits {
    pub changes: usize,
    pub bytes: usize,
}

impl Default for PieceLimits {
    /// The batcher's default limits.
    fn default() -> PieceLimits {
        PieceLimits {
            changes: 10_000,
            bytes: 16 << 20,
        }
    }
}

/// What a column left out as unchanged TOAST counts towards a piece's
/// bytes: its value is read later and can be large, and a stored TOAST
/// value is at least about 2 kB.
const UNCHANGED_VALUE_BYTES: usize = 8 << 10;

/// Changes of one transaction received since Begin or the last piece.
pub(super) struct OpenTx {
    pub commit_lsn: u64,
    /// Microseconds since the Unix epoch.
    pub commit_ts: i64,
    pub changes: Vec<Pending>,
    /// The (table, column) pairs some change here was decoded without,
    /// though the column existed when the transaction committed (see
    /// [`Decoder::mark_missing`]): read by key like unchanged TOAST, once
    /// the catalog says the column still exists.
    pub missing_columns: BTreeSet<(usize, usize)>,
}

/// A change waiting for its transaction's commit.
pub(super) struct Pending {
    /// Index into [`Tables`].
    pub table: usize,
    pub op: Op,
    pub values: Vec<Value>,
    /// Columns pgoutput left out (unchanged TOAST), to fill before handing on.
    pub unchanged: Vec<usize>,
    /// The key's text forms, for the TOAST look-up.
    pub key_text: Vec<String>,
    /// Left out of the transaction (see `toast.rs`: an update whose row was
    /// gone before its left-out columns could be read). It keeps its
    /// ordinal, so the others' positions are the same in every replay.
    pub dropped: bool,
}

/// How one relation's columns map onto its table's.
#[derive(Debug)]
struct Mapping {
    table: usize,
    /// For each relation column: the table column it fills.
    columns: Vec<usize>,
}

/// A Relation message that adds columns at the end of its table: it takes
/// effect once the shell has read the added columns' types and added them
/// to the table ([`Decoder::install`]).
#[derive(Debug)]
pub(super) struct PendingRelation {
    oid: u32,
    name: String,
    mapping: Mapping,
    /// The added columns, in order.
    pub added: Vec<RelationColumn>,
}

impl PendingRelation {
    /// The table the added columns belong to.
    pub fn table(&self) -> usize {
        self.mapping.table
    }
}

/// Part of a transaction, handed on before its commit when the
/// transaction is big, or its rest at Commit.
pub(super) struct Piece {
    /// The ordinal of the first change in the transaction.
    pub first: u32,
    /// Whether the transaction ends with this piece (it was committed).
    pub last: bool,
    pub tx: OpenTx,
}

/// The relation descriptions and the open transaction of one stream session.
pub(super) struct Decoder {
    /// Named in the error about a table that joined it mid-run.
    publication: String,
    relations: HashMap<u32, Mapping>,
    /// The open transaction's changes not yet handed on in a piece.
    open: Option<OpenTx>,
    /// The ordinal of the open transaction's first change not yet handed on.
    first: u32,
    /// Bytes of the row messages held in `open`.
    held_bytes: usize,
    limits: PieceLimits,
    /// The operator's `skip_transaction_at`.
    skip: Skip,
}

/// `skip_transaction_at`: the one transaction to leave out whole, and what
/// became of it.
#[derive(Default)]
struct Skip {
    /// Its commit LSN.
    at: Option<u64>,
    /// The open transaction is the one left out: what it held, for the log.
    open: Option<Skipped>,
    /// It was met, or the stream passed its LSN (said once).
    settled: bool,
}

/// What a left-out transaction held.
#[derive(Default)]
struct Skipped {
    inserts: usize,
    updates: usize,
    deletes: usize,
    truncated: Vec<String>,
}

impl Decoder {
    pub fn new(publication: &str) -> Decoder {
        Decoder::with_limits(publication, PieceLimits::default())
    }

    /// Cuts transactions at `limits` from the next Begin on.
    pub fn set_limits(&mut self, limits: PieceLimits) {
        self.limits = limits;
    }

    pub fn with_limits(publication: &str, limits: PieceLimits) -> Decoder {
        Decoder {
            publication: publication.to_string(),
            relations: HashMap::new(),
            open: None,
            first: 0,
            held_bytes: 0,
            limits,
            skip: Skip::default(),
        }
    }

    /// Leaves out, whole, the transaction that commits at `lsn` (the
    /// operator's `skip_transaction_at`): none of its changes is handed on,
    /// and its Commit stands after it, so it is acknowledged like any other.
    pub fn skip_transaction_at(&mut self, lsn: Option<u64>) {
        self.skip = Skip {
            at: lsn,
            ..Skip::default()
        };
    }

    /// Forgets everything: a new stream session sends relations again and
    /// starts with a whole transaction (the server sends a transaction cut
    /// off mid-way again from its Begin).
    pub fn reset(&mut self) {
        self.relations.clear();
        self.open = None;
    }

    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// The commit LSN of the open transaction.
    pub fn commit_lsn(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.commit_lsn)
    }

    /// A Begin: `commit_micros` counts from Postgres' epoch, as sent.
    pub fn begin(&mut self, commit_lsn: u64, commit_micros: i64) {
        self.skip.open = None;
        if let Some(at) = self.skip.at {
            if commit_lsn == at {
                self.skip.open = Some(Skipped::default());
                self.skip.settled = true;
            } else if commit_lsn > at && !self.skip.settled {
                self.skip.settled = true;
                tracing::warn!(
                    skip_transaction_at = %format_lsn(at),
                    next_commit = %format_lsn(commit_lsn),
                    "the stream is past source.postgres.skip_transaction_at without meeting a \
                     transaction committed there in this run (an earlier run left it out, or \
                     no published change commits at that LSN): nothing was skipped; remove the \
                     key"
                );
            }
        }
        self.open = Some(OpenTx {
            commit_lsn,
            commit_ts: commit_micros + PG_EPOCH_MICROS,
            changes: Vec::new(),
            missing_columns: BTreeSet::new(),
        });
        self.first = 0;
        self.held_bytes = 0;
    }

    /// A Commit: the rest of the transaction since Begin or its last
    /// piece, if a transaction was open.
    pub fn commit(&mut self) -> Option<Piece> {
        let mut tx = self.open.take()?;
        if let Some(skipped) = self.skip.open.take() {
            // Nothing of it was held (see `decode`); standing after it
            // moves the position past it, and nothing before it is lost.
            tx.changes.clear();
            tracing::warn!(
                lsn = %format_lsn(tx.commit_lsn),
                inserts = skipped.inserts,
                updates = skipped.updates,
                deletes = skipped.deletes,
                truncated = %skipped.truncated.join(", "),
                "transaction left out whole, as source.postgres.skip_transaction_at says: \
                 none of its changes reaches a sink"
            );
        }
        Some(Piece {
            first: self.first,
            last: true,
            tx,
        })
    }

    /// The open transaction's changes so far, once they reach the piece
    /// limits; the transaction stays open.
    pub fn full_piece(&mut self) -> Option<Piece> {
        let open = self.open.as_mut()?;
        if open.changes.is_empty()
            || (open.changes.len() < self.limits.changes && self.held_bytes < self.limits.bytes)
        {
            return None;
        }
        let changes = std::mem::take(&mut open.changes);
        let piece = Piece {
            first: self.first,
            last: false,
            tx: OpenTx {
                commit_lsn: open.commit_lsn,
                commit_ts: open.commit_ts,
                changes,
                missing_columns: std::mem::take(&mut open.missing_columns),
            },
        };
        self.first += piece.tx.changes.len() as u32;
        self.held_bytes = 0;
        Some(piece)
    }

    /// One pgoutput message. Returns a relation that waits for the types
    /// of the columns it adds.
    pub fn decode(
        &mut self,
        data: &[u8],
        tables: &Tables,
    ) -> Result<Option<PendingRelation>, SourceError> {
        let message = pgoutput::parse(data).map_err(SourceError::Invalid)?;
        if self.skip.open.is_some() && !matches!(message, Message::Relation(_)) {
            // A relation description holds for later transactions too.
            self.note_skipped(&message, tables);
            return Ok(None);
        }
        if matches!(
            message,
            Message::Insert { .. } | Message::Update { .. } | Message::Delete { .. }
        ) {
            self.held_bytes += data.len();
        }
        match message {
            Message::Relation(rel) => {
                let pending = self.map_relation(&rel, tables)?;
                if pending.added.is_empty() {
                    self.install(pending, tables)?;
                    return Ok(None);
                }
                Ok(Some(pending))
            }
            Message::Insert { oid, new } => {
                let (table, values, mut unchanged) = self.row(oid, &new, None, tables)?;
                self.mark_missing(oid, table, &mut unchanged, tables);
                self.push(oid, Op::Insert, values, unchanged, &new, tables)?;
                Ok(None)
            }
            Message::Update { oid, old, new } => {
                self.on_update(oid, old, new, tables)?;
                Ok(None)
            }
            Message::Delete { oid, old } => {
                let (table, values, _) = self.row(oid, &old.1, None, tables)?;
                let gone = if tables[table].append {
                    values
                } else {
                    key_only(&values, &tables[table].info.key)
                };
                self.push(oid, Op::Delete, gone, Vec::new(), &old.1, tables)?;
                Ok(None)
            }
            Message::Truncate { oids } => Err(self.truncate_error(&oids, tables)),
            Message::Other(_) => Ok(None),
        }
    }

    /// Makes a relation's mapping current, once its table has every column
    /// the relation names.
    pub fn install(
        &mut self,
        pending: PendingRelation,
        tables: &Tables,
    ) -> Result<(), SourceError> {
        // The relation was mapped by its OID (see `map_relation`): a
        // table dropped and re-created under its name never gets here.
        if tables.index_of_oid(pending.oid) != Some(pending.mapping.table) {
            return Err(ddl_error(
                &pending.name,
                "the table was dropped and re-created",
                self.open.as_ref().map(|o| o.commit_lsn),
            ));
        }
        self.relations.insert(pending.oid, pending.mapping);
        Ok(())
    }

    fn on_update(
        &mut self,
        oid: u32,
        old: Option<(u8, Vec<Datum<'_>>)>,
        new: Vec<Datum<'_>>,
        tables: &Tables,
    ) -> Result<(), SourceError> {
        // A whole old row (REPLICA IDENTITY FULL) carries unchanged TOAST values.
        let old_row = match &old {
            Some((b'O', tuple)) => Some(tuple.as_slice()),
            _ => None,
        };
        let (table, values, mut unchanged) = self.row(oid, &new, old_row, tables)?;
        self.mark_missing(oid, table, &mut unchanged, tables);
        if let Some((_, old_tuple)) = &old {
            let (_, old_values, _) = self.row(oid, old_tuple, None, tables)?;
            let key = &tables[table].info.key;
            if !tables[table].append && key.iter().any(|&k| old_values[k] != values[k]) {
                // A changed key: the row leaves its old key.
                let gone = key_only(&old_values, key);
                self.push(oid, Op::Delete, gone, Vec::new(), old_tuple, tables)?;
            }
        }
        self.push(oid, Op::Update, values, unchanged, &new, tables)
    }

    /// Maps a Relation message's columns onto the table's, carrying added
    /// trailing columns and refusing any other change of shape.
    fn map_relation(
        &self,
        rel: &Relation,
        tables: &Tables,
    ) -> Result<PendingRelation, SourceError> {
        let name = rel.qualified();
        let at = self.open.as_ref().map(|o| o.commit_lsn);
        let Some(index) = tables.index_of_oid(rel.oid) else {
            if tables.index_of(&name).is_some() || tables.iter().any(|t| t.info.qualified() == name)
            {
                // A known name (the sinks' or Postgres'), another OID:
                // another table, whose rows cannot be taken for the known one's.
                return Err(ddl_error(
                    &name,
                    &format!(
                        "the table was dropped and re-created (relation OID {} is not the one \
                         weir replicates)",
                        rel.oid
                    ),
                    at,
                ));
            }
            return Err(SourceError::Invalid(format!(
                "table {name} (relation OID {}) joined publication `{}` while weir was \
                 running: restart weir to backfill it and stream it",
                rel.oid, self.publication
            )));
        };
        let table = &tables[index];
        if let Some(known_as) = table.postgres_name_of(rel.oid)
            && known_as != name
        {
            // The OID is the table's identity: a rename (while weir runs, or
            // in the WAL weir still replays) keeps its destination.
            tracing::warn!(
                relation = %name,
                catalog_name = %known_as,
                destination = %table.schema.name,
                oid = rel.oid,
                "table renamed (the stream and the catalog name it differently): its changes \
                 keep streaming into the same destination table"
            );
        }
        check_identity_covers_key(rel, table)?;
        let known = &table.info.columns;
        // A leaf partition may order its columns its own way (one created
        // alone, then attached): they are taken by name, in any order.
        let partition = rel.oid != table.info.oid;
        let mut columns = Vec::with_capacity(rel.columns.len());
        let mut added = Vec::new();
        for (i, rc) in rel.columns.iter().enumerate() {
            let matched = columns.len() - added.len();
            match known.iter().position(|c| c.name == rc.name) {
                Some(c) => {
                    let col = &known[c];
                    if col.type_oid != rc.type_oid || (col.typmod != rc.typmod && rc.typmod != -1) {
                        return Err(ddl_error(
                            &name,
                            &format!("the type of column `{}` changed", rc.name),
                            at,
                        ));
                    }
                    columns.push(c);
                }
                None if i >= known.len() || (partition && matched == known.len()) => {
                    added.push(rc.clone());
                    columns.push(known.len() + added.len() - 1);
                }
                None => {
                    return Err(ddl_error(
                        &name,
                        &format!(
                            "column `{}` is new but not at the end, or another column was dropped or \
                             renamed",
                            rc.name
                        ),
                        at,
                    ));
                }
            }
        }
        // Known columns the relation lacks must be trailing ones the table
        // gained after this part of the stream (they read as null here).
        let in_order = |mut mapped: Vec<usize>| {
            if partition {
                mapped.sort_unstable();
            }
            mapped.iter().enumerate().all(|(i, &c)| i == c)
        };
        if !in_order(columns.clone()) {
            return Err(ddl_error(
                &name,
                "a column was dropped, renamed or reordered",
                at,
            ));
        }
        Ok(PendingRelation {
            oid: rel.oid,
            name,
            mapping: Mapping {
                table: index,
                columns,
            },
            added,
        })
    }

    /// A relation that lacks columns of its table is WAL from before they
    /// were added: the row reads null there. Unless the transaction
    /// committed after the columns surely existed (`Table::present_since`):
    /// then Postgres decoded it with an older catalog than the one it was
    /// written with (seen right after a slot's creation, for an ADD COLUMN
    /// that committed while the slot waited for its snapshot), or the
    /// columns were dropped or left the publication since. Either way null
    /// is not what the row holds: the columns are left to be read by key
    /// (as unchanged TOAST is), after a check that they still exist.
    fn mark_missing(
        &mut self,
        oid: u32,
        table: usize,
        unchanged: &mut Vec<usize>,
        tables: &Tables,
    ) {
        let (Some(mapping), Some(open)) = (self.relations.get(&oid), self.open.as_mut()) else {
            return;
        };
        let table_columns = &tables[table];
        if mapping.columns.len() >= table_columns.info.columns.len() {
            return;
        }
        for (column, &since) in table_columns.present_since.iter().enumerate() {
            if open.commit_lsn > since && !mapping.columns.contains(&column) {
                unchanged.push(column);
                open.missing_columns.insert((table, column));
            }
        }
    }

    /// Decodes a tuple into its table's column order. Returns the table,
    /// the values, and the columns pgoutput left out as unchanged TOAST
    /// (taken from `old` when it has them).
    fn row(
        &self,
        oid: u32,
        tuple: &[Datum<'_>],
        old: Option<&[Datum<'_>]>,
        tables: &Tables,
    ) -> Result<(usize, Vec<Value>, Vec<usize>), SourceError> {
        let mapping = self.relations.get(&oid).ok_or_else(|| {
            SourceError::Invalid(format!(
                "a change to relation {oid} arrived before its description"
            ))
        })?;
        let table = &tables[mapping.table];
        let mut values = vec![Value::Null; table.info.columns.len()];
        let mut unchanged = Vec::new();
        for (i, datum) in tuple.iter().enumerate() {
            let Some(&column) = mapping.columns.get(i) else {
                return Err(SourceError::Invalid(format!(
                    "table {}: a row has more columns than its description",
                    table.schema.name
                )));
            };
            let datum = match (datum, old.and_then(|o| o.get(i))) {
                (Datum::Unchanged, Some(d @ Datum::Text(_))) => d,
                (d, _) => d,
            };
            values[column] = match datum {
                Datum::Null => Value::Null,
                Datum::Unchanged => {
                    unchanged.push(column);
                    Value::Null
                }
                Datum::Text(text) => match decode(&table.info.columns[column].kind, text) {
                    Ok(value) => value,
                    // The row's key as text (looked up only now: this is
                    // the path of every streamed value), so the error
                    // names the row.
                    Err(_) => {
                        let key: Vec<Option<&str>> = table
                            .info
                            .key
                            .iter()
                            .map(|&k| {
                                let i = mapping.columns.iter().position(|&c| c == k)?;
                                match tuple.get(i) {
                                    Some(Datum::Text(t)) => Some(*t),
                                    _ => None,
                                }
                            })
                            .collect();
                        return Err(table
                            .decode_column(column, text, &key)
                            .expect_err("the value did not decode"));
                    }
                },
            };
        }
        Ok((mapping.table, values, unchanged))
    }

    /// Queues a change of relation `oid`: the message's own, whose mapping
    /// the tuple follows (the catalog's OID may be another table's by now).
    fn push(
        &mut self,
        oid: u32,
        op: Op,
        values: Vec<Value>,
        unchanged: Vec<usize>,
        tuple: &[Datum<'_>],
        tables: &Tables,
    ) -> Result<(), SourceError> {
        let mapping = self.relations.get(&oid).ok_or_else(|| {
            SourceError::Invalid(format!(
                "a change to relation {oid} arrived before its description"
            ))
        })?;
        let table = mapping.table;
        // The key's text forms serve only the look-up of left-out values.
        let key_text = if unchanged.is_empty() {
            Vec::new()
        } else {
            tables[table]
                .info
                .key
                .iter()
                .map(|&k| {
                    mapping
                        .columns
                        .iter()
                        .position(|&c| c == k)
                        .and_then(|i| match tuple.get(i) {
                            Some(Datum::Text(t)) => Some(t.to_string()),
                            _ => None,
                        })
                        .unwrap_or_default()
                })
                .collect()
        };
        let open = self.open.as_mut().ok_or_else(|| {
            SourceError::Invalid("a row change arrived outside a transaction".into())
        })?;
        self.held_bytes += unchanged.len() * UNCHANGED_VALUE_BYTES;
        open.changes.push(Pending {
            table,
            op,
            values,
            unchanged,
            key_text,
            dropped: false,
        });
        Ok(())
    }

    /// The destination tables of relations `oids` (those weir knows).
    fn table_names(&self, oids: &[u32], tables: &Tables) -> Vec<String> {
        oids.iter()
            .filter_map(|o| self.relations.get(o))
            .map(|m| tables[m.table].schema.name.clone())
            .collect()
    }

    /// Counts a change of the transaction being left out.
    fn note_skipped(&mut self, message: &Message, tables: &Tables) {
        let truncated = match message {
            Message::Truncate { oids } => self.table_names(oids, tables),
            _ => Vec::new(),
        };
        let Some(skipped) = self.skip.open.as_mut() else {
            return;
        };
        match message {
            Message::Insert { .. } => skipped.inserts += 1,
            Message::Update { .. } => skipped.updates += 1,
            Message::Delete { .. } => skipped.deletes += 1,
            _ => skipped.truncated.extend(truncated),
        }
    }

    /// A TRUNCATE cannot be carried, and it stays in the WAL: every run
    /// would stop at it again. The way on is the operator's, and explicit.
    fn truncate_error(&self, oids: &[u32], tables: &Tables) -> SourceError {
        let names = self.table_names(oids, tables);
        let lsn = format_lsn(self.open.as_ref().map_or(0, |o| o.commit_lsn));
        SourceError::Invalid(format!(
            "TRUNCATE of {} in the transaction committed at LSN {lsn}: weir does not replicate \
             TRUNCATE (the sinks would keep the rows), and the transaction stays in the WAL, so \
             every run stops here until it is left out. To go on: if the destination should \
             match Postgres, first empty the destination table(s) by hand (otherwise they keep \
             the rows the TRUNCATE removed); then set source.postgres.skip_transaction_at: \
             {lsn} and run again. That transaction is left out whole, with any other change it \
             made (the run logs what it left out); remove the key once the run is past it. To \
             keep TRUNCATE out of the stream from now on: ALTER PUBLICATION ... SET (publish = \
             'insert, update, delete')",
            if names.is_empty() {
                "a table".to_string()
            } else {
                names.join(", ")
            },
        ))
    }
}

/// The old row pgoutput sends for an update or delete holds only the
/// replica identity's columns (all of them with FULL): the key must be among
/// them. Checked on every Relation message, since the replica identity can
/// change while weir runs.
fn check_identity_covers_key(rel: &Relation, table: &Table) -> Result<(), SourceError> {
    if table.append || rel.replica_identity == b'f' {
        return Ok(());
    }
    let missing: Vec<&str> = table
        .info
        .key
        .iter()
        .map(|&k| table.info.columns[k].name.as_str())
        .filter(|name| !rel.columns.iter().any(|c| c.key && c.name == *name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(SourceError::Invalid(identity_error(
        &rel.qualified(),
        &missing,
        rel.replica_identity,
    )))
}

/// A row reduced to its key (what a delete needs), the rest null.
fn key_only(values: &[Value], key: &[usize]) -> Vec<Value> {
    let mut gone = vec![Value::Null; values.len()];
    for &k in key {
        gone[k] = values[k].clone();
    }
    gone
}

impl OpenTx {
    /// Seals a whole transaction (one piece from its first change).
    #[cfg(test)]
    pub fn seal(self, tables: &Tables, emitted: &mut Emitted) -> Option<Transaction> {
        Piece {
            first: 0,
            last: true,
            tx: self,
        }
        .seal(tables, emitted)
    }
}

impl Piece {
    /// Marks the changes at or before what was already emitted (a
    /// transaction received again after a restart) as left out, so that
    /// nobody looks up their unchanged TOAST values.
    pub fn leave_out_emitted(&mut self, emitted: &Emitted) {
        let (lsn, first) = (self.tx.commit_lsn, self.first);
        for (i, p) in self.tx.changes.iter_mut().enumerate() {
            if emitted.covers_stream(lsn, first + i as u32) {
                p.dropped = true;
                p.unchanged.clear();
            }
        }
    }

    /// Numbers the changes in commit order and drops those at or before
    /// what was already emitted. None when nothing is left to hand on: a
    /// piece that is not the last ends at its last change, never after the
    /// transaction, so a commit of it is never taken for the whole.
    /// Unchanged TOAST values must have been filled already.
    pub fn seal(self, tables: &Tables, emitted: &mut Emitted) -> Option<Transaction> {
        let mut changes = Vec::with_capacity(self.tx.changes.len());
        for (i, p) in self.tx.changes.into_iter().enumerate() {
            let ordinal = self.first + i as u32;
            if p.dropped || emitted.covers_stream(self.tx.commit_lsn, ordinal) {
                continue;
            }
            let pos = stream_position(self.tx.commit_lsn, ordinal);
            let table = &tables[p.table];
            let mut values = p.values;
            // Rows from before an ADD COLUMN lack the new trailing columns.
            values.resize(table.info.columns.len(), Value::Null);
            changes.push(Change {
                table: table.schema.clone(),
                op: p.op,
                pos,
                commit_ts_micros: self.tx.commit_ts,
                snapshot: false,
                values,
            });
        }
        let end = match changes.last() {
            Some(c) => c.pos.clone(),
            None if self.last => {
                // Nothing new for us in it: stand after it.
                let pos = stream_position(self.tx.commit_lsn, u32::MAX);
                if emitted.covers(&pos) {
                    return None;
                }
                pos
            }
            None => return None,
        };
        emitted.advance(end.clone());
        Some(Transaction {
            continued: self.first > 0,
            ..Transaction::of_changes(changes, end)
        })
    }
}

#[cfg(test)]
#[path = "decoder_tests.rs"]
pub(super) mod tests;
