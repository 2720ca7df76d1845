//! What the sinks of one tenant share under `weir serve`: one storage quota
//! over all their blob stores, one log rate, and its part of the host's
//! shared resources (instance slots, sockets). A sink's own limits still
//! hold; the tenant's bound all of them together.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::budget::Budget;
use super::capability::token_bucket::TokenBucket;

/// A tenant's bounds, from the host file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantBounds {
    /// The most bytes all its sinks' blob stores may hold together.
    pub max_stored_bytes: u64,
    /// Log lines per second, and burst, for all its sinks together.
    pub log_lines_per_second: u64,
    pub log_burst: u64,
    /// The slots of the host's instance pool its sink instances may hold
    /// together, given-up ones still running included (an instance takes
    /// one slot, more if it has more memories or tables than a slot gives).
    pub max_instances: usize,
    /// The sockets and HTTP connections its sinks may hold together.
    pub max_sockets: usize,
}

impl Default for TenantBounds {
    fn default() -> Self {
        TenantBounds {
            max_stored_bytes: 10 << 30,
            log_lines_per_second: 200,
            log_burst: 400,
            max_instances: 16,
            max_sockets: 256,
        }
    }
}

/// Bounds shared by every sink instance of one tenant.
pub struct TenantShare {
    /// The tenant's name, for errors.
    pub tenant: String,
    /// The most bytes all its sinks' blob stores may hold together.
    pub max_stored_bytes: u64,
    /// Log lines per second, and burst, for all its sinks together.
    pub log_lines_per_second: u64,
    pub log_burst: u64,
    /// The instance slots its sinks hold (see [`TenantBounds::max_instances`]).
    pub instances: Arc<Budget>,
    /// The sockets and HTTP connections its sinks hold.
    pub sockets: Arc<Budget>,
    /// What the tenant's roots hold: counted when the host started, then
    /// kept by every put and delete of its sinks (a put claims its growth
    /// before it writes, so two sinks writing at once cannot both pass).
    stored: Mutex<u64>,
    /// The log lines its sinks may still write.
    log: Mutex<TokenBucket>,
}

impl TenantShare {
    /// `stored_now`: what the tenant's root holds when the host starts.
    pub fn new(tenant: &str, bounds: TenantBounds, stored_now: u64) -> TenantShare {
        let key = |field: &str| format!("tenants.{tenant}.{field}");
        TenantShare {
            tenant: tenant.to_string(),
            max_stored_bytes: bounds.max_stored_bytes,
            log_lines_per_second: bounds.log_lines_per_second,
            log_burst: bounds.log_burst,
            instances: Budget::new(key("max_instances"), bounds.max_instances),
            sockets: Budget::new(key("max_sockets"), bounds.max_sockets),
            stored: Mutex::new(stored_now),
            log: Mutex::new(TokenBucket::full(
                bounds.log_lines_per_second,
                bounds.log_burst,
                Instant::now(),
            )),
        }
    }

    /// What all its sinks' blob stores hold now, as counted.
    pub fn stored_bytes(&self) -> u64 {
        *lock(&self.stored)
    }

    /// Claims `bytes` more of the tenant's quota for a write about to be
    /// made. Refused, with the total the tenant's stores would reach, when
    /// that is over `max_stored_bytes`; then nothing is claimed.
    pub fn claim_storage(&self, bytes: u64) -> Result<(), u64> {
        let mut stored = lock(&self.stored);
        let after = stored.saturating_add(bytes);
        if after > self.max_stored_bytes {
            return Err(after);
        }
        *stored = after;
        Ok(())
    }

    /// Gives back `bytes` of the quota: an object deleted or replaced by a
    /// smaller one, or the claim of a write that failed.
    pub fn release_storage(&self, bytes: u64) {
        let mut stored = lock(&self.stored);
        *stored = stored.saturating_sub(bytes);
    }

    /// Takes one line from the tenant's log rate; `false` when its sinks
    /// together have logged too fast and the line must be dropped.
    pub fn admit_log_line(&self) -> bool {
        lock(&self.log).take(Instant::now())
    }

    /// Gives back a line [`admit_log_line`](Self::admit_log_line) took
    /// for a line that was not written after all.
    pub fn return_log_line(&self) {
        lock(&self.log).give_back();
    }

    /// The host-file key of the tenant's `field`, as an operator finds it:
    /// `tenants.acme.max_stored_mb`.
    pub fn config_key(&self, field: &str) -> String {
        format!("tenants.{}.{field}", self.tenant)
    }
}

/// A share of tenant `acme` with these bounds and the rest at their
/// defaults, for the runtime's tests.
#[cfg(test)]
pub(crate) fn acme(
    max_stored_bytes: u64,
    stored_now: u64,
    log_lines_per_second: u64,
    log_burst: u64,
) -> TenantShare {
    let bounds = TenantBounds {
        max_stored_bytes,
        log_lines_per_second,
        log_burst,
        ..TenantBounds::default()
    };
    TenantShare::new("acme", bounds, stored_now)
}

/// Names the tenant only: its counts sit behind locks a debug print should not take.
impl std::fmt::Debug for TenantShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantShare")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_claimed_up_to_the_quota_and_given_back() {
        let share = acme(1000, 300, 10, 10);
        assert_eq!(share.stored_bytes(), 300);
        share.claim_storage(600).unwrap();
        assert_eq!(share.claim_storage(101), Err(1001));
        // A refused claim takes nothing.
        assert_eq!(share.stored_bytes(), 900);
        share.claim_storage(100).unwrap();
        share.release_storage(500);
        assert_eq!(share.stored_bytes(), 500);
        share.release_storage(u64::MAX);
        assert_eq!(share.stored_bytes(), 0);
        assert_eq!(
            share.config_key("max_stored_mb"),
            "tenants.acme.max_stored_mb"
        );
    }

    #[test]
    fn a_tenant_already_over_its_quota_may_only_shrink() {
        let share = acme(1000, 5000, 10, 10);
        assert_eq!(share.claim_storage(1), Err(5001));
        share.release_storage(4500);
        share.claim_storage(500).unwrap();
    }

    #[test]
    fn log_lines_pass_up_to_the_burst() {
        let share = acme(0, 0, 1, 4);
        let admitted = (0..100).filter(|_| share.admit_log_line()).count();
        assert!((4..=5).contains(&admitted), "{admitted}");
        share.return_log_line();
        assert!(share.admit_log_line());
    }
}
