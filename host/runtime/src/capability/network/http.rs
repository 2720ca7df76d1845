//! `wasi:http` requests, sent by the host for a sink: checked against its
//! HTTP grants by name and again at every address the name resolves to,
//! connected to the address that passed, and bounded in time, size and
//! number in flight. A refusal is an error to the guest and a warning
//! naming the sink, the target and the grant to add.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::{SharedSockets, SinkNetwork};

type Sent = Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), Error>> + Send>,
    ),
    Error,
>;

/// The hooks of one sink instance's `wasi:http`.
pub struct HttpGate {
    network: SinkNetwork,
    in_flight: Arc<Semaphore>,
    /// Each connection also counts against these (its tenant's sockets,
    /// the host's descriptors) while it is open.
    shared: SharedSockets,
}

impl HttpGate {
    pub fn new(network: SinkNetwork, shared: SharedSockets) -> Self {
        let permits = network.limits.max_concurrent_requests;
        HttpGate {
            network,
            in_flight: Arc::new(Semaphore::new(permits)),
            shared,
        }
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_done: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        let network = self.network.clone();
        let in_flight = self.in_flight.clone();
        let shared = self.shared.clone();
        Box::new(async move {
            let response = send(&network, &in_flight, &shared, request, options).await?;
            // `send` gives the connection a task of its own, so the caller
            // has nothing left to drive.
            let io: Box<dyn Future<Output = Result<(), Error>> + Send> = Box::new(async { Ok(()) });
            Ok((response, io))
        })
    }
}

/// The smaller of the guest's wish and the host's bound.
fn bounded(asked: Option<Duration>, limit: Duration) -> Duration {
    asked.map_or(limit, |asked| asked.min(limit))
}

async fn send(
    network: &SinkNetwork,
    in_flight: &Arc<Semaphore>,
    shared: &SharedSockets,
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<http::Response<WasiBody>, Error> {
    let limits = network.limits;
    let uri = request.uri().clone();
    let target = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("?"),
        uri.authority().map(|a| a.as_str()).unwrap_or("?")
    );
    let refuse = |why: &dyn std::fmt::Display, error: Error| {
        tracing::warn!(sink = %network.sink, %target, "HTTP request refused: {why}");
        error
    };
    let scheme = uri.scheme_str().unwrap_or("");
    let host = uri.host().ok_or(Error::HttpRequestUriInvalid)?;
    let port = uri.port_u16();
    network
        .grants
        .check_http(scheme, host, port)
        .map_err(|refusal| refuse(&refusal, Error::HttpRequestDenied))?;
    let permit = in_flight.clone().try_acquire_owned().map_err(|_| {
        refuse(
            &format_args!(
                "{} requests are already in flight (limits.max_concurrent_requests)",
                limits.max_concurrent_requests
            ),
            Error::ConnectionLimitReached,
        )
    })?;
    let descriptor = shared
        .take()
        .map_err(|full| refuse(&full, Error::ConnectionLimitReached))?;
    let https = scheme.eq_ignore_ascii_case("https");
    let port_number = port.unwrap_or(if https { 443 } else { 80 });
    let connect_timeout = bounded(
        options.and_then(|o| o.connect_timeout),
        limits.connect_timeout,
    );
    let first_byte_timeout = bounded(
        options.and_then(|o| o.first_byte_timeout),
        limits.first_byte_timeout,
    );
    let between_bytes_timeout = bounded(
        options.and_then(|o| o.between_bytes_timeout),
        limits.between_bytes_timeout,
    );

    // Resolve here, check every address, connect only to one that passed:
    // the guest's name never reaches a resolver the check did not see.
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<IpAddr> = match literal.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => {
            let found = tokio::time::timeout(
                connect_timeout,
                tokio::net::lookup_host((literal, port_number)),
            )
            .await
            .map_err(|_| Error::DnsTimeout)?
            .map_err(|e| Error::DnsError {
                rcode: Some(crate::guest_error::for_guest(&e)),
                info_code: None,
            })?;
            found.map(|a| a.ip()).collect()
        }
    };
    let mut first_refusal = None;
    let mut chosen = None;
    for ip in addresses {
        match network.grants.check_http_address(scheme, host, port, ip) {
            Ok(_) => {
                chosen = Some(ip);
                break;
            }
            Err(refusal) => {
                first_refusal.get_or_insert(refusal);
            }
        }
    }
    let Some(ip) = chosen else {
        return Err(match first_refusal {
            Some(refusal) => refuse(&refusal, Error::DestinationIpProhibited),
            None => Error::DestinationNotFound,
        });
    };

    let stream = tokio::time::timeout(
        connect_timeout,
        tokio::net::TcpStream::connect(SocketAddr::new(ip, port_number)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)?
    .map_err(Error::Connect)?;
    let io: Box<dyn Connection> = if https {
        let name = rustls::pki_types::ServerName::try_from(literal.to_string())
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        let tls = tokio::time::timeout(connect_timeout, tls_connector().connect(name, stream))
            .await
            .map_err(|_| Error::ConnectionTimeout)?
            .map_err(Error::Tls)?;
        Box::new(tls)
    } else {
        Box::new(stream)
    };
    let (mut sender, connection) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::handshake(TokioIo::new(io)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)?
    .map_err(Error::Hyper)?;
    // The connection is driven on its own until the response body is done
    // or dropped, and counted as a descriptor until then.
    tokio::spawn(async move {
        let _descriptor = descriptor;
        let _ = connection.await;
    });

    // On the wire the request names only its path; the host header (set
    // from the URL before this hook) keeps the name.
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    *request.uri_mut() = http::Uri::try_from(path).map_err(|_| Error::HttpRequestUriInvalid)?;
    let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
        .await
        .map_err(|_| {
            refuse(
                &format_args!(
                    "no response within {} ms (limits.http_first_byte_timeout_ms)",
                    first_byte_timeout.as_millis()
                ),
                Error::ConnectionReadTimeout,
            )
        })?
        .map_err(Error::Hyper)?;
    let declared = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(size) = declared
        && size > limits.max_response_bytes
    {
        return Err(refuse(
            &format_args!(
                "the response declares {size} bytes, more than limits.max_response_mb allows ({} MiB)",
                limits.max_response_bytes >> 20
            ),
            Error::HttpResponseBodySize(Some(size)),
        ));
    }
    let sink = network.sink.clone();
    let response = response.map(|incoming| {
        BoundedBody {
            incoming,
            remaining: limits.max_response_bytes,
            limit: limits.max_response_bytes,
            between_bytes: between_bytes_timeout,
            idle: Box::pin(tokio::time::sleep(between_bytes_timeout)),
            sink,
            target,
            _permit: permit,
        }
        .boxed_unsync()
    });
    Ok(response)
}

trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// One TLS client set-up for the process: the Mozilla roots (webpki-roots),
/// so what a sink may reach does not depend on the machine's store.
fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

/// A response body held to the sink's size limit and between-bytes
/// timeout; it holds the request's place among those in flight until it is
/// done or dropped.
struct BoundedBody {
    incoming: hyper::body::Incoming,
    remaining: u64,
    limit: u64,
    between_bytes: Duration,
    idle: Pin<Box<tokio::time::Sleep>>,
    sink: Arc<str>,
    target: String,
    _permit: OwnedSemaphorePermit,
}

impl Body for BoundedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(Error::Hyper(error)))),
            Poll::Ready(Some(Ok(frame))) => {
                let size = frame.data_ref().map_or(0, |d| d.len() as u64);
                if size > self.remaining {
                    tracing::warn!(
                        sink = %self.sink,
                        target = %self.target,
                        "HTTP response cut: larger than limits.max_response_mb ({} MiB)",
                        self.limit >> 20
                    );
                    self.remaining = 0;
                    return Poll::Ready(Some(Err(Error::HttpResponseBodySize(None))));
                }
                self.remaining -= size;
                let deadline = tokio::time::Instant::now() + self.between_bytes;
                self.idle.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.idle.as_mut().poll(cx));
                tracing::warn!(
                    sink = %self.sink,
                    target = %self.target,
                    "HTTP response stalled for {} ms (limits.http_between_bytes_timeout_ms)",
                    self.between_bytes.as_millis()
                );
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
