//! The shop simulation: what happens in which transaction. It decides only
//! the *shape* of each change (table, operation, key) and tracks the few
//! facts row values depend on; [`super::values`] fills in the values.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::change::Op;

/// Key spaces are small so that updates and deletes hit existing rows often,
/// and deleted keys come back.
const CUSTOMER_KEYS: u32 = 1_000;
const ORDER_KEYS: u32 = 3_000;
/// The most items one order holds.
pub(super) const MAX_LINES: u8 = 5;
/// The most changes one transaction holds.
pub(super) const MAX_TX_CHANGES: usize = 6;

/// An order's status, as an index into [`super::values::STATUSES`].
pub(super) type Status = u8;
pub(super) const PENDING: Status = 0;
pub(super) const PAID: Status = 1;
pub(super) const SHIPPED: Status = 2;
pub(super) const DELIVERED: Status = 3;
pub(super) const CANCELLED: Status = 4;
pub(super) const REFUNDED: Status = 5;

/// The shop's tables; the discriminant also keys the value generators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Table {
    Customers = 1,
    Orders = 2,
    Items = 3,
}

/// Where a row was last written.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Write {
    pub tx: u64,
    pub ordinal: u32,
}

/// What the simulation remembers about an order beyond its key.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OrderRow {
    pub customer: u32,
    pub status: Status,
    pub lines: u8,
    pub placed_tx: u64,
}

/// One change of the transaction being simulated; `order` is the order's
/// state right after this change (orders only).
#[derive(Clone, Copy, Debug)]
pub(super) struct Planned {
    pub table: Table,
    pub op: Op,
    pub id: u32,
    pub line: u8,
    pub order: OrderRow,
}

/// The index of an order's item in [`Shop::item_writes`].
pub(super) fn item_slot(order: u32, line: u8) -> usize {
    (order as usize - 1) * MAX_LINES as usize + (line as usize - 1)
}

fn chance(rng: &mut ChaCha8Rng, percent: u32) -> bool {
    rng.random_ratio(percent, 100)
}

/// Keys `1..=capacity`, kept in one array partitioned into live keys, deleted
/// keys (used before) and never-used keys, with each key's index alongside:
/// picking a random key of a region and moving a key between regions are O(1).
pub(super) struct KeySpace {
    keys: Vec<u32>,
    index: Vec<u32>,
    live: usize,
    used: usize,
}

impl KeySpace {
    fn new(capacity: u32) -> Self {
        KeySpace {
            keys: (1..=capacity).collect(),
            index: (0..=capacity).map(|k| k.saturating_sub(1)).collect(),
            live: 0,
            used: 0,
        }
    }

    /// The keys that currently have a row (the oracle lists them).
    #[cfg(any(test, feature = "test-support"))]
    pub fn live(&self) -> &[u32] {
        &self.keys[..self.live]
    }

    fn is_live(&self, key: u32) -> bool {
        (self.index[key as usize] as usize) < self.live
    }

    fn random_live(&self, rng: &mut ChaCha8Rng) -> Option<u32> {
        (self.live > 0).then(|| self.keys[rng.random_range(0..self.live)])
    }

    /// True with probability live / capacity.
    fn crowded(&self, rng: &mut ChaCha8Rng) -> bool {
        rng.random_range(0..self.keys.len()) < self.live
    }

    /// A key that is not live: usually the next never-used one (like a
    /// sequence), sometimes a deleted one coming back.
    fn insertable(&self, rng: &mut ChaCha8Rng) -> Option<u32> {
        let deleted = self.used - self.live;
        let fresh = self.keys.len() - self.used;
        if deleted > 0 && (fresh == 0 || chance(rng, 30)) {
            Some(self.keys[self.live + rng.random_range(0..deleted)])
        } else {
            (fresh > 0).then(|| self.keys[self.used])
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.keys.swap(a, b);
        self.index[self.keys[a] as usize] = a as u32;
        self.index[self.keys[b] as usize] = b as u32;
    }

    fn insert(&mut self, key: u32) {
        let at = self.index[key as usize] as usize;
        debug_assert!(at >= self.live, "key {key} is already live");
        if at >= self.used {
            self.swap(at, self.used);
            self.used += 1;
        }
        self.swap(self.index[key as usize] as usize, self.live);
        self.live += 1;
    }

    fn delete(&mut self, key: u32) {
        let at = self.index[key as usize] as usize;
        debug_assert!(at < self.live, "key {key} is not live");
        self.swap(at, self.live - 1);
        self.live -= 1;
    }
}

/// The shop's state: which keys are live, each order's facts, and where
/// every row was last written (so its values can be recomputed).
pub(super) struct Shop {
    pub customers: KeySpace,
    pub orders: KeySpace,
    pub order_rows: Vec<OrderRow>,
    pub customer_writes: Vec<Write>,
    pub order_writes: Vec<Write>,
    pub item_writes: Vec<Write>,
}

/// Plays the shop forward one transaction at a time, recording only the
/// shape of each change.
pub(super) struct Simulator {
    rng: ChaCha8Rng,
    pub shop: Shop,
    /// Number of the last simulated transaction (0 before the first).
    pub tx: u64,
    /// Changes simulated so far, including those of `plan`.
    pub total: u64,
    /// The last simulated transaction.
    pub plan: Vec<Planned>,
}

impl Simulator {
    pub fn new(seed: u64) -> Self {
        Simulator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            shop: Shop {
                customers: KeySpace::new(CUSTOMER_KEYS),
                orders: KeySpace::new(ORDER_KEYS),
                order_rows: vec![OrderRow::default(); ORDER_KEYS as usize + 1],
                customer_writes: vec![Write::default(); CUSTOMER_KEYS as usize + 1],
                order_writes: vec![Write::default(); ORDER_KEYS as usize + 1],
                item_writes: vec![Write::default(); ORDER_KEYS as usize * MAX_LINES as usize],
            },
            tx: 0,
            total: 0,
            plan: Vec::with_capacity(MAX_TX_CHANGES),
        }
    }

    /// Simulates transactions until at least `max_changes` changes happened.
    pub fn run_to(&mut self, max_changes: u64) {
        while self.total < max_changes {
            self.step();
        }
    }

    /// Simulates the next transaction into `plan` (1..=6 changes) and returns its number.
    pub fn step(&mut self) -> u64 {
        self.tx += 1;
        self.plan.clear();
        // Growth turns into pruning as a table fills up, so the tables hover
        // well below capacity and inserts, deletes and re-inserts keep coming
        // however long the stream runs.
        match self.rng.random_range(0..100) {
            0..25 if self.shop.orders.crowded(&mut self.rng) => self.delete_order(),
            0..25 => self.new_order(),
            25..45 => self.progress_order(),
            45..55 if self.shop.customers.crowded(&mut self.rng) => self.delete_customer(),
            45..55 => self.signup(),
            55..70 => self.update_customers(),
            70..83 => self.change_items(),
            83..91 => self.delete_order(),
            91..95 => self.delete_customer(),
            _ => self.mixed(),
        }
        if self.plan.is_empty() {
            // The chosen story had nothing to act on; a customer can always change.
            self.touch_customer();
        }
        debug_assert!((1..=MAX_TX_CHANGES).contains(&self.plan.len()));
        self.total += self.plan.len() as u64;
        self.tx
    }

    fn chance(&mut self, percent: u32) -> bool {
        chance(&mut self.rng, percent)
    }

    /// A number in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    fn emit(&mut self, table: Table, op: Op, id: u32, line: u8) {
        let at = Write {
            tx: self.tx,
            ordinal: self.plan.len() as u32,
        };
        let shop = &mut self.shop;
        let mut order = OrderRow::default();
        match table {
            Table::Customers => shop.customer_writes[id as usize] = at,
            Table::Orders => {
                shop.order_writes[id as usize] = at;
                order = shop.order_rows[id as usize];
            }
            Table::Items => shop.item_writes[item_slot(id, line)] = at,
        }
        self.plan.push(Planned {
            table,
            op,
            id,
            line,
            order,
        });
    }

    fn random_order(&mut self) -> Option<u32> {
        self.shop.orders.random_live(&mut self.rng)
    }

    fn random_customer(&mut self) -> Option<u32> {
        self.shop.customers.random_live(&mut self.rng)
    }

    fn insert_customer(&mut self) -> Option<u32> {
        let id = self.shop.customers.insertable(&mut self.rng)?;
        self.shop.customers.insert(id);
        self.emit(Table::Customers, Op::Insert, id, 0);
        Some(id)
    }

    /// Updates a random customer, or signs one up if there is none.
    fn touch_customer(&mut self) {
        match self.random_customer() {
            Some(id) => self.emit(Table::Customers, Op::Update, id, 0),
            None => {
                self.insert_customer();
            }
        }
    }

    fn add_line(&mut self, order: u32) {
        let row = &mut self.shop.order_rows[order as usize];
        row.lines += 1;
        let line = row.lines;
        self.emit(Table::Items, Op::Insert, order, line);
    }

    fn update_random_line(&mut self, order: u32) {
        let lines = self.shop.order_rows[order as usize].lines;
        if lines > 0 {
            let line = 1 + self.below(lines.into()) as u8;
            self.emit(Table::Items, Op::Update, order, line);
        }
    }

    fn advance_status(&mut self, order: u32) {
        let status = self.shop.order_rows[order as usize].status;
        let next = match status {
            PENDING | PAID if self.chance(10) => CANCELLED,
            PENDING | PAID | SHIPPED => status + 1,
            DELIVERED if self.chance(20) => REFUNDED,
            final_status => final_status, // only the note and amount change
        };
        self.shop.order_rows[order as usize].status = next;
        self.emit(Table::Orders, Op::Update, order, 0);
    }

    /// A new order with its items, sometimes from a customer signing up in the same transaction.
    fn new_order(&mut self) {
        let Some(order) = self.shop.orders.insertable(&mut self.rng) else {
            return;
        };
        let existing = self.random_customer();
        let customer = match existing {
            Some(id) if !self.chance(15) => id,
            _ => match self.insert_customer().or(existing) {
                Some(id) => id,
                None => return,
            },
        };
        self.shop.orders.insert(order);
        self.shop.order_rows[order as usize] = OrderRow {
            customer,
            status: PENDING,
            lines: 0,
            placed_tx: self.tx,
        };
        self.emit(Table::Orders, Op::Insert, order, 0);
        // At most two changes precede the lines (a signup and the order), so
        // there is always room for at least one.
        let room = (MAX_TX_CHANGES - self.plan.len()).min(MAX_LINES.into());
        for _ in 0..=self.below(room) {
            self.add_line(order);
        }
    }

    /// An order moves on, often together with a change to its customer.
    fn progress_order(&mut self) {
        let Some(order) = self.random_order() else {
            return;
        };
        let customer = self.shop.order_rows[order as usize].customer;
        if self.shop.customers.is_live(customer) && self.chance(50) {
            self.emit(Table::Customers, Op::Update, customer, 0);
        }
        self.advance_status(order);
    }

    fn signup(&mut self) {
        for _ in 0..=self.below(2) {
            self.insert_customer();
        }
    }

    /// Several customer updates, sometimes to the same customer twice.
    fn update_customers(&mut self) {
        for _ in 0..=self.below(3) {
            if let Some(id) = self.random_customer() {
                self.emit(Table::Customers, Op::Update, id, 0);
            }
        }
    }

    /// An item is added, removed or changed, and the order's amount often follows.
    fn change_items(&mut self) {
        let Some(order) = self.random_order() else {
            return;
        };
        let lines = self.shop.order_rows[order as usize].lines;
        if lines == 0 || (lines < MAX_LINES && self.chance(40)) {
            self.add_line(order);
        } else if self.chance(30) {
            self.emit(Table::Items, Op::Delete, order, lines);
            self.shop.order_rows[order as usize].lines -= 1;
        } else {
            self.update_random_line(order);
        }
        if self.chance(50) {
            self.emit(Table::Orders, Op::Update, order, 0);
        }
    }

    /// An order is deleted together with its items.
    fn delete_order(&mut self) {
        let Some(order) = self.random_order() else {
            return;
        };
        for line in (1..=self.shop.order_rows[order as usize].lines).rev() {
            self.emit(Table::Items, Op::Delete, order, line);
        }
        self.shop.order_rows[order as usize].lines = 0;
        self.shop.orders.delete(order);
        self.emit(Table::Orders, Op::Delete, order, 0);
    }

    fn delete_customer(&mut self) {
        if let Some(id) = self.random_customer() {
            self.shop.customers.delete(id);
            self.emit(Table::Customers, Op::Delete, id, 0);
        }
    }

    /// Unrelated single-row changes that happened to commit together.
    fn mixed(&mut self) {
        for _ in 0..2 + self.below(4) {
            match self.below(4) {
                0 => self.touch_customer(),
                1 => {
                    self.insert_customer();
                }
                2 => {
                    if let Some(order) = self.random_order() {
                        self.advance_status(order);
                    }
                }
                _ => {
                    if let Some(order) = self.random_order() {
                        self.update_random_line(order);
                    }
                }
            }
        }
    }
}
