//! What plugin instances hold of the resources the host shares between
//! them all: slots of the engine's instance pool, and file descriptors
//! (sockets, HTTP connections). Each is a [`Budget`]: a count with a bound,
//! checked before the resource is taken, so the last taker is refused
//! rather than the host running out; and given back when it is released,
//! or when its instance ends however it ends ([`Claim`] on drop).
//!
//! A sink's own limit, its tenant's and the host's are separate budgets;
//! one resource is taken from all of them at once or from none.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// A count of something held, and the most that may be.
#[derive(Debug)]
pub struct Budget {
    /// Where an operator sets the bound (`tenants.acme.max_sockets`), or
    /// what the host holds back, for messages.
    key: String,
    most: usize,
    held: Mutex<usize>,
}

/// Why a resource was not taken: `key`'s bound of `most` would be passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{held} of {most} held already ({key})")]
pub struct Exhausted {
    pub key: String,
    pub held: usize,
    pub most: usize,
}

impl Budget {
    pub fn new(key: impl Into<String>, most: usize) -> Arc<Budget> {
        Arc::new(Budget {
            key: key.into(),
            most,
            held: Mutex::new(0),
        })
    }

    fn count(&self) -> MutexGuard<'_, usize> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What is held now.
    pub fn held(&self) -> usize {
        *self.count()
    }

    /// The bound.
    pub fn most(&self) -> usize {
        self.most
    }

    /// Takes `amount`, unless that would pass the bound; then nothing.
    pub fn take(&self, amount: usize) -> Result<(), Exhausted> {
        let mut held = self.count();
        match held.checked_add(amount) {
            Some(after) if after <= self.most => {
                *held = after;
                Ok(())
            }
            _ => Err(Exhausted {
                key: self.key.clone(),
                held: *held,
                most: self.most,
            }),
        }
    }

    /// Gives back `amount` taken earlier.
    pub fn give_back(&self, amount: usize) {
        let mut held = self.count();
        *held = held.saturating_sub(amount);
    }
}

/// Amounts taken from several budgets together, given back on drop.
#[derive(Debug, Default)]
pub struct Claim {
    taken: Vec<(Arc<Budget>, usize)>,
}

impl Claim {
    /// Takes each amount from its budget, all or none: the first budget
    /// that cannot give its amount is the error, and what was taken from
    /// the others before it is given back.
    pub fn take<'a>(
        wanted: impl IntoIterator<Item = (&'a Arc<Budget>, usize)>,
    ) -> Result<Claim, Exhausted> {
        let mut claim = Claim::default();
        for (budget, amount) in wanted {
            budget.take(amount)?;
            claim.taken.push((budget.clone(), amount));
        }
        Ok(claim)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        for (budget, amount) in self.taken.drain(..) {
            budget.give_back(amount);
        }
    }
}

/// The descriptors this process may open at all (its `RLIMIT_NOFILE`).
fn descriptor_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if read != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return 1 << 20;
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

/// The descriptors the host keeps for itself out of `limit`: loading
/// plugins, its stores, the admin API, the sources' connections. A quarter,
/// and never fewer than 256, so no plugin can take the last ones.
pub fn host_reserved_descriptors(limit: usize) -> usize {
    (limit / 4).max(256).min(limit)
}

/// The descriptors every plugin instance of this process holds together
/// (sockets and HTTP connections), bounded by the process's descriptor
/// limit less what the host keeps for itself. Read once, when first used:
/// a host that raises its limit does so at start.
pub fn plugin_descriptors() -> &'static Arc<Budget> {
    static BUDGET: OnceLock<Arc<Budget>> = OnceLock::new();
    BUDGET.get_or_init(|| {
        let limit = descriptor_limit();
        let reserved = host_reserved_descriptors(limit);
        Budget::new(
            format!(
                "the process's descriptor limit of {limit} less the {reserved} the host keeps \
                 for itself"
            ),
            limit - reserved,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_taken_up_to_its_bound_and_given_back() {
        let budget = Budget::new("tenants.acme.max_sockets", 3);
        budget.take(2).unwrap();
        let refused = budget.take(2).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "2 of 3 held already (tenants.acme.max_sockets)"
        );
        assert_eq!(budget.held(), 2);
        budget.take(1).unwrap();
        budget.give_back(3);
        assert_eq!(budget.held(), 0);
        budget.give_back(5);
        assert_eq!(budget.held(), 0);
        assert!(budget.take(usize::MAX).is_err());
    }

    #[test]
    fn a_claim_takes_from_every_budget_or_from_none_and_gives_back_on_drop() {
        let tenant = Budget::new("tenant", 10);
        let host = Budget::new("host", 4);
        let claim = Claim::take([(&tenant, 3), (&host, 3)]).unwrap();
        assert_eq!((tenant.held(), host.held()), (3, 3));
        // The host's bound refuses the second: the tenant's part is undone.
        let refused = Claim::take([(&tenant, 2), (&host, 2)]).unwrap_err();
        assert_eq!(refused.key, "host");
        assert_eq!((tenant.held(), host.held()), (3, 3));
        drop(claim);
        assert_eq!((tenant.held(), host.held()), (0, 0));
    }

    #[test]
    fn the_host_keeps_a_quarter_of_its_descriptors_and_at_least_256() {
        assert_eq!(host_reserved_descriptors(20_000), 5_000);
        assert_eq!(host_reserved_descriptors(1024), 256);
        assert_eq!(host_reserved_descriptors(100), 100);
        let plugins = plugin_descriptors();
        assert!(plugins.most() < descriptor_limit());
    }
}
