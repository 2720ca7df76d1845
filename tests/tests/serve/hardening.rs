//! `weir serve` against a hostile client or tenant (docs/serve.md, "Bounds"):
//! uploads counted against the tenant's quota and never kept when refused,
//! old plugin versions pruned, the watcher never taking an unreadable
//! folder for a removed file nor reading an oversized file whole, bodies
//! refused from their headers (no token, a declared length over the bound),
//! slow and idle clients cut at the timeouts while others are answered,
//! connections capped per client, `.` and `..` refused as names, and
//! `/metrics` behind a token.

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::files_in;
use common::*;

const TENANT_A: &str = "A";
const TENANT_B: &str = "B";
const SINK: &str = "lake";

// ---------------------------------------------------------------------------
// Raw HTTP: requests ureq would not send (dot paths, a declared length with
// no body, bodies trickled or cut off) and connections held open.
// ---------------------------------------------------------------------------

fn connect(host: &ServeHost) -> TcpStream {
    let address = host.base_url().trim_start_matches("http://").to_string();
    let stream = TcpStream::connect(&address).unwrap_or_else(|e| panic!("connect {address}: {e}"));
    stream.set_nodelay(true).unwrap();
    stream
}

/// The head of a request, with a bearer token when given.
fn head(method: &str, path: &str, token: Option<&str>, length: Option<u64>) -> String {
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: weir\r\n");
    if let Some(token) = token {
        text += &format!("Authorization: Bearer {token}\r\n");
    }
    if let Some(length) = length {
        text += &format!("Content-Length: {length}\r\n");
    }
    text + "\r\n"
}

/// Reads what the server sends until it closes the connection or a whole
/// answer (by its Content-Length) arrived; the status code and the text.
/// `None` when the connection closed before a status line came.
fn read_answer(stream: &mut TcpStream, timeout: Duration) -> Option<(u16, String)> {
    stream.set_read_timeout(Some(timeout)).unwrap();
    let mut bytes = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!(
                    "no answer within {timeout:?}; so far: {:?}",
                    String::from_utf8_lossy(&bytes)
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                panic!(
                    "no answer within {timeout:?}; so far: {:?}",
                    String::from_utf8_lossy(&bytes)
                )
            }
            Err(_) => break,
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let code = text.split(' ').nth(1)?.parse().ok()?;
    Some((code, text))
}

/// One request on a new connection, its answer.
fn raw_request(
    host: &ServeHost,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let mut stream = connect(host);
    stream
        .write_all(head(method, path, token, Some(body.len() as u64)).as_bytes())
        .unwrap();
    stream.write_all(body).unwrap();
    read_answer(&mut stream, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{method} {path}: closed without an answer"))
}

/// How long after `since` the server closed `stream` (read end or reset);
/// `None` if it was still open at `bound` after `since`.
fn closed_after(stream: &mut TcpStream, since: Instant, bound: Duration) -> Option<Duration> {
    let mut buffer = [0u8; 4096];
    loop {
        let left = bound.checked_sub(since.elapsed())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match stream.read(&mut buffer) {
            Ok(0) => return Some(since.elapsed()),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(since.elapsed()),
        }
    }
}

/// A line of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn uploads_dir(host: &ServeHost, tenant: &str) -> PathBuf {
    host.dir()
        .join("state/tenants")
        .join(tenant)
        .join("plugins")
}

fn positioned_pipeline(name: &str, seed: u64, changes: u64, pace_us: u64) -> PipelineBuilder {
    PipelineBuilder::generator(seed, changes)
        .name(name)
        .pace_us(pace_us)
        .max_rows(100)
        .linger_ms(20)
        .heartbeat_ms(200)
        .sink(
            SinkBuilder::new(SINK, plugin("weir-fixture-positioned"))
                .limits(64, 30_000)
                .retries(1),
        )
}

/// Random bytes: no plugin, and no two alike.
fn random_bytes(len: usize) -> Vec<u8> {
    use rand::RngCore as _;
    let mut bytes = vec![0u8; len];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

// ---------------------------------------------------------------------------
// Uploads
// ---------------------------------------------------------------------------

/// Tenant A's quota: two versions of the positioned fixture (2.5 MB each)
/// and its sink's commits fit; 12 MiB more does not, though 12 MiB alone does.
const A_MAX_STORED_MB: u64 = 16;
const RANDOM_UPLOAD: usize = 12 << 20;

#[test]
fn uploads_count_against_the_quota_refused_ones_are_not_kept_and_old_versions_are_pruned() {
    const PIPELINE: &str = "orders";
    const SEED: u64 = 23;
    const CHANGES: u64 = 6_000;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A).max_stored_mb(A_MAX_STORED_MB))
        .start();
    let token = host.token(TENANT_A);
    let pipeline = positioned_pipeline(PIPELINE, SEED, CHANGES, 2_000);
    let reply = host.deploy(TENANT_A, &pipeline, token);
    assert!(reply.is_success(), "deploying A/orders: {reply}");
    host.wait_for_state(TENANT_A, PIPELINE, "running", Duration::from_secs(60));
    let uploads = uploads_dir(&host, TENANT_A);

    // Refused as plugins (under the quota): nothing kept, not even a
    // temporary file.
    for attempt in 1..=3 {
        let reply = host.replace_plugin(
            TENANT_A,
            PIPELINE,
            SINK,
            &random_bytes(RANDOM_UPLOAD),
            None,
            token,
        );
        assert_eq!(reply.code, 422, "random upload {attempt}: {reply}");
        assert_eq!(
            files_in(&uploads),
            Vec::<String>::new(),
            "random upload {attempt} was kept in {}",
            uploads.display()
        );
    }

    // Three versions in turn: the current one and its rollback target are
    // kept, the first is pruned.
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    let versions: Vec<Vec<u8>> = (1..=3u8)
        .map(|n| with_custom_section(&honest, "weir-test-version", &[n]))
        .collect();
    let file_of = |v: &[u8]| format!("{}.wasm", sha256_hex(v));
    for (i, version) in versions.iter().enumerate() {
        let reply = host.replace_plugin(TENANT_A, PIPELINE, SINK, version, None, token);
        assert!(reply.is_success(), "version {}: {reply}", i + 1);
    }
    let mut expected = vec![file_of(&versions[1]), file_of(&versions[2])];
    expected.sort();
    assert_eq!(
        files_in(&uploads),
        expected,
        "after three versions the uploads hold more than the current one and its rollback target"
    );
    let reply = host.rollback(TENANT_A, PIPELINE, SINK, token);
    assert!(reply.is_success(), "rollback: {reply}");
    assert_eq!(reply.json()["sha256"], sha256_hex(&versions[1]), "{reply}");
    assert_eq!(files_in(&uploads), expected, "a rollback removed a version");

    // With two versions kept, 12 MiB more is over the quota: refused as
    // such before it is loaded, and not kept.
    let reply = host.replace_plugin(
        TENANT_A,
        PIPELINE,
        SINK,
        &random_bytes(RANDOM_UPLOAD),
        None,
        token,
    );
    assert_eq!(reply.code, 409, "an upload over the quota: {reply}");
    assert!(
        reply.error().contains("tenants.A.max_stored_mb"),
        "the refusal does not name the quota: {reply}"
    );
    assert_eq!(
        files_in(&uploads),
        expected,
        "the upload over the quota was kept"
    );

    host.wait_for_state(TENANT_A, PIPELINE, "finished", Duration::from_secs(300));
    assert_positioned_exact(
        &host.sink_root(TENANT_A, PIPELINE, SINK),
        &expected_state(SEED, CHANGES),
    );
}

// ---------------------------------------------------------------------------
// The watcher
// ---------------------------------------------------------------------------

/// The host's descriptor limit in the exhaustion test: enough to start and
/// run a pipeline, few enough for the test to take the rest.
const OPEN_FILES: u64 = 512;

#[test]
fn the_watcher_leaves_pipelines_alone_while_the_host_is_out_of_descriptors() {
    const PIPELINE: &str = "orders";
    const SEED: u64 = 31;
    // About 1,600 transactions 4 ms apart: it runs through the exhaustion.
    const CHANGES: u64 = 4_000;
    const HOLD: Duration = Duration::from_secs(3);
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A))
        .tenant(Tenant::new(TENANT_B))
        .watch_interval_ms(100)
        // Failures for want of descriptors back off briefly and never park.
        .restart(200, 500, 1_000)
        .max_open_files(OPEN_FILES)
        // Every connection the test opens is held, not cut or capped: the
        // point is to run the host out of descriptors.
        .admin("max_connections", 100_000)
        .admin("max_connections_per_client", 100_000)
        .admin("header_timeout_ms", 600_000)
        .admin("idle_timeout_ms", 600_000)
        .start();
    let reply = host.deploy(
        TENANT_B,
        &positioned_pipeline(PIPELINE, SEED, CHANGES, 4_000),
        host.token(TENANT_B),
    );
    assert!(reply.is_success(), "deploying B/orders: {reply}");
    host.wait_for_state(TENANT_B, PIPELINE, "running", Duration::from_secs(60));

    // Connections the host accepts until it has no descriptor left: it
    // holds all it may, or it said an accept failed for want of one (a
    // descriptor a failing run gives back and takes again can keep the
    // count just under the limit; more connections would then only fill
    // the listen queue, whose overflow the kernel leaves unanswered).
    let pid = host.pid();
    let mut held = Vec::new();
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let out_of_descriptors = || {
        host.log()
            .lines()
            .any(|l| l.contains("cannot accept a connection") && l.contains("os error 24"))
    };
    while most < OPEN_FILES as usize && !out_of_descriptors() {
        assert!(
            Instant::now() < deadline,
            "the host holds only {most} descriptors of {OPEN_FILES} after {} connections",
            held.len()
        );
        for _ in 0..16 {
            held.push(connect(&host));
        }
        std::thread::sleep(Duration::from_millis(20));
        most = most.max(open_descriptors(pid));
    }
    std::thread::sleep(HOLD);
    let still = open_descriptors(pid);
    let connections = held.len();
    drop(held);

    let finished = host.wait_for_state(TENANT_B, PIPELINE, "finished", Duration::from_secs(300));
    let log = host.log();
    let created = log
        .lines()
        // The log is coloured: the line's parts are found one by one.
        .filter(|l| l.contains(" created ") && l.contains("B/orders"))
        .count();
    let removed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pipeline file removed"))
        .collect();
    assert_eq!(
        (created, removed.as_slice()),
        (1, &[][..]),
        "B/orders was deleted or created again while the host was out of descriptors\n{}",
        host.log_tail(60)
    );
    assert_positioned_exact(
        &host.sink_root(TENANT_B, PIPELINE, SINK),
        &expected_state(SEED, CHANGES),
    );
    println!(
        "descriptors: the host held {most} of {OPEN_FILES} through {} connections (still {still} \
         after {HOLD:?}); B/orders created once, finished exact (status {finished})",
        connections
    );
}

#[test]
fn an_oversized_pipeline_file_is_refused_without_being_read() {
    const SIZE: u64 = 200 << 20;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A))
        .watch_interval_ms(100)
        .start();
    let pid = host.pid();
    let resident_before = memory_kib(pid, "VmRSS");
    // Sparse: 200 MB of zeros (valid text) that take no disk.
    let file = host.pipelines_dir(TENANT_A).join("big.yaml");
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let reply = host.get("/ready");
        if reply.body.contains("big.yaml") {
            break reply;
        }
        assert!(
            Instant::now() < deadline,
            "/ready never names big.yaml: {reply}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(reply.code, 503, "{reply}");
    let rejected = &reply.json()["rejected"];
    let why = rejected[0]["error"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("{SIZE} bytes")) && why.contains("1024 KiB"),
        "the refusal does not say the file is too large: {reply}"
    );
    // The tenant's own list names the refused file and why, as /ready does.
    let listed = host.list(host.token(TENANT_A));
    assert_eq!(listed.code, 200, "{listed}");
    assert_eq!(listed.json()["rejected"], *rejected, "{listed}");
    // Bound: a tenth of the file. Reading it whole takes all of it.
    let peak = memory_kib(pid, "VmHWM");
    let grown_kib = peak.saturating_sub(resident_before);
    assert!(
        grown_kib < (SIZE >> 10) / 10,
        "the host's peak resident set grew {grown_kib} KiB over the {resident_before} KiB it \
         held before: the file was read"
    );
    // Removed, it no longer keeps the host from being ready.
    std::fs::remove_file(&file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.get("/ready").code != 200 {
        assert!(
            Instant::now() < deadline,
            "/ready still refuses after big.yaml went"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// The admin API's bodies and connections
// ---------------------------------------------------------------------------

#[test]
fn bodies_are_refused_from_their_headers_without_a_token_or_over_the_bound() {
    const UPLOADS: usize = 4;
    const UPLOAD: u64 = 250 << 20;
    /// What the four uploads may add to the host's resident set: a tenth
    /// of one of them. Buffering them takes four times the whole.
    const BOUND_KIB: u64 = (UPLOAD >> 10) / 10;
    let host = ServeHost::builder().tenant(Tenant::new(TENANT_A)).start();
    let pid = host.pid();
    let resident_before = memory_kib(pid, "VmRSS");
    let path = "/v1/pipelines/A/orders/sinks/lake/plugin";
    let done = AtomicBool::new(false);
    let (answers, peak_kib) = std::thread::scope(|scope| {
        let uploads: Vec<_> = (0..UPLOADS)
            .map(|_| {
                scope.spawn(|| {
                    let mut stream = connect(&host);
                    stream
                        .write_all(head("PUT", path, None, Some(UPLOAD)).as_bytes())
                        .unwrap();
                    let mut reader = stream.try_clone().unwrap();
                    let answer = std::thread::spawn(move || {
                        read_answer(&mut reader, Duration::from_secs(120))
                    });
                    let chunk = vec![0u8; 64 << 10];
                    let mut sent = 0u64;
                    while sent < UPLOAD && stream.write_all(&chunk).is_ok() {
                        sent += chunk.len() as u64;
                    }
                    (answer.join().unwrap(), sent)
                })
            })
            .collect();
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(memory_kib(pid, "VmRSS"));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        });
        let answers: Vec<_> = uploads.into_iter().map(|u| u.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        (answers, sampler.join().unwrap())
    });
    for (i, (answer, sent)) in answers.iter().enumerate() {
        let (code, text) = answer
            .clone()
            .unwrap_or_else(|| panic!("upload {i}: closed without an answer after {sent} bytes"));
        assert_eq!(code, 401, "upload {i}: {text}");
        assert!(
            *sent < UPLOAD,
            "upload {i}: the host took all {sent} bytes of an unauthenticated body"
        );
    }
    let grown_kib = peak_kib.saturating_sub(resident_before);
    assert!(
        grown_kib < BOUND_KIB,
        "four unauthenticated {UPLOAD}-byte uploads grew the host's resident set by {grown_kib} \
         KiB (from {resident_before} KiB), over the bound of {BOUND_KIB} KiB"
    );

    // A declared length over the route's bound, with the operator's token:
    // 413 from the headers, no body sent.
    for (path, length) in [
        (path, 2u64 << 30),
        ("/v1/pipelines/A/orders", (1 << 20) + 1),
    ] {
        let mut stream = connect(&host);
        stream
            .write_all(head("PUT", path, Some(host.operator_token()), Some(length)).as_bytes())
            .unwrap();
        let (code, text) = read_answer(&mut stream, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("PUT {path} of {length} bytes: closed without an answer"));
        assert_eq!(code, 413, "PUT {path} declaring {length} bytes: {text}");
        assert!(text.contains(&length.to_string()), "{text}");
    }
    let health = host.get("/health");
    assert_eq!(health.code, 200, "{health}");
    println!(
        "bodies: four unauthenticated uploads answered 401 after {:?} bytes; resident {resident_before} \
         KiB before, at most {peak_kib} KiB during",
        answers.iter().map(|(_, sent)| sent).collect::<Vec<_>>()
    );
}

const HEADER_TIMEOUT_MS: u64 = 1_500;
const BODY_TIMEOUT_MS: u64 = 3_000;
const IDLE_TIMEOUT_MS: u64 = 2_000;
/// How long after its timeout a connection may still be open: the host's
/// timers are not exact on a busy machine.
const CUT_SLACK: Duration = Duration::from_secs(5);

/// Writes one byte to `stream` every 300 ms until the server closes it.
fn trickle(mut stream: TcpStream) {
    std::thread::spawn(move || {
        while stream.write_all(b"x").is_ok() {
            std::thread::sleep(Duration::from_millis(300));
        }
    });
}

#[test]
fn slow_and_idle_clients_are_cut_at_the_timeouts_while_others_are_answered() {
    const EACH: usize = 10;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A))
        .admin("header_timeout_ms", HEADER_TIMEOUT_MS)
        .admin("body_timeout_ms", BODY_TIMEOUT_MS)
        .admin("idle_timeout_ms", IDLE_TIMEOUT_MS)
        .start();
    let started = Instant::now();
    // (what, timeout, connection)
    let mut slow: Vec<(&str, u64, TcpStream)> = Vec::new();
    for _ in 0..EACH {
        // Connects and says nothing.
        slow.push(("silent", HEADER_TIMEOUT_MS, connect(&host)));
        // Headers a byte at a time, never ending.
        let mut headers = connect(&host);
        headers
            .write_all(b"GET /health HTTP/1.1\r\nX-Slow: ")
            .unwrap();
        trickle(headers.try_clone().unwrap());
        slow.push(("trickled headers", HEADER_TIMEOUT_MS, headers));
        // A body a byte at a time, with the operator's token.
        let mut body = connect(&host);
        body.write_all(
            head(
                "PUT",
                "/v1/pipelines/A/slow",
                Some(host.operator_token()),
                Some(4096),
            )
            .as_bytes(),
        )
        .unwrap();
        trickle(body.try_clone().unwrap());
        slow.push(("trickled body", BODY_TIMEOUT_MS, body));
        // One answered request, then silence on the kept-alive connection.
        let mut kept = connect(&host);
        kept.write_all(head("GET", "/health", None, None).as_bytes())
            .unwrap();
        let (code, text) = read_answer(&mut kept, Duration::from_secs(30)).unwrap();
        assert_eq!(code, 200, "{text}");
        slow.push(("idle after an answer", IDLE_TIMEOUT_MS, kept));
    }
    // Meanwhile the host answers others.
    assert_eq!(host.get("/health").code, 200);
    let listed = host.list(host.operator_token());
    assert_eq!(listed.code, 200, "{listed}");
    let answered_at = started.elapsed();

    for (what, timeout_ms, stream) in &mut slow {
        let bound = Duration::from_millis(*timeout_ms) + CUT_SLACK;
        let closed = closed_after(stream, started, bound);
        assert!(
            closed.is_some(),
            "a connection with {what} is still open {bound:?} after it started (its timeout is \
             {timeout_ms} ms)"
        );
    }
    assert_eq!(host.get("/health").code, 200);
    println!(
        "timeouts: {} slow connections cut; /health and an authenticated list answered {answered_at:?} \
         into them",
        slow.len()
    );
}

#[test]
fn connections_over_the_per_client_cap_are_closed_unanswered() {
    const PER_CLIENT: usize = 8;
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A))
        .admin("max_connections_per_client", PER_CLIENT as u64)
        .start();
    let ask = |stream: &mut TcpStream| {
        stream
            .write_all(head("GET", "/health", None, None).as_bytes())
            .unwrap();
        read_answer(stream, Duration::from_secs(30))
    };
    // Every connection of the cap answered and kept open. The start-up
    // probe's connection counts until the host has seen it close, which a
    // loaded machine may delay: a full set is tried again for a while
    // before the cap is judged too small.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held: Vec<TcpStream> = loop {
        let mut held: Vec<TcpStream> = (0..PER_CLIENT).map(|_| connect(&host)).collect();
        let unanswered = held
            .iter_mut()
            .enumerate()
            .find_map(|(i, stream)| (ask(stream).map(|a| a.0) != Some(200)).then_some(i));
        match unanswered {
            None => break held,
            Some(i) if Instant::now() >= deadline => {
                panic!("connection {i} of the cap of {PER_CLIENT} was not answered")
            }
            Some(_) => {
                drop(held);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let mut over = connect(&host);
    let answer = ask(&mut over);
    assert!(
        answer.is_none(),
        "a connection over the cap of {PER_CLIENT} was answered: {answer:?}"
    );
    // A place freed is taken again.
    held.pop();
    std::thread::sleep(Duration::from_millis(200));
    let mut again = connect(&host);
    assert_eq!(ask(&mut again).map(|a| a.0), Some(200));
}

// ---------------------------------------------------------------------------
// Names and metrics
// ---------------------------------------------------------------------------

#[test]
fn dot_names_are_refused_through_the_api_and_in_pipeline_files() {
    let host = ServeHost::builder().tenant(Tenant::new(TENANT_A)).start();
    let state_root = host.dir().join("state/tenants/A");
    let before = files_in(&state_root);
    for (path, name) in [
        ("/v1/pipelines/A/..", ".."),
        ("/v1/pipelines/A/.", "."),
        ("/v1/pipelines/A/%2E%2E", ".."),
    ] {
        // The file as the builder writes it, named as the path says.
        let text = positioned_pipeline("placeholder", 1, 10, 0)
            .for_serve()
            .text()
            .replace("placeholder", name);
        for plugin in positioned_pipeline("x", 1, 10, 0).plugins() {
            std::fs::copy(
                plugin,
                host.pipelines_dir(TENANT_A)
                    .join(plugin.file_name().unwrap()),
            )
            .unwrap();
        }
        let (code, answer) = raw_request(
            &host,
            "PUT",
            path,
            Some(host.operator_token()),
            text.as_bytes(),
        );
        assert_eq!(code, 400, "PUT {path}: {answer}");
        assert!(
            answer.contains("pipeline name") && answer.contains(&format!("`{name}`")),
            "PUT {path}: the refusal does not name the name: {answer}"
        );
    }
    assert_eq!(
        files_in(&state_root),
        before,
        "a dot name reached the state folder"
    );

    // A sink named `..` in a pipeline file.
    let pipeline = positioned_pipeline("dotted", 1, 10, 0);
    let text = pipeline
        .clone()
        .for_serve()
        .text()
        .replace(&format!("\"name\": \"{SINK}\""), "\"name\": \"..\"");
    assert!(text.contains("\"name\": \"..\""), "{text}");
    let reply = host.put_pipeline(TENANT_A, "dotted", &text, host.operator_token());
    assert_eq!(reply.code, 400, "a sink named `..`: {reply}");
    assert!(reply.error().contains("sinks[0].name"), "{reply}");
}

#[test]
fn metrics_take_a_token_and_a_tenant_sees_only_its_own_series() {
    let host = ServeHost::builder()
        .tenant(Tenant::new(TENANT_A))
        .tenant(Tenant::new(TENANT_B))
        .start();
    for (tenant, pipeline) in [(TENANT_A, "a-orders"), (TENANT_B, "b-secret")] {
        let reply = host.deploy(
            tenant,
            &positioned_pipeline(pipeline, 3, 200, 0),
            host.token(tenant),
        );
        assert!(reply.is_success(), "{tenant}/{pipeline}: {reply}");
        host.wait_for_state(tenant, pipeline, "finished", Duration::from_secs(120));
    }
    let open = host.get("/metrics");
    assert_eq!(open.code, 401, "/metrics without a token: {open}");
    assert!(!open.body.contains("b-secret"), "{open}");
    let all = host.get_with("/metrics", host.operator_token());
    assert_eq!(all.code, 200, "{all}");
    for needle in ["pipeline=\"a-orders\"", "pipeline=\"b-secret\""] {
        assert!(
            all.body.contains(needle),
            "the operator's page lacks {needle}:\n{}",
            all.body
        );
    }
    let own = host.get_with("/metrics", host.token(TENANT_A));
    assert_eq!(own.code, 200, "{own}");
    assert!(own.body.contains("pipeline=\"a-orders\""), "{}", own.body);
    assert!(
        !own.body.contains("b-secret") && !own.body.contains("tenant=\"B\""),
        "A's page shows B's series:\n{}",
        own.body
    );
    assert!(own.body.ends_with("# EOF\n"), "{}", own.body);
}
