//! What the admin API sends, as types: [`admin`](super::admin) builds them
//! and `weir ctl` reads them back, so both sides spell every field alike.
//!
//! A client may talk to a server of another version. So every reply
//! ignores fields it does not know, a field that may be missing reads as
//! its default, and a list or map sent as null reads as empty. Only what
//! makes a reply the reply it is (`ready`, `pipelines`, `changed`,
//! `error`) is required.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use super::supervisor::PluginVersion;

pub use super::supervisor::{State, SwapRecord};
pub use weir_pipeline::control::{LiveSink, LiveStatus, LiveTable};

/// The body of every refusal, whatever its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

/// `GET /ready`: 200 when ready, 503 with what keeps it from being so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Readiness {
    pub ready: bool,
    #[serde(default, deserialize_with = "empty_if_null")]
    pub not_running: Vec<NotRunning>,
    #[serde(default, deserialize_with = "empty_if_null")]
    pub rejected: Vec<RejectedFile>,
}

/// A pipeline that should run and does not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NotRunning {
    /// `tenant/pipeline`.
    pub pipeline: String,
    pub state: State,
    pub reason: Option<String>,
}

/// A pipeline file in the watched folder that was not admitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RejectedFile {
    pub file: String,
    pub error: String,
}

/// `GET /v1/pipelines`: the pipelines the token reaches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineList {
    pub pipelines: Vec<PipelineSummary>,
    /// Pipeline files in the watched folder that were not admitted, with
    /// why (those of the token's tenant; all for the operator's).
    #[serde(default, deserialize_with = "empty_if_null")]
    pub rejected: Vec<RejectedFile>,
}

/// One pipeline of the list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineSummary {
    pub tenant: String,
    pub pipeline: String,
    pub state: State,
    pub reason: Option<String>,
}

/// `PUT /v1/pipelines/{tenant}/{pipeline}`: false when the same
/// definition was applied again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub changed: bool,
}

/// `DELETE /v1/pipelines/{tenant}/{pipeline}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deleted {
    #[serde(default)]
    pub deleted: bool,
}

/// `POST /v1/pipelines/{tenant}/{pipeline}/{verb}`: the state right after
/// the pipeline was asked (a pause or a stop lands at the next commit
/// boundary, so it may not show yet).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Steered {
    pub state: State,
    pub reason: Option<String>,
}

/// `GET /v1/pipelines/{tenant}/{pipeline}`. While a pipeline starts, most
/// of it is not known yet: `live` is null until a run has begun.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineStatus {
    pub tenant: String,
    pub pipeline: String,
    pub state: State,
    pub reason: Option<String>,
    /// Failed runs in a row.
    pub failures: u32,
    /// The pipeline file in the watched folder.
    pub file: String,
    /// The plugin version each sink runs.
    #[serde(deserialize_with = "empty_if_null")]
    pub plugins: BTreeMap<String, PluginView>,
    /// The running run's figures, or the last run's.
    pub live: Option<LiveStatus>,
    /// The last error each sink caused, by sink.
    #[serde(deserialize_with = "empty_if_null")]
    pub sink_errors: BTreeMap<String, String>,
    /// The swaps asked for, oldest first.
    #[serde(deserialize_with = "empty_if_null")]
    pub swaps: Vec<SwapRecord>,
    /// In a cluster, the host whose view this is (the one that runs the
    /// pipeline, unless `?local=true` asked another for its own).
    pub host: Option<String>,
}

/// The plugin a sink runs, as the status shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginView {
    pub path: String,
    pub sha256: String,
    /// What a rollback would go back to.
    pub previous_sha256: Option<String>,
    pub swaps: u64,
}

impl From<PluginVersion> for PluginView {
    fn from(version: PluginVersion) -> Self {
        PluginView {
            path: version.path.display().to_string(),
            sha256: version.sha256,
            previous_sha256: version.previous.map(|(_, sha256)| sha256),
            swaps: version.swaps,
        }
    }
}

/// `PUT …/sinks/{sink}/plugin` and `POST …/sinks/{sink}/rollback`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Swapped {
    pub sink: String,
    pub sha256: String,
    pub previous_sha256: Option<String>,
    /// How long the pipeline stopped taking changes; `None` when it was
    /// not running (the version is taken at its next start).
    pub pause_ms: Option<f64>,
    /// The checkpoint where the new version took over.
    pub at: Option<String>,
    /// The pipeline was parked (or backing off) and starts again with the
    /// version swapped in: a rollback of the version that parked it.
    #[serde(default)]
    pub restarted: bool,
}

/// `PUT /v1/tenants/{tenant}/plugins/{sha256}`: the plugin is kept, for
/// pipeline files to name as `sha256:<digest>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Uploaded {
    pub sha256: String,
    /// Its length in bytes.
    pub size: u64,
    /// False when the tenant had uploaded the same bytes already.
    pub new: bool,
}

/// A list or map sent as null reads as empty, as a missing one does.
fn empty_if_null<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::path::PathBuf;

    use serde_json::json;

    use super::*;

    fn full_status() -> PipelineStatus {
        let table = |position: &str, from: &'static str| LiveTable {
            position: Some(position.into()),
            from: Some(Cow::Borrowed(from)),
        };
        let lake = LiveSink {
            required: true,
            positioned: true,
            disabled: None,
            tables: BTreeMap::from([
                ("orders".into(), table("0/16B3F28", "sink")),
                ("customers".into(), LiveTable::default()),
            ]),
        };
        let audit = LiveSink {
            disabled: Some("open failed: bucket gone".into()),
            ..LiveSink::default()
        };
        let version = PluginVersion {
            path: PathBuf::from("pipelines/acme/lake.wasm"),
            sha256: "3f2a".repeat(16),
            previous: Some((PathBuf::from("uploads/77ab.wasm"), "77ab".repeat(16))),
            swaps: 2,
            file_sha256: String::new(),
        };
        PipelineStatus {
            tenant: "acme".into(),
            pipeline: "orders".into(),
            state: State::Running,
            reason: None,
            failures: 0,
            file: "pipelines/acme/orders.yaml".into(),
            plugins: BTreeMap::from([("lake".into(), version.into())]),
            live: Some(LiveStatus {
                epoch: 3,
                transactions: 56,
                changes: 1234,
                batches_committed: 12,
                checkpoint: Some("0/16B3F28".into()),
                lag_seconds: 0.25,
                lag_bytes: Some(4096),
                sinks: BTreeMap::from([("lake".into(), lake), ("audit".into(), audit)]),
            }),
            sink_errors: BTreeMap::from([("audit".into(), "open failed".into())]),
            swaps: vec![SwapRecord {
                sink: "lake".into(),
                outcome: Cow::Borrowed("rolled_back"),
                sha256: "77ab".repeat(16),
                pause_ms: Some(12.5),
                at: Some("0/16B3F28".into()),
                reason: None,
            }],
            host: Some("host-a".into()),
        }
    }

    #[test]
    fn a_status_reads_back_as_it_was_sent() {
        let status = full_status();
        let sent = serde_json::to_string(&status).unwrap();
        let read: PipelineStatus = serde_json::from_str(&sent).unwrap();
        assert_eq!(read, status);
    }

    #[test]
    fn a_status_keeps_its_field_names_and_shapes() {
        // Scripts and the integration tests read these names; a rename is
        // a break of the API, not a refactoring.
        assert_eq!(
            sent(full_status()),
            json!({
                "tenant": "acme", "pipeline": "orders", "state": "running", "reason": null,
                "failures": 0, "file": "pipelines/acme/orders.yaml",
                "plugins": {"lake": {"path": "pipelines/acme/lake.wasm", "sha256": "3f2a".repeat(16),
                                     "previous_sha256": "77ab".repeat(16), "swaps": 2}},
                "live": {"epoch": 3, "transactions": 56, "changes": 1234, "batches_committed": 12,
                         "checkpoint": "0/16B3F28", "lag_seconds": 0.25, "lag_bytes": 4096,
                         "sinks": {
                             "audit": {"required": false, "positioned": false,
                                       "disabled": "open failed: bucket gone", "tables": {}},
                             "lake": {"required": true, "positioned": true, "disabled": null,
                                      "tables": {"customers": {"position": null, "from": null},
                                                 "orders": {"position": "0/16B3F28", "from": "sink"}}}}},
                "sink_errors": {"audit": "open failed"},
                "swaps": [{"sink": "lake", "outcome": "rolled_back", "sha256": "77ab".repeat(16),
                           "pause_ms": 12.5, "at": "0/16B3F28", "reason": null}],
                "host": "host-a"
            })
        );
    }

    fn sent(reply: impl Serialize) -> serde_json::Value {
        serde_json::to_value(reply).unwrap()
    }

    #[test]
    fn the_other_replies_keep_their_field_names_too() {
        assert_eq!(
            sent(&Readiness {
                ready: false,
                not_running: vec![NotRunning {
                    pipeline: "acme/orders".into(),
                    state: State::Parked,
                    reason: Some("open failed".into()),
                }],
                rejected: vec![RejectedFile {
                    file: "pipelines/acme/bad.yaml".into(),
                    error: "unknown key".into(),
                }],
            }),
            json!({"ready": false,
                   "not_running": [{"pipeline": "acme/orders", "state": "parked", "reason": "open failed"}],
                   "rejected": [{"file": "pipelines/acme/bad.yaml", "error": "unknown key"}]})
        );
        assert_eq!(
            sent(&PipelineList {
                pipelines: vec![PipelineSummary {
                    tenant: "acme".into(),
                    pipeline: "orders".into(),
                    state: State::Stopped,
                    reason: None,
                }],
                rejected: vec![RejectedFile {
                    file: "pipelines/acme/bad.yaml".into(),
                    error: "unknown key".into(),
                }],
            }),
            json!({"pipelines": [{"tenant": "acme", "pipeline": "orders", "state": "stopped", "reason": null}],
                   "rejected": [{"file": "pipelines/acme/bad.yaml", "error": "unknown key"}]})
        );
        assert_eq!(sent(&Applied { changed: true }), json!({"changed": true}));
        assert_eq!(sent(&Deleted { deleted: true }), json!({"deleted": true}));
        assert_eq!(
            sent(&Steered {
                state: State::Paused,
                reason: None,
            }),
            json!({"state": "paused", "reason": null})
        );
        assert_eq!(
            sent(&Swapped {
                sink: "lake".into(),
                sha256: "aa".into(),
                previous_sha256: None,
                pause_ms: Some(1.5),
                at: Some("0/10".into()),
                restarted: false,
            }),
            json!({"sink": "lake", "sha256": "aa", "previous_sha256": null, "pause_ms": 1.5, "at": "0/10",
                   "restarted": false})
        );
        assert_eq!(
            sent(&Uploaded {
                sha256: "cd".into(),
                size: 1234,
                new: true,
            }),
            json!({"sha256": "cd", "size": 1234, "new": true})
        );
        assert_eq!(
            sent(&ApiError {
                error: "no pipeline".into(),
            }),
            json!({"error": "no pipeline"})
        );
    }

    #[test]
    fn a_reply_missing_optional_fields_still_reads() {
        let starting: PipelineStatus = serde_json::from_value(
            json!({"tenant": "acme", "pipeline": "orders", "state": "starting"}),
        )
        .unwrap();
        assert_eq!(starting.state, State::Starting);
        assert!(
            starting.live.is_none() && starting.plugins.is_empty() && starting.swaps.is_empty()
        );

        let sparse: PipelineStatus = serde_json::from_value(json!({
            "plugins": null, "swaps": [{"sink": "lake", "outcome": "swapped"}],
            "live": {"sinks": {"lake": {"tables": {"orders": {}}}}}
        }))
        .unwrap();
        assert_eq!(sparse.state, State::Unknown);
        assert_eq!(sparse.swaps[0].pause_ms, None);
        let lake = &sparse.live.unwrap().sinks["lake"];
        assert!(!lake.required && lake.tables["orders"].position.is_none());

        let swapped: Swapped = serde_json::from_value(json!({"sink": "lake"})).unwrap();
        assert_eq!((swapped.sha256.as_str(), swapped.pause_ms), ("", None));
        let not_ready: Readiness = serde_json::from_value(json!({"ready": false})).unwrap();
        assert!(not_ready.not_running.is_empty() && not_ready.rejected.is_empty());
    }

    #[test]
    fn what_a_newer_server_adds_is_ignored() {
        let status: PipelineStatus = serde_json::from_value(json!({
            "state": "draining", "shard": 4,
            "live": {"epoch": 2, "sinks": {}, "lag_transactions": 7}
        }))
        .unwrap();
        assert_eq!(
            status.state,
            State::Unknown,
            "a state this build does not know"
        );
        assert_eq!(status.live.unwrap().epoch, 2);
    }

    #[test]
    fn what_makes_a_reply_what_it_is_is_required() {
        assert!(serde_json::from_value::<Readiness>(json!({"not_running": []})).is_err());
        assert!(serde_json::from_value::<PipelineList>(json!({"other": 1})).is_err());
        assert!(serde_json::from_value::<Applied>(json!({})).is_err());
        assert!(serde_json::from_value::<ApiError>(json!({"message": "no"})).is_err());
    }

    #[test]
    fn states_are_sent_as_the_lowercase_words() {
        for (state, word) in [(State::Running, "running"), (State::Backoff, "backoff")] {
            assert_eq!(serde_json::to_value(state).unwrap(), word);
            assert_eq!(state.as_str(), word);
        }
    }
}
