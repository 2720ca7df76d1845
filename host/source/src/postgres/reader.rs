//! The thread the replication client reads the socket on: a runtime of
//! its own, paced while the stream flows.
//!
//! Why paced: the walsender sends each message as soon as it has decoded
//! it. A client that reads as fast as it can, waiting on the socket in
//! between, gets every message as a TCP segment of its own, and each
//! segment costs both processes (on loopback the sender pays for the
//! receiving side's processing too). A client that leaves the socket alone
//! for a few milliseconds while data flows lets the server's buffers fill,
//! and the messages then travel many to a segment. Measured on a 500k-row
//! backlog over loopback: about 450k segments unpaced, 16k-60k paced; 40%
//! less server CPU and 30% less wall time (docs/postgres.md).
//!
//! The pause is a plain sleep, not a timer: a runtime waiting on a timer
//! still waits on the socket too, and would be woken all the same. That is
//! why the client gets a runtime and thread of its own rather than the
//! process's shared I/O runtime, whose other users must not be held up.
//! Nothing else runs here, so a pause delays only this stream's reading,
//! by at most [`PAUSE`] per read. Only TCP sessions are paced ([`paces`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::Notify;

use crate::SourceError;

/// How long the reader sleeps between reads while the stream flows. Long
/// enough that the server's socket buffer fills and it sends many messages
/// per segment, short enough that the server is not left waiting on a full
/// buffer, and short against a batch's linger. Measured on loopback, 500k
/// rows: on one machine 0.3 ms left the coalescing to chance and 3 to 8 ms
/// did it every run; on a slower one 5 ms did not (the walsender needed
/// 2.9 to 3.2 CPU-s), 10 ms did (1.8 CPU-s, the stream 40% faster), and
/// 40 ms came too late (the walsender idle half the time).
const PAUSE: Duration = Duration::from_millis(10);

/// Whether the replication session, which goes to the connection string's
/// first host, runs over TCP: only then is it paced (see
/// [`ReaderThread::start`]).
pub(super) fn paces(dsn: &tokio_postgres::Config) -> bool {
    !matches!(
        dsn.get_hosts().first(),
        Some(tokio_postgres::config::Host::Unix(_))
    )
}

/// The replication client's runtime and the thread that drives it.
pub(super) struct ReaderThread {
    handle: tokio::runtime::Handle,
    /// Off for a Unix socket: see [`ReaderThread::start`].
    paced: bool,
    pacing: Arc<Pacing>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Pacing {
    flowing: AtomicBool,
    stop: AtomicBool,
    /// Wakes the idle pacer when the stream starts flowing or must stop.
    wake: Notify,
}

impl ReaderThread {
    /// `paced`: whether to pause between reads while the stream flows; for
    /// TCP only. A Unix socket gives each message a buffer of its own
    /// whatever the reader does, and its few hundred kilobytes hold only a
    /// few hundred of them: paused between reads, a stream that took 1.3 s
    /// took 12 s.
    pub fn start(paced: bool) -> Result<ReaderThread, SourceError> {
        let cannot = |e: std::io::Error| {
            SourceError::Unavailable(format!("cannot start the replication reader's thread: {e}"))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(cannot)?;
        let handle = runtime.handle().clone();
        let pacing = Arc::new(Pacing::default());
        let driven = pacing.clone();
        let thread = std::thread::Builder::new()
            .name("weir-pg-reader".into())
            .spawn(move || runtime.block_on(pace(&driven)))
            .map_err(cannot)?;
        Ok(ReaderThread {
            handle,
            paced,
            pacing,
            thread: Some(thread),
        })
    }

    /// Runs a future of the replication client (connecting spawns its
    /// reader here) from the calling thread; this thread does the I/O.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.handle.block_on(future)
    }

    /// Tells whether messages are arriving back to back (pause between
    /// reads) or the stream is quiet (wait on the socket, answer at once).
    pub fn set_flowing(&self, flowing: bool) {
        if !self.paced {
            return;
        }
        let was = self.pacing.flowing.swap(flowing, Ordering::Relaxed);
        if flowing && !was {
            self.pacing.wake.notify_one();
        }
    }
}

/// The reader thread's own task: while the stream flows, a pause, then a
/// turn for the client to read everything that gathered.
async fn pace(pacing: &Pacing) {
    while !pacing.stop.load(Ordering::Relaxed) {
        if pacing.flowing.load(Ordering::Relaxed) {
            std::thread::sleep(PAUSE);
            // Lets the runtime poll the socket and run the client's reader
            // until it has taken what is there.
            tokio::task::yield_now().await;
        } else {
            pacing.wake.notified().await;
        }
    }
}

impl Drop for ReaderThread {
    fn drop(&mut self) {
        self.pacing.stop.store(true, Ordering::Relaxed);
        self.pacing.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // Ending the runtime drops what still runs on it (a client
            // that was not shut down closes its socket).
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tcp_session_is_paced() {
        let dsn = |s: &str| s.parse::<tokio_postgres::Config>().expect("parses");
        assert!(paces(&dsn("host=127.0.0.1 port=5432 user=u")));
        assert!(paces(&dsn("host=db.example port=5432 user=u")));
        assert!(paces(&dsn("user=u")), "no host: localhost over TCP");
        assert!(!paces(&dsn("host=/var/run/postgresql user=u")));
        assert!(
            !paces(&dsn("host=/tmp,127.0.0.1 user=u")),
            "the first host counts"
        );

        let unpaced = ReaderThread::start(false).expect("starts");
        unpaced.set_flowing(true);
        assert!(!unpaced.pacing.flowing.load(Ordering::Relaxed));
    }

    #[test]
    fn drives_the_client_flowing_or_quiet_and_stops_when_dropped() {
        let reader = Arc::new(ReaderThread::start(true).expect("starts"));
        for flowing in [false, true, false] {
            reader.set_flowing(flowing);
            // A task spawned here that waits on a timer only finishes if
            // the reader's thread drives this runtime, pausing or not.
            let (done_tx, done) = std::sync::mpsc::channel();
            let driven = reader.clone();
            std::thread::spawn(move || {
                let answer = driven.block_on(async {
                    tokio::spawn(async {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        7
                    })
                    .await
                    .expect("joins")
                });
                drop(driven);
                let _ = done_tx.send(answer);
            });
            let answer = done.recv_timeout(Duration::from_secs(10));
            assert_eq!(answer, Ok(7), "flowing: {flowing}");
        }
        reader.set_flowing(true);
        let reader = Arc::into_inner(reader).expect("the only handle left");
        let (dropped_tx, dropped) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(reader);
            let _ = dropped_tx.send(());
        });
        assert!(
            dropped.recv_timeout(Duration::from_secs(10)).is_ok(),
            "dropping stops the pacing thread"
        );
    }
}
