//! The process's own series, named as every Prometheus client library
//! names them (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! ...), read from `/proc/self` at each scrape. They carry no tenant label:
//! a tenant's page leaves them out, the operator's shows them. On a system
//! without `/proc` there are none.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// What `/proc/self` says of this process now.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ProcessStats {
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
    pub resident_bytes: i64,
    pub virtual_bytes: i64,
    pub threads: i64,
    pub open_fds: i64,
    pub max_fds: i64,
}

impl ProcessStats {
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot_time: f64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        // SAFETY: sysconf reads constants of the system.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let (ticks, page) = (ticks.max(1) as f64, i64::from(page.max(1) as i32));
        // The command name (field 2) is in parentheses and may hold spaces:
        // the fields after it are counted from its closing parenthesis.
        let after_name = &stat[stat.rfind(')')? + 2..];
        let field = |n: usize| -> Option<f64> { after_name.split(' ').nth(n - 3)?.parse().ok() };
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the one struct it is given.
        let max_fds = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
            0 => i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX),
            _ => -1,
        };
        Some(ProcessStats {
            cpu_seconds: (field(14)? + field(15)?) / ticks,
            start_time_seconds: boot_time + field(22)? / ticks,
            virtual_bytes: field(23)? as i64,
            resident_bytes: field(24)? as i64 * page,
            threads: field(20)? as i64,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as i64,
            max_fds,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stats) = ProcessStats::read() else {
            return Ok(());
        };
        let counter = ConstCounter::new(stats.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            counter.metric_type(),
        )?)?;
        let gauges: [(&str, &str, f64); 6] = [
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                stats.start_time_seconds,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stats.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stats.virtual_bytes as f64,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                stats.threads as f64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                stats.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                stats.max_fds as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}
