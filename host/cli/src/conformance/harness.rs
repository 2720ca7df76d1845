//! The test host: it plays the pipeline's part for one sink. It starts and
//! crashes instances of the plugin over one blob root, hands out epochs as a
//! restarted host would, makes batches at known positions, keeps its own
//! record of what was acknowledged, and reads the destination back through
//! the operator's reader to compare.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_source::commit_order::{describe, stream_position};

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use weir_contract::{Mode, OP_COLUMN, POS_COLUMN};
use weir_core::{CommitRequest, Position};

use super::config::{Shows, TestConfig};
use super::verify::{Difference, Reader, Row};
use weir_metrics::PipelineMetrics;
use weir_runtime::capability::blob_faults::{BlobFaults, FaultKind};
use weir_runtime::network::SinkNetwork;
use weir_runtime::{
    BatchHeader, BlobScope, CallError, Plugin, SinkClaim, SinkError, SinkWorker, TableDescription,
    WorkerSpec,
};

/// The sink's name in the test host's messages and logs.
pub const SINK_NAME: &str = "sink-under-test";

/// Why a scenario ended before it passed.
#[derive(Debug)]
pub enum Stop {
    /// The sink broke a rule of the contract.
    Fail(String),
    /// The reader could not say what the destination holds.
    CannotVerify(String),
    /// The scenario does not apply to this sink.
    NotApplicable(String),
    /// The sink declined the change, as the contract lets it (`poison`).
    Refused(String),
}

pub type Step<T = ()> = Result<T, Stop>;

/// One table as the test host knows it.
pub struct Table {
    pub description: Arc<TableDescription>,
    /// The last commit the sink acknowledged, and its epoch.
    pub acknowledged: Option<(Position, u64)>,
    /// Committed changes, in commit order, each batch once.
    committed: Vec<Row>,
    /// Batches written since the last commit: id and rows.
    staged: Vec<(String, Vec<Row>)>,
    /// Batch ids whose rows are in `committed`.
    applied: HashSet<String>,
}

/// A batch the test host made.
#[derive(Clone)]
pub struct TestBatch {
    pub header: BatchHeader,
    pub ipc: Arc<Vec<u8>>,
    pub rows: Vec<Row>,
}

pub struct Harness {
    plugin: Arc<Plugin>,
    config: TestConfig,
    reader: Option<Reader>,
    root: PathBuf,
    io: tokio::runtime::Handle,
    pub faults: Arc<BlobFaults>,
    pub pipeline: String,
    pub positioned: bool,
    worker: Option<SinkWorker>,
    /// The epoch of the running instance's host; grows at every start.
    pub epoch: u64,
    /// The last position handed out; positions grow across tables.
    last_position: u64,
}

impl Harness {
    pub fn new(
        plugin: Arc<Plugin>,
        config: TestConfig,
        root: &Path,
        io: tokio::runtime::Handle,
        pipeline: String,
    ) -> Harness {
        let reader = config
            .verify
            .as_ref()
            .map(|verify| Reader::new(verify, &config.base_dir));
        Harness {
            positioned: plugin.info.positioned(),
            plugin,
            config,
            reader,
            root: root.to_path_buf(),
            io,
            faults: Arc::default(),
            pipeline,
            worker: None,
            epoch: 0,
            last_position: 0,
        }
    }

    /// What the reader shows, if there is one.
    pub fn shows(&self) -> Option<Shows> {
        self.reader.as_ref().map(|r| r.shows)
    }

    /// A table of the test, named `plugin_test.<name>`; upsert by `id`.
    pub fn table(&self, name: &str) -> Table {
        let name = format!("plugin_test.{}", name.replace('-', "_"));
        Table {
            description: Arc::new(TableDescription {
                name: name.clone(),
                key_columns: vec!["id".into()],
                mode: Mode::Upsert,
                destination: name,
                metadata: Vec::new(),
            }),
            acknowledged: None,
            committed: Vec::new(),
            staged: Vec::new(),
            applied: HashSet::new(),
        }
    }

    /// Starts a new instance, as a host (re)starting the pipeline would:
    /// a fresh instance over the same root, with the next epoch.
    pub fn start(&mut self) -> Step {
        self.crash();
        self.epoch += 1;
        let fail = |why: String| Stop::Fail(format!("starting it (epoch {}): {why}", self.epoch));
        let blob = BlobScope::open(
            &self.root.display().to_string(),
            &[],
            &self.root,
            self.io.clone(),
        )
        .map_err(|e| fail(e.to_string()))?
        .with_limits(self.config.limits.blob_limits(SINK_NAME, "test root"))
        .with_faults(self.faults.clone());
        let grants = self.config.grants.parse().map_err(fail)?;
        let limits = &self.config.limits;
        let worker = SinkWorker::start(WorkerSpec {
            name: SINK_NAME.into(),
            plugin: self.plugin.clone(),
            blob: Arc::new(blob),
            network: SinkNetwork::new(SINK_NAME, Arc::new(grants), limits.network_limits()),
            limits: limits.call_limits(),
            // Every answer reaches the scenario as the sink gave it.
            retries: 0,
            pipeline: self.pipeline.clone(),
            config: self.config.config.clone().into_iter().collect(),
            metrics: PipelineMetrics::detached().sink(SINK_NAME),
            tenant: None,
        })
        .map_err(|e| fail(e.to_string()))?;
        self.worker = Some(worker);
        Ok(())
    }

    /// Ends the running instance without another call, as a kill would:
    /// whatever it staged is gone.
    pub fn crash(&mut self) {
        self.worker = None;
    }

    fn worker(&self) -> &SinkWorker {
        self.worker
            .as_ref()
            .expect("a scenario calls the sink only after `start`")
    }

    /// Takes the running instance aside without ending it, as a host that
    /// stalls while the pipeline moves: the next `start` runs a new
    /// instance (the new owner) beside it, and the scenario calls this one
    /// through [`Harness::write_aside`] and [`Harness::commit_aside`].
    pub fn set_aside(&mut self) -> SinkWorker {
        self.worker
            .take()
            .expect("a scenario sets an instance aside only after `start`")
    }

    /// Stages `batch` in an instance set aside. The test host's record of
    /// the table is not touched: [`Harness::record_landed`] says when its
    /// commit landed.
    pub fn write_aside(&self, aside: &SinkWorker, batch: &TestBatch) -> Result<(), CallError> {
        aside.write(batch.header.clone(), batch.ipc.clone()).wait()
    }

    /// Commits `table` at `high` in an instance set aside, with its `epoch`.
    pub fn commit_aside(
        &self,
        aside: &SinkWorker,
        table: &Table,
        high: &Position,
        epoch: u64,
    ) -> Result<(), CallError> {
        aside.commit(self.request(table, high, epoch)).wait()
    }

    /// What a host of `epoch` sends to commit `table` at `high`.
    fn request(&self, table: &Table, high: &Position, epoch: u64) -> CommitRequest {
        CommitRequest {
            table: table.description.name.clone(),
            high: high.clone(),
            pipeline: self.pipeline.clone(),
            epoch,
        }
    }

    /// A batch for `table` with `rows`, at the next positions.
    pub fn batch(&mut self, table: &Table, rows: Vec<Row>) -> TestBatch {
        let first = self.last_position + 1;
        self.last_position += rows.len().max(1) as u64;
        self.batch_at(table, first, self.last_position, rows)
    }

    /// A batch over positions `first..=last` (the same range and table give
    /// the same batch id, as in the host).
    pub fn batch_at(&self, table: &Table, first: u64, last: u64, rows: Vec<Row>) -> TestBatch {
        let low = stream_position(first, 0);
        let high = stream_position(last, 0);
        let with_note = rows.iter().any(|r| r.note.is_some());
        let records = encode(&rows, first, with_note);
        TestBatch {
            header: BatchHeader {
                id: weir_source::batch::batch_id(&table.description.name, &low, &high),
                table: table.description.clone(),
                low,
                high,
                rows: rows.len() as u32,
            },
            ipc: Arc::new(
                weir_contract::ipc::encode(&records).expect("the test's own batch encodes"),
            ),
            rows,
        }
    }

    /// The last position handed out.
    pub fn last_position(&self) -> u64 {
        self.last_position
    }

    /// The next position, for a commit that carries no batch.
    pub fn advance(&mut self) -> Position {
        self.last_position += 1;
        stream_position(self.last_position, 0)
    }

    /// Stages `batch`; the test host now expects its rows at the next commit.
    pub fn write(&mut self, table: &mut Table, batch: &TestBatch) -> Result<(), CallError> {
        self.worker()
            .write(batch.header.clone(), batch.ipc.clone())
            .wait()?;
        match table
            .staged
            .iter_mut()
            .find(|(id, _)| *id == batch.header.id)
        {
            Some(staged) => staged.1 = batch.rows.clone(),
            None => table
                .staged
                .push((batch.header.id.clone(), batch.rows.clone())),
        }
        Ok(())
    }

    /// Writes, failing the scenario if the sink refuses.
    pub fn must_write(&mut self, table: &mut Table, batch: &TestBatch) -> Step {
        self.write(table, batch).map_err(|e| {
            Stop::Fail(format!(
                "`write` of {} rows to {} answered: {e}",
                batch.rows.len(),
                table.description.name
            ))
        })
    }

    /// Commits `table` at `high` with this host's epoch.
    pub fn commit(&mut self, table: &mut Table, high: &Position) -> Result<(), CallError> {
        self.commit_at_epoch(table, high, self.epoch)
    }

    /// Commits `table` at `high` as a host of `epoch` would.
    pub fn commit_at_epoch(
        &mut self,
        table: &mut Table,
        high: &Position,
        epoch: u64,
    ) -> Result<(), CallError> {
        let request = self.request(table, high, epoch);
        self.worker().commit(request).wait()?;
        table.acknowledged = Some((high.clone(), epoch));
        for (id, rows) in table.staged.drain(..) {
            // A batch applied before (a replay) must not show twice.
            if table.applied.insert(id) {
                table.committed.extend(rows);
            }
        }
        Ok(())
    }

    /// Commits, failing the scenario if the sink refuses.
    pub fn must_commit(&mut self, table: &mut Table, high: &Position) -> Step {
        self.commit(table, high).map_err(|e| {
            Stop::Fail(format!(
                "`commit` of {} at {high} answered: {e}",
                table.description.name
            ))
        })
    }

    /// Records that `batch` was committed at `epoch` without the sink's
    /// answer reaching the host (the instance died after its commit point).
    pub fn record_landed(&self, table: &mut Table, batch: &TestBatch, epoch: u64) {
        table.acknowledged = Some((batch.header.high.clone(), epoch));
        if table.applied.insert(batch.header.id.clone()) {
            table.committed.extend(batch.rows.iter().cloned());
        }
    }

    /// Writes `batch` and commits at its `high`.
    pub fn deliver(&mut self, table: &mut Table, batch: &TestBatch) -> Step {
        self.must_write(table, batch)?;
        self.must_commit(table, &batch.header.high.clone())
    }

    /// Drops what is staged, in the sink and in the test host's record.
    pub fn abort(&mut self, table: &mut Table) {
        self.worker().abort(&table.description.name);
        table.staged.clear();
    }

    /// Forgets staged batches after a crash: the instance that held them
    /// is gone.
    pub fn forget_staged(&self, table: &mut Table) {
        table.staged.clear();
    }

    /// The sink's own claim for `table`; `None` from a sink without
    /// `positions`.
    pub fn claim(&self, table: &Table) -> Step<Option<SinkClaim>> {
        if !self.positioned {
            return Ok(None);
        }
        self.worker()
            .committed(&self.pipeline, &table.description.name)
            .wait()
            .map_err(|e| {
                Stop::Fail(format!(
                    "`committed` for {} answered: {e}",
                    table.description.name
                ))
            })
    }

    /// For a sink with `positions`: its claim must be the last commit it
    /// acknowledged, position and epoch.
    pub fn check_claim(&self, table: &Table, when: &str) -> Step {
        if !self.positioned {
            return Ok(());
        }
        let claim = self.claim(table)?;
        let expected = table.acknowledged.clone();
        let matches = match (&claim, &expected) {
            (None, None) => true,
            (Some(c), Some((position, epoch))) => c.position == *position && c.epoch == *epoch,
            _ => false,
        };
        if matches {
            return Ok(());
        }
        Err(Stop::Fail(format!(
            "{when}, `committed` for {} answered position {}, but the last commit it acknowledged was at {}",
            table.description.name,
            describe_claim(claim.as_ref().map(|c| (&c.position, c.epoch))),
            describe_claim(expected.as_ref().map(|(p, e)| (p, *e))),
        )))
    }

    /// Reads the destination and compares it with what was committed.
    pub fn verify(&self, table: &Table, when: &str) -> Step {
        let seen = self.read(table)?;
        let expected = self.expected(table);
        let difference = Difference::between(&expected, &seen);
        if difference.is_empty() {
            return Ok(());
        }
        Err(Stop::Fail(format!(
            "{when}, the reader shows for {}: {difference}",
            table.description.name
        )))
    }

    /// What the reader shows of `table`.
    pub fn read(&self, table: &Table) -> Step<Vec<Row>> {
        let Some(reader) = &self.reader else {
            return Err(Stop::CannotVerify(
                "no reader named (`verify` in the test config)".into(),
            ));
        };
        reader
            .read(&self.root, &table.description.destination, &self.pipeline)
            .map_err(Stop::CannotVerify)
    }

    /// What the destination must hold: every committed change, or the rows
    /// they leave, as the reader shows them.
    fn expected(&self, table: &Table) -> Vec<Row> {
        match self.shows() {
            Some(Shows::Changes) | None => table.committed.clone(),
            Some(Shows::State) => {
                let mut live = std::collections::BTreeMap::new();
                for change in &table.committed {
                    match change.op.as_deref() {
                        Some("delete") => {
                            live.remove(&change.id);
                        }
                        _ => {
                            live.insert(
                                change.id,
                                Row {
                                    op: None,
                                    ..change.clone()
                                },
                            );
                        }
                    }
                }
                live.into_values().collect()
            }
        }
    }

    /// Arms a fault at the `at`-th blob write from now.
    pub fn arm(&self, kind: FaultKind, at: u64) {
        self.faults.arm(kind, at);
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.crash();
    }
}

fn describe_claim(claim: Option<(&Position, u64)>) -> String {
    match claim {
        None => "nothing".into(),
        Some((position, epoch)) => format!("{} (epoch {epoch})", describe(position)),
    }
}

/// A row change of the test's tables.
pub fn change(op: &str, id: i64, name: Option<&str>, amount: Option<i64>) -> Row {
    Row {
        id,
        name: name.map(String::from),
        amount,
        note: None,
        op: Some(op.into()),
    }
}

/// Inserts of ids `ids`, with names and amounts derived from the id.
pub fn inserts(ids: std::ops::RangeInclusive<i64>) -> Vec<Row> {
    ids.map(|id| change("insert", id, Some(&format!("row {id}")), Some(id * 100)))
        .collect()
}

/// A delete of `id`: the key only, the other columns null.
pub fn delete(id: i64) -> Row {
    change("delete", id, None, None)
}

fn encode(rows: &[Row], first: u64, with_note: bool) -> RecordBatch {
    let ids = Int64Array::from_iter_values(rows.iter().map(|r| r.id));
    let names = StringArray::from_iter(rows.iter().map(|r| r.name.as_deref()));
    let amounts = Int64Array::from_iter(rows.iter().map(|r| r.amount));
    let ops =
        StringArray::from_iter_values(rows.iter().map(|r| r.op.as_deref().unwrap_or("insert")));
    let positions: Vec<Vec<u8>> = (0..rows.len() as u64)
        .map(|i| stream_position(first + i, 0).as_bytes().to_vec())
        .collect();
    let positions = BinaryArray::from_iter_values(positions.iter());
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(ids)),
        ("name", Arc::new(names)),
        ("amount", Arc::new(amounts)),
    ];
    if with_note {
        let notes = StringArray::from_iter(rows.iter().map(|r| r.note.as_deref()));
        columns.push(("note", Arc::new(notes)));
    }
    columns.push((OP_COLUMN, Arc::new(ops)));
    columns.push((POS_COLUMN, Arc::new(positions)));
    let schema = arrow_schema::Schema::new(
        columns
            .iter()
            .map(|(name, array)| {
                // The key is never null; everything else may be.
                let nullable = *name != "id" && *name != OP_COLUMN && *name != POS_COLUMN;
                arrow_schema::Field::new(*name, array.data_type().clone(), nullable)
            })
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .expect("the test's own batch is well formed")
}

/// How a call's failure reads in a scenario's detail.
pub fn answered(result: &Result<(), CallError>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(CallError::Sink(SinkError::Retryable(m))) => format!("retryable ({m})"),
        Err(e) => e.to_string(),
    }
}
