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

use std::io;
use std::net::TcpStream;

pub use weir_contract::grants;

use grants::Host;

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

/// Blocking HTTP/1.1 requests: build a [`Request`](http::Request), `send`
/// it, read the [`Response`](http::Response).
///
/// Every status is a response, not an error: check
/// [`Response::status`](http::Response::status) yourself, since what a 4xx
/// or 5xx means depends on the service. Errors are for requests that got
/// no answer ([`HttpError`](http::HttpError)). Redirects are not followed
/// (the target of a redirect may not be granted): a 3xx comes back as a
/// response. `Content-Length` is set from the body; it, `Host` and the
/// connection-level headers (`Connection`, `Transfer-Encoding`, ...) cannot
/// be set by the sink.
pub mod http {
    use std::borrow::Cow;
    use std::fmt;
    use std::time::Duration;

    use weir_contract::grants::Host;

    use crate::SinkError;

    /// How long a request waits, by default, to connect and then for each
    /// part of the exchange (see [`Request::timeout`]).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// The largest response body a request reads, by default (see
    /// [`Request::max_response_bytes`]).
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 << 20;

    /// An HTTP request, built step by step and sent with [`Request::send`].
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Request {
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        timeout: Duration,
        max_response_bytes: usize,
    }

    impl Request {
        /// A request with `method` (`GET`, `POST`, ...) to `url`
        /// (`http://` or `https://`; user info such as `user:pw@` is
        /// refused: send credentials in a header).
        pub fn new(method: impl Into<String>, url: impl Into<String>) -> Request {
            Request {
                method: method.into(),
                url: url.into(),
                headers: Vec::new(),
                body: Vec::new(),
                timeout: DEFAULT_TIMEOUT,
                max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            }
        }

        /// A `GET` request to `url`.
        pub fn get(url: impl Into<String>) -> Request {
            Request::new("GET", url)
        }

        /// A `POST` request to `url`.
        pub fn post(url: impl Into<String>) -> Request {
            Request::new("POST", url)
        }

        /// A `PUT` request to `url`.
        pub fn put(url: impl Into<String>) -> Request {
            Request::new("PUT", url)
        }

        /// A `DELETE` request to `url`.
        pub fn delete(url: impl Into<String>) -> Request {
            Request::new("DELETE", url)
        }

        /// Adds a header. Adding a name twice sends it twice.
        pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request {
            self.headers.push((name.into(), value.into()));
            self
        }

        /// Sets the body.
        pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
            self.body = body.into();
            self
        }

        /// Bounds each wait: for the connection, for the response to start,
        /// and between two pieces of the response (and, natively, of the
        /// request body). A request that waits longer fails with
        /// [`HttpError::Timeout`]. Default [`DEFAULT_TIMEOUT`]. The host
        /// also bounds every sink call as a whole.
        pub fn timeout(mut self, timeout: Duration) -> Request {
            self.timeout = timeout;
            self
        }

        /// The largest response body to read; a larger one fails with
        /// [`HttpError::TooLarge`] instead of filling the sink's memory.
        /// Default [`DEFAULT_MAX_RESPONSE_BYTES`].
        pub fn max_response_bytes(mut self, limit: usize) -> Request {
            self.max_response_bytes = limit;
            self
        }

        /// The method.
        pub fn method(&self) -> &str {
            &self.method
        }

        /// The URL.
        pub fn url(&self) -> &str {
            &self.url
        }

        /// Checks the URL, method and headers as [`Request::send`] would,
        /// without sending anything (and without checking grants): use it
        /// in [`Sink::open`](crate::Sink::open) to refuse a bad
        /// configuration early.
        pub fn validate(&self) -> Result<(), HttpError> {
            self.clone().prepare().map(drop)
        }

        /// Sends the request and reads the whole response. Any status is
        /// `Ok`; see [`HttpError`] for what fails.
        pub fn send(self) -> Result<Response, HttpError> {
            let prepared = self.prepare()?;
            super::imp::send(prepared)
        }

        /// Checks the request and builds it for a client.
        fn prepare(self) -> Result<Prepared, HttpError> {
            let invalid =
                |why: String| HttpError::Invalid(format!("{} {}: {why}", self.method, self.url));
            let method = ::http::Method::from_bytes(self.method.as_bytes())
                .map_err(|_| invalid(format!("`{}` is not an HTTP method", self.method)))?;
            let uri: ::http::Uri = self
                .url
                .parse()
                .map_err(|e| invalid(format!("not a URL: {e}")))?;
            let scheme = uri.scheme_str().unwrap_or_default().to_ascii_lowercase();
            if scheme != "http" && scheme != "https" {
                return Err(invalid(
                    "the URL must start with http:// or https://".into(),
                ));
            }
            let authority = uri
                .authority()
                .ok_or_else(|| invalid("the URL has no host".into()))?;
            if authority.as_str().contains('@') {
                return Err(invalid(
                    "the URL has user info (`...@`); send credentials in a header".into(),
                ));
            }
            let host = Host::parse(authority.host())
                .map_err(|why| invalid(format!("the URL's host {why}")))?;
            let port = authority.port_u16();
            let mut builder = ::http::Request::builder()
                .method(method.clone())
                .uri(uri.clone());
            for (name, value) in &self.headers {
                let header = ::http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| invalid(format!("`{name}` is not a header name")))?;
                if CLIENT_HEADERS.contains(&header.as_str()) {
                    return Err(invalid(format!(
                        "header `{name}` is set by the client (or refused by the host), not by a sink"
                    )));
                }
                let value = ::http::HeaderValue::from_str(value).map_err(|_| {
                    invalid(format!(
                        "header `{name}` has a value with a control character or non-ASCII text"
                    ))
                })?;
                builder = builder.header(header, value);
            }
            // Natively the client would add it; `wasi:http` would send the
            // body chunked instead, which some receivers refuse.
            let has_body = !self.body.is_empty()
                || [
                    ::http::Method::POST,
                    ::http::Method::PUT,
                    ::http::Method::PATCH,
                ]
                .contains(&method);
            if has_body {
                builder = builder.header(::http::header::CONTENT_LENGTH, self.body.len());
            }
            let request = builder
                .body(self.body)
                .map_err(|e| invalid(e.to_string()))?;
            Ok(Prepared {
                request,
                scheme,
                host,
                port,
                timeout: self.timeout,
                max_response_bytes: self.max_response_bytes,
            })
        }
    }

    /// Headers a sink may not set: the body's length is set from the body,
    /// and `wasi:http` refuses the connection-level ones (the list of
    /// wasmtime's `DEFAULT_FORBIDDEN_HEADERS`), so both targets refuse them.
    const CLIENT_HEADERS: [&str; 10] = [
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "host",
        "http2-settings",
    ];

    /// A request checked and ready for the client.
    pub(super) struct Prepared {
        pub request: ::http::Request<Vec<u8>>,
        /// `http` or `https`.
        pub scheme: String,
        pub host: Host,
        /// The URL's port, if it names one.
        pub port: Option<u16>,
        pub timeout: Duration,
        pub max_response_bytes: usize,
    }

    impl Prepared {
        /// The target as the grants see it: `scheme://host[:port]`.
        pub fn target(&self) -> String {
            match self.port {
                Some(port) => format!("{}://{}:{port}", self.scheme, self.host),
                None => format!("{}://{}", self.scheme, self.host),
            }
        }
    }

    /// What the server answered.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Response {
        /// The status code, for example 200 or 503.
        pub status: u16,
        /// The headers in the order received, names in lower case, values
        /// decoded as UTF-8 (bytes that are not become U+FFFD).
        pub headers: Vec<(String, String)>,
        /// The whole body.
        pub body: Vec<u8>,
    }

    impl Response {
        /// The first value of header `name` (any case), if any.
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        /// True for a 2xx status.
        pub fn is_success(&self) -> bool {
            (200..300).contains(&self.status)
        }

        /// The body as text (bytes that are not UTF-8 become U+FFFD).
        pub fn text(&self) -> Cow<'_, str> {
            String::from_utf8_lossy(&self.body)
        }
    }

    /// Why a request got no response. Converts into a
    /// [`SinkError`] with `?`: [`HttpError::Timeout`] and
    /// [`HttpError::Connection`] become `Retryable`, the others `Fatal`.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    pub enum HttpError {
        /// The target is not granted (or resolved to an address no grant
        /// reaches); the message names the grant to add to `grants.http`.
        Denied(String),
        /// The request itself is wrong: a malformed URL, method or header.
        Invalid(String),
        /// A wait took longer than [`Request::timeout`].
        Timeout(String),
        /// No connection, or it broke: the name does not resolve, the
        /// server refused or reset, TLS failed, the answer was not HTTP.
        Connection(String),
        /// The response body was larger than
        /// [`Request::max_response_bytes`].
        TooLarge(String),
    }

    impl HttpError {
        /// The message, without the kind.
        pub fn message(&self) -> &str {
            match self {
                HttpError::Denied(m)
                | HttpError::Invalid(m)
                | HttpError::Timeout(m)
                | HttpError::Connection(m)
                | HttpError::TooLarge(m) => m,
            }
        }
    }

    impl fmt::Display for HttpError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let kind = match self {
                HttpError::Denied(_) => "HTTP request refused",
                HttpError::Invalid(_) => "invalid HTTP request",
                HttpError::Timeout(_) => "HTTP request timed out",
                HttpError::Connection(_) => "HTTP connection failed",
                HttpError::TooLarge(_) => "HTTP response too large",
            };
            write!(f, "{kind}: {}", self.message())
        }
    }

    impl std::error::Error for HttpError {}

    /// A timeout or a failed connection is worth a retry; a refused,
    /// malformed or oversized exchange will fail the same way again.
    impl From<HttpError> for SinkError {
        fn from(e: HttpError) -> Self {
            match e {
                HttpError::Timeout(_) | HttpError::Connection(_) => {
                    SinkError::Retryable(e.to_string())
                }
                HttpError::Denied(_) | HttpError::Invalid(_) | HttpError::TooLarge(_) => {
                    SinkError::Fatal(e.to_string())
                }
            }
        }
    }
}

/// Natively: the grant check of the host, then `std::net` and `ureq`.
#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::io;
    use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
    use std::sync::Arc;

    use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
    use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

    use super::grants::{Grants, Host, Refusal};
    use super::http::{HttpError, Prepared, Response};
    use crate::native::network;

    /// How a native refusal tells the test author where grants go.
    fn native_hint(refusal: &Refusal) -> String {
        let call = match refusal.kind() {
            super::grants::GrantKind::Http => "NativeSink::grant_http",
            super::grants::GrantKind::Tcp => "NativeSink::grant_tcp",
        };
        format!("{refusal} (natively: {call})")
    }

    fn denied(refusal: &Refusal) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, native_hint(refusal))
    }

    pub fn tcp_connect(target: &str, host: &Host, port: u16) -> io::Result<TcpStream> {
        let grants = network::current();
        let (name, addresses): (Option<&str>, Vec<SocketAddr>) = match host {
            Host::Ip(ip) => (None, vec![SocketAddr::new(*ip, port)]),
            Host::Name(name) => {
                // The host resolves only names a grant names.
                grants.check_lookup(name, port).map_err(|r| denied(&r))?;
                let found = (name.as_str(), port).to_socket_addrs().map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("TCP target {target}: cannot resolve: {e}"),
                    )
                })?;
                (Some(name.as_str()), found.collect())
            }
        };
        let mut refusal = None;
        let mut failure = None;
        for address in addresses {
            match grants.check_tcp_address(name, address.ip(), port) {
                Ok(_) => match TcpStream::connect(address) {
                    Ok(stream) => return Ok(stream),
                    Err(e) => failure = Some(e),
                },
                Err(r) => {
                    refusal.get_or_insert(r);
                }
            }
        }
        match (failure, refusal) {
            (Some(e), _) => Err(io::Error::new(
                e.kind(),
                format!("TCP connection to {target} failed: {e}"),
            )),
            (None, Some(r)) => Err(denied(&r)),
            (None, None) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("TCP target {target} resolved to no address"),
            )),
        }
    }

    /// Hands ureq the addresses the grants allow, and nothing else: the
    /// addresses were resolved and checked once, so what is connected to
    /// is what was checked.
    #[derive(Debug)]
    struct CheckedAddresses(Vec<SocketAddr>);

    impl Resolver for CheckedAddresses {
        fn resolve(
            &self,
            _uri: &ureq::http::Uri,
            _config: &ureq::config::Config,
            _timeout: NextTimeout,
        ) -> Result<ResolvedSocketAddrs, ureq::Error> {
            let mut found = self.empty();
            // ureq keeps at most 16 addresses; more would panic its push.
            for address in self.0.iter().take(16) {
                found.push(*address);
            }
            Ok(found)
        }
    }

    /// The addresses of `prepared`'s host that the grants allow it to
    /// reach, or why none.
    fn checked_addresses(
        prepared: &Prepared,
        grants: &Grants,
    ) -> Result<Vec<SocketAddr>, HttpError> {
        let scheme = prepared.scheme.as_str();
        let host = prepared.host.to_string();
        let target = prepared.target();
        grants
            .check_http(scheme, &host, prepared.port)
            .map_err(|r| HttpError::Denied(native_hint(&r)))?;
        let port = prepared
            .port
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let ips: Vec<IpAddr> = match &prepared.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => (name.as_str(), port)
                .to_socket_addrs()
                .map_err(|e| HttpError::Connection(format!("{target}: cannot resolve: {e}")))?
                .map(|a| a.ip())
                .collect(),
        };
        let mut refusal = None;
        let mut allowed = Vec::new();
        for ip in ips {
            match grants.check_http_address(scheme, &host, prepared.port, ip) {
                Ok(_) => allowed.push(SocketAddr::new(ip, port)),
                Err(r) => {
                    refusal.get_or_insert(r);
                }
            }
        }
        match (allowed.is_empty(), refusal) {
            (false, _) => Ok(allowed),
            (true, Some(r)) => Err(HttpError::Denied(native_hint(&r))),
            (true, None) => Err(HttpError::Connection(format!(
                "{target} resolved to no address"
            ))),
        }
    }

    pub fn send(prepared: Prepared) -> Result<Response, HttpError> {
        let grants: Arc<Grants> = network::current();
        let addresses = checked_addresses(&prepared, &grants)?;
        let target = format!("{} {}", prepared.request.method(), prepared.request.uri());
        let timeout = Some(prepared.timeout);
        let config = ureq::config::Config::builder()
            .http_status_as_error(false)
            // The target of a redirect is not checked against the grants
            // here, and `wasi:http` does not follow redirects either.
            .max_redirects(0)
            // Environment proxies would send the request somewhere the
            // grants do not name.
            .proxy(None)
            .timeout_connect(timeout)
            .timeout_per_read(timeout)
            .timeout_per_write(timeout)
            .build();
        let agent =
            ureq::Agent::with_parts(config, DefaultConnector::new(), CheckedAddresses(addresses));
        let mut response = agent
            .run(prepared.request)
            .map_err(|e| classify(&target, e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = response
            .body_mut()
            .with_config()
            .limit(prepared.max_response_bytes as u64)
            .read_to_vec()
            .map_err(|e| classify(&target, e))?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    fn classify(target: &str, e: ureq::Error) -> HttpError {
        let message = format!("{target}: {e}");
        match e {
            ureq::Error::Timeout(_) => HttpError::Timeout(message),
            ureq::Error::Io(io) if io.kind() == io::ErrorKind::TimedOut => {
                HttpError::Timeout(message)
            }
            ureq::Error::BodyExceedsLimit(limit) => {
                HttpError::TooLarge(format!("{target}: the response body exceeds {limit} bytes"))
            }
            ureq::Error::BadUri(_) | ureq::Error::Http(_) => HttpError::Invalid(message),
            _ => HttpError::Connection(message),
        }
    }
}

/// In WebAssembly: `std::net` over `wasi:sockets`, and `wasi:http` through
/// the Bytecode Alliance's `wasip2` bindings, blocking; the host checks the
/// grants.
#[cfg(target_arch = "wasm32")]
mod imp {
    use std::io;
    use std::net::{SocketAddr, TcpStream};

    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{
        ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, RequestOptions,
        Scheme,
    };
    use wasip2::io::streams::{OutputStream, StreamError};

    use super::grants::Host;
    use super::http::{HttpError, Prepared, Response};

    pub fn tcp_connect(target: &str, host: &Host, port: u16) -> io::Result<TcpStream> {
        let connected = match host {
            Host::Ip(ip) => TcpStream::connect(SocketAddr::new(*ip, port)),
            Host::Name(name) => TcpStream::connect((name.as_str(), port)),
        };
        connected.map_err(|e| {
            // The host refuses an ungranted address as a denied connect and
            // an ungranted name as a failed lookup; an ordinary network
            // failure needs no hint.
            use io::ErrorKind::*;
            let hint = match e.kind() {
                ConnectionRefused | ConnectionReset | ConnectionAborted | TimedOut
                | HostUnreachable | NetworkUnreachable => String::new(),
                _ => format!(" (if it is not granted: add `{host}:{port}` to grants.tcp)"),
            };
            io::Error::new(
                e.kind(),
                format!("TCP connection to {target} failed: {e}{hint}"),
            )
        })
    }

    /// Sends the request with the blocking calls of `wasi:http`: start it,
    /// write the whole body, then wait for the answer, which decides what
    /// went wrong (a client that writes the body while it waits, as `wstd`
    /// does, reports whichever fails first: a refused request then looks
    /// like a reset connection).
    pub fn send(prepared: Prepared) -> Result<Response, HttpError> {
        let target = prepared.target();
        let shown = format!("{} {}", prepared.request.method(), prepared.request.uri());
        let invalid = |why: String| HttpError::Invalid(format!("{shown}: {why}"));
        let (parts, body) = prepared.request.into_parts();

        let headers: Vec<(String, Vec<u8>)> = parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect();
        let headers = Fields::from_list(&headers)
            .map_err(|e| invalid(format!("the host refuses the headers: {e:?}")))?;
        let request = OutgoingRequest::new(headers);
        let method = match parts.method.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_string()),
        };
        let scheme = match prepared.scheme.as_str() {
            "https" => Scheme::Https,
            _ => Scheme::Http,
        };
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let authority = parts.uri.authority().map(|a| a.as_str());
        request
            .set_method(&method)
            .and_then(|()| request.set_scheme(Some(&scheme)))
            .and_then(|()| request.set_authority(authority))
            .and_then(|()| request.set_path_with_query(Some(path)))
            .map_err(|()| invalid("the host refuses the method, scheme, host or path".into()))?;

        let options = RequestOptions::new();
        let nanos = Some(u64::try_from(prepared.timeout.as_nanos()).unwrap_or(u64::MAX));
        // A host that does not support a timeout keeps its own bound.
        let _ = options.set_connect_timeout(nanos);
        let _ = options.set_first_byte_timeout(nanos);
        let _ = options.set_between_bytes_timeout(nanos);

        let outgoing_body = request
            .body()
            .map_err(|()| invalid("the request body was already taken".into()))?;
        let pending = outgoing_handler::handle(request, Some(options))
            .map_err(|code| classify(&shown, &target, &code))?;
        // A failed write is not the verdict: the host closes the body
        // stream when it refuses the request, when the connection fails,
        // and also when the client has taken all `Content-Length` bytes.
        // The answer below says which.
        if let Ok(stream) = outgoing_body.write() {
            let _ = write_all(&stream, &body);
        }
        let _ = OutgoingBody::finish(outgoing_body, None);

        pending.subscribe().block();
        let answer = match pending.get() {
            Some(Ok(answer)) => answer,
            _ => {
                return Err(HttpError::Connection(format!(
                    "{shown}: the host gave no answer"
                )));
            }
        };
        let response = answer.map_err(|code| classify(&shown, &target, &code))?;

        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect();
        let incoming = response
            .consume()
            .map_err(|()| HttpError::Connection(format!("{shown}: the answer has no body")))?;
        let body = read_all(&incoming, prepared.max_response_bytes).map_err(|e| match e {
            ReadError::TooLarge => HttpError::TooLarge(format!(
                "{shown}: the response body exceeds {} bytes",
                prepared.max_response_bytes
            )),
            ReadError::Stream(e) => {
                HttpError::Connection(format!("{shown}: reading the answer failed: {e:?}"))
            }
        })?;
        drop(IncomingBody::finish(incoming));
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// Writes `data` as fast as the host takes it, then flushes.
    fn write_all(stream: &OutputStream, mut data: &[u8]) -> Result<(), StreamError> {
        while !data.is_empty() {
            let permitted = stream.check_write()?;
            if permitted == 0 {
                stream.subscribe().block();
                continue;
            }
            let n = usize::try_from(permitted)
                .unwrap_or(usize::MAX)
                .min(data.len());
            stream.write(&data[..n])?;
            data = &data[n..];
        }
        stream.blocking_flush()
    }

    enum ReadError {
        TooLarge,
        Stream(StreamError),
    }

    /// Reads the whole body, refusing more than `limit` bytes.
    fn read_all(incoming: &IncomingBody, limit: usize) -> Result<Vec<u8>, ReadError> {
        let stream = incoming
            .stream()
            .map_err(|()| ReadError::Stream(StreamError::Closed))?;
        let mut bytes = Vec::new();
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => {
                    if bytes.len() + chunk.len() > limit {
                        return Err(ReadError::TooLarge);
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Err(StreamError::Closed) => return Ok(bytes),
                Err(e) => return Err(ReadError::Stream(e)),
            }
        }
    }

    fn classify(shown: &str, target: &str, code: &ErrorCode) -> HttpError {
        let message = format!("{shown}: {code:?}");
        match code {
            ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => {
                HttpError::Denied(format!(
                    "{shown}: refused by the host; the operator grants it in grants.http \
                     (`{target}`), and a granted name reaches public addresses only"
                ))
            }
            ErrorCode::DnsTimeout
            | ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout => HttpError::Timeout(message),
            ErrorCode::HttpRequestMethodInvalid
            | ErrorCode::HttpRequestUriInvalid
            | ErrorCode::HttpRequestUriTooLong
            | ErrorCode::HttpRequestHeaderSectionSize(_)
            | ErrorCode::HttpRequestHeaderSize(_)
            | ErrorCode::HttpRequestBodySize(_)
            | ErrorCode::HttpRequestLengthRequired => HttpError::Invalid(message),
            ErrorCode::HttpResponseBodySize(_) | ErrorCode::HttpResponseHeaderSectionSize(_) => {
                HttpError::TooLarge(message)
            }
            _ => HttpError::Connection(message),
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Ipv4Addr, TcpListener};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use super::grants::Grants;
    use super::http::{HttpError, Request};
    use super::*;
    use crate::SinkError;
    use crate::native::with_grants;

    /// One request as the test server read it.
    #[derive(Debug)]
    struct Received {
        request_line: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    /// A tiny HTTP/1.1 server on 127.0.0.1 for the requests under test:
    /// answers each connection's one request with the next canned
    /// response and reports what it received. Stopped (and joined) on drop.
    struct TestServer {
        port: u16,
        received: mpsc::Receiver<Received>,
        stop: Option<mpsc::Sender<()>>,
        thread: Option<thread::JoinHandle<()>>,
    }

    impl TestServer {
        fn start(responses: Vec<&'static str>) -> TestServer {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            listener.set_nonblocking(true).unwrap();
            let port = listener.local_addr().unwrap().port();
            let (sent, received) = mpsc::channel();
            let (stop, stopped) = mpsc::channel::<()>();
            let thread = thread::spawn(move || {
                let mut responses = responses.into_iter();
                loop {
                    if stopped.try_recv().is_ok() {
                        return;
                    }
                    let (stream, _) = match listener.accept() {
                        Ok(accepted) => accepted,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        Err(e) => panic!("test server: {e}"),
                    };
                    stream.set_nonblocking(false).unwrap();
                    let Some(response) = responses.next() else {
                        return;
                    };
                    let request = read_request(&stream);
                    (&stream).write_all(response.as_bytes()).unwrap();
                    let _ = sent.send(request);
                }
            });
            TestServer {
                port,
                received,
                stop: Some(stop),
                thread: Some(thread),
            }
        }

        fn url(&self, path: &str) -> String {
            format!("http://127.0.0.1:{}{path}", self.port)
        }

        fn next(&self) -> Received {
            self.received
                .recv_timeout(Duration::from_secs(10))
                .expect("the server received a request")
        }
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    fn read_request(stream: &TcpStream) -> Received {
        let mut reader = BufReader::new(stream);
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        Received {
            request_line: request_line.trim_end().to_string(),
            headers,
            body,
        }
    }

    fn http_grants(patterns: &[&str]) -> Grants {
        Grants::parse(patterns, [] as [&str; 0]).unwrap()
    }

    #[test]
    fn a_granted_request_reaches_the_server() {
        let server = TestServer::start(vec![
            "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-Reply: yes\r\nConnection: close\r\n\r\nok",
        ]);
        let grants = http_grants(&[&format!("http://127.0.0.1:{}", server.port)]);
        assert_eq!(Request::get(server.url("/")).validate(), Ok(()));
        let response = with_grants(&grants, || {
            Request::post(server.url("/hook?x=1"))
                .header("X-Test", "one")
                .body("hello")
                .send()
        })
        .unwrap();
        assert_eq!(response.status, 201);
        assert!(response.is_success());
        assert_eq!(response.header("x-reply"), Some("yes"));
        assert_eq!(response.text(), "ok");
        let received = server.next();
        assert_eq!(received.request_line, "POST /hook?x=1 HTTP/1.1");
        assert!(
            received
                .headers
                .contains(&("x-test".to_string(), "one".to_string())),
            "{:?}",
            received.headers
        );
        assert_eq!(received.body, b"hello");
        let lengths: Vec<_> = received
            .headers
            .iter()
            .filter(|(n, _)| n == "content-length")
            .collect();
        assert_eq!(lengths, [&("content-length".to_string(), "5".to_string())]);
    }

    #[test]
    fn statuses_are_responses_and_bodies_are_bounded() {
        let server = TestServer::start(vec![
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy",
            "HTTP/1.1 302 Found\r\nLocation: http://example.com/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789",
        ]);
        let grants = http_grants(&[&format!("http://127.0.0.1:{}", server.port)]);
        with_grants(&grants, || {
            let busy = Request::get(server.url("/")).send().unwrap();
            assert_eq!((busy.status, busy.text().as_ref()), (503, "busy"));
            // The redirect is not followed (example.com is not granted).
            let moved = Request::get(server.url("/")).send().unwrap();
            assert_eq!(moved.status, 302);
            let e = Request::get(server.url("/"))
                .max_response_bytes(10)
                .send()
                .unwrap_err();
            assert!(matches!(e, HttpError::TooLarge(_)), "{e}");
            assert!(matches!(SinkError::from(e), SinkError::Fatal(_)));
        });
    }

    #[test]
    fn ungranted_requests_are_refused_with_the_grant_to_add() {
        let server = TestServer::start(vec![]);
        // Nothing granted at all.
        let e = Request::get(server.url("/")).send().unwrap_err();
        let HttpError::Denied(message) = &e else {
            panic!("expected a refusal, got {e}");
        };
        assert!(
            message.contains(&format!(
                "add `http://127.0.0.1:{}` to grants.http",
                server.port
            )),
            "{message}"
        );
        assert!(message.contains("NativeSink::grant_http"), "{message}");
        assert!(matches!(SinkError::from(e), SinkError::Fatal(_)));

        let other_port = http_grants(&[&format!("http://127.0.0.1:{}", server.port + 1)]);
        let https_only = http_grants(&[&format!("https://127.0.0.1:{}", server.port)]);
        for grants in [other_port, https_only] {
            let e = with_grants(&grants, || Request::get(server.url("/")).send()).unwrap_err();
            assert!(matches!(e, HttpError::Denied(_)), "{e}");
        }
        // A granted name that resolves to loopback is refused: names reach
        // public addresses only.
        let by_name = http_grants(&[&format!("http://localhost:{}", server.port)]);
        let e = with_grants(&by_name, || {
            Request::get(format!("http://localhost:{}/", server.port)).send()
        })
        .unwrap_err();
        let HttpError::Denied(message) = &e else {
            panic!("expected a refusal, got {e}");
        };
        assert!(message.contains("loopback"), "{message}");
        // Nothing reached the server.
        assert!(server.received.try_recv().is_err());
    }

    #[test]
    fn malformed_requests_are_invalid() {
        let grants = http_grants(&["http://127.0.0.1:9"]);
        with_grants(&grants, || {
            for request in [
                Request::get("ftp://127.0.0.1:9/"),
                Request::get("http://user:pw@127.0.0.1:9/"),
                Request::get("not a url"),
                Request::get("http://127.1:9/"),
                Request::new("BAD METHOD", "http://127.0.0.1:9/"),
                Request::get("http://127.0.0.1:9/").header("bad name", "x"),
                Request::get("http://127.0.0.1:9/").header("x", "line\nbreak"),
                Request::get("http://127.0.0.1:9/").header("Host", "elsewhere"),
                Request::post("http://127.0.0.1:9/").header("Content-Length", "1"),
                Request::post("http://127.0.0.1:9/").header("Transfer-Encoding", "chunked"),
            ] {
                let shown = format!("{request:?}");
                assert!(request.validate().is_err(), "{shown}");
                let e = request.send().unwrap_err();
                assert!(matches!(e, HttpError::Invalid(_)), "{shown}: {e}");
            }
        });
    }

    #[test]
    fn refused_connections_and_timeouts_are_retryable() {
        // A port nobody listens on: bind, learn the port, close.
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let grants = http_grants(&[&format!("http://127.0.0.1:{port}")]);
        let e = with_grants(&grants, || {
            Request::get(format!("http://127.0.0.1:{port}/")).send()
        })
        .unwrap_err();
        assert!(matches!(e, HttpError::Connection(_)), "{e}");
        assert!(matches!(SinkError::from(e), SinkError::Retryable(_)));

        // A server that accepts and never answers.
        let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = silent.local_addr().unwrap().port();
        let grants = http_grants(&[&format!("http://127.0.0.1:{port}")]);
        let e = with_grants(&grants, || {
            Request::get(format!("http://127.0.0.1:{port}/"))
                .timeout(Duration::from_millis(200))
                .send()
        })
        .unwrap_err();
        assert!(matches!(e, HttpError::Timeout(_)), "{e}");
        assert!(matches!(SinkError::from(e), SinkError::Retryable(_)));
    }

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
