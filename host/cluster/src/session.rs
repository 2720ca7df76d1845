//! One host's place in the cluster: its etcd client, its lease (renewed in
//! the background, granted anew if it ran out), its member key, and the
//! clock that tells it when it must stop committing.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, ConnectOptions, Identity, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    TlsOptions,
};
use tokio::runtime::Handle;
use weir_metrics::ClusterMetrics;

use crate::ClusterError;
use crate::config::ClusterConfig;
use crate::keys::Keys;

/// The lease a host holds now, and when etcd last confirmed it.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: i64,
    /// When the last renewal that etcd confirmed was *sent*: etcd restarted
    /// the lease's time-to-live no earlier than that, so the lease lasts at
    /// least until this plus the time-to-live, on any clock that runs at
    /// the same rate as ours.
    renewed: Instant,
}

pub struct Session {
    config: ClusterConfig,
    keys: Keys,
    client: Client,
    io: Handle,
    /// What the member key says: the host's admin address.
    advertise: String,
    lease: Mutex<Lease>,
    metrics: ClusterMetrics,
}

impl Session {
    /// Connects, takes a lease and registers this host, then keeps the
    /// lease alive on `io` until the process ends or [`Session::leave`].
    pub fn start(
        config: &ClusterConfig,
        advertise: &str,
        io: &Handle,
        metrics: ClusterMetrics,
    ) -> Result<Arc<Session>, ClusterError> {
        let options = connect_options(config)?;
        let endpoints = config.endpoints.clone();
        let timeout = config.request_timeout() * 3;
        let client = io
            .block_on(async {
                tokio::time::timeout(timeout, Client::connect(endpoints, Some(options))).await
            })
            .map_err(|_| ClusterError::Timeout {
                endpoints: config.endpoints_text(),
                timeout_ms: timeout.as_millis() as u64,
                what: "connecting",
            })?
            .map_err(|e| etcd_error(config, "connecting", e))?;
        let session = Arc::new(Session {
            config: config.clone(),
            keys: Keys::new(&config.prefix),
            client,
            io: io.clone(),
            advertise: advertise.to_string(),
            lease: Mutex::new(Lease {
                id: 0,
                renewed: Instant::now(),
            }),
            metrics,
        });
        session.wait(session.register())?;
        io.spawn(Session::keep_alive(session.clone()));
        Ok(session)
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// A client to etcd (cheap: clones share one connection).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn lease_state(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease this host holds now. It changes when the old one ran out:
    /// whatever was held on the old one is gone.
    pub fn lease(&self) -> i64 {
        self.lease_state().id
    }

    /// Whether this host may still commit under `lease`: it is the lease
    /// held now, and etcd confirmed it recently enough that it cannot have
    /// run out before a commit begun now has ended. Measured on this host's
    /// monotonic clock, without asking etcd: a host cut off from etcd stops
    /// on its own.
    pub fn may_commit(&self, lease: i64) -> Result<(), String> {
        let now = self.lease_state();
        if now.id != lease {
            return Err(format!(
                "this host's lease {lease:x} ran out (it holds {:x} now); whatever it held \
                 under the old one may be another host's",
                now.id
            ));
        }
        let age = now.renewed.elapsed();
        let bound = self.config.commit_bound();
        if age > bound {
            return Err(format!(
                "etcd last confirmed this host's lease {:.1} s ago, past the {:.1} s a host may \
                 commit on it (the lease lives {} s): it stops committing before the lease can \
                 run out",
                age.as_secs_f64(),
                bound.as_secs_f64(),
                self.config.lease_ttl_s
            ));
        }
        Ok(())
    }

    /// How long ago etcd last confirmed the lease.
    pub fn since_renewal(&self) -> Duration {
        self.lease_state().renewed.elapsed()
    }

    /// Runs `work` on the I/O runtime from a thread outside it, bounded by
    /// the request timeout.
    pub fn wait<T>(
        &self,
        work: impl Future<Output = Result<T, ClusterError>>,
    ) -> Result<T, ClusterError> {
        let bound = self.config.request_timeout();
        self.io
            .block_on(async { tokio::time::timeout(bound, work).await })
            .map_err(|_| ClusterError::Timeout {
                endpoints: self.config.endpoints_text(),
                timeout_ms: self.config.request_timeout_ms,
                what: "a request",
            })?
    }

    pub fn error_of(&self, what: &str, error: etcd_client::Error) -> ClusterError {
        etcd_error(&self.config, what, error)
    }

    /// Takes a new lease and puts the member key on it.
    async fn register(&self) -> Result<(), ClusterError> {
        let sent = Instant::now();
        let mut client = self.client.clone();
        let granted = client
            .lease_grant(self.config.lease_ttl_s as i64, None)
            .await
            .map_err(|e| self.error_of("granting a lease", e))?;
        client
            .put(
                self.keys.member(self.name()),
                self.advertise.clone(),
                Some(PutOptions::new().with_lease(granted.id())),
            )
            .await
            .map_err(|e| self.error_of("registering this host", e))?;
        *self.lease_state() = Lease {
            id: granted.id(),
            renewed: sent,
        };
        tracing::info!(host = %self.name(), lease = format!("{:x}", granted.id()), "joined the cluster");
        Ok(())
    }

    /// Renews the lease five times a time-to-live; takes a new one when
    /// etcd says the old one is gone.
    async fn keep_alive(self: Arc<Session>) {
        let mut stream: Option<(i64, LeaseKeeper, LeaseKeepAliveStream)> = None;
        let mut ticker = tokio::time::interval(self.config.renew_every());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let lease = self.lease();
            if lease == 0 {
                return; // left
            }
            let sent = Instant::now();
            let bound = self.config.request_timeout();
            let renewed = tokio::time::timeout(bound, self.renew(lease, &mut stream)).await;
            let outcome = match &renewed {
                Ok(Ok(true)) => "renewed",
                Ok(Ok(false)) => "expired",
                _ => "failed",
            };
            self.metrics.renewal(outcome, sent.elapsed().as_secs_f64());
            match renewed {
                Ok(Ok(true)) => {
                    let mut state = self.lease_state();
                    if state.id == lease {
                        state.renewed = sent;
                    }
                }
                Ok(Ok(false)) => {
                    tracing::warn!(
                        host = %self.name(),
                        "etcd says this host's lease ran out: its pipelines may run elsewhere now; \
                         taking a new lease"
                    );
                    stream = None;
                    if let Err(e) = tokio::time::timeout(bound, self.register()).await {
                        tracing::warn!(host = %self.name(), "cannot take a new lease yet: {e}");
                    }
                }
                Ok(Err(e)) => {
                    stream = None;
                    tracing::warn!(host = %self.name(), "renewing the lease failed: {e}");
                }
                Err(_) => {
                    stream = None;
                    tracing::warn!(
                        host = %self.name(),
                        "etcd did not confirm the lease within {} ms",
                        self.config.request_timeout_ms
                    );
                }
            }
        }
    }

    /// One renewal: `Ok(false)` when the lease is gone.
    async fn renew(
        &self,
        lease: i64,
        stream: &mut Option<(i64, LeaseKeeper, LeaseKeepAliveStream)>,
    ) -> Result<bool, String> {
        if stream.as_ref().is_none_or(|(id, ..)| *id != lease) {
            // Opening the stream sends the first renewal and reads its
            // answer; a lease that is gone is refused here.
            match self.client.clone().lease_keep_alive(lease).await {
                Ok((keeper, answers)) => {
                    *stream = Some((lease, keeper, answers));
                    return Ok(true);
                }
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => return Ok(false),
                Err(e) => return Err(e.to_string()),
            }
        }
        let Some((_, keeper, answers)) = stream.as_mut() else {
            return Err("no renewal stream".into());
        };
        keeper.keep_alive().await.map_err(|e| e.to_string())?;
        match answers.message().await {
            Ok(Some(answer)) => Ok(answer.ttl() > 0),
            Ok(None) => Err("etcd closed the renewal stream".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Gives the lease back: the member key and every assignment on it go
    /// at once, so other hosts need not wait for it to run out.
    pub fn leave(&self) -> Result<(), ClusterError> {
        let lease = std::mem::replace(&mut self.lease_state().id, 0);
        if lease == 0 {
            return Ok(());
        }
        let mut client = self.client.clone();
        self.wait(async move {
            client
                .lease_revoke(lease)
                .await
                .map(|_| ())
                .map_err(|e| self.error_of("giving back the lease", e))
        })
    }
}

fn connect_options(config: &ClusterConfig) -> Result<ConnectOptions, ClusterError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.request_timeout())
        .with_timeout(config.request_timeout())
        .with_keep_alive(config.renew_every(), config.request_timeout());
    if let (Some(user), Some(variable)) = (&config.user, &config.password_env) {
        let password = std::env::var(variable).map_err(|_| {
            ClusterError::Config(format!(
                "cluster.password_env: the environment variable `{variable}` is not set"
            ))
        })?;
        options = options.with_user(user.clone(), password);
    }
    if let Some(tls) = &config.tls {
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                ClusterError::Config(format!(
                    "cluster.tls.{what}: cannot read {}: {e}",
                    path.display()
                ))
            })
        };
        let mut settings =
            TlsOptions::new().ca_certificate(Certificate::from_pem(read("ca_file", &tls.ca_file)?));
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            settings = settings.identity(Identity::from_pem(
                read("cert_file", cert)?,
                read("key_file", key)?,
            ));
        }
        if let Some(domain) = &tls.domain {
            settings = settings.domain_name(domain.clone());
        }
        options = options.with_tls(settings);
    }
    Ok(options)
}

fn etcd_error(config: &ClusterConfig, what: &str, error: etcd_client::Error) -> ClusterError {
    ClusterError::Etcd {
        endpoints: config.endpoints_text(),
        detail: format!("{what}: {error}"),
    }
}
