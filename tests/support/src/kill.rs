//! When crash tests kill the host.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Kill delays for crash tests, from a fresh seed so every run probes other
/// moments, or from `WEIR_CRASH_SEED` to replay one; the seed is printed
/// either way.
pub struct KillSchedule(ChaCha8Rng);

impl KillSchedule {
    /// Seeded by `WEIR_CRASH_SEED` when set, else randomly.
    pub fn from_env_or_random() -> Self {
        let seed = std::env::var("WEIR_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("kill schedule seed: {seed} (set WEIR_CRASH_SEED to replay it)");
        KillSchedule(ChaCha8Rng::seed_from_u64(seed))
    }

    /// A delay in `low..high` milliseconds.
    pub fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0.random_range(low..high)
    }
}

/// How deep the slowest crash and reader tests go: bounded by default, so
/// that `make test` stays within CI's time, or at full depth with
/// `WEIR_TESTS=long` (more kills, longer streams), as before a release.
/// Both depths must prove what the test claims; the long one probes more.
pub fn depth<T>(bounded: T, long: T) -> T {
    match std::env::var("WEIR_TESTS").as_deref() {
        Ok("long") => long,
        Ok("") | Err(_) => bounded,
        Ok(other) => panic!("WEIR_TESTS={other}: unknown depth (set `long`, or leave it unset)"),
    }
}
