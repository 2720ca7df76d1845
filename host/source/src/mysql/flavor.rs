//! Where MariaDB and Oracle MySQL differ, in one place: how a server says
//! where its binlog ends, how a backfill's snapshot gets its binlog
//! coordinates, and how a transaction's GTID is written. Only the MariaDB
//! side runs against a server in the tests (Debian ships MariaDB); the
//! MySQL side is what MySQL's documentation specifies, unit-tested here,
//! and docs/mysql.md says so.

use std::fmt;

/// The kind of server, from `SELECT VERSION()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    MariaDb,
    /// Oracle MySQL (or a fork that reports a plain MySQL version).
    Mysql {
        major: u32,
        minor: u32,
    },
}

impl Flavor {
    /// `10.11.19-MariaDB-0+deb12u1` is MariaDB; `8.4.3` MySQL 8.4.
    pub fn of(version: &str) -> Flavor {
        if version.to_ascii_lowercase().contains("mariadb") {
            return Flavor::MariaDb;
        }
        let mut numbers = version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().unwrap_or(0));
        Flavor::Mysql {
            major: numbers.next().unwrap_or(0),
            minor: numbers.next().unwrap_or(0),
        }
    }

    /// The statement whose first row is the binlog's current file and
    /// offset: MySQL 8.4 removed `SHOW MASTER STATUS`.
    pub fn binlog_status_sql(self) -> &'static str {
        match self {
            Flavor::Mysql { major, minor } if (major, minor) >= (8, 4) => "SHOW BINARY LOG STATUS",
            _ => "SHOW MASTER STATUS",
        }
    }

    /// The statements that open a backfill's consistent snapshot and tell
    /// its binlog coordinates, then (`after`) what ends any lock taken.
    /// MariaDB reports the snapshot's coordinates without a lock
    /// (`binlog_snapshot_file` / `_position`); MySQL has no such report, so
    /// its tables are locked for as long as it takes to open the snapshot
    /// and read the binlog's end (which needs the RELOAD privilege).
    pub fn snapshot_steps(self) -> SnapshotSteps {
        match self {
            Flavor::MariaDb => SnapshotSteps {
                before: &[
                    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                    "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
                ],
                coordinates: Coordinates::StatusVariables("SHOW STATUS LIKE 'binlog_snapshot_%'"),
                after: &[],
            },
            Flavor::Mysql { .. } => SnapshotSteps {
                before: &[
                    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                    "FLUSH TABLES WITH READ LOCK",
                    "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
                ],
                coordinates: Coordinates::BinlogStatus(self.binlog_status_sql()),
                after: &["UNLOCK TABLES"],
            },
        }
    }
}

/// How a backfill's snapshot is opened (see [`Flavor::snapshot_steps`]).
#[derive(Debug, PartialEq, Eq)]
pub struct SnapshotSteps {
    pub before: &'static [&'static str],
    pub coordinates: Coordinates,
    pub after: &'static [&'static str],
}

/// Where the snapshot's binlog coordinates come from.
#[derive(Debug, PartialEq, Eq)]
pub enum Coordinates {
    /// Rows of (name, value): `binlog_snapshot_file`, `binlog_snapshot_position`.
    StatusVariables(&'static str),
    /// The first row's file and offset.
    BinlogStatus(&'static str),
}

/// A transaction's global id, as its server wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gtid {
    /// MariaDB: domain, server id, sequence number (`0-1-42`).
    MariaDb { domain: u32, server: u32, seq: u64 },
    /// MySQL: the source server's UUID and the transaction's number.
    Mysql { sid: [u8; 16], gno: u64 },
}

impl Gtid {
    /// A MariaDB GTID event's body: the sequence number (8 bytes) and the
    /// domain (4), little-endian; the server id is the event header's.
    pub fn of_mariadb_event(body: &[u8], server: u32) -> Option<Gtid> {
        let seq = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
        let domain = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?);
        Some(Gtid::MariaDb {
            domain,
            server,
            seq,
        })
    }
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gtid::MariaDb {
                domain,
                server,
                seq,
            } => write!(f, "{domain}-{server}-{seq}"),
            Gtid::Mysql { sid, gno } => {
                let hex = hex::encode(sid);
                write!(
                    f,
                    "{}-{}-{}-{}-{}:{gno}",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_told_apart_by_their_version() {
        assert_eq!(
            Flavor::of("10.11.19-MariaDB-0+deb12u1-log"),
            Flavor::MariaDb
        );
        assert_eq!(Flavor::of("5.5.5-10.11.6-MariaDB"), Flavor::MariaDb);
        assert_eq!(Flavor::of("8.0.39"), Flavor::Mysql { major: 8, minor: 0 });
        assert_eq!(
            Flavor::of("8.4.3-commercial"),
            Flavor::Mysql { major: 8, minor: 4 }
        );
        assert_eq!(Flavor::MariaDb.binlog_status_sql(), "SHOW MASTER STATUS");
        assert_eq!(
            Flavor::of("8.0.39").binlog_status_sql(),
            "SHOW MASTER STATUS"
        );
        assert_eq!(
            Flavor::of("8.4.0").binlog_status_sql(),
            "SHOW BINARY LOG STATUS"
        );
        assert_eq!(
            Flavor::of("9.1.0").binlog_status_sql(),
            "SHOW BINARY LOG STATUS"
        );
    }

    #[test]
    fn only_mysql_locks_the_tables_to_open_a_snapshot_and_always_unlocks() {
        let maria = Flavor::MariaDb.snapshot_steps();
        assert!(!maria.before.iter().any(|s| s.contains("LOCK")));
        assert!(maria.after.is_empty());
        assert!(matches!(maria.coordinates, Coordinates::StatusVariables(_)));
        let mysql = Flavor::of("8.4.1").snapshot_steps();
        let lock = mysql
            .before
            .iter()
            .position(|s| *s == "FLUSH TABLES WITH READ LOCK");
        let snapshot = mysql
            .before
            .iter()
            .position(|s| s.starts_with("START TRANSACTION"));
        assert!(
            lock < snapshot,
            "the lock is taken before the snapshot opens"
        );
        assert_eq!(
            mysql.coordinates,
            Coordinates::BinlogStatus("SHOW BINARY LOG STATUS")
        );
        assert_eq!(mysql.after, ["UNLOCK TABLES"]);
    }

    #[test]
    fn gtids_print_as_their_servers_print_them() {
        let mut body = Vec::new();
        body.extend_from_slice(&42u64.to_le_bytes());
        body.extend_from_slice(&3u32.to_le_bytes());
        body.push(1);
        let gtid = Gtid::of_mariadb_event(&body, 7).unwrap();
        assert_eq!(gtid.to_string(), "3-7-42");
        assert_eq!(Gtid::of_mariadb_event(&body[..10], 7), None);
        let sid: [u8; 16] = hex::decode("3e11fa47716711e19b4d0800200c9a66")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            Gtid::Mysql { sid, gno: 5 }.to_string(),
            "3e11fa47-7167-11e1-9b4d-0800200c9a66:5"
        );
    }
}
