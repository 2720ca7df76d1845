//! Where the built artifacts are (the `weir` binary built with the tests,
//! the WASM plugins) and how tests run `weir`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The root of the weir workspace.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support sits two levels below the workspace")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// The `weir` binary built with the running test (scripts/test builds both
/// in one cargo call, in the `release-tests` profile), or the one
/// `WEIR_BIN` names: pointing the tests at an older build shows what they
/// catch.
pub fn weir_bin() -> PathBuf {
    let bin = std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("weir"));
    assert!(
        bin.exists(),
        "{} is missing: build it with the tests, `cargo build --bins --tests` \
         in the same profile (scripts/test does)",
        bin.display()
    );
    bin
}

/// The folder of the cargo profile the running test binary was built in
/// (`target/<profile>`): test and bench binaries sit in its `deps` folder.
/// Outside one (a binary copied elsewhere), the release folder.
fn profile_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let deps = exe.parent()?;
            (deps.file_name()? == "deps").then(|| deps.parent().map(Path::to_path_buf))?
        })
        .unwrap_or_else(|| target_dir().join("release"))
}

/// A plugin built by scripts/build-plugins, by crate name.
pub fn plugin(crate_name: &str) -> PathBuf {
    let file = target_dir()
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    assert!(
        file.exists(),
        "{} is missing: run scripts/build-plugins",
        file.display()
    );
    file
}

/// The target folder scripts/build-plugins builds the Rust plugins in
/// (`<target>/plugins`): their compiled dependencies are there.
pub fn plugin_target_dir() -> PathBuf {
    target_dir().join("plugins")
}

/// The component cache the tests share (`WEIR_COMPONENT_CACHE`): each
/// plugin compiles once per test run, not once per test (the Iceberg sink
/// takes 15 to 25 CPU-seconds, and most of the Iceberg and Postgres tests
/// use it). Tests of the cache itself set the variable to their own folder,
/// or to nothing for the cache beside the pipeline's state.
pub fn shared_component_cache() -> PathBuf {
    target_dir().join("test-component-cache")
}

/// `weir` as the tests start it: reading pipeline files rather than asking
/// a server (`weir status` asks one when WEIR_SERVER is set), and compiling
/// plugins into the [shared cache](shared_component_cache). An `env` set
/// on the command afterwards overrides either.
pub fn weir_command() -> Command {
    let mut command = Command::new(weir_bin());
    command
        .env_remove("WEIR_SERVER")
        .env_remove("WEIR_TOKEN")
        .env("WEIR_COMPONENT_CACHE", shared_component_cache());
    command
}

/// Runs `weir` with arguments and extra environment, returning its output.
pub fn weir(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = weir_command();
    command.args(args).env("WEIR_LOG", "warn");
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().expect("weir runs")
}

/// A run's exit code and output, for assertion messages.
pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `weir run PIPELINE` with the failpoint `spec` (`after-sink-commit@9`),
/// which must kill it (SIGKILL): a run the failpoint did not end is
/// INCONCLUSIVE, never a pass, since the crash never landed.
pub fn run_killed_at(pipeline: &Path, spec: &str) -> Output {
    use std::os::unix::process::ExitStatusExt;
    let out = weir(
        &["run", pipeline.to_str().unwrap()],
        &[("WEIR_FAILPOINT", spec)],
    );
    if out.status.signal() != Some(9) {
        panic!(
            "INCONCLUSIVE: the failpoint {spec} did not kill the run: {}",
            text(&out)
        );
    }
    out
}

/// `weir status --json`, parsed.
pub fn status(pipeline: &Path) -> serde_json::Value {
    let out = weir(&["status", pipeline.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "weir status failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("status is JSON")
}

/// A sink's committed position per table from a status, as raw bytes.
pub fn positions_of(status: &serde_json::Value, sink: &str) -> BTreeMap<String, Option<Vec<u8>>> {
    let sinks = status["sinks"].as_array().expect("sinks");
    let sink = sinks
        .iter()
        .find(|s| s["sink"] == sink)
        .unwrap_or_else(|| panic!("no sink {sink} in status"));
    sink["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let position = t["position_hex"].as_str().map(|h| hex::decode(h).unwrap());
            (t["table"].as_str().unwrap().to_string(), position)
        })
        .collect()
}

/// Lag (in source transactions) summed over `sink`'s tables, as `weir
/// status` reports it, and whether the sink has committed anything yet.
pub fn sink_progress(pipeline: &Path, sink: &str) -> (u64, bool) {
    let status = status(pipeline);
    let entry = status["sinks"]
        .as_array()
        .expect("status lists sinks")
        .iter()
        .find(|s| s["sink"] == sink)
        .unwrap_or_else(|| panic!("status has no sink `{sink}`"))
        .clone();
    let mut lag = 0;
    let mut any = false;
    for table in entry["tables"].as_array().expect("a sink lists tables") {
        lag += table["lag_transactions"].as_u64().unwrap_or(0);
        any |= !table["position"].is_null();
    }
    (lag, any)
}
