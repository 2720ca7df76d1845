//! The test config `weir plugin test --config` reads: what the sink is
//! given (its `config` map, grants and limits, as in a pipeline) and the
//! reader that shows what it wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use weir_pipeline::config::{GrantsConfig, LimitsConfig, interpolate};

/// A plugin test's settings; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestConfig {
    /// The sink's `config` map, as `sinks[].config` in a pipeline.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Where it may connect, as `sinks[].grants`.
    #[serde(default)]
    pub grants: GrantsConfig,
    /// Its limits, as `sinks[].limits`.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// How to read back what it wrote; without it nothing can be verified.
    pub verify: Option<VerifyConfig>,
    /// The folder relative paths are taken from: the config file's.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// The operator's reader of the destination.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// The program and its arguments. It prints the rows one table holds,
    /// one JSON object per line, and is run with `WEIR_TEST_ROOT`,
    /// `WEIR_TEST_TABLE` and `WEIR_TEST_PIPELINE` set, in the config
    /// file's folder.
    pub command: Vec<String>,
    /// What the printed rows are.
    pub shows: Shows,
    /// How long one reading may take.
    #[serde(default = "default_verify_timeout_ms")]
    pub timeout_ms: u64,
}

/// What a reader prints of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shows {
    /// The live rows, one per key (the destination applies changes).
    State,
    /// Every change recorded, each with its `op`.
    Changes,
}

fn default_verify_timeout_ms() -> u64 {
    60_000
}

impl VerifyConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

impl TestConfig {
    /// Reads `path`, with `${VAR}` taken from `run` (the test's own
    /// values, such as `WEIR_TEST_ROOT`), else from the environment.
    pub fn load(path: &Path, run: &[(&str, String)]) -> Result<TestConfig, String> {
        let fail = |detail: String| format!("test config {}: {detail}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let lookup = |name: &str| {
            run.iter()
                .find(|(known, _)| *known == name)
                .map(|(_, value)| value.clone())
                .or_else(|| std::env::var(name).ok())
        };
        let expanded = interpolate(&text, &lookup).map_err(&fail)?;
        let mut config: TestConfig =
            serde_saphyr::from_str(&expanded).map_err(|e| fail(e.to_string()))?;
        config.grants.parse().map_err(&fail)?;
        if let Some(verify) = &config.verify
            && verify
                .command
                .first()
                .is_none_or(|program| program.is_empty())
        {
            return Err(fail("verify.command: name the program to run".into()));
        }
        config.base_dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<TestConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, text).unwrap();
        TestConfig::load(&path, &[("WEIR_TEST_ROOT", "/tmp/root".into())])
    }

    #[test]
    fn reads_a_reader_and_the_sinks_settings() {
        let config = load(
            "config: { prefix: x, warehouse: \"file://${WEIR_TEST_ROOT}\" }\nverify: { command: [sh, read.sh], shows: changes }\n",
        )
        .unwrap();
        assert_eq!(config.config["prefix"], "x");
        assert_eq!(config.config["warehouse"], "file:///tmp/root");
        let verify = config.verify.unwrap();
        assert_eq!(verify.command, ["sh", "read.sh"]);
        assert_eq!(verify.shows, Shows::Changes);
    }

    #[test]
    fn refuses_what_it_cannot_use_naming_the_key() {
        let typo = load("verfy: { command: [cat], shows: state }\n").unwrap_err();
        assert!(typo.contains("verfy"), "{typo}");
        let shows = load("verify: { command: [cat], shows: rows }\n").unwrap_err();
        assert!(shows.contains("rows"), "{shows}");
        let empty = load("verify: { command: [], shows: state }\n").unwrap_err();
        assert!(empty.contains("verify.command"), "{empty}");
        let grant = load("grants: { tcp: [nonsense] }\n").unwrap_err();
        assert!(grant.contains("grants.tcp[0]"), "{grant}");
    }
}
