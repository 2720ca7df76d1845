//! `weir serve`: one process that runs many tenants' pipelines, each on
//! threads of its own, with an admin API ([`admin`]), a watched folder of
//! pipeline files ([`watch`]), and plugins swapped at commit boundaries.
//!
//! [`api`] holds what the admin API sends, shared with `weir ctl`;
//! [`connections`] bounds the API's clients in number and time;
//! [`host_file`] reads the host file, [`tenant`] holds each tenant's
//! folders and bounds, [`policy`] decides what a tenant may run (every
//! admission and count check), [`supervisor`] runs one pipeline
//! (restarts, backoff, parking), and [`server`] is what the API and the
//! watcher do to pipelines.

pub mod admin;
pub mod api;
pub mod cluster;
pub mod connections;
mod forward;
pub mod host_file;
pub mod mirror;
pub mod plugin_store;
pub mod policy;
pub mod server;
pub mod supervisor;
pub mod tenant;
pub mod watch;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use host_file::HostConfig;
use plugin_store::PluginStore;
use server::Server;
use supervisor::Context;
use tenant::{Tenant, TenantRoot};

use weir_metrics::Metrics;
use weir_runtime::{WasmEngine, engine};

/// Runs the host file's tenants' pipelines and the admin API until SIGTERM
/// (or Ctrl-C): then every pipeline stops at a commit boundary, and the
/// process exits within the host file's `shutdown_grace_ms` whatever a
/// sink is doing.
pub fn serve(host_file: &Path) -> Result<ExitCode, String> {
    let host = HostConfig::load(host_file)?;
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("weir-io")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the I/O runtime: {e}"))?;
    let state_dir = tenant::made(&host.resolve(&host.state_dir), "state_dir")?;
    let pipelines_dir = tenant::made(&host.resolve(&host.pipelines_dir), "pipelines_dir")?;
    let mut tenants = BTreeMap::new();
    for name in host.tenants.keys() {
        tenants.insert(
            name.clone(),
            Arc::new(Tenant::open(&host, name, Some(io.handle()))?),
        );
    }
    check_apart(&host, &tenants, &state_dir, &pipelines_dir)?;
    // Every tenant's share of instance slots is there for it whatever the
    // others hold: the pool is their sum, and the reserve no tenant takes.
    let pool_slots = host
        .tenants
        .values()
        .map(|tenant| tenant.max_instances)
        .sum::<usize>()
        + engine::RESERVED_POOL_SLOTS;
    let cache_dir = weir_pipeline::config::component_cache_dir(&state_dir);
    let engine = WasmEngine::with_pool_slots(&cache_dir, pool_slots).map_err(|e| e.to_string())?;
    let engine = Arc::new(engine);
    let metrics = Metrics::new();
    // Opened before joining: a plugin store the host file gets wrong is
    // refused at start, with nothing registered.
    let store = PluginStore::open(&host, io.handle())?.map(Arc::new);
    // In a cluster, the host joins before any pipeline starts: a pipeline
    // runs only once placed here and claimed.
    let session = match &host.cluster {
        Some(cluster) => Some(
            weir_cluster::Session::start(
                cluster,
                &advertised(cluster, host.listen),
                io.handle(),
                metrics.cluster(),
            )
            .map_err(|e| format!("{}: cluster: {e}", host.file.display()))?,
        ),
        None => None,
    };
    let context = Context {
        engine,
        io: io.handle().clone(),
        restart: host.restart.clone(),
        cluster: session.clone(),
        plugin_store: store.clone(),
    };
    let grace = Duration::from_millis(host.shutdown_grace_ms);
    let interval = Duration::from_millis(host.watch_interval_ms);
    let listen = host.listen;
    let server = Arc::new(Server::new(host, tenants, metrics, context)?);

    let listener = io
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let router = admin::router(server.clone());
    io.spawn(connections::serve(
        listener,
        router,
        server.host.admin.clone(),
    ));
    tracing::info!(%listen, "weir serve: admin API listening");

    let agent = session.map(|session| {
        let mirror = store.map(|store| {
            mirror::Mirror::new(
                session.clone(),
                store,
                pipelines_dir.clone(),
                server.host.tenants.keys().cloned().collect(),
            )
        });
        cluster::Agent::new(session, mirror)
    });
    if let Some(agent) = &agent {
        let agent = agent.clone();
        let server = server.clone();
        std::thread::Builder::new()
            .name("cluster".into())
            .spawn(move || agent.run(server))
            .map_err(|e| format!("cannot start the cluster agent: {e}"))?;
    }

    let stop_watching = Arc::new(AtomicBool::new(false));
    {
        let server = server.clone();
        let stop = stop_watching.clone();
        std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || watch::watch(server, interval, stop))
            .map_err(|e| format!("cannot start the folder watcher: {e}"))?;
    }

    let signal = io.block_on(first_signal())?;
    let started = Instant::now();
    tracing::warn!(
        "{signal}: stopping every pipeline at a commit boundary, within {:.1} s (again to exit at once)",
        grace.as_secs_f64()
    );
    stop_watching.store(true, Ordering::Relaxed);
    io.spawn(exit_on_second_signal());
    if let Some(agent) = &agent {
        agent.halt();
    }
    let all_ended = server.stop_all(grace);
    // Every run ended at a commit boundary: the pipelines are handed over
    // now rather than when the lease runs out. A run that did not end keeps
    // its claim, which the lease's end frees.
    if let Some(agent) = &agent
        && all_ended
        && let Err(e) = agent.leave()
    {
        tracing::warn!(
            "cluster: could not hand the pipelines over ({e}); they move when this host's lease runs out"
        );
    }
    if !all_ended {
        let in_flight = weir_runtime::worker::calls_in_flight();
        eprintln!(
            "weir: not every pipeline stopped within {:.1} s; exiting anyway ({}); nothing \
             uncommitted was acknowledged, the next start resumes from the last checkpoint",
            grace.as_secs_f64(),
            if in_flight.is_empty() {
                "no sink call was under way".to_string()
            } else {
                format!("still under way: {}", in_flight.join("; "))
            }
        );
        std::process::exit(1);
    }
    tracing::info!(
        "every pipeline stopped in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    // Every run has ended and closed its store: nothing is left to write.
    // Tearing down the engine's reserved memory pool and the I/O runtime
    // would only spend the grace.
    std::process::exit(0)
}

async fn first_signal() -> Result<&'static str, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    Ok(tokio::select! {
        _ = interrupt.recv() => "Ctrl-C",
        _ = terminate.recv() => "SIGTERM",
    })
}

async fn exit_on_second_signal() {
    if let Ok(name) = first_signal().await {
        let code = if name == "SIGTERM" { 143 } else { 130 };
        eprintln!("weir: {name} again: exiting at once");
        std::process::exit(code);
    }
}

/// No tenant root may overlap another's, the host's state folder or the
/// watched folder: a sink could otherwise reach what is not its tenant's.
fn check_apart(
    host: &HostConfig,
    tenants: &BTreeMap<String, Arc<Tenant>>,
    state_dir: &Path,
    pipelines_dir: &Path,
) -> Result<(), String> {
    // The plugin store as a root, to be kept apart from the tenants' as
    // theirs are from each other.
    let plugin_store = host
        .cluster
        .as_ref()
        .and_then(|c| c.plugin_store.as_deref())
        .map(|store| match host_file::local_folder(store) {
            Some(folder) => TenantRoot::Folder(host.resolve(&folder)),
            None => TenantRoot::Objects {
                url: store.trim_end_matches('/').to_string(),
                options: BTreeMap::new(),
            },
        });
    for (name, tenant) in tenants {
        if let Some(store) = &plugin_store
            && tenant.root.overlaps(store)
        {
            return Err(format!(
                "{}: tenants.{name}.root ({}) overlaps cluster.plugin_store ({})",
                host.file.display(),
                tenant.root.describe(),
                store.describe()
            ));
        }
        for (what, place) in [("state_dir", state_dir), ("pipelines_dir", pipelines_dir)] {
            if tenant
                .root
                .overlaps(&TenantRoot::Folder(place.to_path_buf()))
            {
                return Err(format!(
                    "{}: tenants.{name}.root ({}) overlaps the host's {what} ({})",
                    host.file.display(),
                    tenant.root.describe(),
                    place.display()
                ));
            }
        }
        for (other, theirs) in tenants.range(name.clone()..).skip(1) {
            if tenant.root.overlaps(&theirs.root) {
                return Err(format!(
                    "{}: tenants.{name}.root and tenants.{other}.root overlap ({} and {})",
                    host.file.display(),
                    tenant.root.describe(),
                    theirs.root.describe()
                ));
            }
        }
    }
    Ok(())
}

/// The admin address this host publishes to the others, which they
/// forward requests to: `advertise`, else `listen`. A `listen` on every
/// interface (0.0.0.0) names no host the others can reach: said at start.
fn advertised(cluster: &weir_cluster::ClusterConfig, listen: std::net::SocketAddr) -> String {
    match &cluster.advertise {
        Some(address) => address.clone(),
        None => {
            if listen.ip().is_unspecified() {
                tracing::warn!(
                    %listen,
                    "cluster: the other hosts cannot forward requests to {listen}; \
                     set cluster.advertise to this host's reachable address"
                );
            }
            listen.to_string()
        }
    }
}
