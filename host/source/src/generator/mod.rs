//! The built-in deterministic generator: an OLTP-like shop (customers, orders
//! and their items) whose change stream depends on nothing but a seed.
//!
//! It is the quickstart's default source and the test suite's source of
//! truth, so the same seed must give the same stream in every run and from
//! every resume position. Hence:
//!
//! - The stream's *shape* (which rows change, and how) comes from a small
//!   simulation of the shop ([`simulator`]) driven by one seeded ChaCha8
//!   stream.
//! - A row's *values* ([`values`]) are a pure function of the seed, its key,
//!   the position of the write and the few facts the simulation tracks (an
//!   order's customer, status and placing transaction). Skipping ahead on
//!   resume and computing the final state therefore only run the cheap
//!   simulation and materialize just the rows they need.
//!
//! The stream is fixed for a given `rand_chacha` version; tests compare it
//! with the oracle ([`oracle`], test builds only), never with literal values.

#[cfg(any(test, feature = "test-support"))]
pub mod oracle;
mod schema;
mod simulator;
mod values;

use crate::commit_order::{StreamPosition, stream_position};
use std::cell::OnceCell;
use std::sync::Arc;

use super::{Source, SourceError};
use crate::change::{TableSchema, Transaction};
#[cfg(any(test, feature = "test-support"))]
pub use oracle::{ExpectedState, KeyPart, change_log, expected_state};
use schema::ShopTables;
pub use schema::{CUSTOMERS, ORDER_ITEMS, ORDERS};
use simulator::Simulator;
use weir_core::position::{PHASE_STREAM, Position};

/// What the generator produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratorConfig {
    /// Everything in the stream follows from it.
    pub seed: u64,
    /// Stop after the transaction that reaches this many changes; None = endless.
    pub max_changes: Option<u64>,
}

/// The generator as a [`Source`]: whole transactions in position order,
/// resumable from any position it produced.
pub struct Generator {
    config: GeneratorConfig,
    tables: ShopTables,
    sim: Simulator,
    /// Set by `resume_after` until the first transaction past it is emitted.
    after: Option<Position>,
    /// The last position emitted: the head of an endless stream.
    last: Option<Position>,
    /// The final position of a bounded stream, found by simulating it once.
    bounded_head: OnceCell<Option<Position>>,
}

impl Generator {
    /// A generator at the start of the stream `config` describes.
    pub fn new(config: GeneratorConfig) -> Generator {
        Generator {
            sim: Simulator::new(config.seed),
            config,
            tables: ShopTables::new(),
            after: None,
            last: None,
            bounded_head: OnceCell::new(),
        }
    }

    fn exhausted(&self) -> bool {
        self.config
            .max_changes
            .is_some_and(|max| self.sim.total >= max)
    }
}

impl Source for Generator {
    fn tables(&self) -> Vec<Arc<TableSchema>> {
        self.tables.all()
    }

    fn resume_after(&mut self, after: Option<&Position>) -> Result<(), SourceError> {
        // Positions from a later phase than streaming would make an endless
        // generator skip forever.
        if let Some(first) = after.and_then(|p| p.as_bytes().first())
            && *first > PHASE_STREAM
        {
            return Err(SourceError::Resume {
                position: after.cloned().unwrap_or_default(),
                reason: "not a position of the generator".into(),
            });
        }
        self.sim = Simulator::new(self.config.seed);
        self.after = after.cloned();
        Ok(())
    }

    fn next_transaction(&mut self) -> Result<Option<Transaction>, SourceError> {
        loop {
            if self.exhausted() {
                return Ok(None);
            }
            let tx = self.sim.step();
            let count = self.sim.plan.len() as u32;
            let end = stream_position(tx, count - 1);
            let first = match &self.after {
                Some(after) if end <= *after => continue,
                Some(after) => (0..count)
                    .find(|&ordinal| stream_position(tx, ordinal) > *after)
                    .unwrap_or(0),
                None => 0,
            };
            self.after = None;
            let changes = (first..count)
                .map(|ordinal| {
                    let planned = &self.sim.plan[ordinal as usize];
                    self.tables.change(self.config.seed, planned, tx, ordinal)
                })
                .collect();
            self.last = Some(end.clone());
            return Ok(Some(Transaction::of_changes(changes, end)));
        }
    }

    /// Its positions are numbered transactions (`commit_order::stream_position`).
    fn transactions_after(&self, position: Option<&Position>) -> Option<u64> {
        let (head, _) = self.head()?.as_stream()?;
        match position {
            None => Some(head),
            Some(p) => p.as_stream().map(|(p, _)| head.saturating_sub(p)),
        }
    }

    fn head(&self) -> Option<Position> {
        let Some(max) = self.config.max_changes else {
            return self.last.clone();
        };
        self.bounded_head
            .get_or_init(|| {
                let mut sim = Simulator::new(self.config.seed);
                sim.run_to(max);
                (sim.tx > 0).then(|| stream_position(sim.tx, sim.plan.len() as u32 - 1))
            })
            .clone()
    }

    /// A bounded stream never goes past its head, whichever run produced
    /// it, so a sink claiming more is refused (as Postgres refuses a claim
    /// past its WAL). That holds for this seed and `max_changes`: a sink
    /// that committed an earlier run with a larger `max_changes` stands
    /// past a shorter run's head and is refused too. An endless stream may
    /// have run any length before: it cannot tell.
    fn ceiling(&mut self) -> Result<Option<Position>, SourceError> {
        Ok(match self.config.max_changes {
            Some(_) => self.head(),
            None => None,
        })
    }

    fn acknowledge(&mut self, _pos: &Position) -> Result<(), SourceError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
