//! The webhook sink against a real receiver: an HTTP/1.1 server on
//! 127.0.0.1 started by each test, answering as the test scripts it and
//! recording every request it read. The sink runs natively through
//! `NativeSink`, with the same grant rules as the host.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};
use weir_sdk::arrow_array::{ArrayRef, BinaryArray, Int64Array, StringArray};
use weir_sdk::native::{NativeSink, encode_ipc};
use weir_sdk::{BatchMeta, CommitRequest, RecordBatch, SinkError, Table};
use weir_webhook_sink::WebhookSink;

/// How the receiver answers one request.
#[derive(Debug, Clone)]
enum Answer {
    /// This status, with this body.
    Status(u16, &'static str),
    /// Read the request, then say nothing for this long and hang up.
    Silence(Duration),
}

/// One request as the receiver read it.
#[derive(Debug, Clone, PartialEq)]
struct Received {
    request_line: String,
    /// Names in lower case, in the order sent.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn key(&self) -> &str {
        self.header("idempotency-key").expect("an Idempotency-Key")
    }

    fn rows(&self) -> Vec<Value> {
        std::str::from_utf8(&self.body)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// The receiver under test. Answers from its script, then 200; stops and
/// joins its thread on drop, also when a test panics.
struct Receiver {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Answer>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, script, stop) = (received.clone(), script.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let answer = script
                                .lock()
                                .unwrap()
                                .pop_front()
                                .unwrap_or(Answer::Status(200, "ok"));
                            // Its own thread: a silent answer must not
                            // hold up the next request (the retry).
                            let received = received.clone();
                            thread::spawn(move || serve(stream, answer, &received));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => panic!("receiver: {e}"),
                    }
                }
            })
        };
        Receiver {
            port,
            received,
            script,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn grant(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn answer(&self, answers: impl IntoIterator<Item = Answer>) {
        self.script.lock().unwrap().extend(answers);
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request from `stream`, records it, then answers it (in
/// that order: once the client has its answer, the test may look).
/// Gives up quietly when the client hangs up before a whole request.
fn serve(stream: TcpStream, answer: Answer, received: &Mutex<Vec<Received>>) -> Option<()> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(&stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    received.lock().unwrap().push(Received {
        request_line: request_line.trim_end().to_string(),
        headers,
        body,
    });
    match answer {
        Answer::Status(status, text) => {
            let reply = format!(
                "HTTP/1.1 {status} Scripted\r\nContent-Type: text/plain\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
            let _ = (&stream).write_all(reply.as_bytes());
        }
        Answer::Silence(duration) => thread::sleep(duration),
    }
    Some(())
}

const ORDERS: &str = "public.orders";
const CUSTOMERS: &str = "public.customers";

fn blob_root(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("weir-webhook-test-{name}-{}", std::process::id()))
}

/// A sink granted to reach `receiver`, opened with `config` (plus `url`).
fn sink(name: &str, receiver: &Receiver, config: &[(&str, &str)]) -> NativeSink<WebhookSink> {
    let mut sink =
        NativeSink::new(WebhookSink::default(), blob_root(name)).grant_http(&receiver.grant());
    open(&mut sink, &receiver.url(), config).unwrap();
    sink
}

fn open(
    sink: &mut NativeSink<WebhookSink>,
    url: &str,
    config: &[(&str, &str)],
) -> weir_sdk::Result<()> {
    let mut entries = vec![("url".to_string(), url.to_string())];
    entries.extend(config.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    sink.open("p1", &entries)
}

/// Rows `(id, name, op)`; a row's position is its id, big-endian.
fn rows(rows: &[(i64, Option<&str>, &str)]) -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))) as ArrayRef,
        ),
        (
            "__op",
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))) as ArrayRef,
        ),
        (
            "__pos",
            Arc::new(BinaryArray::from_iter_values(
                rows.iter().map(|r| r.0.to_be_bytes()),
            )) as ArrayRef,
        ),
    ])
    .unwrap()
}

fn write(
    sink: &mut NativeSink<WebhookSink>,
    table: &str,
    id: &str,
    low: &[u8],
    high: &[u8],
    records: &RecordBatch,
) {
    let meta = BatchMeta {
        table: Table::new(table),
        id: id.into(),
        low: low.to_vec(),
        high: high.to_vec(),
        rows: records.num_rows() as u32,
    };
    sink.write(meta, &encode_ipc(records)).unwrap();
}

fn commit(sink: &mut NativeSink<WebhookSink>, table: &str) -> weir_sdk::Result<()> {
    sink.commit(CommitRequest {
        table: table.into(),
        high: vec![0xFF],
        pipeline: "p1".into(),
        epoch: 1,
    })
}

#[test]
fn every_batch_arrives_with_its_id_positions_and_rows() {
    let receiver = Receiver::start();
    let mut sink = sink(
        "arrives",
        &receiver,
        &[("headers.Authorization", "Bearer t0ken")],
    );
    write(
        &mut sink,
        ORDERS,
        "orders-1",
        &[0x00, 0x01],
        &[0x00, 0x02],
        &rows(&[(1, Some("ann"), "insert"), (2, Some("bob"), "update")]),
    );
    write(
        &mut sink,
        CUSTOMERS,
        "customers-1",
        &[0x00, 0x05],
        &[0x00, 0x06],
        &rows(&[(9, Some("cy"), "read")]),
    );
    write(
        &mut sink,
        ORDERS,
        "orders-2",
        &[0x00, 0x03],
        &[0xAB, 0xCD],
        &rows(&[(1, None, "delete")]),
    );
    // Nothing leaves before the commit.
    assert!(receiver.received().is_empty());

    commit(&mut sink, ORDERS).unwrap();
    let got = receiver.received();
    assert_eq!(
        got.iter().map(Received::key).collect::<Vec<_>>(),
        ["orders-1", "orders-2"]
    );
    let first = &got[0];
    assert_eq!(first.request_line, "POST /hook HTTP/1.1");
    for (name, value) in [
        ("content-type", "application/x-ndjson"),
        ("weir-pipeline", "p1"),
        ("weir-table", ORDERS),
        ("weir-destination", ORDERS),
        ("weir-position-low", "0001"),
        ("weir-position-high", "0002"),
        ("weir-rows", "2"),
        ("authorization", "Bearer t0ken"),
    ] {
        assert_eq!(
            first.header(name),
            Some(value),
            "{name}: {:?}",
            first.headers
        );
    }
    assert_eq!(
        first.rows(),
        [
            json!({"id": 1, "name": "ann", "__op": "insert", "__pos": "0000000000000001"}),
            json!({"id": 2, "name": "bob", "__op": "update", "__pos": "0000000000000002"}),
        ]
    );
    let second = &got[1];
    assert_eq!(second.header("weir-position-low"), Some("0003"));
    assert_eq!(second.header("weir-position-high"), Some("abcd"));
    // A delete carries its key; its other columns are null, and say so.
    assert_eq!(
        second.rows(),
        [json!({"id": 1, "name": null, "__op": "delete", "__pos": "0000000000000001"})]
    );

    commit(&mut sink, CUSTOMERS).unwrap();
    let got = receiver.received();
    assert_eq!(got.len(), 3);
    assert_eq!(got[2].key(), "customers-1");
    assert_eq!(got[2].header("weir-table"), Some(CUSTOMERS));

    // Delivered batches are not sent again; an empty commit sends nothing.
    commit(&mut sink, ORDERS).unwrap();
    commit(&mut sink, CUSTOMERS).unwrap();
    assert_eq!(receiver.received().len(), 3);

    // Many batches: every id arrives once, in position order; batches
    // without rows are not sent.
    let ids: Vec<String> = (0..25).map(|i| format!("orders-b{i:03}")).collect();
    for (i, id) in ids.iter().enumerate() {
        write(
            &mut sink,
            ORDERS,
            id,
            &[i as u8],
            &[i as u8 + 1],
            &rows(&[(i as i64, Some("r"), "insert")]),
        );
    }
    write(&mut sink, ORDERS, "orders-empty", &[99], &[100], &rows(&[]));
    commit(&mut sink, ORDERS).unwrap();
    let keys: Vec<String> = receiver.received()[3..]
        .iter()
        .map(|r| r.key().to_string())
        .collect();
    assert_eq!(keys, ids);
}

#[test]
fn a_replay_carries_the_same_id_and_body() {
    let receiver = Receiver::start();
    let batch = rows(&[(7, Some("g"), "insert"), (8, None, "delete")]);
    for run in ["first-run", "after-restart"] {
        // A fresh instance, as after a crash: the host replays the batch
        // with the same id and rows.
        let mut sink = sink(run, &receiver, &[]);
        write(&mut sink, ORDERS, "orders-7", &[7], &[9], &batch);
        commit(&mut sink, ORDERS).unwrap();
    }
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].key(), "orders-7");
    assert_eq!(got[0], got[1], "a replay must be the same request");
}

#[test]
fn server_errors_are_retried_until_delivered() {
    let receiver = Receiver::start();
    receiver.answer([
        Answer::Status(503, "busy, come back later"),
        Answer::Status(429, "slow down"),
    ]);
    let mut sink = sink("retry", &receiver, &[]);
    write(
        &mut sink,
        ORDERS,
        "orders-1",
        &[1],
        &[2],
        &rows(&[(1, Some("a"), "insert")]),
    );

    let e = commit(&mut sink, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Retryable(_)), "{e}");
    assert!(e.message().contains("503"), "{e}");
    assert!(e.message().contains("busy, come back later"), "{e}");
    assert!(e.message().contains("orders-1"), "{e}");
    let e = commit(&mut sink, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Retryable(_)), "{e}");
    assert!(e.message().contains("429"), "{e}");
    commit(&mut sink, ORDERS).unwrap();

    let got = receiver.received();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|r| r == &got[0]), "retries differ: {got:?}");
    commit(&mut sink, ORDERS).unwrap();
    assert_eq!(receiver.received().len(), 3);
}

#[test]
fn a_retry_sends_only_what_was_not_delivered() {
    let receiver = Receiver::start();
    receiver.answer([Answer::Status(200, "ok"), Answer::Status(500, "oops")]);
    let mut sink = sink("partial", &receiver, &[]);
    for (i, id) in ["orders-1", "orders-2"].into_iter().enumerate() {
        let i = i as u8;
        write(
            &mut sink,
            ORDERS,
            id,
            &[i],
            &[i + 1],
            &rows(&[(i.into(), Some("x"), "insert")]),
        );
    }
    let e = commit(&mut sink, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Retryable(_)), "{e}");
    assert!(e.message().contains("orders-2"), "{e}");
    commit(&mut sink, ORDERS).unwrap();
    let keys: Vec<String> = receiver
        .received()
        .iter()
        .map(|r| r.key().to_string())
        .collect();
    assert_eq!(keys, ["orders-1", "orders-2", "orders-2"]);
}

#[test]
fn a_client_error_is_fatal_with_the_first_body_line() {
    let receiver = Receiver::start();
    receiver.answer([Answer::Status(
        400,
        "row 2: column `name` is too long\nat validate (receiver.js:12)",
    )]);
    let mut sink = sink("client-error", &receiver, &[]);
    write(
        &mut sink,
        ORDERS,
        "orders-1",
        &[1],
        &[2],
        &rows(&[(1, Some("a"), "insert")]),
    );
    let e = commit(&mut sink, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Fatal(_)), "{e}");
    let message = e.message();
    assert!(message.contains("400"), "{message}");
    assert!(
        message.contains("row 2: column `name` is too long"),
        "{message}"
    );
    assert!(!message.contains("receiver.js"), "{message}");
    assert!(message.contains(&receiver.url()), "{message}");
}

#[test]
fn timeouts_and_refused_connections_are_retryable() {
    let receiver = Receiver::start();
    receiver.answer([Answer::Silence(Duration::from_millis(1500))]);
    let mut sink = sink("timeout", &receiver, &[("timeout_ms", "200")]);
    write(
        &mut sink,
        ORDERS,
        "orders-1",
        &[1],
        &[2],
        &rows(&[(1, Some("a"), "insert")]),
    );
    let e = commit(&mut sink, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Retryable(_)), "{e}");
    assert!(e.message().contains("timed out"), "{e}");
    commit(&mut sink, ORDERS).unwrap();
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], got[1]);

    // Nobody listens on the port: bind one, learn it, close it.
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sink = NativeSink::new(WebhookSink::default(), blob_root("refused"))
        .grant_http(&format!("http://127.0.0.1:{port}"));
    open(&mut sink, &format!("http://127.0.0.1:{port}/"), &[]).unwrap();
    write(
        &mut sink,
        ORDERS,
        "orders-1",
        &[1],
        &[2],
        &rows(&[(1, Some("a"), "insert")]),
    );
    let e = commit(&mut sink, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Retryable(_)), "{e}");
}

#[test]
fn an_ungranted_url_is_refused() {
    let receiver = Receiver::start();
    // No grant at all, a grant for another port, and a granted name that
    // resolves to loopback (names reach public addresses only).
    let other_port = format!("http://127.0.0.1:{}", receiver.port.wrapping_add(1).max(1));
    let by_name = format!("http://localhost:{}", receiver.port);
    let cases = [
        (None, receiver.url(), format!("add `{}`", receiver.grant())),
        (
            Some(other_port),
            receiver.url(),
            format!("add `{}`", receiver.grant()),
        ),
        // `localhost` may resolve to 127.0.0.1 or ::1 first.
        (
            Some(by_name.clone()),
            format!("{by_name}/hook"),
            "a loopback address".into(),
        ),
    ];
    for (grant, url, expected) in cases {
        let mut sink = NativeSink::new(WebhookSink::default(), blob_root("ungranted"));
        if let Some(grant) = &grant {
            sink = sink.grant_http(grant);
        }
        open(&mut sink, &url, &[]).unwrap();
        write(
            &mut sink,
            ORDERS,
            "orders-1",
            &[1],
            &[2],
            &rows(&[(1, Some("a"), "insert")]),
        );
        let e = commit(&mut sink, ORDERS).unwrap_err();
        assert!(matches!(e, SinkError::Fatal(_)), "{grant:?}: {e}");
        let message = e.message();
        assert!(
            message.contains(&expected) && message.contains("grants.http"),
            "{grant:?}: {message}"
        );
    }
    assert!(receiver.received().is_empty());
}

#[test]
fn configuration_errors_name_the_key() {
    let receiver = Receiver::start();
    let refused = |url: Option<&str>, config: &[(&str, &str)], needle: &str| {
        let mut sink = NativeSink::new(WebhookSink::default(), blob_root("config"))
            .grant_http(&receiver.grant());
        let mut entries: Vec<(String, String)> = url
            .map(|u| ("url".to_string(), u.to_string()))
            .into_iter()
            .collect();
        entries.extend(config.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let e = sink.open("p1", &entries).unwrap_err();
        assert!(matches!(e, SinkError::Fatal(_)), "{e}");
        assert!(e.message().contains(needle), "{config:?}: {e}");
    };
    let url = receiver.url();
    refused(None, &[], "`url` is required");
    refused(Some("ftp://example.com/"), &[], "http:// or https://");
    refused(Some("http://u:p@example.com/"), &[], "user info");
    refused(Some("not a url"), &[], "`url`");
    refused(Some(&url), &[("timeout_ms", "0")], "`timeout_ms`");
    refused(Some(&url), &[("timeout_ms", "soon")], "`timeout_ms`");
    refused(
        Some(&url),
        &[("headers.idempotency-key", "x")],
        "sets `Idempotency-Key` itself",
    );
    refused(
        Some(&url),
        &[("headers.Content-Type", "text/plain")],
        "sets `Content-Type` itself",
    );
    refused(
        Some(&url),
        &[("header.X-Token", "x")],
        "`header.X-Token` is unknown",
    );
    refused(Some(&url), &[("headers.X-Token", "a\nb")], "X-Token");
    refused(Some(&url), &[("headers.Bad Name", "x")], "Bad Name");
    // A commit before open has no configuration to act on.
    let mut unopened = NativeSink::new(WebhookSink::default(), blob_root("config"));
    let e = commit(&mut unopened, ORDERS).unwrap_err();
    assert!(matches!(e, SinkError::Fatal(_)), "{e}");
}

#[test]
fn abort_drops_the_staged_batches() {
    let receiver = Receiver::start();
    let mut sink = sink("abort", &receiver, &[]);
    write(
        &mut sink,
        ORDERS,
        "orders-1",
        &[1],
        &[2],
        &rows(&[(1, Some("a"), "insert")]),
    );
    sink.abort(ORDERS);
    commit(&mut sink, ORDERS).unwrap();
    assert!(receiver.received().is_empty());
}
