//! Named crash points for crash tests: `WEIR_FAILPOINT=after-sink-commit@3`
//! kills the process with SIGKILL the third time that point is passed, so a
//! test can land a crash exactly between two steps of a commit.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct Armed {
    name: String,
    at: u64,
    hits: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("WEIR_FAILPOINT").ok()?;
            let (name, at) = spec.split_once('@').unwrap_or((spec.as_str(), "1"));
            Some(Armed {
                name: name.to_string(),
                at: at.parse().ok()?,
                hits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Passes a crash point; dies here if this is the armed hit.
pub fn hit(name: &str) {
    let Some(armed) = armed() else { return };
    if armed.name != name {
        return;
    }
    if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.at {
        eprintln!(
            "weir: failpoint {name}@{} reached, killing the process",
            armed.at
        );
        // SAFETY: kill(2) on our own pid with a valid signal number.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
