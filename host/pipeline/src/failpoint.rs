//! Named crash points for crash tests: with the `failpoints` feature,
//! `WEIR_FAILPOINT=after-sink-commit@3` kills the process with SIGKILL the
//! third time that point is passed, so a test can land a crash exactly
//! between two steps of a commit. Without the feature (the shipped binary)
//! every crash point compiles to nothing.
//!
//! The points are the executor's [`CrashPoint`]s, so the names the tests
//! aim at are the ones the core passes.

use weir_core::CrashPoint;

/// Arms the crash point `WEIR_FAILPOINT` names, if any. Call once, before
/// the pipeline starts.
pub fn arm_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var("WEIR_FAILPOINT") else {
        return Ok(());
    };
    if !cfg!(feature = "failpoints") {
        return Err(format!(
            "WEIR_FAILPOINT={spec}: this weir was built without crash points \
             (build it with `--features failpoints`)"
        ));
    }
    let (name, at) = spec.split_once('@').unwrap_or((spec.as_str(), "1"));
    let known = [
        CrashPoint::BeforeSinkCommit,
        CrashPoint::AfterSinkCommit,
        CrashPoint::AfterStoreWrite,
        CrashPoint::AfterSourceAck,
    ];
    if !known.iter().any(|p| p.name() == name) {
        let names: Vec<&str> = known.iter().map(|p| p.name()).collect();
        return Err(format!(
            "WEIR_FAILPOINT={spec}: unknown crash point (known: {})",
            names.join(", ")
        ));
    }
    let at: u64 = at
        .parse()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("WEIR_FAILPOINT={spec}: the hit after `@` must be 1 or more"))?;
    // Pass the point `at - 1` times, then take its action: the kill below.
    let actions = match at {
        1 => "return".to_string(),
        n => format!("{}*off->return", n - 1),
    };
    fail::cfg(name, &actions)
}

/// Passes a crash point; dies here if it is the armed hit.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
pub fn reached(point: CrashPoint) {
    let name = point.name();
    fail::fail_point!(name, |_| {
        eprintln!("weir: failpoint {name} reached, killing the process");
        // SAFETY: kill(2) on our own pid with a valid signal number.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    });
}
