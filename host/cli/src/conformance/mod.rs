//! `weir plugin test`: what a sink plugin guarantees, found by running it.
//!
//! A test host ([`harness`]) drives the plugin in the real runtime, over a
//! temporary blob root, through fixed [`scenarios`]: delivery, replays,
//! crashes at each step of a commit, abort, fencing, schema change, store
//! failures. It checks the sink's own position claims and reads the
//! destination back only through the operator's reader ([`verify`]). The
//! verdict is earned, never assumed: "exactly-once" only for a sink with
//! `positions` that passed everything; "at-least-once, idempotent by ..."
//! for one without; "cannot verify" when no reader could say.

pub mod config;
pub mod harness;
pub mod scenarios;
pub mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use config::Shows;
pub use config::TestConfig;
use harness::{Harness, Stop};
use weir_runtime::{Plugin, WasmEngine, plugin};

/// How one scenario ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Pass,
    Fail,
    /// The scenario does not apply to this kind of sink.
    #[serde(rename = "n/a")]
    NotApplicable,
    /// The sink declined with `poison`, as the contract allows.
    Refused,
    /// The reader could not say what the destination holds.
    CannotVerify,
}

/// One scenario's result.
#[derive(Debug, Serialize)]
pub struct ScenarioResult {
    pub name: &'static str,
    pub checks: &'static str,
    pub outcome: Outcome,
    pub detail: String,
    pub seconds: f64,
}

/// The guarantee a sink earned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    ExactlyOnce,
    AtLeastOnce,
    Fails,
    CannotVerify,
}

/// What `weir plugin test` found.
#[derive(Debug, Serialize)]
pub struct Report {
    pub plugin: PathBuf,
    pub sha256: String,
    pub positioned: bool,
    pub guarantee: Guarantee,
    /// The guarantee in words, with the failing scenario or the dedup key.
    pub verdict: String,
    pub scenarios: Vec<ScenarioResult>,
}

/// Runs every scenario against the plugin at `path`, configured by the
/// test config at `config_path` (none: no config and no reader).
pub fn run(
    engine: &WasmEngine,
    path: &Path,
    config_path: Option<&Path>,
    io: &tokio::runtime::Handle,
) -> Result<Report, String> {
    // Everything the sink writes goes here and goes away with it.
    let root = tempfile::Builder::new()
        .prefix("weir-plugin-test-")
        .tempdir()
        .map_err(|e| format!("cannot make a temporary root: {e}"))?;
    let pipeline = format!("plugin-test-{:08x}", rand::random::<u32>());
    // A sink that must be told where its root is (the Iceberg sink's
    // `warehouse`) names it in the test config as `${WEIR_TEST_ROOT}`.
    let config = match config_path {
        Some(config_path) => TestConfig::load(
            config_path,
            &[
                ("WEIR_TEST_ROOT", root.path().display().to_string()),
                ("WEIR_TEST_PIPELINE", pipeline.clone()),
            ],
        )?,
        None => TestConfig::default(),
    };
    let grants = config.grants.parse()?;
    let linker = plugin::linker(engine).map_err(|e| e.to_string())?;
    let loaded = Plugin::load(
        engine,
        &linker,
        path,
        None,
        &config.limits.compile_limits(),
        &grants,
    )
    .map_err(|e| e.to_string())?;
    let sha256 = loaded.info.sha256.clone();
    let mut harness = Harness::new(Arc::new(loaded), config, root.path(), io.clone(), pipeline);
    let mut results = Vec::new();
    for scenario in scenarios::SCENARIOS {
        let started = Instant::now();
        let (outcome, detail) = match (scenario.run)(&mut harness) {
            Ok(detail) => (Outcome::Pass, detail),
            Err(Stop::Fail(why)) => (Outcome::Fail, why),
            Err(Stop::CannotVerify(why)) => (Outcome::CannotVerify, why),
            Err(Stop::NotApplicable(why)) => (Outcome::NotApplicable, why),
            Err(Stop::Refused(why)) => (Outcome::Refused, why),
        };
        harness.crash();
        harness.faults.disarm();
        results.push(ScenarioResult {
            name: scenario.name,
            checks: scenario.checks,
            outcome,
            detail,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let (guarantee, verdict) = verdict(&results, harness.positioned, harness.shows());
    Ok(Report {
        plugin: path.to_path_buf(),
        sha256,
        positioned: harness.positioned,
        guarantee,
        verdict,
        scenarios: results,
    })
}

/// The guarantee the results earn, and how it reads.
fn verdict(
    results: &[ScenarioResult],
    positioned: bool,
    shows: Option<Shows>,
) -> (Guarantee, String) {
    if let Some(failed) = results.iter().find(|r| r.outcome == Outcome::Fail) {
        return (
            Guarantee::Fails,
            format!("fails: {}: {}", failed.name, failed.detail),
        );
    }
    if let Some(unverified) = results.iter().find(|r| r.outcome == Outcome::CannotVerify) {
        return (
            Guarantee::CannotVerify,
            format!("cannot verify: {}: {}", unverified.name, unverified.detail),
        );
    }
    if positioned {
        return (Guarantee::ExactlyOnce, "exactly-once".into());
    }
    let key = match shows {
        // Replays showed once in a log of changes: the batch id is what
        // made them overwrite.
        Some(Shows::Changes) | None => "batch id",
        // The destination applies changes at the table's key.
        Some(Shows::State) => "key",
    };
    (
        Guarantee::AtLeastOnce,
        format!("at-least-once, idempotent by {key}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &'static str, outcome: Outcome) -> ScenarioResult {
        ScenarioResult {
            name,
            checks: "",
            outcome,
            detail: format!("{name} detail"),
            seconds: 0.0,
        }
    }

    #[test]
    fn the_verdict_is_earned_never_assumed() {
        let passed = [
            result("delivery", Outcome::Pass),
            result("older-epoch", Outcome::NotApplicable),
        ];
        assert_eq!(verdict(&passed, true, Some(Shows::State)).1, "exactly-once");
        assert_eq!(
            verdict(&passed, false, Some(Shows::Changes)).1,
            "at-least-once, idempotent by batch id"
        );
        assert_eq!(
            verdict(&passed, false, Some(Shows::State)).1,
            "at-least-once, idempotent by key"
        );
        let failed = [
            result("delivery", Outcome::Pass),
            result("replay", Outcome::Fail),
            result("retryable", Outcome::CannotVerify),
        ];
        assert_eq!(
            verdict(&failed, true, Some(Shows::State)),
            (Guarantee::Fails, "fails: replay: replay detail".into())
        );
        let unverified = [result("delivery", Outcome::CannotVerify)];
        assert_eq!(verdict(&unverified, true, None).0, Guarantee::CannotVerify);
    }
}
