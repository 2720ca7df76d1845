//! A cluster on this machine for the cluster tests and the chaos run: one
//! etcd and several `weir serve` hosts sharing one folder (the pipelines
//! and the tenants' data), paced generator pipelines into the positioned
//! fixture, and each destination compared with the generator's oracle.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use common::etcd::Etcd;
use common::*;

pub const T: &str = "acme";
pub const SINK: &str = "lake";
/// Short enough that failovers fit a test, long enough for a busy
/// machine's renewals: renewed every 600 ms, commits stop 2 s after the
/// last renewal etcd confirmed.
pub const LEASE_TTL_S: u64 = 3;
pub const PLACEMENT_DELAY_MS: u64 = 500;
/// Long enough to outlast every fault a test makes; a test lifts the pace
/// once the fault is over, and the streams run to their end.
pub const CHANGES: u64 = 30_000;
pub const PACE_US: u64 = 1_000;

pub struct Cluster {
    // Dropped in this order: the hosts before etcd, and both before the
    // folder they write in.
    pub hosts: Vec<ServeHost>,
    pub etcd: Etcd,
    pub names: Vec<String>,
    pub shared: PathBuf,
    _shared: tempfile::TempDir,
    lease_ttl_s: u64,
    /// Each pipeline's stream length (the oracle needs it too).
    changes: u64,
    /// The one tenant, as every host's file names it.
    tenant: Tenant,
}

impl Cluster {
    pub fn start(hosts: usize, lease_ttl_s: u64) -> Cluster {
        Cluster::start_with(hosts, lease_ttl_s, Tenant::new(T).max_pipelines(8))
    }

    /// A cluster whose hosts' files name `tenant` (its root on object
    /// storage, say) as tenant [`T`].
    pub fn start_with(hosts: usize, lease_ttl_s: u64, tenant: Tenant) -> Cluster {
        let etcd = Etcd::start();
        let shared = tempfile::tempdir().expect("a shared folder");
        let path = shared.path().to_path_buf();
        let names: Vec<String> = (0..hosts).map(|n| format!("host-{n}")).collect();
        let hosts = names
            .iter()
            .map(|name| host(&etcd, &path, name, lease_ttl_s, &tenant))
            .collect();
        Cluster {
            hosts,
            etcd,
            names,
            shared: path,
            _shared: shared,
            lease_ttl_s,
            changes: CHANGES,
            tenant,
        }
    }

    /// Streams of `changes` changes instead of [`CHANGES`].
    pub fn with_changes(mut self, changes: u64) -> Cluster {
        self.changes = changes;
        self
    }

    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// A fresh host in place of host `index` (after it was killed or
    /// stopped): the same name and shared folder, a new process and state.
    pub fn restart(&mut self, index: usize) {
        self.hosts[index] = self.fresh_host(index);
    }

    /// A host that would take host `index`'s place, started now.
    pub fn fresh_host(&self, index: usize) -> ServeHost {
        host(
            &self.etcd,
            &self.shared,
            &self.names[index],
            self.lease_ttl_s,
            &self.tenant,
        )
    }

    pub fn join(&mut self, name: &str) {
        self.hosts.push(host(
            &self.etcd,
            &self.shared,
            name,
            self.lease_ttl_s,
            &self.tenant,
        ));
        self.names.push(name.to_string());
    }

    pub fn deploy(&self, via: usize, pipelines: &[(&str, u64)], pace_us: u64) {
        let host = &self.hosts[via];
        for (name, seed) in pipelines {
            let pipeline = paced_positioned(name, SINK, *seed, self.changes, pace_us);
            let reply = host.deploy(T, &pipeline, host.token(T));
            assert!(reply.is_success(), "deploying {name}: {reply}");
        }
    }

    /// Where `pipeline`'s sink keeps its commits.
    pub fn sink_root(&self, pipeline: &str) -> PathBuf {
        self.shared.join("data").join(T).join(pipeline).join(SINK)
    }

    /// The host etcd says owns `pipeline`, if any.
    pub fn owner(&self, pipeline: &str) -> Option<usize> {
        let name = self
            .etcd
            .get(&format!("/weir/assignments/{T}/{pipeline}"))?;
        self.names.iter().position(|n| *n == name)
    }

    /// Waits until `pipeline` runs on a host other than `not_on` and has
    /// taken changes there; returns that host.
    pub fn running_elsewhere(
        &self,
        pipeline: &str,
        not_on: Option<usize>,
        bound: Duration,
    ) -> usize {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(owner) = self.owner(pipeline).filter(|o| Some(*o) != not_on) {
                let host = &self.hosts[owner];
                let status = host.status(T, pipeline, host.operator_token());
                if status["state"] == "running" && status["live"]["changes"].as_u64() > Some(0) {
                    return owner;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{pipeline} does not run on another host than {not_on:?} after {bound:?}; etcd: {:?}",
                self.etcd.list("/weir/")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Lifts the pace and waits until each pipeline finished on its owner,
    /// up to `bound` for each in turn; the names of those that did not.
    pub fn lift_pace_and_finish(
        &self,
        via: usize,
        pipelines: &[(&str, u64)],
        bound: Duration,
    ) -> Vec<String> {
        self.deploy(via, pipelines, 0);
        let mut unfinished = Vec::new();
        for (name, _) in pipelines {
            let deadline = Instant::now() + bound;
            loop {
                let finished = self.owner(name).is_some_and(|owner| {
                    let host = &self.hosts[owner];
                    host.status(T, name, host.operator_token())["state"] == "finished"
                });
                if finished {
                    break;
                }
                if Instant::now() >= deadline {
                    unfinished.push(name.to_string());
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        unfinished
    }

    /// Lifts the pace, waits until each pipeline finished on its owner, and
    /// compares its destination with the oracle.
    pub fn finish_exact(&self, via: usize, pipelines: &[(&str, u64)]) {
        let unfinished = self.lift_pace_and_finish(via, pipelines, Duration::from_secs(240));
        assert!(
            unfinished.is_empty(),
            "{unfinished:?} did not finish; etcd: {:?}",
            self.etcd.list("/weir/assignments/")
        );
        for (name, seed) in pipelines {
            assert_positioned_exact(&self.sink_root(name), &expected_state(*seed, self.changes));
        }
    }
}

fn host(etcd: &Etcd, shared: &Path, name: &str, lease_ttl_s: u64, tenant: &Tenant) -> ServeHost {
    ServeHost::builder()
        .tenant(tenant.clone())
        .cluster(&etcd.endpoint(), name)
        .cluster_setting("lease_ttl_s", lease_ttl_s)
        .cluster_setting("placement_delay_ms", PLACEMENT_DELAY_MS)
        .cluster_setting("request_timeout_ms", 800)
        .shared(shared)
        .shared_tokens(&shared.display().to_string())
        .start()
}
