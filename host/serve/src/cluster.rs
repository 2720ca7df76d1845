//! This host's part in a cluster (the host file's `cluster:`): it says
//! which pipelines it defines, leads when it wins the election and then
//! places pipelines on hosts, claims what is placed on it, and gives up
//! what was moved away or what it can no longer hold.
//!
//! Everything here reads and writes etcd through [`weir_cluster`]; what a
//! slot does with a claim is the supervisor's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use weir_cluster::etcd_client::{self, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use weir_cluster::claims::Claim;
use weir_cluster::placement::{Placer, View, Weight};
use weir_cluster::{ClusterError, Keys, PipelineId, Session};

use crate::mirror::Mirror;
use crate::server::Server;
use crate::supervisor::{Held, Slot};

/// How often the agent looks at the cluster.
const TICK: Duration = Duration::from_millis(250);

pub struct Agent {
    session: Arc<Session>,
    /// With a plugin store: the pipelines folders kept alike through etcd.
    mirror: Option<Mirror>,
    placer: Mutex<Placer>,
    /// What this host last wrote under `pipelines/`, to write only changes.
    registered: Mutex<BTreeMap<PipelineId, Weight>>,
    /// Claims this host holds in etcd, including those whose run is still
    /// ending after the slot gave them up.
    claims: Mutex<BTreeMap<PipelineId, Held>>,
    leading: AtomicBool,
    stop: AtomicBool,
    /// When an error was last logged, so a dead etcd logs once a while.
    last_complaint: Mutex<Option<Instant>>,
}

/// What one look at etcd found.
struct Snapshot {
    /// Each member and its admin address.
    members: BTreeMap<String, String>,
    pipelines: BTreeMap<PipelineId, Weight>,
    placements: BTreeMap<PipelineId, String>,
    /// Owner and the lease it holds it on.
    assignments: BTreeMap<PipelineId, (String, i64)>,
}

impl Agent {
    pub fn new(session: Arc<Session>, mirror: Option<Mirror>) -> Arc<Agent> {
        let config = session.config();
        let placer = Placer::new(config.placement_delay(), config.max_moves_per_minute);
        Arc::new(Agent {
            session,
            mirror,
            placer: Mutex::new(placer),
            registered: Mutex::new(BTreeMap::new()),
            claims: Mutex::new(BTreeMap::new()),
            leading: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            last_complaint: Mutex::new(None),
        })
    }

    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    /// How many claims this host holds now.
    pub fn claims_held(&self) -> usize {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Looks at the cluster four times a second until [`Agent::halt`].
    pub fn run(self: Arc<Self>, server: Arc<Server>) {
        while !self.stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            if let Err(e) = self.tick(&server) {
                self.complain(&e);
            }
            std::thread::sleep(TICK.saturating_sub(started.elapsed()));
        }
    }

    /// Stops looking: nothing is claimed or placed from here on.
    pub fn halt(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn complain(&self, error: &ClusterError) {
        let mut last = self
            .last_complaint
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
            tracing::warn!(host = %self.session.name(), "cluster: {error}");
            *last = Some(Instant::now());
        }
    }

    fn tick(&self, server: &Server) -> Result<(), ClusterError> {
        if let Some(mirror) = &self.mirror {
            mirror.sync()?;
        }
        let slots: BTreeMap<PipelineId, Arc<Slot>> = server
            .slots()
            .into_iter()
            .map(|slot| (PipelineId::new(&slot.tenant.name, &slot.name), slot))
            .collect();
        self.register(&slots)?;
        let mut snapshot = self.read()?;
        self.lead(&mut snapshot)?;
        self.own(&slots, &snapshot)?;
        Ok(())
    }

    /// Writes what placement weighs of each pipeline this host defines, and
    /// removes what it no longer defines.
    fn register(&self, slots: &BTreeMap<PipelineId, Arc<Slot>>) -> Result<(), ClusterError> {
        let keys = self.session.keys();
        let mut registered = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (id, slot) in slots {
            let weight = Weight {
                memory_mb: slot.memory_mb(),
            };
            if registered.get(id) == Some(&weight) {
                continue;
            }
            let value = serde_json::to_string(&weight).unwrap_or_default();
            let mut client = self.session.client();
            self.session.wait(async {
                client
                    .put(keys.pipeline(id), value, None)
                    .await
                    .map(|_| ())
                    .map_err(|e| self.session.error_of("defining a pipeline", e))
            })?;
            registered.insert(id.clone(), weight);
        }
        let gone: Vec<PipelineId> = registered
            .keys()
            .filter(|id| !slots.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let mut client = self.session.client();
            self.session.wait(async {
                client
                    .delete(keys.pipeline(&id), None)
                    .await
                    .map(|_| ())
                    .map_err(|e| self.session.error_of("removing a pipeline", e))
            })?;
            registered.remove(&id);
        }
        Ok(())
    }

    fn read(&self) -> Result<Snapshot, ClusterError> {
        let keys = self.session.keys().clone();
        let mut client = self.session.client();
        let session = &self.session;
        let (members, pipelines, placements, assignments) = self.session.wait(async move {
            let all = Some(GetOptions::new().with_prefix());
            let error = |e| session.error_of("reading the cluster", e);
            let members = client
                .get(keys.members(), all.clone())
                .await
                .map_err(error)?;
            let pipelines = client
                .get(keys.pipelines(), all.clone())
                .await
                .map_err(error)?;
            let placements = client
                .get(keys.placements(), all.clone())
                .await
                .map_err(error)?;
            let assignments = client.get(keys.assignments(), all).await.map_err(error)?;
            Ok((members, pipelines, placements, assignments))
        })?;
        let text = |value: &[u8]| String::from_utf8_lossy(value).into_owned();
        let under = |prefix: String, key: &[u8]| Keys::id_in(&prefix, key);
        let keys = self.session.keys();
        Ok(Snapshot {
            members: members
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let host = kv.key().strip_prefix(keys.members().as_bytes())?;
                    Some((text(host), text(kv.value())))
                })
                .collect(),
            pipelines: pipelines
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let id = under(keys.pipelines(), kv.key())?;
                    let weight = serde_json::from_slice(kv.value()).unwrap_or_default();
                    Some((id, weight))
                })
                .collect(),
            placements: placements
                .kvs()
                .iter()
                .filter_map(|kv| Some((under(keys.placements(), kv.key())?, text(kv.value()))))
                .collect(),
            assignments: assignments
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let id = under(keys.assignments(), kv.key())?;
                    Some((id, (text(kv.value()), kv.lease())))
                })
                .collect(),
        })
    }

    /// Takes the lead if nobody holds it; the leader places pipelines.
    fn lead(&self, snapshot: &mut Snapshot) -> Result<(), ClusterError> {
        let keys = self.session.keys();
        let lease = self.session.lease();
        let me = self.session.name();
        let leader = keys.leader();
        let campaign = Txn::new()
            .when([Compare::create_revision(
                leader.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                leader.clone(),
                me,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(leader.clone(), None)]);
        let mut client = self.session.client();
        let answer = self.session.wait(async {
            client
                .txn(campaign)
                .await
                .map_err(|e| self.session.error_of("campaigning", e))
        })?;
        let leading = answer.succeeded()
            || answer.op_responses().iter().any(|op| match op {
                etcd_client::TxnOpResponse::Get(found) => found
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.value() == me.as_bytes() && kv.lease() == lease),
                _ => false,
            });
        let was = self.leading.swap(leading, Ordering::Relaxed);
        self.session.metrics().leading(leading);
        if leading != was {
            tracing::info!(host = %me, "cluster: {}", if leading { "leading" } else { "following" });
        }
        if !leading {
            return Ok(());
        }
        let view = View {
            members: snapshot.members.keys().cloned().collect(),
            pipelines: snapshot.pipelines.clone(),
            placements: snapshot.placements.clone(),
        };
        let moves = self
            .placer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .plan(&view, Instant::now());
        for step in moves {
            let key = keys.placement(&step.id);
            // Written only while this host still leads on this lease.
            let guard = [
                Compare::value(leader.clone(), CompareOp::Equal, me),
                Compare::lease(leader.clone(), CompareOp::Equal, lease),
            ];
            let write = match &step.to {
                Some(to) => TxnOp::put(key, to.as_str(), None),
                None => TxnOp::delete(key, None),
            };
            let txn = Txn::new().when(guard).and_then([write]);
            if !self.session.transact(txn, "placing a pipeline")? {
                return Ok(());
            }
            tracing::info!(
                pipeline = %step.id,
                from = step.from.as_deref().unwrap_or("-"),
                to = step.to.as_deref().unwrap_or("-"),
                "cluster: placed"
            );
            match step.to {
                Some(to) => snapshot.placements.insert(step.id, to),
                None => snapshot.placements.remove(&step.id),
            };
        }
        Ok(())
    }

    /// Claims what is placed here and free; gives up what is not placed
    /// here any more, or what this host's lease no longer holds.
    fn own(
        &self,
        slots: &BTreeMap<PipelineId, Arc<Slot>>,
        snapshot: &Snapshot,
    ) -> Result<(), ClusterError> {
        let me = self.session.name();
        let lease = self.session.lease();
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        // Claims whose slot is gone, or whose run ended after the slot gave
        // them up: released in etcd.
        let ended: Vec<(PipelineId, Held)> = claims
            .iter()
            .filter(|(id, _)| {
                slots
                    .get(*id)
                    .is_none_or(|slot| slot.held().is_none() && !slot.running())
            })
            .map(|(id, held)| (id.clone(), *held))
            .collect();
        for (id, held) in ended {
            if held.lease == lease {
                self.session.wait(self.session.release(&id, held.lease))?;
            }
            claims.remove(&id);
            tracing::info!(pipeline = %id, host = %me, "cluster: released");
        }
        for (id, slot) in slots {
            let placed = snapshot.placements.get(id).map(String::as_str);
            let assigned = snapshot.assignments.get(id);
            if let Some(held) = slot.held() {
                let why = if held.lease != lease {
                    Some(
                        "this host's lease ran out; the pipeline may run elsewhere now".to_string(),
                    )
                } else if placed != Some(me) {
                    Some(format!(
                        "placed on {} now",
                        placed.map_or("no host".to_string(), |p| format!("`{p}`"))
                    ))
                } else if assigned != Some(&(me.to_string(), held.lease)) {
                    Some("its assignment in etcd is gone".to_string())
                } else {
                    None
                };
                if let Some(why) = why {
                    tracing::warn!(pipeline = %id, host = %me, "cluster: giving up: {why}");
                    slot.revoke(why);
                }
                continue;
            }
            if claims.contains_key(id) {
                continue; // its run is still ending
            }
            if placed != Some(me) {
                let why = match (assigned, placed) {
                    (Some((owner, _)), _) => match snapshot.members.get(owner) {
                        Some(address) => format!(
                            "runs on `{owner}`; its status is there (admin API at {address})"
                        ),
                        None => format!("runs on `{owner}`"),
                    },
                    (None, Some(host)) => format!("placed on `{host}`"),
                    (None, None) => "waiting to be placed on a host".to_string(),
                };
                slot.standby(why);
                continue;
            }
            if assigned.is_some() || !slot.wants_to_run() {
                if let Some((owner, _)) = assigned {
                    slot.standby(format!("placed here; `{owner}` still gives it up"));
                }
                continue;
            }
            match self.session.wait(self.session.claim(id))? {
                Claim::Taken { lease, epoch } => {
                    tracing::info!(pipeline = %id, host = %me, epoch, "cluster: claimed");
                    let held = Held { lease, epoch };
                    claims.insert(id.clone(), held);
                    self.session.metrics().claimed();
                    slot.grant(held);
                }
                Claim::Held => {}
            }
        }
        self.session.metrics().assignments(claims.len());
        Ok(())
    }

    /// Leaving on SIGTERM, after every run ended: this host's member key
    /// first (so the leader places nothing more here), then its claims and
    /// their placements (so the leader places them at once, without waiting
    /// out the delay), then its lease.
    pub fn leave(&self) -> Result<(), ClusterError> {
        self.halt();
        let keys = self.session.keys();
        let me = self.session.name();
        let mut client = self.session.client();
        self.session.wait(async {
            client
                .delete(keys.member(me), None)
                .await
                .map(|_| ())
                .map_err(|e| self.session.error_of("leaving", e))
        })?;
        let claims =
            std::mem::take(&mut *self.claims.lock().unwrap_or_else(PoisonError::into_inner));
        for (id, held) in claims {
            let placement = keys.placement(&id);
            let txn = Txn::new()
                .when([
                    Compare::value(keys.assignment(&id), CompareOp::Equal, me),
                    Compare::lease(keys.assignment(&id), CompareOp::Equal, held.lease),
                    Compare::value(placement.clone(), CompareOp::Equal, me),
                ])
                .and_then([
                    TxnOp::delete(keys.assignment(&id), None),
                    TxnOp::delete(placement, None),
                ]);
            self.session.transact(txn, "handing a pipeline over")?;
            tracing::info!(pipeline = %id, host = %me, "cluster: handed over");
        }
        self.session.leave()
    }
}
