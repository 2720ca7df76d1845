//! A token bucket, which the log capability rate-limits a sink's lines
//! with, and a tenant's share all its sinks' lines together.

use std::time::Instant;

/// A token bucket: `per_second` tokens an average, at most `burst` at once.
#[derive(Debug)]
pub struct TokenBucket {
    tokens: f64,
    refilled: Instant,
    per_second: u64,
    burst: u64,
}

impl TokenBucket {
    /// A bucket holding its whole burst at `now`.
    pub fn full(per_second: u64, burst: u64, now: Instant) -> Self {
        TokenBucket {
            tokens: burst as f64,
            refilled: now,
            per_second,
            burst,
        }
    }

    /// Refills for the time since the last call, then takes a token if
    /// there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + refill * self.per_second as f64).min(self.burst as f64);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        false
    }

    /// The tokens it holds now (a fraction while it refills).
    pub fn tokens(&self) -> f64 {
        self.tokens
    }

    /// Puts back a token taken for something that did not happen.
    pub fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst as f64);
    }
}
