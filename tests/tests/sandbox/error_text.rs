//! What a sink reads of a host error holds nothing of the host's insides:
//! with `RUST_BACKTRACE=1` in the host's environment, wasmtime's errors
//! carry the host's stack backtrace in their `Debug` form, and the text a
//! guest gets of a failed WASI stream (`to-debug-string`) was that form.
//! The `netprobe` fixture reads an HTTP answer the server cuts short and
//! fails with the text it got, which the host reports as the sink's error.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use common::*;

const SEED: u64 = 21;
const CHANGES: u64 = 100;

/// An HTTP server that promises 100 bytes of body, sends 5, and hangs up.
fn short_answer_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nshort",
            );
        }
    });
    port
}

#[test]
fn a_failed_stream_tells_the_guest_no_host_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let port = short_answer_server();
    let probe = sink("probe", "weir-fixture-netprobe", dir.path())
        .config("probe", "http")
        .config("target", &format!("http://127.0.0.1:{port}/"))
        .grant_http(&format!("http://127.0.0.1:{port}"))
        .grant_tcp("127.0.0.1:1");
    let pipeline = workload(SEED, CHANGES, 100)
        .sink(probe)
        .write_in(dir.path());
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("RUST_BACKTRACE", "1"), ("RUST_LIB_BACKTRACE", "1")],
    );
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    // The sink's own error, from the text the host handed it on.
    let marker = "reading the answer failed: ";
    let at = report
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in: {report}"));
    let guest_text = report[at + marker.len()..].lines().next().unwrap_or("");
    assert!(
        guest_text.trim().len() > 3,
        "the host told the sink nothing: {report}"
    );
    let lowered = guest_text.to_lowercase();
    for host_insides in ["stack backtrace", " at /", "rustc/"] {
        assert!(
            !lowered.contains(host_insides),
            "{host_insides:?} reached the sink: {guest_text}"
        );
    }
}
