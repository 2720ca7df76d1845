//! When crash tests kill the host.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Kill delays for crash tests, from a fresh seed so every run probes other
/// moments, or from `WEIR_CRASH_SEED` to replay one; the seed is printed
/// either way.
pub struct KillSchedule {
    seed: u64,
    random: ChaCha8Rng,
}

impl KillSchedule {
    /// Seeded by `WEIR_CRASH_SEED` when set, else randomly.
    pub fn from_env_or_random() -> Self {
        let seed = std::env::var("WEIR_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("kill schedule seed: {seed} (set WEIR_CRASH_SEED to replay it)");
        KillSchedule {
            seed,
            random: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The seed, to derive what else a replay must repeat (the workload).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A delay in `low..high` milliseconds.
    pub fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.random.random_range(low..high)
    }

    /// One of `weights.len()` choices, each as likely as its weight.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut drawn = self.random.random_range(0..total);
        for (choice, weight) in weights.iter().enumerate() {
            if drawn < *weight {
                return choice;
            }
            drawn -= weight;
        }
        unreachable!("a draw below the total falls in one weight")
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
