//! The replication stream: transactions from the slot (a big one in
//! pieces, see `decoder.rs`), empty ones standing at heartbeat positions
//! while nothing arrives, and the acknowledgement that lets the server
//! release WAL.
//!
//! The replication client reads the socket on its own thread (`reader`),
//! into a bounded queue of events, and answers the server (standby status
//! updates every `status_interval`) from there, also while the queue is
//! full because the pipeline is busy committing: the server never times
//! the session out, and the reader never runs further ahead than the queue.

use crate::commit_order::{StreamPosition, stream_position};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures::FutureExt;

use pgwire_replication::{Lsn, PgWireError, ReplicationClient, ReplicationEvent};
use tokio_postgres::error::SqlState;

use super::catalog;
use super::decoder::{Decoder, PendingRelation, Piece, PieceLimits};
use super::session::unavailable;
use super::setup::{Start, check_missing_columns, check_slot_and_publication, replication_config};
use super::table::added_column;
use super::toast::fill_unchanged;
use super::{Context, Emitted};
use crate::SourceError;
use crate::change::Transaction;
use weir_core::position::Position;

/// How long to wait for the stream before standing at a heartbeat.
const IDLE_WAIT: Duration = Duration::from_millis(200);
/// The most events taken from the replication client's queue at once.
/// Taking what is ready in one go, rather than one event per wake-up,
/// keeps the source thread and the client's reader from waking each other
/// for every message.
const DRAIN_EVENTS: usize = 1024;

/// How long to let a busy stream gather in the client's queue.
const FLOWING_PAUSE: Duration = Duration::from_micros(500);

/// What the replication client's queue gave.
enum Received {
    Event(ReplicationEvent),
    /// The server ended the stream.
    Ended,
    Failed(PgWireError),
}

/// The streaming phase's state.
pub(super) struct Stream {
    client: Option<ReplicationClient>,
    /// Taken from the client's queue, not yet decoded.
    inbox: VecDeque<Received>,
    /// Whether the last look at the client's queue found events.
    flowing: bool,
    /// The session that created the slot, waiting for the backfill to end
    /// before it starts streaming.
    gated: Option<ReplicationClient>,
    decoder: Decoder,
    /// The newest position known safe to stand at while idle.
    heartbeat: Option<Position>,
    /// Stop once this LSN has been reached (`exit_when_caught_up`).
    catch_up_lsn: Option<u64>,
    /// The furthest LSN the server said it has sent us.
    reached: u64,
    done: bool,
    /// The last LSN confirmed to the server (at first, the slot's own).
    acked: u64,
    acked_at: Option<Instant>,
    /// When the stream last carried something (for heartbeats).
    last_event: Instant,
    /// Whether the events taken since `last_event` was set carried a
    /// transaction (it is set from this once they are decoded).
    carried: bool,
    /// Since when look-ups on the query connection (TOAST values, added
    /// columns) have found the server away, without one getting through.
    lookups_failing_since: Option<Instant>,
}

impl Stream {
    pub fn new(publication: &str) -> Stream {
        Stream {
            client: None,
            inbox: VecDeque::new(),
            flowing: false,
            gated: None,
            decoder: Decoder::new(publication),
            heartbeat: None,
            catch_up_lsn: None,
            reached: 0,
            done: false,
            acked: 0,
            acked_at: None,
            last_event: Instant::now(),
            carried: false,
            lookups_failing_since: None,
        }
    }

    /// Where big transactions are cut into pieces.
    pub fn set_piece_limits(&mut self, limits: PieceLimits) {
        self.decoder.set_limits(limits);
    }

    /// Takes over what setting up found or created.
    pub fn prepare(&mut self, start: &mut Start) {
        self.acked = start.acked;
        self.catch_up_lsn = start.catch_up_lsn;
        self.gated = start.gated.take();
        self.decoder.skip_transaction_at(start.skip_transaction_at);
    }

    /// After the backfill: streams on the session that created the slot,
    /// if this run did. On failure the next call reconnects.
    pub fn start_gated(&mut self, cx: &Context) {
        let Some(mut gated) = self.gated.take() else {
            return;
        };
        let started = cx.reader.block_on(async {
            gated.start().await?;
            gated.wait_started().await?;
            Ok::<_, PgWireError>(gated)
        });
        match started {
            Ok(client) => {
                self.client = Some(client);
                self.last_event = Instant::now();
            }
            Err(e) => {
                tracing::warn!("cannot stream on the slot's first session ({e}); reconnecting")
            }
        }
    }

    /// The next transaction from the stream (or the next piece of a big
    /// one), or an empty one standing at a heartbeat position after a
    /// quiet spell; None once caught up (`exit_when_caught_up`).
    pub fn next(&mut self, cx: &mut Context) -> Result<Option<Transaction>, SourceError> {
        let mut deadline = Instant::now() + IDLE_WAIT;
        loop {
            if self.done {
                return Ok(None);
            }
            if self.client.is_none() {
                self.connect(cx)?;
            }
            if self.caught_up() {
                self.done = true;
                return Ok(self.idle_tx(&mut cx.emitted));
            }
            // The clock is read between the batches of events taken from
            // the client, not for every event: a busy stream carries
            // hundreds of thousands a second.
            let mut left = Duration::ZERO;
            if self.inbox.is_empty() {
                if self.carried {
                    self.last_event = Instant::now();
                    self.carried = false;
                }
                self.heartbeat_if_quiet(cx);
                left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    match self.idle_tx(&mut cx.emitted) {
                        Some(tx) => return Ok(Some(tx)),
                        // No position to stand at yet: wait on.
                        None => {
                            deadline = Instant::now() + IDLE_WAIT;
                            continue;
                        }
                    }
                }
            }
            let Some(event) = self.receive(cx, left)? else {
                continue;
            };
            if let Some(tx) = self.on_event(cx, event)? {
                return Ok(Some(tx));
            }
        }
    }

    /// WAL bytes the server has sent past what was confirmed to it: how far
    /// the sinks are behind the server's log (`None` before the stream ran).
    pub fn lag_bytes(&self) -> Option<u64> {
        (self.reached > 0).then(|| self.reached.saturating_sub(self.acked))
    }

    /// Every required sink has committed up to `pos`: confirm it to the server.
    pub fn acknowledge(&mut self, pos: &Position) {
        // Backfill positions release nothing: the slot stays at its start.
        // A position standing after a whole transaction (or at a heartbeat),
        // ordinal u32::MAX, covers everything that commits at or before its
        // LSN, so the server may skip those: confirm the next byte. That
        // also lets a stopping server see us caught up with it (it waits for
        // confirmed == sent before shutting down). Any other position, the
        // end of a piece included, confirms only its commit LSN: the server
        // sends a transaction committed at the confirmed LSN again, and the
        // changes at or before the position are skipped (`Emitted`).
        let confirm = match pos.as_stream() {
            Some((lsn, u32::MAX)) => lsn + 1,
            Some((lsn, _)) => lsn,
            None => return,
        };
        if confirm > self.acked {
            self.acked = confirm;
            self.acked_at = Some(Instant::now());
            if let Some(client) = &self.client {
                client.update_applied_lsn(Lsn::from_u64(confirm));
            }
        }
    }

    /// Ends the session, leaving the server with the last acknowledgement.
    /// The replication client sends acknowledgements at most once per
    /// `status_interval_ms`, and the one under way when the stream stops may
    /// never be read (a close with the server's messages unread resets the
    /// connection): waiting for the next one cost every bounded run up to
    /// that interval at its end. So the stream stops first, which releases
    /// the slot, and the query session moves the slot's confirmed position
    /// to what the sinks committed (`pg_replication_slot_advance`, the same
    /// step an acknowledgement takes).
    pub fn shutdown(&mut self, cx: &mut Context) {
        if let Some(mut client) = self.client.take() {
            let _ = cx.reader.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await
            });
        }
        if self.acked_at.is_some() {
            self.confirm_to_server(cx);
        }
    }

    /// Moves the slot's confirmed position up to what was acknowledged, if
    /// the server does not have it yet. The server releases the slot when
    /// the stream ends, but a slow server may still hold it for a moment:
    /// the attempt is repeated for up to two seconds.
    fn confirm_to_server(&mut self, cx: &mut Context) {
        let (slot, acked) = (cx.config.slot.clone(), self.acked);
        let deadline = Instant::now() + Duration::from_secs(2);
        let outcome = cx.session.without_waiting(|session| {
            loop {
                let confirmed = session.query("reading the slot's confirmed position", |c| {
                    let slot = slot.clone();
                    Box::pin(async move { catalog::slot(c, &slot).await })
                });
                match confirmed {
                    Ok(Some(info)) if info.confirmed_flush >= Some(acked) => return Ok(()),
                    Ok(Some(_)) => {}
                    Ok(None) => return Err(format!("the slot {slot} is gone")),
                    Err(e) => return Err(e.to_string()),
                }
                let moved = session.query("moving the slot to what the sinks committed", |c| {
                    let slot = slot.clone();
                    Box::pin(async move { catalog::advance_slot(c, &slot, acked).await })
                });
                match moved {
                    Ok(true) => return Ok(()),
                    Ok(false) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Ok(false) => return Err("another session still holds the slot".to_string()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        });
        if let Err(cause) = outcome {
            tracing::info!(
                acknowledged = %catalog::format_lsn(acked),
                %cause,
                "the server does not have the last acknowledgement: the next run receives \
                 the changes after the slot's confirmed position again, and skips those \
                 the sinks hold"
            );
        }
    }

    fn caught_up(&self) -> bool {
        !self.decoder.in_transaction()
            && self
                .catch_up_lsn
                .is_some_and(|target| self.reached >= target)
    }

    /// Writes a logical decoding message when nothing arrived for a while,
    /// so an idle or filtered database still gives a position to stand at.
    fn heartbeat_if_quiet(&mut self, cx: &mut Context) {
        let Some(interval) = cx.config.heartbeat_interval() else {
            return;
        };
        if self.last_event.elapsed() < interval {
            return;
        }
        self.last_event = Instant::now();
        // A missed heartbeat only delays the next idle position; waiting
        // for a server that is away would keep this stream from being read
        // and confirmed, which a stopping server waits for.
        let _ = cx.session.without_waiting(|session| {
            session.execute(
                "writing a heartbeat message",
                "SELECT pg_logical_emit_message(false, 'weir.heartbeat', '')",
            )
        });
    }

    /// Opens a replication session on the slot, retrying (within the
    /// reconnect timeout) while the server restarts or a killed
    /// predecessor's walsender still holds the slot.
    fn connect(&mut self, cx: &mut Context) -> Result<(), SourceError> {
        let deadline = Instant::now() + cx.config.reconnect_timeout();
        let patience = cx.session.patience().clone();
        let acked = self.acked;
        let attempt = || -> Result<ReplicationClient, ConnectError> {
            check_slot_and_publication(&mut cx.session, &cx.config, &cx.emitted)
                .map_err(ConnectError::Setup)?;
            let cfg = replication_config(cx.session.dsn(), &cx.config, acked);
            let connected = cx
                .reader
                .block_on(async {
                    let mut client = ReplicationClient::connect(cfg).await?;
                    client.wait_started().await?;
                    Ok(client)
                })
                .map_err(ConnectError::Replication);
            if let Err(ConnectError::Replication(e)) = &connected
                && cx.take_over_slot
                && sqlstate(e) == Some(SqlState::OBJECT_IN_USE)
            {
                end_slot_holder(&mut cx.session, &cx.config.slot);
            }
            connected
        };
        let client = patience
            .retry(deadline, attempt, ConnectError::may_clear, |e| {
                format!("cannot start streaming yet ({e})")
            })
            .map_err(|e| match e {
                ConnectError::Setup(e) => e,
                ConnectError::Replication(e) => {
                    unavailable("cannot start streaming from the slot", e)
                }
            })
            .map_err(|e| patience.gave_up(e))?;
        self.client = Some(client);
        self.inbox.clear();
        self.decoder.reset();
        self.last_event = Instant::now();
        tracing::info!(slot = %cx.config.slot, "streaming from the slot");
        Ok(())
    }

    /// The next event within `wait`; None on a timeout or a lost stream
    /// (which the next call reconnects). Takes every event already queued
    /// (up to [`DRAIN_EVENTS`]) with the first, for the calls after.
    fn receive(
        &mut self,
        cx: &Context,
        wait: Duration,
    ) -> Result<Option<ReplicationEvent>, SourceError> {
        if self.inbox.is_empty() {
            let client = self.client.as_mut().expect("connected");
            let inbox = &mut self.inbox;
            let drain = |inbox: &mut VecDeque<Received>, client: &mut ReplicationClient| {
                // Once the client's reader has ended, its outcome is read by
                // a wait below, never by a poll that could drop it half-read.
                while inbox.len() < DRAIN_EVENTS
                    && client.is_running()
                    && !matches!(inbox.back(), Some(Received::Ended | Received::Failed(_)))
                {
                    match client.recv().now_or_never() {
                        Some(next) => inbox.push_back(received(next)),
                        None => break,
                    }
                }
            };
            drain(inbox, client);
            if inbox.is_empty() && self.flowing {
                // The stream was busy a moment ago: more is probably on its
                // way. A short sleep lets it gather in the client's queue;
                // parking on the queue would have the client wake this
                // thread for every message.
                std::thread::sleep(FLOWING_PAUSE);
                drain(inbox, client);
            }
            if inbox.is_empty() {
                cx.reader.set_flowing(false);
                cx.reader.block_on(async {
                    if let Ok(first) = tokio::time::timeout(wait, client.recv()).await {
                        inbox.push_back(received(first));
                    }
                });
                drain(inbox, client);
            }
            self.flowing = !inbox.is_empty();
            cx.reader.set_flowing(self.flowing);
        }
        match self.inbox.pop_front() {
            None => Ok(None),
            Some(Received::Event(event)) => Ok(Some(event)),
            Some(Received::Ended) => {
                self.lost("the server ended the stream".into());
                Ok(None)
            }
            Some(Received::Failed(e)) if sqlstate(&e) == Some(SqlState::UNDEFINED_OBJECT) => {
                // The slot or the publication was dropped under us.
                Err(SourceError::Resume {
                    position: cx.emitted.last().cloned().unwrap_or_default(),
                    reason: format!("the server stopped the stream: {e}"),
                })
            }
            Some(Received::Failed(e)) => {
                self.lost(e.to_string());
                Ok(None)
            }
        }
    }

    fn lost(&mut self, why: String) {
        tracing::warn!("replication stream lost ({why}); reconnecting");
        self.inbox.clear();
        if let Some(mut client) = self.client.take() {
            client.abort();
        }
        self.decoder.reset();
    }

    fn on_event(
        &mut self,
        cx: &mut Context,
        event: ReplicationEvent,
    ) -> Result<Option<Transaction>, SourceError> {
        match event {
            ReplicationEvent::KeepAlive { wal_end, .. } if !self.decoder.in_transaction() => {
                self.at_heartbeat(wal_end.as_u64(), &cx.emitted);
            }
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                self.carried = true;
                self.decoder.begin(final_lsn.as_u64(), commit_time_micros);
            }
            ReplicationEvent::XLogData { data, .. } => {
                if let Some(pending) = self.decoder.decode(&data, &cx.tables)? {
                    if let Err(e) = self.add_columns(cx, pending) {
                        return self.away_during_lookup(cx, e);
                    }
                    self.lookups_failing_since = None;
                }
                if let Some(piece) = self.decoder.full_piece() {
                    return self.hand_on(cx, piece);
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.carried = true;
                self.reached = self.reached.max(end_lsn.as_u64());
                return self.on_commit(cx);
            }
            ReplicationEvent::Message {
                transactional: false,
                lsn,
                ..
            } if !self.decoder.in_transaction() => {
                self.at_heartbeat(lsn.as_u64(), &cx.emitted);
            }
            _ => {}
        }
        Ok(None)
    }

    /// Closes the transaction: hands on what is left of it.
    fn on_commit(&mut self, cx: &mut Context) -> Result<Option<Transaction>, SourceError> {
        match self.decoder.commit() {
            Some(piece) => self.hand_on(cx, piece),
            None => Ok(None),
        }
    }

    /// Drops what was already emitted, fills the rest's unchanged TOAST
    /// values and numbers the changes.
    fn hand_on(
        &mut self,
        cx: &mut Context,
        mut piece: Piece,
    ) -> Result<Option<Transaction>, SourceError> {
        piece.leave_out_emitted(&cx.emitted);
        let (tables, config) = (&cx.tables, &cx.config);
        let filled = cx.session.without_waiting(|session| {
            check_missing_columns(session, config, tables, &piece.tx)?;
            fill_unchanged(session, tables, &mut piece.tx)
        });
        if let Err(e) = filled {
            return self.away_during_lookup(cx, e);
        }
        self.lookups_failing_since = None;
        let tx = piece.seal(&cx.tables, &mut cx.emitted);
        if tx.is_some() {
            self.heartbeat = None;
        }
        Ok(tx)
    }

    /// A look-up of the stream failed. If the server is away, the stream
    /// lets go of its session rather than wait for it: a stopping server
    /// waits for this stream's confirmation before it goes, so the session
    /// must close. The transaction being read was not handed on; after the
    /// reconnect the server sends it again from the confirmed position (what
    /// was handed on already is skipped). Only look-ups failing for the
    /// whole reconnect timeout, or failing otherwise, stop the run.
    fn away_during_lookup(
        &mut self,
        cx: &Context,
        e: SourceError,
    ) -> Result<Option<Transaction>, SourceError> {
        if !e.is_transient() {
            return Err(e);
        }
        let since = *self.lookups_failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= cx.session.reconnect_timeout() {
            return Err(e);
        }
        self.lost(format!("{e}, while the stream waited for it"));
        Ok(None)
    }

    /// Reads the types of the columns a relation adds, adds them to the
    /// table, and keeps the new shape for the next run's check.
    fn add_columns(
        &mut self,
        cx: &mut Context,
        pending: PendingRelation,
    ) -> Result<(), SourceError> {
        let mut added = Vec::with_capacity(pending.added.len());
        for rc in &pending.added {
            let (oid, typmod) = (rc.type_oid, rc.typmod);
            let (kind, sql_type) = cx.session.without_waiting(|session| {
                session.query("reading an added column's type", |c| {
                    Box::pin(async move { catalog::type_kind(c, oid, typmod).await })
                })
            })?;
            added.push(added_column(rc, kind, sql_type));
        }
        // Every change committed after this transaction was written with
        // the added columns (ADD COLUMN committed before it).
        let present_since = self.decoder.commit_lsn().unwrap_or(u64::MAX);
        cx.tables[pending.table()].add_columns(added, present_since);
        cx.schema_file.save(&cx.tables);
        self.decoder.install(pending, &cx.tables)
    }

    /// Everything before `lsn` has been sent (a keepalive's or a message's
    /// position, received between transactions).
    fn at_heartbeat(&mut self, lsn: u64, emitted: &Emitted) {
        if lsn == 0 {
            return;
        }
        self.reached = self.reached.max(lsn);
        let pos = stream_position(lsn - 1, u32::MAX);
        if !emitted.covers(&pos) && self.heartbeat.as_ref().is_none_or(|h| pos > *h) {
            self.heartbeat = Some(pos);
        }
    }

    /// An empty transaction at the newest heartbeat, else at the last
    /// position emitted (the batcher's heartbeat needs one to stand at).
    fn idle_tx(&mut self, emitted: &mut Emitted) -> Option<Transaction> {
        if let Some(hb) = self.heartbeat.take()
            && !emitted.covers(&hb)
        {
            emitted.advance(hb.clone());
            return Some(Transaction::of_changes(Vec::new(), hb));
        }
        emitted
            .last()
            .cloned()
            .map(|end| Transaction::of_changes(Vec::new(), end))
    }
}

fn received(result: Result<Option<ReplicationEvent>, PgWireError>) -> Received {
    match result {
        Ok(Some(event)) => Received::Event(event),
        Ok(None) => Received::Ended,
        Err(e) => Received::Failed(e),
    }
}

/// Why a replication session did not start.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    /// The slot or publication check failed: retrying will not help.
    #[error("{0}")]
    Setup(SourceError),
    #[error("{0}")]
    Replication(PgWireError),
}

impl ConnectError {
    /// The connection broke, the server is starting or stopping, or a
    /// killed predecessor's walsender still holds the slot.
    fn may_clear(&self) -> bool {
        let ConnectError::Replication(e) = self else {
            return false;
        };
        e.is_transient()
            || sqlstate(e).is_some_and(|code| {
                code == SqlState::OBJECT_IN_USE || code == SqlState::CANNOT_CONNECT_NOW
            })
    }
}

/// Ends the walsender that holds `slot`: an earlier owner's, which can no
/// longer commit (the caller holds a fenced claim). Its failure is only
/// logged: the retry that follows says what still stands in the way.
fn end_slot_holder(session: &mut super::session::Session, slot: &str) {
    let literal = slot.replace('\'', "''");
    let sql = format!(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
         WHERE slot_name = '{literal}' AND active_pid IS NOT NULL"
    );
    match session.execute(
        "ending the walsender an earlier owner left on the slot",
        &sql,
    ) {
        Ok(()) => tracing::warn!(
            %slot,
            "ended the walsender an earlier owner of this pipeline left on the slot"
        ),
        Err(e) => tracing::warn!(%slot, "cannot end the walsender holding the slot: {e}"),
    }
}

/// The SQLSTATE of a server error on the replication session (the client
/// keeps only the text, which ends in `(SQLSTATE xxxxx)`).
fn sqlstate(e: &PgWireError) -> Option<SqlState> {
    let PgWireError::Server(message) = e else {
        return None;
    };
    let (_, tail) = message.rsplit_once("(SQLSTATE ")?;
    Some(SqlState::from_code(tail.strip_suffix(')')?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_on_the_replication_session_give_their_sqlstate() {
        let held = PgWireError::Server(
            "replication slot \"weir\" is active for PID 42 (SQLSTATE 55006)".into(),
        );
        assert_eq!(sqlstate(&held), Some(SqlState::OBJECT_IN_USE));
        assert!(ConnectError::Replication(held).may_clear());
        let gone =
            PgWireError::Server("replication slot \"weir\" does not exist (SQLSTATE 42704)".into());
        assert_eq!(sqlstate(&gone), Some(SqlState::UNDEFINED_OBJECT));
        assert!(!ConnectError::Replication(gone).may_clear());
        assert_eq!(sqlstate(&PgWireError::Server("no code".into())), None);
        assert_eq!(
            sqlstate(&PgWireError::Protocol("x (SQLSTATE 55006)".into())),
            None
        );
    }

    #[test]
    fn heartbeats_stand_after_what_was_emitted_and_only_move_forward() {
        let mut stream = Stream::new("weir_cdc");
        let mut emitted = Emitted::default();
        emitted.advance(stream_position(100, 0));
        stream.at_heartbeat(50, &emitted);
        assert!(stream.heartbeat.is_none());
        stream.at_heartbeat(201, &emitted);
        stream.at_heartbeat(150, &emitted);
        let tx = stream.idle_tx(&mut emitted).unwrap();
        assert_eq!(tx.end, stream_position(200, u32::MAX));
        assert!(tx.changes.is_empty());
        // Nothing newer: stand where we are.
        assert_eq!(stream.idle_tx(&mut emitted).unwrap().end, tx.end);
        assert_eq!(stream.reached, 201);
    }

    #[test]
    fn acknowledging_confirms_the_next_byte_after_a_whole_transaction() {
        let mut stream = Stream::new("weir_cdc");
        stream.acknowledge(&Position::snapshot("public.docs", b"k"));
        assert_eq!(stream.acked, 0);
        stream.acknowledge(&stream_position(10, 3));
        assert_eq!(stream.acked, 10);
        stream.acknowledge(&stream_position(10, u32::MAX));
        assert_eq!(stream.acked, 11);
        stream.acknowledge(&stream_position(5, 0));
        assert_eq!(stream.acked, 11);
    }
}
