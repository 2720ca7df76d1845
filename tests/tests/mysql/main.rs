//! The MySQL/MariaDB source against a real server (scripts/mariadb starts a
//! private MariaDB; each test makes a database of its own).

#[path = "../common/mod.rs"]
mod common;
#[path = "../mysql_support/mod.rs"]
mod mysql_support;

mod bench;
mod cdc;
mod kills;
mod schema;
mod settings;
mod smoke;
mod stops;
