//! Outgoing network access, granted per sink: the `netprobe` fixture
//! reaches for an HTTP server and a TCP server this test starts on the
//! loopback, and every grant path allows what was granted and refuses the
//! rest with an error to the sink and a warning naming the sink, the target
//! and the grant to add. A required sink that is refused stops the run
//! (exit 1); an optional one is disabled and the others go on (exit 3).

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const SEED: u64 = 21;
const CHANGES: u64 = 300;

/// A small HTTP/1.1 server for the probe: `/ok` answers `hello`, `/big`
/// declares and sends 3 MiB, `/big-stream` streams 3 MiB without a length,
/// `/hang` never answers.
fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer(stream));
        }
    });
    port
}

fn answer(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let big = vec![b'x'; 3 << 20];
    let _ = match path {
        "/ok" => stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"),
        "/big" => stream
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    big.len()
                )
                .as_bytes(),
            )
            .and_then(|_| stream.write_all(&big)),
        "/big-stream" => stream
            .write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            .and_then(|_| stream.write_all(&big)),
        "/hang" => {
            std::thread::sleep(Duration::from_secs(60));
            Ok(())
        }
        _ => stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
    };
}

/// A TCP server that answers every line with `PONG`.
fn tcp_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    let _ = writer.write_all(b"PONG\n");
                    line.clear();
                }
            });
        }
    });
    port
}

/// A port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The probe, granted nothing (so it is refused at load: it imports both
/// `wasi:http` and `wasi:sockets`).
fn bare_probe(dir: &Path, kind: &str, target: &str) -> SinkBuilder {
    sink("probe", "weir-fixture-netprobe", dir)
        .config("probe", kind)
        .config("target", target)
}

/// The probe, loadable: each kind of access granted to a port nothing
/// listens on, plus what the test grants.
fn probe(dir: &Path, kind: &str, target: &str) -> SinkBuilder {
    bare_probe(dir, kind, target)
        .grant_http("http://127.0.0.1:1")
        .grant_tcp("127.0.0.1:1")
}

struct Outcome {
    code: Option<i32>,
    report: String,
    result: Option<String>,
    took: Duration,
}

fn run(dir: &Path, probe: SinkBuilder) -> Outcome {
    let pipeline = workload(SEED, CHANGES, 100).sink(probe).write_in(dir);
    let started = Instant::now();
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let took = started.elapsed();
    let result = std::fs::read_to_string(sink_root(dir, "probe").join("probe/result")).ok();
    Outcome {
        code: out.status.code(),
        report: text(&out),
        result,
        took,
    }
}

fn assert_refused(outcome: &Outcome, needles: &[&str]) {
    assert_eq!(outcome.code, Some(1), "{}", outcome.report);
    assert_eq!(
        outcome.result, None,
        "the probe got through: {}",
        outcome.report
    );
    for needle in needles {
        assert!(
            outcome.report.contains(needle),
            "missing {needle:?} in: {}",
            outcome.report
        );
    }
}

#[test]
fn a_granted_http_request_and_tcp_connection_get_through() {
    let dir = tempfile::tempdir().unwrap();
    let http = http_server();
    let tcp = tcp_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "http", &format!("http://127.0.0.1:{http}/ok"))
            .grant_http(&format!("http://127.0.0.1:{http}"))
            .grant_tcp(&format!("127.0.0.1:{tcp}")),
    );
    assert_eq!(outcome.code, Some(0), "{}", outcome.report);
    assert_eq!(outcome.result.as_deref(), Some("status 200 bytes 5"));

    let dir = tempfile::tempdir().unwrap();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "tcp", &format!("127.0.0.1:{tcp}"))
            .grant_tcp(&format!("127.0.0.1:{tcp}")),
    );
    assert_eq!(outcome.code, Some(0), "{}", outcome.report);
    assert_eq!(outcome.result.as_deref(), Some("reply PONG"));
}

#[test]
fn a_plugin_importing_the_network_without_a_grant_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let outcome = run(
        dir.path(),
        bare_probe(dir.path(), "http", "http://127.0.0.1:1/"),
    );
    assert_refused(&outcome, &["weir_fixture_netprobe.wasm", "has no `grants."]);
}

#[test]
fn an_ungranted_http_host_or_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let http = http_server();
    let other = http_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "http", &format!("http://127.0.0.1:{other}/ok"))
            .grant_http(&format!("http://127.0.0.1:{http}")),
    );
    assert_refused(
        &outcome,
        &[
            "HTTP request refused",
            "probe",
            &format!("127.0.0.1:{other}"),
            "grants.http",
        ],
    );
}

#[test]
fn a_granted_name_that_resolves_to_the_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let http = http_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "http", &format!("http://localhost:{http}/ok"))
            .grant_http(&format!("http://localhost:{http}")),
    );
    assert_refused(&outcome, &["HTTP request refused", "localhost", "loopback"]);
}

#[test]
fn a_granted_tcp_name_that_resolves_to_the_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = tcp_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "tcp", &format!("localhost:{tcp}"))
            .grant_tcp(&format!("localhost:{tcp}")),
    );
    assert_refused(
        &outcome,
        &["socket refused", "probe", "localhost", "loopback"],
    );
}

#[test]
fn an_ungranted_tcp_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = tcp_server();
    let other = tcp_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "tcp", &format!("127.0.0.1:{other}"))
            .grant_tcp(&format!("127.0.0.1:{tcp}")),
    );
    assert_refused(
        &outcome,
        &[
            "socket refused",
            "probe",
            &format!("127.0.0.1:{other}"),
            "grants.tcp",
        ],
    );
}

#[test]
fn tcp_connections_past_the_cap_are_refused_and_closed_ones_count_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = tcp_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "tcp-hold", &format!("127.0.0.1:{tcp}"))
            .config("count", "5")
            .grant_tcp(&format!("127.0.0.1:{tcp}"))
            .limit("max_tcp_connections", 3),
    );
    assert_refused(
        &outcome,
        &[
            "TCP socket refused",
            "probe",
            "limits.max_tcp_connections = 3",
            "connection 4",
        ],
    );

    let dir = tempfile::tempdir().unwrap();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "tcp-cycle", &format!("127.0.0.1:{tcp}"))
            .config("count", "5")
            .grant_tcp(&format!("127.0.0.1:{tcp}"))
            .limit("max_tcp_connections", 1),
    );
    assert_eq!(outcome.code, Some(0), "{}", outcome.report);
    assert_eq!(outcome.result.as_deref(), Some("cycled 5"));
}

#[test]
fn udp_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = tcp_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "udp", &format!("127.0.0.1:{tcp}"))
            .grant_tcp(&format!("127.0.0.1:{tcp}")),
    );
    assert_refused(
        &outcome,
        &["socket refused", "may not use UDP", "udp probe"],
    );
}

#[test]
fn listening_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "listen", &format!("127.0.0.1:{port}"))
            .grant_tcp(&format!("127.0.0.1:{port}")),
    );
    assert_refused(&outcome, &["socket refused", "may not listen"]);
}

#[test]
fn a_lookup_of_an_ungranted_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = tcp_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "lookup", "localhost:80").grant_tcp(&format!("127.0.0.1:{tcp}")),
    );
    assert_refused(
        &outcome,
        &["name lookup refused", "`localhost`", "lookup probe"],
    );
}

#[test]
fn a_response_over_the_cap_is_cut() {
    for path in ["/big", "/big-stream"] {
        let dir = tempfile::tempdir().unwrap();
        let http = http_server();
        let outcome = run(
            dir.path(),
            probe(
                dir.path(),
                "http",
                &format!("http://127.0.0.1:{http}{path}"),
            )
            .grant_http(&format!("http://127.0.0.1:{http}"))
            .limit("max_response_mb", 1),
        );
        assert_refused(&outcome, &["limits.max_response_mb", "http probe"]);
    }
}

#[test]
fn a_request_that_hangs_is_cut_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let http = http_server();
    let outcome = run(
        dir.path(),
        probe(dir.path(), "http", &format!("http://127.0.0.1:{http}/hang"))
            .grant_http(&format!("http://127.0.0.1:{http}"))
            .limit("http_first_byte_timeout_ms", 500),
    );
    assert_refused(
        &outcome,
        &["limits.http_first_byte_timeout_ms", "http probe"],
    );
    assert!(
        outcome.took < Duration::from_secs(20),
        "the run took {:?}: {}",
        outcome.took,
        outcome.report
    );
}

#[test]
fn an_optional_sink_refused_is_disabled_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = tcp_server();
    let other = closed_port();
    let pipeline = workload(SEED, CHANGES, 100)
        .sink(sink("exact", "weir-fixture-positioned", dir.path()))
        .sink(
            probe(dir.path(), "tcp", &format!("127.0.0.1:{other}"))
                .grant_tcp(&format!("127.0.0.1:{tcp}"))
                .required(false),
        )
        .write_in(dir.path());
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    assert!(report.contains("socket refused"), "{report}");
    assert_positioned_exact(
        &sink_root(dir.path(), "exact"),
        &expected_state(SEED, CHANGES),
    );
}
