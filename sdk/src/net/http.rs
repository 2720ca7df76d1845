//! Blocking HTTP/1.1 requests: build a [`Request`], `send` it, read the
//! [`Response`].
//!
//! Every status is a response, not an error: check [`Response::status`]
//! yourself, since what a 4xx or 5xx means depends on the service. Errors
//! are for requests that got no answer ([`HttpError`]). Redirects are not
//! followed (the target of a redirect may not be granted): a 3xx comes back
//! as a response. `Content-Length` is set from the body; it, `Host` and the
//! connection-level headers (`Connection`, `Transfer-Encoding`, ...) cannot
//! be set by the sink.

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
            HttpError::Timeout(_) | HttpError::Connection(_) => SinkError::Retryable(e.to_string()),
            HttpError::Denied(_) | HttpError::Invalid(_) | HttpError::TooLarge(_) => {
                SinkError::Fatal(e.to_string())
            }
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use super::{HttpError, Request};
    use crate::SinkError;
    use crate::native::with_grants;
    use crate::net::grants::Grants;

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
}
