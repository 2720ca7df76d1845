//! A server the source cannot reach: the failure is one sentence naming
//! where the source tried to connect and why it could not, a wait for a
//! server that is away gives up as soon as the run is asked to stop, and a
//! mistake waiting cannot fix (an unknown role, a missing database) ends
//! the run at once instead of being retried for the reconnect timeout.

use crate::postgres_support;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use postgres_support::*;

/// Far longer than any bound below: a run that ends within them did not
/// wait the reconnect timeout out (the pipeline file sets 60 s).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// A loopback port nothing listens on: bound by this process, then let go.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Waits up to `within` for `needle` in the log at `log`; the log's text.
fn wait_for_log(log: &Path, needle: &str, within: Duration) -> String {
    let started = Instant::now();
    loop {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        if said.contains(needle) || started.elapsed() > within {
            return said;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to `within` for the run to end; how long it took, or None.
fn wait_for_exit(run: &mut Running, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if run.try_wait().unwrap().is_some() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn an_unreachable_server_is_named_with_its_cause_and_sigterm_ends_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let dsn = format!("host=127.0.0.1 port={port} user=weir dbname=weir");
    let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(dir.path(), &dir.path().join("sink"));
    let log = dir.path().join("weir.log");
    let mut run = spawn_weir(&pipeline, &log);

    let expected = format!("cannot connect to Postgres at 127.0.0.1:{port}: connection refused");
    let said = wait_for_log(&log, &expected, Duration::from_secs(20));
    assert!(
        said.contains(&expected),
        "the log does not name the address and the cause ({expected}):\n{said}"
    );
    // Let it wait a few rounds (attempts at about 0, 0.5 and 1.5 s, the
    // next at 3.5 s), so the stop lands in a pause between attempts.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        run.try_wait().unwrap().is_none(),
        "the run ended before the reconnect timeout of {RECONNECT_TIMEOUT:?}:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let attempts = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches(&expected)
        .count();

    Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    // Well inside the reconnect timeout, and inside the 5 s between the
    // longest-spaced attempts: the wait itself was cut short.
    let took = wait_for_exit(&mut run, Duration::from_secs(4));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        took.is_some(),
        "the first SIGTERM did not end the run within 4 s of waiting for the server:\n{said}"
    );
    assert!(
        said.contains("the run was asked to stop"),
        "the run does not say it stopped waiting because it was asked to:\n{said}"
    );
    // Attempts are spaced out (half a second, doubling to 5 s): two and a
    // half seconds of waiting are three attempts (one more for a slow
    // machine), not one per 500 ms.
    assert!(
        (1..=4).contains(&attempts),
        "{attempts} attempts logged in the first seconds of waiting:\n{said}"
    );
    assert!(
        !dir.path().join("sink").exists()
            || std::fs::read_dir(dir.path().join("sink"))
                .unwrap()
                .next()
                .is_none(),
        "the sink was written to although the source was never reached"
    );
}

#[test]
fn an_unknown_role_and_a_missing_database_end_the_run_at_once_naming_them() {
    let pg = cluster();
    let dir = tempfile::tempdir().unwrap();
    for (dsn, expected) in [
        (
            format!(
                "host=127.0.0.1 port={} user=no_such_role dbname=weir",
                pg.port
            ),
            "authentication failed for user `no_such_role`",
        ),
        (
            format!(
                "host=127.0.0.1 port={} user=weir dbname=no_such_db",
                pg.port
            ),
            "database `no_such_db` does not exist",
        ),
    ] {
        let case = dir.path().join(expected.split_whitespace().next().unwrap());
        std::fs::create_dir_all(&case).unwrap();
        let pipeline = PgPipeline::new(&dsn, &["public.t"]).write(&case, &case.join("sink"));
        let log = case.join("weir.log");
        let mut run = spawn_weir(&pipeline, &log);
        let took = wait_for_exit(&mut run, RECONNECT_TIMEOUT / 2);
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            took.is_some(),
            "{dsn}: the run was still retrying after half the reconnect timeout:\n{said}"
        );
        assert!(!run.wait().unwrap().success(), "{dsn}: the run succeeded");
        let at = format!("cannot connect to Postgres at 127.0.0.1:{}", pg.port);
        assert!(
            said.contains(&at) && said.contains(expected),
            "{dsn}: the error does not say `{at}` and `{expected}`:\n{said}"
        );
    }
}
