//! The MySQL/MariaDB source against a real server (scripts/mariadb starts a
//! private MariaDB; each test makes a database of its own).

#[path = "../common/mod.rs"]
mod common;
#[path = "../iceberg_support/mod.rs"]
mod iceberg_support;
#[path = "../mysql_support/mod.rs"]
mod mysql_support;

mod bench;
mod big_tx;
mod cdc;
mod kills;
mod lake;
mod schema;
mod settings;
mod smoke;
mod stops;
