//! Outgoing network connections, to the hosts the operator granted.
//!
//! A sink reaches a service with an HTTP request ([`http::Request`]) or a
//! TCP connection ([`tcp_connect`]). Nothing is reachable by default: the
//! operator grants each target for this sink in the pipeline,
//!
//! ```yaml
//! grants:
//!   http: ["https://hooks.example.com", "http://[10.0.0.0/8]:8080"]
//!   tcp: ["redis.internal:6379", "10.0.0.0/8:6379"]
//! ```
//!
//! (the patterns are described in [`grants`]). Inside WebAssembly the host
//! checks every request and connection. Natively,
//! [`NativeSink`](crate::native::NativeSink) checks them with the same
//! rules, from the grants given with
//! [`NativeSink::grant_http`](crate::native::NativeSink::grant_http) and
//! [`NativeSink::grant_tcp`](crate::native::NativeSink::grant_tcp), so a
//! test shows which grants the sink needs. A refusal names the target and
//! the grant to add: tell the operator in your sink's documentation which
//! grants it needs.
//!
//! A granted *name* reaches public addresses only: if
//! `hooks.example.com` resolves to a loopback or private address, the
//! connection is refused unless that address (or a range holding it) is
//! granted too. Tests against a server on this machine therefore grant
//! and use the address, `http://127.0.0.1:PORT`, not `localhost`.
//!
//! ```no_run
//! use weir_sdk::net::http::Request;
//!
//! # fn run() -> weir_sdk::Result<()> {
//! let response = Request::post("https://hooks.example.com/weir")
//!     .header("Content-Type", "application/json")
//!     .body(r#"{"hello":"world"}"#)
//!     .send()?;
//! if !response.is_success() {
//!     return Err(weir_sdk::SinkError::Fatal(format!(
//!         "hooks.example.com answered {}",
//!         response.status
//!     )));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Natively this module is a check of grants, not a sandbox: native code
//! can open any socket it likes. The sandbox is the host.
//!
//! A plugin that imports the network is refused at load when its sink has
//! no grant of that kind, so an operator learns of a missing grant at
//! once. A sink that reaches the network only when its configuration asks
//! (say, a catalog that is either files in the blob store or a REST
//! service) declares that kind optional with [`optional_network!`]: it
//! then loads without the grant, and each request it makes is refused,
//! naming the grant to add.

pub mod http;

/// Declares network kinds (`"http"`, `"tcp"`, or both as `"http,tcp"`)
/// that the sink uses only when its configuration asks for them, so that
/// a pipeline that does not use them need not grant them (see the module
/// documentation). Write it once, at the top level of the sink's crate:
///
/// ```
/// weir_sdk::optional_network!("http");
/// ```
///
/// The declaration is a custom section of the component
/// (`weir:optional-network`), read by the host when it loads the plugin;
/// `weir plugin inspect` shows it. Natively it is nothing.
#[macro_export]
macro_rules! optional_network {
    ($kinds:literal) => {
        #[cfg(target_family = "wasm")]
        #[used]
        #[unsafe(link_section = "weir:optional-network")]
        static __WEIR_OPTIONAL_NETWORK: [u8; $kinds.len()] = {
            let text: &[u8] = $kinds.as_bytes();
            let mut bytes = [0u8; $kinds.len()];
            let mut i = 0;
            while i < text.len() {
                bytes[i] = text[i];
                i += 1;
            }
            bytes
        };
    };
}
#[cfg(not(target_arch = "wasm32"))]
mod native;
#[cfg(target_arch = "wasm32")]
mod wasm;

use std::io;
use std::net::TcpStream;

pub use weir_contract::grants;

use grants::Host;
#[cfg(not(target_arch = "wasm32"))]
use native as imp;
#[cfg(target_arch = "wasm32")]
use wasm as imp;

/// Opens a TCP connection to `target`, written `host:port` (an IPv6
/// address in brackets: `[fd00::5]:6379`).
///
/// The target must be granted in `grants.tcp`. A refused target fails
/// with [`io::ErrorKind::PermissionDenied`] and a message naming the grant
/// to add; a malformed one with [`io::ErrorKind::InvalidInput`]. A name
/// with several addresses is tried address by address, as
/// [`TcpStream::connect`] does. In WebAssembly the connection goes
/// through `wasi:sockets`; the host resolves only granted names and
/// connects only to granted addresses.
pub fn tcp_connect(target: &str) -> io::Result<TcpStream> {
    let (host, port) = Host::parse_with_port(target).map_err(|why| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TCP target `{target}` {why}"),
        )
    })?;
    imp::tcp_connect(target, &host, port)
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpListener};

    use super::grants::Grants;
    use super::*;
    use crate::native::with_grants;

    #[test]
    fn tcp_connections_follow_the_grants() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = format!("127.0.0.1:{port}");

        let e = tcp_connect(&target).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let message = e.to_string();
        assert!(
            message.contains(&format!("add `{target}` to grants.tcp")),
            "{message}"
        );
        assert!(message.contains("NativeSink::grant_tcp"), "{message}");

        let granted = Grants::parse([] as [&str; 0], [target.as_str()]).unwrap();
        let mut stream = with_grants(&granted, || tcp_connect(&target)).unwrap();
        stream.write_all(b"ping").unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        let mut got = [0; 4];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");

        // A range grant holds it too; a granted name resolving to loopback
        // does not reach it.
        let range = Grants::parse([] as [&str; 0], [format!("127.0.0.0/8:{port}")]).unwrap();
        assert!(with_grants(&range, || tcp_connect(&target)).is_ok());
        let by_name = Grants::parse([] as [&str; 0], [format!("localhost:{port}")]).unwrap();
        let e = with_grants(&by_name, || tcp_connect(&format!("localhost:{port}"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("loopback"), "{e}");
        // An ungranted name is refused before it is resolved.
        let e = with_grants(&range, || tcp_connect(&format!("localhost:{port}"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(
            e.to_string().contains(&format!("add `localhost:{port}`")),
            "{e}"
        );

        for bad in ["127.0.0.1", "::1:80", "tcp://127.0.0.1:80", "127.0.0.1:0"] {
            let e = tcp_connect(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}: {e}");
        }
    }
}
