//! The binlog stream: a task on the I/O runtime registers as a replica,
//! reads the binlog from a coordinate, and turns the row events of the
//! tables read into whole transactions (a big one in pieces, so memory
//! stays bounded), handed to the pipeline's thread through a small bounded
//! channel. The pipeline's side leaves out what was already handed on
//! (after a resume or a reconnect the stream starts at the start of a
//! transaction), ends the run once caught up, and reconnects when the
//! server goes away.
//!
//! A transaction runs from its GTID event (MariaDB; `BEGIN` elsewhere) to
//! its XID event (or `COMMIT`); DDL comes as a statement of its own.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mysql_async::binlog::events::{
    Event, EventData, OptionalMetadataField, RowsEventData, TableMapEvent,
};
use mysql_async::prelude::*;
use mysql_async::{BinlogStreamRequest, Conn};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::flavor::Gtid;
use super::position::{BinlogCoord, describe};
use super::row_image::{RowError, RowLayout, Wanted};
use super::schema_file::SchemaFile;
use super::session::Session;
use super::session::server_error;
use super::setup::{COLUMNS_SQL, ColumnRow, Table, column_of, file_of};
use crate::SourceError;
use crate::change::{Change, Op, TableSchema, Transaction, Value};
use crate::postgres::PieceLimits;
use weir_core::position::Position;

/// How long `next` waits for the stream before it hands on an idle
/// transaction, so that the pipeline can flush and heartbeat.
const IDLE_WAIT: Duration = Duration::from_millis(200);
/// How far the reader may run ahead of the pipeline, in batches of the
/// piece limits (changes and bytes): far enough to go on decoding while
/// the pipeline commits a batch, bounded so that memory stays so.
const READ_AHEAD_BATCHES: usize = 2;
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// MariaDB's GTID event and its "standalone" flag (a statement without
/// BEGIN/COMMIT around it, such as DDL).
const MARIADB_GTID_EVENT: u8 = 0xa2;
const GTID_STANDALONE: u8 = 1;
const HEARTBEAT_EVENT: u8 = 0x1b;

/// What the reading task hands on.
enum Item {
    /// A transaction or a piece of one; `reached` is where the reader then
    /// stands when it ended a transaction (None inside one); `bytes`, the
    /// size of its values as the reader counted them for the piece limits.
    Tx {
        tx: Transaction,
        reached: Option<BinlogCoord>,
        bytes: usize,
    },
    /// Between transactions, at this coordinate.
    Stand(BinlogCoord),
    /// The stream cannot go on: the row data is wrong, or a DDL statement
    /// on a table read.
    Failed(SourceError),
    /// The connection was lost; read again from `restart` (the start of
    /// the transaction that was open, or the boundary reached).
    Lost { error: String, restart: BinlogCoord },
    /// A table gained columns (ADD COLUMN): a later connection reads it so.
    Evolved { index: usize, table: TableInfo },
}

/// What the reading task works with.
struct ReaderSetup {
    opts: mysql_async::Opts,
    server_id: u32,
    heartbeat: Duration,
    tables: Arc<Vec<TableInfo>>,
    file: String,
    from: BinlogCoord,
    skip: Option<BinlogCoord>,
    limits: PieceLimits,
}

/// A table as the reading task needs it.
#[derive(Clone)]
struct TableInfo {
    db: String,
    table: String,
    kinds: Vec<super::types::Kind>,
    schema: Arc<TableSchema>,
}

pub(super) struct Stream {
    /// Where a table's added columns are recorded for later runs.
    schema_file: SchemaFile,
    rx: Option<mpsc::UnboundedReceiver<Ahead>>,
    task: Option<tokio::task::JoinHandle<()>>,
    tables: Arc<Vec<TableInfo>>,
    /// Where the stream reads from next time it connects.
    from: BinlogCoord,
    catch_up: Option<BinlogCoord>,
    done: bool,
    skip: Option<BinlogCoord>,
    limits: PieceLimits,
    /// Since when the connection is lost, while it is.
    lost_since: Option<Instant>,
    reconnect_timeout: Duration,
    heartbeat: Duration,
    server_id: u32,
}

impl Stream {
    pub fn new(
        schema_file: SchemaFile,
        tables: &[Table],
        from: BinlogCoord,
        catch_up: Option<BinlogCoord>,
        config: &super::config::MysqlConfig,
        limits: PieceLimits,
    ) -> Stream {
        let tables = tables
            .iter()
            .map(|t| TableInfo {
                db: t.db.clone(),
                table: t.table.clone(),
                kinds: t.kinds.clone(),
                schema: t.schema.clone(),
            })
            .collect();
        Stream {
            schema_file,
            rx: None,
            task: None,
            tables: Arc::new(tables),
            from,
            catch_up,
            done: false,
            skip: config.skip_transaction(),
            limits,
            lost_since: None,
            reconnect_timeout: config.reconnect_timeout(),
            heartbeat: config.heartbeat(),
            server_id: config.server_id,
        }
    }

    /// The next transaction after `emitted`, an idle one at `emitted` when
    /// nothing came for a moment, or None once caught up.
    pub fn next(
        &mut self,
        session: &mut Session,
        emitted: &mut Option<Position>,
    ) -> Result<Option<Transaction>, SourceError> {
        let deadline = Instant::now() + IDLE_WAIT;
        let mut stand: Option<Position> = None;
        loop {
            if self.done {
                return Ok(None);
            }
            if self.rx.is_none() {
                self.connect(session)?;
                if self.rx.is_none() {
                    // The server is away: `connect` waited; try again.
                    continue;
                }
            }
            let rx = self.rx.as_mut().expect("connected above");
            // What the reader has ready is taken without a timer and a
            // trip through the runtime: most items, when the stream is
            // behind.
            let item = match rx.try_recv() {
                Ok(ahead) => Ok(Some(ahead)),
                Err(mpsc::error::TryRecvError::Disconnected) => Ok(None),
                Err(mpsc::error::TryRecvError::Empty) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    session
                        .io()
                        .block_on(async { tokio::time::timeout(left, rx.recv()).await })
                }
            };
            let item = match item {
                Err(_) => {
                    // Nothing for a moment: stand where the stream is.
                    let at = stand.or_else(|| emitted.clone());
                    return Ok(at.map(|end| {
                        *emitted = Some(end.clone());
                        Transaction::of_changes(Vec::new(), end)
                    }));
                }
                Ok(None) => Item::Lost {
                    error: "the binlog reader ended".into(),
                    restart: self.from,
                },
                // The item's share of the read-ahead is given back here.
                Ok(Some(ahead)) => ahead.item,
            };
            match item {
                Item::Tx { tx, reached, .. } => {
                    self.lost_since = None;
                    if let Some(at) = reached {
                        self.from = at;
                        self.check_caught_up(at);
                    }
                    if let Some(tx) = admit(tx, emitted) {
                        return Ok(Some(tx));
                    }
                }
                Item::Stand(at) => {
                    self.lost_since = None;
                    self.from = at;
                    self.check_caught_up(at);
                    let pos = at.position(0);
                    if emitted.as_ref().is_none_or(|e| *e < pos) {
                        stand = Some(pos);
                    }
                    if self.done
                        && let Some(end) = stand.take()
                    {
                        *emitted = Some(end.clone());
                        return Ok(Some(Transaction::of_changes(Vec::new(), end)));
                    }
                }
                Item::Evolved { index, table } => {
                    let shape = table
                        .schema
                        .columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .zip(&table.kinds)
                        .collect();
                    self.schema_file
                        .save([(table.schema.name.as_str(), shape)])?;
                    Arc::make_mut(&mut self.tables)[index] = table;
                }
                Item::Failed(error) => {
                    self.disconnect();
                    return Err(error);
                }
                Item::Lost { error, restart } => {
                    self.disconnect();
                    self.from = restart;
                    let since = *self.lost_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.reconnect_timeout {
                        return Err(SourceError::Unavailable(format!(
                            "the binlog stream was lost and could not be read again for {:.0} s: {error}",
                            self.reconnect_timeout.as_secs_f64()
                        )));
                    }
                    tracing::warn!(
                        "binlog stream lost ({error}); reading again from {}",
                        describe(&restart.position(0))
                    );
                    std::thread::sleep(RETRY_DELAY);
                    if session
                        .stop_flag()
                        .load(std::sync::atomic::Ordering::Relaxed)
                    {
                        return Err(SourceError::Unavailable(format!(
                            "the binlog stream was lost ({error}); stopped waiting: the run was asked to stop"
                        )));
                    }
                }
            }
        }
    }

    fn check_caught_up(&mut self, at: BinlogCoord) {
        if self.catch_up.is_some_and(|target| at >= target) {
            self.done = true;
        }
    }

    fn connect(&mut self, session: &mut Session) -> Result<(), SourceError> {
        let file = match file_of(session, self.from) {
            Ok(file) => file,
            Err(e @ SourceError::Resume { .. }) => return Err(e),
            Err(e) if e.is_transient() => {
                let since = *self.lost_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.reconnect_timeout
                    || session
                        .stop_flag()
                        .load(std::sync::atomic::Ordering::Relaxed)
                {
                    return Err(e);
                }
                std::thread::sleep(RETRY_DELAY);
                session.reset();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        let sender = Outbox::new(sender, self.limits);
        let setup = ReaderSetup {
            opts: session.opts().clone(),
            server_id: self.server_id,
            heartbeat: self.heartbeat,
            tables: self.tables.clone(),
            file,
            from: self.from,
            skip: self.skip,
            limits: self.limits,
        };
        self.task = Some(session.io().spawn(read_binlog(setup, sender)));
        self.rx = Some(receiver);
        Ok(())
    }

    fn disconnect(&mut self) {
        self.rx = None;
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.disconnect();
    }
}

/// `tx` without what was already handed on; None when nothing is left.
fn admit(mut tx: Transaction, emitted: &mut Option<Position>) -> Option<Transaction> {
    if let Some(last) = emitted.as_ref() {
        // Changes come in position order: only a transaction that begins
        // at or before what was handed on needs a look at each.
        if tx.changes.first().is_some_and(|c| c.pos <= *last) {
            tx.changes.retain(|c| c.pos > *last);
        }
        if tx.changes.is_empty() && tx.end <= *last {
            return None;
        }
    }
    *emitted = Some(tx.end.clone());
    Some(tx)
}

/// An item read ahead, holding its share of the read-ahead until taken.
struct Ahead {
    item: Item,
    _changes: OwnedSemaphorePermit,
    _kib: Option<OwnedSemaphorePermit>,
}

/// The reader's end of the channel: an item waits for its changes and
/// bytes to fit in what the pipeline has not taken yet.
struct Outbox {
    tx: mpsc::UnboundedSender<Ahead>,
    changes: Arc<Semaphore>,
    kib: Arc<Semaphore>,
    changes_total: u32,
    kib_total: u32,
}

impl Outbox {
    fn new(tx: mpsc::UnboundedSender<Ahead>, limits: PieceLimits) -> Outbox {
        let total = |n: usize| {
            u32::try_from(n.saturating_mul(READ_AHEAD_BATCHES))
                .unwrap_or(u32::MAX)
                .clamp(1, Semaphore::MAX_PERMITS as u32)
        };
        let changes_total = total(limits.changes);
        let kib_total = total(limits.bytes.div_ceil(1024));
        Outbox {
            tx,
            changes: Arc::new(Semaphore::new(changes_total as usize)),
            kib: Arc::new(Semaphore::new(kib_total as usize)),
            changes_total,
            kib_total,
        }
    }

    /// Sends `item` once it fits (an item bigger than the whole read-ahead
    /// waits for all of it); Err when the pipeline's side is gone.
    async fn send(&self, item: Item) -> Result<(), ()> {
        let (changes, bytes) = match &item {
            Item::Tx { tx, bytes, .. } => (tx.changes.len(), *bytes),
            _ => (1, 0),
        };
        let changes = (changes.max(1) as u32).min(self.changes_total);
        let kib = (bytes.div_ceil(1024) as u32).min(self.kib_total);
        let changes = self
            .changes
            .clone()
            .acquire_many_owned(changes)
            .await
            .map_err(|_| ())?;
        let kib = match kib {
            0 => None,
            n => Some(
                self.kib
                    .clone()
                    .acquire_many_owned(n)
                    .await
                    .map_err(|_| ())?,
            ),
        };
        self.tx
            .send(Ahead {
                item,
                _changes: changes,
                _kib: kib,
            })
            .map_err(|_| ())
    }
}

/// The reading task: connects, reads, and ends with `Lost` or `Failed`.
async fn read_binlog(setup: ReaderSetup, out: Outbox) {
    let restart = setup.from;
    let mut reader = Reader {
        file: setup.file.clone(),
        file_number: setup.from.file,
        open: None,
        maps: HashMap::new(),
        layouts: HashMap::new(),
        tables: setup.tables.as_ref().clone(),
        may_have_dropped: HashSet::new(),
        skip: setup.skip,
        limits: setup.limits,
        boundary: setup.from,
        seen_format: false,
    };
    let stream = match start(&setup).await {
        Ok(stream) => stream,
        Err(e) => {
            let item = match e {
                mysql_async::Error::Server(s) if s.code == 1045 || s.code == 1227 => {
                    Item::Failed(SourceError::Config(format!(
                        "the user may not read the binlog: grant it REPLICATION SLAVE ({})",
                        s.message
                    )))
                }
                mysql_async::Error::Server(s) => Item::Failed(SourceError::Config(format!(
                    "the server refused to send its binlog from {}:{} ({}, server error {})",
                    setup.file, setup.from.offset, s.message, s.code
                ))),
                other => Item::Lost {
                    error: other.to_string(),
                    restart,
                },
            };
            let _ = out.send(item).await;
            return;
        }
    };
    let mut stream = stream;
    // A query connection, opened when a table's catalog must be read.
    let mut catalog: Option<Conn> = None;
    // The server sends a heartbeat at least this often: silence for
    // longer is a dead connection, however quiet the database.
    let silence = setup.heartbeat * 3 + Duration::from_secs(5);
    loop {
        let Ok(next) = tokio::time::timeout(silence, stream.next()).await else {
            let restart = reader.restart_point();
            let error = format!(
                "nothing came from the server for {:.0} s, heartbeats included",
                silence.as_secs_f64()
            );
            let _ = out.send(Item::Lost { error, restart }).await;
            return;
        };
        let event = match next {
            Some(Ok(event)) => event,
            Some(Err(mysql_async::Error::Server(s))) => {
                let _ = out
                    .send(Item::Failed(SourceError::Config(format!(
                        "the server stopped sending its binlog: {} (server error {})",
                        s.message, s.code
                    ))))
                    .await;
                return;
            }
            Some(Err(e)) => {
                let restart = reader.restart_point();
                let _ = out
                    .send(Item::Lost {
                        error: e.to_string(),
                        restart,
                    })
                    .await;
                return;
            }
            None => {
                let restart = reader.restart_point();
                let _ = out
                    .send(Item::Lost {
                        error: "the server ended the binlog stream".into(),
                        restart,
                    })
                    .await;
                return;
            }
        };
        let mut step = reader.on_event(&event);
        if let Ok(Step::Fetch { index, names }) = step {
            // A table map with columns added at the end: what they are,
            // from the server's catalog, then the event again.
            step = match fetch_added(&setup.opts, &mut catalog, &reader.tables[index], &names).await
            {
                Ok(table) => {
                    reader.tables[index] = table.clone();
                    if out.send(Item::Evolved { index, table }).await.is_err() {
                        return;
                    }
                    reader.on_event(&event)
                }
                Err(e) => Err(e),
            };
        }
        let items = match step {
            Ok(Step::Items(items)) => items,
            Ok(Step::Fetch { index, .. }) => {
                let name = reader.tables[index].schema.name.clone();
                let _ = out
                    .send(Item::Failed(SourceError::Invalid(format!(
                        "{name}: the columns added in the binlog could not be matched with the catalog"
                    ))))
                    .await;
                return;
            }
            Err(e) => {
                let _ = out.send(Item::Failed(e)).await;
                return;
            }
        };
        for item in items {
            if out.send(item).await.is_err() {
                return;
            }
        }
    }
}

/// What one binlog event asks of the reading task.
enum Step {
    Items(Vec<Item>),
    /// A table map names the table's known columns and more after them:
    /// read the catalog for what the added ones are.
    Fetch {
        index: usize,
        names: Vec<String>,
    },
}

/// `table` with the columns a table map added after its known ones
/// (`names`: all of the map's), as the server's catalog describes them now.
/// The catalog must still start with exactly those columns: if the table
/// changed again since, which columns the map meant cannot be told.
async fn fetch_added(
    opts: &mysql_async::Opts,
    catalog: &mut Option<Conn>,
    table: &TableInfo,
    names: &[String],
) -> Result<TableInfo, SourceError> {
    let name = &table.schema.name;
    if catalog.is_none() {
        let conn = Conn::new(opts.clone())
            .await
            .map_err(|e| server_error(&format!("reading the columns of {name}"), e))?;
        *catalog = Some(conn);
    }
    let conn = catalog.as_mut().expect("connected above");
    let rows: Vec<ColumnRow> = conn
        .exec(COLUMNS_SQL, (table.db.clone(), table.table.clone()))
        .await
        .map_err(|e| server_error(&format!("reading the columns of {name}"), e))?;
    let now: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    if now.len() < names.len() || now[..names.len()] != names[..] {
        return Err(SourceError::Invalid(format!(
            "{name}: the binlog adds columns ({}), but the table has changed again since (it now \
             has {}): the columns cannot be told apart. Back the table up again under a new \
             pipeline id",
            names.join(", "),
            now.join(", ")
        )));
    }
    let mut evolved = table.clone();
    let mut schema = (*table.schema).clone();
    for row in rows.into_iter().take(names.len()).skip(table.kinds.len()) {
        let (mut column, kind) = column_of(name, row)?;
        // Rows written before the column was added read null there.
        column.nullable = true;
        tracing::info!(
            "{name}: column `{}` added; the sinks get it from here on",
            column.name
        );
        schema.columns.push(column);
        evolved.kinds.push(kind);
    }
    evolved.schema = Arc::new(schema);
    Ok(evolved)
}

async fn start(setup: &ReaderSetup) -> Result<mysql_async::BinlogStream, mysql_async::Error> {
    let mut conn = Conn::new(setup.opts.clone()).await?;
    // GTID events as MariaDB writes them (not replaced by BEGIN), and a
    // heartbeat while the server is idle.
    conn.query_drop("SET @mariadb_slave_capability = 4").await?;
    let period_ns = setup.heartbeat.as_nanos().min(u128::from(u64::MAX)) as u64;
    conn.query_drop(format!("SET @master_heartbeat_period = {period_ns}"))
        .await?;
    let request = BinlogStreamRequest::new(setup.server_id)
        .with_filename(setup.file.as_bytes())
        .with_pos(u64::from(setup.from.offset));
    conn.get_binlog_stream(request).await
}

/// A transaction being read.
struct Open {
    start: BinlogCoord,
    /// Its global id, where the server wrote one.
    gtid: Option<Gtid>,
    commit_ts: i64,
    standalone: bool,
    changes: Vec<Change>,
    bytes: usize,
    ordinal: u32,
    pieces: u32,
    skipped: bool,
}

struct Reader {
    /// Whether the server's format event came: from then on the event
    /// reader knows whether events carry checksums.
    seen_format: bool,
    file: String,
    file_number: u32,
    open: Option<Open>,
    /// Table ids of the binlog's table maps: the table read, or None for
    /// a table not read.
    maps: HashMap<u64, Option<Mapped>>,
    /// Each table map's column types, for reading its row images.
    layouts: HashMap<u64, RowLayout>,
    tables: Vec<TableInfo>,
    /// Tables an ALTER that may drop or change columns was seen for: a map
    /// with fewer columns than known is then a drop, not a replay of rows
    /// from before an ADD COLUMN.
    may_have_dropped: HashSet<usize>,
    skip: Option<BinlogCoord>,
    limits: PieceLimits,
    /// The last boundary between transactions the reader passed.
    boundary: BinlogCoord,
}

impl Reader {
    fn restart_point(&self) -> BinlogCoord {
        self.open.as_ref().map_or(self.boundary, |o| o.start)
    }

    fn coord(&self, offset: u32) -> BinlogCoord {
        BinlogCoord {
            file: self.file_number,
            offset,
        }
    }

    /// [`Self::where_`], with the open transaction's GTID when it has one.
    fn named(&self, coord: BinlogCoord) -> String {
        match self.open.as_ref().and_then(|o| o.gtid) {
            Some(gtid) => format!("{} (GTID {gtid})", self.where_(coord)),
            None => self.where_(coord),
        }
    }

    fn where_(&self, coord: BinlogCoord) -> String {
        format!("{}:{}", coord.file_name(&self.file), coord.offset)
    }

    fn on_event(&mut self, event: &Event) -> Result<Step, SourceError> {
        let header = event.header();
        let end = header.log_pos();
        let start = end.saturating_sub(header.event_size());
        let kind = header.event_type_raw();
        if kind == MARIADB_GTID_EVENT {
            let flags = event.data().get(12).copied().unwrap_or(0);
            let gtid = Gtid::of_mariadb_event(event.data(), header.server_id());
            self.begin(
                start,
                header.timestamp(),
                flags & GTID_STANDALONE != 0,
                gtid,
            );
            return Ok(Step::Items(Vec::new()));
        }
        if kind == HEARTBEAT_EVENT {
            if self.open.is_none() && end > 0 {
                let at = self.coord(end);
                if at >= self.boundary {
                    self.boundary = at;
                    return Ok(Step::Items(vec![Item::Stand(at)]));
                }
            }
            return Ok(Step::Items(Vec::new()));
        }
        let data = event.read_data().map_err(|e| {
            SourceError::Invalid(format!(
                "cannot read a binlog event at {}:{start}: {e}",
                self.file
            ))
        })?;
        match data {
            // The server's first event is a made-up rotate to the file asked
            // for, sent before the format event that says checksums are on:
            // its name would carry the checksum's bytes. The file is known.
            // A made-up rotate later on (the server moving on to the next
            // file after one that ended without a rotate, as a restart
            // leaves it) comes after a format event and names the file.
            Some(EventData::RotateEvent(_)) if end == 0 && !self.seen_format => {
                Ok(Step::Items(vec![Item::Stand(self.boundary)]))
            }
            Some(EventData::FormatDescriptionEvent(_)) => {
                self.seen_format = true;
                Ok(Step::Items(Vec::new()))
            }
            Some(EventData::RotateEvent(rotate)) => {
                let name = rotate.name().into_owned();
                let number = BinlogCoord::file_number(&name).map_err(SourceError::Invalid)?;
                // Positions only grow: a rotate back to an earlier file
                // (a binlog reset under us) would make them go back.
                if number < self.file_number {
                    return Err(SourceError::Invalid(format!(
                        "the server's binlog went back from {} to {name}: was it reset (RESET \
                         MASTER)? Positions in the old files mean nothing now; back the tables \
                         up again under a new pipeline id",
                        self.file
                    )));
                }
                self.file = name;
                self.file_number = number;
                let offset = u32::try_from(rotate.position()).unwrap_or(4);
                self.boundary = self.coord(offset);
                self.maps.clear();
                Ok(Step::Items(vec![Item::Stand(self.boundary)]))
            }
            Some(EventData::QueryEvent(query)) => {
                let text = query.query();
                let statement = text.trim();
                if statement.eq_ignore_ascii_case("BEGIN") {
                    if self.open.is_none() {
                        self.begin(start, header.timestamp(), false, None);
                    }
                    return Ok(Step::Items(Vec::new()));
                }
                if statement.eq_ignore_ascii_case("COMMIT") {
                    return Ok(Step::Items(self.commit(end)));
                }
                match self.ddl(&query.schema(), statement) {
                    // An ALTER's effect shows in the table maps that follow.
                    None | Some((_, Ddl::Alter { may_drop: false })) => {}
                    Some((index, Ddl::Alter { may_drop: true })) => {
                        self.may_have_dropped.insert(index);
                    }
                    Some((index, Ddl::Stop)) => {
                        let table = self.tables[index].schema.name.clone();
                        let at = self.open.as_ref().map_or(self.coord(start), |o| o.start);
                        if self.skip == Some(at) {
                            tracing::warn!(
                                "leaving out the statement at {} on {table}, as skip_transaction_at says",
                                self.where_(at)
                            );
                        } else {
                            return Err(SourceError::Invalid(format!(
                                "`{}` at {} changes table {table} in a way the sinks cannot \
                                 follow (its rows would stay there, or reach them under another \
                                 name): bring the destination in line by hand and set \
                                 source.mysql.skip_transaction_at: \"{}\" to go on past it, or \
                                 back the table up again under a new pipeline id",
                                clip(statement),
                                self.named(at),
                                self.where_(at)
                            )));
                        }
                    }
                }
                if self.open.as_ref().is_some_and(|o| o.standalone) {
                    return Ok(Step::Items(self.commit(end)));
                }
                Ok(Step::Items(Vec::new()))
            }
            Some(EventData::GtidEvent(gtid)) => {
                let gtid = Gtid::Mysql {
                    sid: gtid.sid(),
                    gno: gtid.gno(),
                };
                self.begin(start, header.timestamp(), false, Some(gtid));
                Ok(Step::Items(Vec::new()))
            }
            Some(EventData::XidEvent(_)) => Ok(Step::Items(self.commit(end))),
            Some(EventData::TableMapEvent(map)) => match self.map_table(&map)? {
                MapOutcome::NotRead => {
                    self.maps.insert(map.table_id(), None);
                    Ok(Step::Items(Vec::new()))
                }
                MapOutcome::Read(mapped) => {
                    let kinds = &self.tables[mapped.index].kinds;
                    let layout = RowLayout::of(&map, kinds).map_err(|e| {
                        SourceError::Invalid(format!(
                            "{}: {e}",
                            self.tables[mapped.index].schema.name
                        ))
                    })?;
                    self.layouts.insert(map.table_id(), layout);
                    self.maps.insert(map.table_id(), Some(mapped));
                    Ok(Step::Items(Vec::new()))
                }
                MapOutcome::Added { index, names } => Ok(Step::Fetch { index, names }),
            },
            Some(EventData::RowsEvent(rows)) => {
                let Some(Some(mapped)) = self.maps.get(&rows.table_id()).copied() else {
                    return Ok(Step::Items(Vec::new()));
                };
                self.on_rows(mapped, &rows, start).map(Step::Items)
            }
            _ => Ok(Step::Items(Vec::new())),
        }
    }

    fn begin(&mut self, start: u32, timestamp: u32, standalone: bool, gtid: Option<Gtid>) {
        let start = self.coord(start);
        self.open = Some(Open {
            start,
            gtid,
            commit_ts: i64::from(timestamp) * 1_000_000,
            standalone,
            changes: Vec::new(),
            bytes: 0,
            ordinal: 0,
            pieces: 0,
            skipped: self.skip == Some(start),
        });
    }

    fn commit(&mut self, end: u32) -> Vec<Item> {
        let reached = self.coord(end);
        self.boundary = reached;
        let Some(open) = self.open.take() else {
            return vec![Item::Stand(reached)];
        };
        if open.skipped {
            tracing::warn!(
                "left out the transaction at {}, as skip_transaction_at says",
                self.where_(open.start)
            );
        }
        let end_pos = match open.changes.last() {
            Some(change) => change.pos.clone(),
            None => open.start.position(u32::MAX),
        };
        vec![Item::Tx {
            tx: Transaction {
                continued: open.pieces > 0,
                ..Transaction::of_changes(open.changes, end_pos)
            },
            reached: Some(reached),
            bytes: open.bytes,
        }]
    }

    /// What a table map means for a table the source reads: its columns
    /// as known (or the known ones but the last few, from before an ADD
    /// COLUMN), columns added after the known ones, or a change of shape
    /// the sinks cannot follow (an error that names it).
    fn map_table(&self, map: &TableMapEvent<'_>) -> Result<MapOutcome, SourceError> {
        let db = map.database_name();
        let name = map.table_name();
        let Some(index) = self
            .tables
            .iter()
            .position(|t| t.db == db && t.table == name)
        else {
            return Ok(MapOutcome::NotRead);
        };
        let table = &self.tables[index];
        let mut names = Vec::new();
        let mut unsigned: Vec<bool> = Vec::new();
        for field in map.iter_optional_meta() {
            match field {
                Ok(OptionalMetadataField::ColumnName(columns)) => {
                    for column in columns.iter_names() {
                        let column = column
                            .map_err(|e| SourceError::Invalid(format!("{db}.{name}: {e}")))?;
                        names.push(column.name().into_owned());
                    }
                }
                Ok(OptionalMetadataField::Signedness(bits)) => {
                    unsigned = bits.iter().map(|b| *b).collect();
                }
                _ => {}
            }
        }
        if names.is_empty() {
            return Err(SourceError::Config(format!(
                "the binlog's table map of {db}.{name} names no columns: set \
                 binlog_row_metadata=FULL on the server"
            )));
        }
        let known: Vec<&str> = table
            .schema
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        let shared = names.len().min(known.len());
        let changed = |what: String| {
            SourceError::Invalid(format!(
                "table {db}.{name}: {what}, which the sinks cannot follow (only columns added at \
                 the end can be carried). Bring the destination in line by hand and back the \
                 table up again under a new pipeline id"
            ))
        };
        if names[..shared] != known[..shared] {
            let gone: Vec<&str> = known
                .iter()
                .copied()
                .filter(|k| !names.iter().any(|n| n == k))
                .collect();
            let new: Vec<&str> = names
                .iter()
                .map(String::as_str)
                .filter(|n| !known.contains(n))
                .collect();
            let what = match (gone.is_empty(), new.is_empty()) {
                (false, true) => format!("column `{}` was dropped", gone.join("`, `")),
                (true, false) => format!("column `{}` was added before the end", new.join("`, `")),
                _ => "columns were renamed, replaced or reordered".to_string(),
            };
            return Err(changed(format!(
                "{what}: its columns are ({}) in the binlog where the source knows ({})",
                names.join(", "),
                known.join(", ")
            )));
        }
        if names.len() < known.len() && self.may_have_dropped.contains(&index) {
            return Err(changed(format!(
                "column `{}` was dropped (the binlog now has ({}))",
                known[names.len()],
                names.join(", ")
            )));
        }
        // Each shared column must still be of the kind the source reads it as.
        let mut numeric = 0;
        for (i, kind) in table.kinds.iter().enumerate().take(shared) {
            let Ok(Some(ty)) = map.get_column_type(i) else {
                return Err(changed(format!(
                    "column `{}` has no type in the binlog",
                    known[i]
                )));
            };
            let meta = map.get_column_metadata(i).unwrap_or(&[]);
            let is_unsigned = if ty.is_numeric_type() {
                numeric += 1;
                unsigned.get(numeric - 1).copied().unwrap_or(false)
            } else {
                false
            };
            if !kind.logged_as(ty, meta, is_unsigned) {
                return Err(changed(format!(
                    "column `{}` is now logged as {ty:?}{} where the source reads it as {kind:?} \
                     (its type was changed)",
                    known[i],
                    if is_unsigned { " unsigned" } else { "" }
                )));
            }
        }
        if names.len() > known.len() {
            return Ok(MapOutcome::Added { index, names });
        }
        Ok(MapOutcome::Read(Mapped { index }))
    }

    fn on_rows(
        &mut self,
        mapped: Mapped,
        rows: &RowsEventData<'_>,
        at: u32,
    ) -> Result<Vec<Item>, SourceError> {
        let Mapped { index } = mapped;
        let Some(layout) = self.layouts.get(&rows.table_id()) else {
            return Err(SourceError::Invalid(format!(
                "a row event at {}:{at} has no table map",
                self.file
            )));
        };
        let table = self.tables[index].schema.clone();
        let file = self.file.clone();
        let Some(open) = self.open.as_mut() else {
            return Err(SourceError::Invalid(format!(
                "a row event at {}:{at} lies outside a transaction",
                self.file
            )));
        };
        if open.skipped {
            return Ok(Vec::new());
        }
        // A before image is needed for its key alone: a delete hands on
        // the key, an update compares it with the after image's.
        let key = table.key.clone();
        let images = layout
            .rows(rows, Wanted::Only(&key), Wanted::All)
            .map_err(|e| match e {
                RowError::Read(e) => SourceError::Invalid(format!(
                    "{}: cannot read a row event at {}:{at}: {e}",
                    table.name, file
                )),
                RowError::Missing(i) => SourceError::Config(format!(
                    "{}: the binlog lacks column `{}` in a row: set binlog_row_image=FULL",
                    table.name, table.columns[i].name
                )),
                RowError::Convert(i, e) => SourceError::Invalid(format!(
                    "{}, column `{}`, a change of the transaction at {}:{}: {e}",
                    table.name,
                    table.columns[i].name,
                    open.start.file_name(&file),
                    open.start.offset
                )),
            })?;
        let lacks_image = || {
            SourceError::Invalid(format!(
                "{}: a row event at {}:{at} lacks a row image",
                table.name, file
            ))
        };
        let mut out = Vec::new();
        for (before, after) in images {
            let changes: Vec<(Op, Vec<Value>)> = match rows {
                RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => {
                    vec![(Op::Insert, after.ok_or_else(lacks_image)?)]
                }
                RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => {
                    vec![(Op::Delete, before.ok_or_else(lacks_image)?)]
                }
                RowsEventData::UpdateRowsEvent(_)
                | RowsEventData::UpdateRowsEventV1(_)
                | RowsEventData::PartialUpdateRowsEvent(_) => {
                    let old = before.ok_or_else(lacks_image)?;
                    let new = after.ok_or_else(lacks_image)?;
                    if key.iter().any(|&k| old[k] != new[k]) {
                        // A changed key: the row leaves its old key.
                        vec![(Op::Delete, old), (Op::Update, new)]
                    } else {
                        vec![(Op::Update, new)]
                    }
                }
            };
            for (op, values) in changes {
                open.ordinal = open.ordinal.checked_add(1).filter(|&o| o < u32::MAX).ok_or_else(|| {
                    SourceError::Invalid(format!(
                        "the transaction at binlog file {} offset {} has more than 4 billion changes",
                        open.start.file, open.start.offset
                    ))
                })?;
                open.bytes += values.iter().map(value_bytes).sum::<usize>();
                open.changes.push(Change {
                    table: table.clone(),
                    op,
                    pos: open.start.position(open.ordinal),
                    commit_ts_micros: open.commit_ts,
                    snapshot: false,
                    values,
                });
                if open.changes.len() >= self.limits.changes || open.bytes >= self.limits.bytes {
                    let changes = std::mem::take(&mut open.changes);
                    let end = changes.last().expect("a full piece").pos.clone();
                    out.push(Item::Tx {
                        tx: Transaction {
                            continued: open.pieces > 0,
                            ..Transaction::of_changes(changes, end)
                        },
                        reached: None,
                        bytes: open.bytes,
                    });
                    open.pieces += 1;
                    open.bytes = 0;
                }
            }
        }
        Ok(out)
    }

    /// The table a DDL statement changes, if it is one the source reads,
    /// and what that means: an ALTER shows in the table maps that follow; a
    /// TRUNCATE, DROP or RENAME of the table cannot reach the sinks.
    fn ddl(&self, schema: &str, statement: &str) -> Option<(usize, Ddl)> {
        let lower = statement.to_ascii_lowercase();
        let words: Vec<&str> = lower.split_whitespace().take(2).collect();
        let tokens: Vec<String> = lower
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '.' || c == '`'))
            .filter(|t| !t.is_empty())
            .map(|t| t.replace('`', ""))
            .collect();
        let kind = match words.as_slice() {
            ["alter", "table", ..] | ["alter", "ignore", ..] | ["alter", "online", ..] => {
                if tokens.iter().any(|t| t == "rename") {
                    Ddl::Stop
                } else {
                    Ddl::Alter {
                        may_drop: tokens
                            .iter()
                            .any(|t| matches!(t.as_str(), "drop" | "change" | "modify")),
                    }
                }
            }
            ["drop", "database" | "schema"] => {
                // The database's tables go with it.
                let index = self.tables.iter().position(|t| {
                    tokens
                        .iter()
                        .skip(2)
                        .any(|tok| tok.eq_ignore_ascii_case(&t.db))
                })?;
                return Some((index, Ddl::Stop));
            }
            ["drop", ..] | ["rename", ..] | ["truncate", ..] | ["create", "or"] => Ddl::Stop,
            _ => return None,
        };
        let index = self.tables.iter().position(|t| {
            let qualified = format!("{}.{}", t.db, t.table).to_ascii_lowercase();
            let bare = t.table.to_ascii_lowercase();
            tokens.iter().any(|tok| {
                *tok == qualified || (*tok == bare && schema.eq_ignore_ascii_case(&t.db))
            })
        })?;
        Some((index, kind))
    }
}

/// What a DDL statement on a table read means for the stream.
#[derive(Debug, PartialEq)]
enum Ddl {
    /// The table maps after it show what changed.
    Alter {
        may_drop: bool,
    },
    Stop,
}

/// A table map of a table the source reads: which table. (How many of its
/// known columns the rows carry, fewer for rows from before an ADD COLUMN,
/// is in the map's [`RowLayout`].)
#[derive(Clone, Copy, Debug)]
struct Mapped {
    index: usize,
}

enum MapOutcome {
    NotRead,
    Read(Mapped),
    Added { index: usize, names: Vec<String> },
}

fn value_bytes(value: &Value) -> usize {
    match value {
        Value::Utf8(s) => s.len() + 8,
        Value::Binary(b) => b.len() + 8,
        _ => 16,
    }
}

fn clip(text: &str) -> String {
    let mut out: String = text.chars().take(120).collect();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader() -> Reader {
        let schema = Arc::new(TableSchema {
            name: "shop.orders".into(),
            columns: Vec::new(),
            key: Vec::new(),
        });
        Reader {
            file: "binlog.000001".into(),
            file_number: 1,
            open: None,
            maps: HashMap::new(),
            layouts: HashMap::new(),
            may_have_dropped: HashSet::new(),
            tables: vec![TableInfo {
                db: "shop".into(),
                table: "orders".into(),
                kinds: Vec::new(),
                schema,
            }],
            skip: None,
            limits: PieceLimits::default(),
            boundary: BinlogCoord { file: 1, offset: 4 },
            seen_format: false,
        }
    }

    #[test]
    fn ddl_on_a_table_read_is_told_from_other_statements() {
        let r = reader();
        let alter = |may_drop| Some((0, Ddl::Alter { may_drop }));
        assert_eq!(
            r.ddl("shop", "ALTER TABLE orders ADD COLUMN x int"),
            alter(false)
        );
        assert_eq!(
            r.ddl("other", "alter table `shop`.`orders` drop column x"),
            alter(true)
        );
        assert_eq!(
            r.ddl("shop", "ALTER TABLE orders MODIFY x bigint"),
            alter(true)
        );
        assert_eq!(
            r.ddl("shop", "ALTER TABLE orders RENAME TO old_orders"),
            Some((0, Ddl::Stop))
        );
        assert_eq!(
            r.ddl("shop", "ALTER TABLE orders RENAME COLUMN a TO b"),
            Some((0, Ddl::Stop))
        );
        assert_eq!(
            r.ddl("x", "TRUNCATE TABLE shop.orders"),
            Some((0, Ddl::Stop))
        );
        assert_eq!(
            r.ddl("shop", "DROP TABLE IF EXISTS orders"),
            Some((0, Ddl::Stop))
        );
        assert_eq!(
            r.ddl("shop", "RENAME TABLE orders TO old_orders"),
            Some((0, Ddl::Stop))
        );
        assert_eq!(r.ddl("other", "ALTER TABLE orders ADD COLUMN x int"), None);
        assert_eq!(r.ddl("shop", "ALTER TABLE orders_archive ADD x int"), None);
        assert_eq!(r.ddl("shop", "CREATE TABLE t (orders int)"), None);
        assert_eq!(r.ddl("shop", "INSERT INTO orders VALUES (1)"), None);
        assert_eq!(r.ddl("x", "DROP DATABASE `shop`"), Some((0, Ddl::Stop)));
        assert_eq!(
            r.ddl("x", "DROP SCHEMA IF EXISTS shop"),
            Some((0, Ddl::Stop))
        );
        assert_eq!(r.ddl("shop", "DROP DATABASE shop2"), None);
    }

    #[test]
    fn what_was_handed_on_is_not_handed_on_again() {
        let at = BinlogCoord {
            file: 1,
            offset: 100,
        };
        let schema = reader().tables[0].schema.clone();
        let change = |ordinal| Change {
            table: schema.clone(),
            op: Op::Insert,
            pos: at.position(ordinal),
            commit_ts_micros: 0,
            snapshot: false,
            values: Vec::new(),
        };
        let tx = Transaction::of_changes(vec![change(1), change(2), change(3)], at.position(3));
        let mut emitted = Some(at.position(2));
        let admitted = admit(tx.clone(), &mut emitted).unwrap();
        assert_eq!(admitted.changes.len(), 1);
        assert_eq!(emitted, Some(at.position(3)));
        assert!(admit(tx, &mut emitted).is_none());
        let mut fresh = None;
        let empty = Transaction::of_changes(Vec::new(), at.position(u32::MAX));
        assert!(admit(empty.clone(), &mut fresh).is_some());
        assert!(admit(empty, &mut fresh).is_none());
    }
}
