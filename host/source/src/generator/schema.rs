//! The shop's three tables, and how a planned write becomes a [`Change`] of one.

use crate::commit_order::stream_position;
use std::sync::Arc;

use arrow_schema::{DataType, TimeUnit};

use super::simulator::{Planned, Table, Write};
use super::values::{commit_ts, row};
use crate::change::{Change, Column, TableSchema};

/// The generator's customers table (key `id`).
pub const CUSTOMERS: &str = "shop.customers";
/// The generator's orders table (key `id`).
pub const ORDERS: &str = "shop.orders";
/// The generator's order items table (key `order_id`, `line`).
pub const ORDER_ITEMS: &str = "shop.order_items";

/// The schemas of the shop's tables, built once per generator.
pub(super) struct ShopTables {
    pub customers: Arc<TableSchema>,
    pub orders: Arc<TableSchema>,
    pub items: Arc<TableSchema>,
}

impl ShopTables {
    pub fn new() -> Self {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some(crate::change::UTC_ZONE.into()));
        let table = |name: &str, columns: Vec<(&str, DataType, bool)>, key: Vec<usize>| {
            let columns = columns
                .into_iter()
                .map(|(name, data_type, nullable)| Column {
                    name: name.into(),
                    data_type,
                    nullable,
                })
                .collect();
            Arc::new(TableSchema {
                name: name.into(),
                columns,
                key,
            })
        };
        ShopTables {
            customers: table(
                CUSTOMERS,
                vec![
                    ("id", DataType::Int64, false),
                    ("name", DataType::Utf8, false),
                    ("email", DataType::Utf8, true),
                    ("tier", DataType::Utf8, true),
                    ("balance", DataType::Decimal128(12, 2), true),
                    ("active", DataType::Boolean, false),
                    ("signup_date", DataType::Date32, false),
                    ("updated_at", utc, false),
                ],
                vec![0],
            ),
            orders: table(
                ORDERS,
                vec![
                    ("id", DataType::Int64, false),
                    ("customer_id", DataType::Int64, false),
                    ("status", DataType::Utf8, false),
                    ("amount", DataType::Float64, false),
                    ("note", DataType::Utf8, true),
                    (
                        "placed_at",
                        DataType::Timestamp(TimeUnit::Microsecond, None),
                        false,
                    ),
                    ("payload", DataType::Binary, true),
                ],
                vec![0],
            ),
            items: table(
                ORDER_ITEMS,
                vec![
                    ("order_id", DataType::Int64, false),
                    ("line", DataType::Int32, false),
                    ("sku", DataType::Utf8, false),
                    ("qty", DataType::Int32, false),
                    ("unit_price", DataType::Decimal128(10, 2), false),
                ],
                vec![0, 1],
            ),
        }
    }

    pub fn all(&self) -> Vec<Arc<TableSchema>> {
        vec![
            self.customers.clone(),
            self.orders.clone(),
            self.items.clone(),
        ]
    }

    pub fn of(&self, table: Table) -> &Arc<TableSchema> {
        match table {
            Table::Customers => &self.customers,
            Table::Orders => &self.orders,
            Table::Items => &self.items,
        }
    }

    /// The change `planned` makes as the `ordinal`-th change of transaction `tx`.
    pub fn change(&self, seed: u64, planned: &Planned, tx: u64, ordinal: u32) -> Change {
        Change {
            table: self.of(planned.table).clone(),
            op: planned.op,
            pos: stream_position(tx, ordinal),
            commit_ts_micros: commit_ts(tx),
            snapshot: false,
            values: row(seed, planned, Write { tx, ordinal }),
        }
    }
}
