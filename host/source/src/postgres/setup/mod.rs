//! Setting the source up: the publication's tables, the shapes kept between
//! runs, the slot and the publication, and where the first run starts.
//!
//! `tables` finds the tables, `schema_file` keeps their shapes between
//! runs, and `slot` checks and creates the slot and the publication; this
//! module decides where the run starts.

mod schema_file;
mod slot;
mod tables;

use crate::commit_order::StreamPosition;
use pgwire_replication::ReplicationClient;

use super::Context;
use super::backfill::{Backfill, SlotSnapshot};
use super::catalog::format_lsn;
use super::keys::decode_key_texts;
use super::table::Tables;
use crate::SourceError;
use slot::{check_slot, create_publication, create_slot, gone_error, slot_and_publication};
use weir_core::position::Position;

pub(super) use schema_file::SchemaFile;
pub(super) use slot::{
    check_slot_and_publication, confirmed_flush, current_wal_lsn, replication_config,
};
pub(super) use tables::{add_columns_seen_by_snapshot, check_missing_columns, load_tables};

/// Where the run starts, as [`start`] decided it.
pub(super) struct Start {
    /// The slot's confirmed position (its consistent point when this run
    /// created it).
    pub acked: u64,
    /// The WAL position to stop at (`exit_when_caught_up`).
    pub catch_up_lsn: Option<u64>,
    /// The session that created the slot, kept open until the backfill has
    /// read its exported snapshot; it then streams.
    pub gated: Option<ReplicationClient>,
    pub backfill: Option<Backfill>,
    /// The commit LSN of the transaction to leave out whole
    /// (`skip_transaction_at`), for the stream's decoder.
    pub skip_transaction_at: Option<u64>,
}

/// Creates what is missing on a first run (the publication, the slot) and
/// decides where the run starts: a backfill from the start, a backfill
/// resumed after a committed row, or the stream.
pub(super) fn start(cx: &mut Context, after: Option<&Position>) -> Result<Start, SourceError> {
    let (slot, publication_exists) = slot_and_publication(&mut cx.session, &cx.config)?;
    if let Some(after) = after {
        cx.emitted.advance(after.clone());
        if let Some(e) = gone_error(&cx.config, slot.is_some(), publication_exists, &cx.emitted) {
            return Err(e);
        }
    }
    if !publication_exists {
        create_publication(cx)?;
    }
    let mut start = Start {
        acked: 0,
        catch_up_lsn: None,
        gated: None,
        backfill: None,
        skip_transaction_at: cx.config.skip_transaction_lsn(),
    };
    if let Some(info) = &slot {
        check_slot(&cx.config, cx.session.dsn(), info)?;
        start.acked = info.confirmed_flush.unwrap_or(0);
    }
    if cx.config.exit_when_caught_up {
        start.catch_up_lsn = current_wal_lsn(&mut cx.session)?;
    }
    match after {
        None if slot.is_none() => {
            let (gated, consistent_point, snapshot) = create_slot(cx)?;
            start.acked = consistent_point;
            start.gated = Some(gated);
            let snapshot = snapshot.map(|name| SlotSnapshot {
                name,
                consistent_point,
            });
            start.backfill = Some(Backfill::new(cx.tables.len(), None, snapshot));
            cx.schema_file.backfill_start.save(consistent_point);
            // The backfill places the columns at the snapshot it reads.
            return Ok(start);
        }
        None => {
            tracing::info!(
                slot = %cx.config.slot,
                "no sink has a position yet: backfilling every table from the current data, \
                 then streaming from the slot's confirmed position"
            );
            start.backfill = Some(Backfill::new(cx.tables.len(), None, None));
            cx.schema_file.backfill_start.save(start.acked);
        }
        Some(p) if p.as_snapshot().is_some() => {
            let backfill_start = cx.schema_file.backfill_start.read();
            check_slot_still_at_backfill_start(p, backfill_start, start.acked, &cx.config.slot)?;
            let (t, key) = backfill_resume_point(&cx.tables, p)?;
            start.backfill = Some(Backfill::new(cx.tables.len(), Some((t, key)), None));
        }
        Some(p) => check_not_behind_the_slot(p, start.acked, &cx.config.slot)?,
    }
    // The catalog was read before now: every change committed from here
    // on was written with the columns it listed. A run that exits when
    // caught up has just read the position.
    let now = match start.catch_up_lsn {
        Some(lsn) => Some(lsn),
        None => current_wal_lsn(&mut cx.session)?,
    };
    if let Some(lsn) = now {
        for t in cx.tables.iter_mut() {
            t.columns_present_at(lsn);
        }
    }
    Ok(start)
}

/// The table and key a backfill position stands at.
fn backfill_resume_point(
    tables: &Tables,
    p: &Position,
) -> Result<(usize, Vec<String>), SourceError> {
    let (table, key) = p.as_snapshot().expect("a backfill position");
    let Some(t) = tables.index_of(table) else {
        return Err(SourceError::Resume {
            position: p.clone(),
            reason: format!(
                "the backfill stopped in table {table}, which the publication no longer has"
            ),
        });
    };
    let key =
        decode_key_texts(&tables[t].key_orders(), key).ok_or_else(|| SourceError::Resume {
            position: p.clone(),
            reason: format!(
                "its key bytes do not decode as table {table}'s key, so the backfill cannot \
                 find where it stopped (a weir that orders this key's type differently wrote \
                 it: uuid and time keys are ordered by value now, by text before). Finish the \
                 backfill with the weir that started it, or start the pipeline over: empty the \
                 sinks, drop the slot and delete the state directory"
            ),
        })?;
    tracing::info!(%table, "resuming the backfill after the last committed row");
    Ok((t, key))
}

/// A backfill resumes from the current data and then streams from the
/// slot: exact only while the slot still stands where the backfill began
/// (see [`BackfillStart`](schema_file::BackfillStart)). It has moved when
/// the required sinks finished the backfill and streamed while another sink
/// stayed inside it (an optional sink left out of a run, or restored from a
/// backup): resuming for that sink would leave it wrong without a word, so
/// the run stops, before anything is acknowledged.
fn check_slot_still_at_backfill_start(
    p: &Position,
    backfill_start: Option<u64>,
    acked: u64,
    slot: &str,
) -> Result<(), SourceError> {
    let Some(began) = backfill_start else {
        tracing::warn!(
            %slot,
            "resuming the backfill without knowing where its stream starts (the state \
             directory does not say): exact only if the slot has not moved since it began"
        );
        return Ok(());
    };
    if acked <= began {
        return Ok(());
    }
    let (began, confirmed) = (format_lsn(began), format_lsn(acked));
    Err(SourceError::Resume {
        position: p.clone(),
        reason: format!(
            "a sink stands inside the backfill, but replication slot `{slot}` has moved from \
             where the backfill began (LSN {began}) to {confirmed}: the changes committed in \
             between are no longer on the server, so the rows that sink read before would keep \
             stale values, and rows deleted since, for good. This happens when an optional \
             sink was left out of a run (or restored from a backup) while the others finished \
             the backfill. Nothing was acknowledged. Re-create that sink's data: empty its \
             destination and its positions (or remove it from the pipeline), and run again"
        ),
    })
}

/// A stream position older than the slot's confirmed position means a
/// sink needs changes the server has already released: going on would lose
/// them without a word, so the run stops there, before anything is
/// acknowledged. Anything else is not a position of ours.
fn check_not_behind_the_slot(p: &Position, acked: u64, slot: &str) -> Result<(), SourceError> {
    let Some((lsn, ordinal)) = p.as_stream() else {
        return Err(SourceError::Resume {
            position: p.clone(),
            reason: "not a position of the Postgres source".into(),
        });
    };
    // The first commit LSN the sinks at `p` still need.
    let needed = if ordinal == u32::MAX { lsn + 1 } else { lsn };
    if needed < acked {
        let (resume, confirmed) = (format_lsn(lsn), format_lsn(acked));
        return Err(SourceError::Resume {
            position: p.clone(),
            reason: format!(
                "a sink stands at LSN {resume}, behind replication slot `{slot}` \
                 (confirmed_flush_lsn {confirmed}): the changes committed between {resume} and \
                 {confirmed} are no longer on the server, so that sink would miss them. This \
                 happens when a sink's data was restored from an older backup, or an optional \
                 sink fell behind while the required ones were acknowledged. Nothing was \
                 acknowledged. To repair it, restore a backup of that sink taken at or after \
                 {confirmed}, or re-create its data: empty its destination, drop the slot (or \
                 name a new one) and delete the pipeline's state directory, so that the next \
                 run backfills every table again from a new slot"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit_order::stream_position;

    #[test]
    fn a_backfill_resumes_only_while_the_slot_stands_where_it_began() {
        let inside = Position::snapshot("public.t", b"k");
        assert!(check_slot_still_at_backfill_start(&inside, Some(0x200), 0x200, "weir").is_ok());
        // Nothing recorded (an older state directory): a warning, not a stop.
        assert!(check_slot_still_at_backfill_start(&inside, None, 0x300, "weir").is_ok());
        let said = check_slot_still_at_backfill_start(&inside, Some(0x200), 0x300, "weir")
            .unwrap_err()
            .to_string();
        assert!(
            said.contains("backfill public.t")
                && said.contains("0/200")
                && said.contains("0/300")
                && said.contains("no longer on the server"),
            "{said}"
        );
    }

    #[test]
    fn a_stream_position_behind_the_slot_is_an_error_naming_both_positions() {
        let resume = stream_position(0x1_0000_0100, 2);
        let err = check_not_behind_the_slot(&resume, 0x1_0000_0200, "weir").unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("1/100")
                && said.contains("confirmed_flush_lsn 1/200")
                && said.contains("no longer on the server"),
            "{said}"
        );
        // At or after the slot: nothing is missing.
        assert!(
            check_not_behind_the_slot(&stream_position(0x1_0000_0200, 0), 0x1_0000_0200, "weir")
                .is_ok()
        );
        assert!(
            check_not_behind_the_slot(
                &stream_position(0x1_0000_01ff, u32::MAX),
                0x1_0000_0200,
                "weir"
            )
            .is_ok()
        );
        assert!(
            check_not_behind_the_slot(&stream_position(0x1_0000_0300, 0), 0x1_0000_0200, "weir")
                .is_ok()
        );
    }
}
