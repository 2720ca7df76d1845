//! The admin API's accept loop: each connection admitted under the host
//! file's caps (all clients together, and per client address), its request
//! headers, bodies and silences bounded in time, so slow or idle clients
//! cannot hold the host's memory or descriptors. axum's own `serve` has
//! none of these bounds; hyper's connection builder has the header one.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use super::host_file::AdminConfig;

/// How long the accept loop waits after a failed accept (the host is out
/// of descriptors, say) before it tries again, rather than spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, router: Router, bounds: AdminConfig) {
    let caps = Arc::new(Caps::new(
        bounds.max_connections,
        bounds.max_connections_per_client,
    ));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("the admin API cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        // Over a cap the connection is closed at once: holding it until a
        // slot frees would hold the descriptor the cap is there to save.
        let Some(pass) = caps.admit(peer.ip()) else {
            tracing::debug!(%peer, "admin API connection refused: over the connection caps");
            drop(stream);
            continue;
        };
        let router = router.clone();
        let bounds = bounds.clone();
        tokio::spawn(async move {
            serve_connection(stream, peer, router, &bounds).await;
            drop(pass);
        });
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: Router,
    bounds: &AdminConfig,
) {
    let handling = Arc::new(AtomicUsize::new(0));
    let io = IdleBounded::new(stream, bounds.idle_timeout(), handling.clone());
    let body_timeout = bounds.body_timeout();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let router = router.clone();
        let in_flight = InFlight::new(handling.clone());
        async move {
            let request = request.map(|body| Body::new(BodyBounded::new(body, body_timeout)));
            let response = router.oneshot(request).await;
            drop(in_flight);
            response
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_timeout())
        .serve_connection(TokioIo::new(io), service);
    if let Err(e) = connection.await {
        tracing::debug!(%peer, "admin API connection ended: {e}");
    }
}

/// The caps on open connections; a [`Pass`] holds one place under each.
struct Caps {
    max_total: usize,
    max_per_client: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

impl Caps {
    fn new(max_total: usize, max_per_client: usize) -> Self {
        Caps {
            max_total,
            max_per_client,
            open: Mutex::new(Open::default()),
        }
    }

    fn admit(self: &Arc<Self>, client: IpAddr) -> Option<Pass> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let of_client = open.per_client.get(&client).copied().unwrap_or(0);
        if open.total >= self.max_total || of_client >= self.max_per_client {
            return None;
        }
        open.total += 1;
        open.per_client.insert(client, of_client + 1);
        Some(Pass {
            caps: self.clone(),
            client,
        })
    }
}

/// One open connection, counted until dropped.
struct Pass {
    caps: Arc<Caps>,
    client: IpAddr,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut open = self
            .caps
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if let Some(count) = open.per_client.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.per_client.remove(&self.client);
            }
        }
    }
}

/// A request of the connection being handled, counted until dropped: a
/// handler may wait long (a swap waits for a commit boundary), and the
/// connection is not idle meanwhile.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(handling: Arc<AtomicUsize>) -> Self {
        handling.fetch_add(1, Ordering::Relaxed);
        InFlight(handling)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection that fails once it has moved no byte either way for
/// `idle` while no request of it is being handled: a client that stops
/// reading its answer, or keeps a connection open and says nothing.
struct IdleBounded<IO> {
    io: IO,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    handling: Arc<AtomicUsize>,
}

impl<IO> IdleBounded<IO> {
    fn new(io: IO, idle: Duration, handling: Arc<AtomicUsize>) -> Self {
        IdleBounded {
            io,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            handling,
        }
    }

    fn moved(&mut self) {
        let deadline = Instant::now() + self.idle;
        self.timer.as_mut().reset(deadline);
    }

    /// Called when the connection would wait: an error once it idled too long.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.handling.load(Ordering::Relaxed) > 0 {
            self.moved();
            return Poll::Pending;
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the connection was idle for {} ms (admin.idle_timeout_ms)",
                    self.idle.as_millis()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleBounded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.check_idle(cx),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleBounded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(result) => {
                if matches!(result, Ok(n) if n > 0) {
                    this.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.check_idle(cx).map(|r| r.map(|()| 0)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.check_idle(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A request body that fails when it has not fully arrived within the
/// body timeout of the end of its headers: a client trickling a byte now
/// and then is cut off rather than held.
struct BodyBounded {
    body: Incoming,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl BodyBounded {
    fn new(body: Incoming, timeout: Duration) -> Self {
        BodyBounded {
            body,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl HttpBody for BodyBounded {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        ready!(this.deadline.as_mut().poll(cx));
        Poll::Ready(Some(Err(format!(
            "the request body did not arrive within {} ms (admin.body_timeout_ms)",
            this.timeout.as_millis()
        )
        .into())))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_in_all_and_per_client() {
        let caps = Arc::new(Caps::new(3, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = caps.admit(a).unwrap();
        let _a2 = caps.admit(a).unwrap();
        assert!(caps.admit(a).is_none(), "a third of one client");
        let _b1 = caps.admit(b).unwrap();
        assert!(caps.admit(b).is_none(), "a fourth in all");
        drop(a1);
        assert!(caps.admit(a).is_some(), "a place freed is taken again");
    }
}
