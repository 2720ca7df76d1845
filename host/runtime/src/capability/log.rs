//! The log capability: a sink's messages go into the host's log, tagged
//! with the sink's name: one line per message, cut to a bound, escaped,
//! and rate-limited per instance (and, under `weir serve`, per tenant too).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::token_bucket::TokenBucket;
use super::{Capability, Grants, Provides};
use crate::tenant::TenantShare;

/// The log capability.
pub struct Log;

impl Capability for Log {
    const PROVIDES: Provides = Provides::ContractInterface("log");
    type State = SinkLog;

    fn instance_state(grants: &Grants) -> SinkLog {
        let mut log = SinkLog::new(&grants.sink_name, grants.log);
        if let Some(tenant) = &grants.tenant {
            log.share_with(tenant.clone());
        }
        log
    }
}

/// How important a sink's message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Step-by-step detail.
    Trace,
    /// Detail for whoever debugs the sink.
    Debug,
    /// Normal operation.
    Info,
    /// Something the operator may want to look at.
    Warn,
    /// Something failed.
    Error,
}

/// How much one sink may log: each message is cut to `max_message_bytes`
/// (`limits.max_message_bytes`, which bounds the sink's error messages too),
/// and lines pass a token bucket refilled at `lines_per_second`
/// (`limits.log_lines_per_second`) holding at most `burst`
/// (`limits.log_burst`); the lines it drops are counted and reported in one
/// line at most once a [`DROP_REPORT_INTERVAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// The longest message kept, in bytes, after escaping.
    pub max_message_bytes: usize,
    /// Lines per second on average.
    pub lines_per_second: u64,
    /// Lines at once after a quiet spell.
    pub burst: u64,
}

impl Default for LogLimits {
    /// What a sink gets when its pipeline file sets none of these.
    fn default() -> Self {
        LogLimits {
            max_message_bytes: 4096,
            lines_per_second: 100,
            burst: 1000,
        }
    }
}

/// How often, at most, a sink's dropped lines are reported.
pub const DROP_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// One instance's log: where its messages go, under which name, and how
/// many it may still write.
#[derive(Debug)]
pub struct SinkLog {
    sink: String,
    limits: LogLimits,
    bucket: Mutex<Bucket>,
    /// The tenant whose log rate it shares with the tenant's other sinks.
    tenant: Option<Arc<TenantShare>>,
}

#[derive(Debug)]
struct Bucket {
    own: TokenBucket,
    /// Lines dropped by the sink's own limits since the last report.
    dropped: u64,
    /// Lines dropped by its tenant's limits since the last report.
    dropped_by_tenant: u64,
    reported: Instant,
}

impl SinkLog {
    /// A log for sink `sink` under `limits`, its bucket full.
    pub fn new(sink: &str, limits: LogLimits) -> Self {
        let now = Instant::now();
        SinkLog {
            sink: sink.to_string(),
            limits,
            bucket: Mutex::new(Bucket {
                own: TokenBucket::full(limits.lines_per_second, limits.burst, now),
                dropped: 0,
                dropped_by_tenant: 0,
                reported: now,
            }),
            tenant: None,
        }
    }

    /// Makes every line also pass `tenant`'s log rate, shared with the
    /// tenant's other sinks.
    pub fn share_with(&mut self, tenant: Arc<TenantShare>) {
        self.tenant = Some(tenant);
    }

    /// Writes one message from the sink, as one line: cut, escaped, and
    /// only if the sink has not logged too fast.
    pub fn write(&self, level: LogLevel, message: &str) {
        if !self.admit() {
            return;
        }
        let message = escape_and_cut(message, self.limits.max_message_bytes);
        let sink = self.sink.as_str();
        match level {
            LogLevel::Trace => tracing::trace!(sink, "{message}"),
            LogLevel::Debug => tracing::debug!(sink, "{message}"),
            LogLevel::Info => tracing::info!(sink, "{message}"),
            LogLevel::Warn => tracing::warn!(sink, "{message}"),
            LogLevel::Error => tracing::error!(sink, "{message}"),
        }
    }

    /// A message the sink handed the host in an error, made safe to log
    /// and keep: cut to the same bound and escaped to one line.
    pub fn error_message(&self, message: &str) -> String {
        escape_and_cut(message, self.limits.max_message_bytes)
    }

    /// Takes a token from the sink's bucket and then from its tenant's, if
    /// there are; counts the line as dropped if not, and reports what was
    /// dropped once an interval has passed.
    fn admit(&self) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let pending = bucket.dropped + bucket.dropped_by_tenant;
        if pending > 0 && now.duration_since(bucket.reported) >= DROP_REPORT_INTERVAL {
            self.report_dropped(&mut bucket, now);
        }
        // The sink's own bucket first: a line it drops must not spend the
        // tenant's lines, which its other sinks could have used.
        let dropped_by_tenant = if !bucket.own.take(now) {
            false
        } else if self.tenant.as_ref().is_none_or(|t| t.admit_log_line()) {
            return true;
        } else {
            // Not written, so not the sink's to pay for.
            bucket.own.give_back();
            true
        };
        if bucket.dropped + bucket.dropped_by_tenant == 0 {
            bucket.reported = now;
        }
        match dropped_by_tenant {
            true => bucket.dropped_by_tenant += 1,
            false => bucket.dropped += 1,
        }
        false
    }

    fn report_dropped(&self, bucket: &mut Bucket, now: Instant) {
        let sink = self.sink.as_str();
        let seconds = now.duration_since(bucket.reported).as_secs_f64();
        if bucket.dropped > 0 {
            tracing::warn!(
                sink,
                "sink `{sink}` logged too fast: {} lines dropped in {seconds:.1} s \
                 (limits.log_lines_per_second = {}, limits.log_burst = {})",
                bucket.dropped,
                self.limits.lines_per_second,
                self.limits.burst
            );
        }
        if bucket.dropped_by_tenant > 0
            && let Some(tenant) = &self.tenant
        {
            tracing::warn!(
                sink,
                tenant = %tenant.tenant,
                "sink `{sink}` logged too fast for its tenant `{}`: {} lines dropped in \
                 {seconds:.1} s ({} = {}, {} = {}, shared by all the tenant's sinks)",
                tenant.tenant,
                bucket.dropped_by_tenant,
                tenant.config_key("log_lines_per_second"),
                tenant.log_lines_per_second,
                tenant.config_key("log_burst"),
                tenant.log_burst
            );
        }
        bucket.dropped = 0;
        bucket.dropped_by_tenant = 0;
        bucket.reported = now;
    }
}

impl Drop for SinkLog {
    /// Lines dropped since the last report are reported when the instance
    /// goes, so a flood just before the end is not silent.
    fn drop(&mut self) {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        if bucket.dropped + bucket.dropped_by_tenant > 0 {
            self.report_dropped(&mut bucket, Instant::now());
        }
    }
}

/// One line of at most about `max` bytes: newlines, carriage returns and
/// other control characters (terminal escapes included) written as
/// escapes, so a message cannot start a line of its own that looks like
/// the host's; a longer message is cut and says how long it was.
pub fn escape_and_cut(message: &str, max: usize) -> String {
    let mut out = String::with_capacity(message.len().min(max) + 48);
    for (at, c) in message.char_indices() {
        let before = out.len();
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
        if out.len() > max {
            out.truncate(before);
            out.push_str(&format!(
                " [cut: {} more of {} bytes]",
                message.len() - at,
                message.len()
            ));
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_stays_one_line_and_is_cut() {
        let forged = "ok\n2030-01-01T00:00:00Z  INFO weir_pipeline: forged\r\u{1b}[2K";
        let line = escape_and_cut(forged, 4096);
        assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\u{1b}'));
        assert!(line.starts_with("ok\\n2030"), "{line}");
        let long = "é".repeat(10_000);
        let cut = escape_and_cut(&long, 100);
        assert!(cut.len() < 160, "{cut}");
        assert!(cut.ends_with("of 20000 bytes]"), "{cut}");
    }

    #[test]
    fn a_flood_is_cut_to_the_burst() {
        let log = SinkLog::new(
            "s",
            LogLimits {
                max_message_bytes: 100,
                lines_per_second: 1,
                burst: 5,
            },
        );
        let admitted = (0..1000).filter(|_| log.admit()).count();
        assert!((5..=6).contains(&admitted), "{admitted}");
        assert!(log.bucket.lock().unwrap().dropped >= 994);
    }

    #[test]
    fn the_sinks_of_a_tenant_share_its_log_rate() {
        let roomy = LogLimits {
            max_message_bytes: 100,
            lines_per_second: 1,
            burst: 100,
        };
        let tenant = Arc::new(crate::tenant::acme(0, 0, 1, 8));
        let mut first = SinkLog::new("first", roomy);
        first.share_with(tenant.clone());
        let mut second = SinkLog::new("second", roomy);
        second.share_with(tenant.clone());
        // Each sink alone may log 100 lines; together they get the tenant's 8.
        let first_admitted = (0..6).filter(|_| first.admit()).count();
        let second_admitted = (0..50).filter(|_| second.admit()).count();
        let first_later = (0..50).filter(|_| first.admit()).count();
        assert_eq!(first_admitted, 6);
        assert!((2..=3).contains(&second_admitted), "{second_admitted}");
        assert!(first_later <= 1, "{first_later}");
        for (log, sent, admitted) in [
            (&first, 56, first_admitted + first_later),
            (&second, 50, second_admitted),
        ] {
            let bucket = log.bucket.lock().unwrap();
            // Dropped for the tenant, not for itself, and its own lines
            // were given back.
            assert_eq!(bucket.dropped, 0);
            assert_eq!(bucket.dropped_by_tenant as usize, sent - admitted);
            assert!(bucket.own.tokens() > 90.0, "{}", bucket.own.tokens());
        }
        // A sink without a tenant is bound by its own limits only.
        let alone = SinkLog::new("alone", roomy);
        assert_eq!((0..50).filter(|_| alone.admit()).count(), 50);
    }

    #[test]
    fn a_line_dropped_by_the_sink_spends_nothing_of_the_tenant() {
        let tight = LogLimits {
            max_message_bytes: 100,
            lines_per_second: 1,
            burst: 2,
        };
        let tenant = Arc::new(crate::tenant::acme(0, 0, 1, 10));
        let mut log = SinkLog::new("s", tight);
        log.share_with(tenant.clone());
        let admitted = (0..20).filter(|_| log.admit()).count();
        assert!((2..=3).contains(&admitted), "{admitted}");
        let left = (0..20).filter(|_| tenant.admit_log_line()).count();
        assert!(left >= 10 - admitted, "{left}");
    }
}
