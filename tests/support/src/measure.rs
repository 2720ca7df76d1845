//! A child process's CPU time and peak memory, measured as the child's own.
//!
//! `ru_maxrss` from `wait4` is not the child's own peak: `Command::spawn`
//! uses `posix_spawn`, whose child shares the parent's address space until
//! it execs, and the kernel carries that space's high-water mark into the
//! child's `ru_maxrss`. A test process holding 80 MB makes every `weir` it
//! starts report at least 80 MB. `VmHWM` in `/proc/<pid>/status` belongs to
//! the address space the child execs into, so it is polled while the child
//! runs; it only grows, so the last reading is the peak up to that moment.

use std::process::{Child, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the child's high-water mark is read.
const POLL: Duration = Duration::from_millis(10);

/// What a child used, up to its exit.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub status: ExitStatus,
    /// User plus system CPU time, in seconds.
    pub cpu_secs: f64,
    /// The child's own peak resident size, in MiB.
    pub peak_rss_mb: f64,
}

/// Waits for `child` and returns its exit status, CPU time and peak RSS.
/// The child is reaped here; the caller must not wait for it again.
pub fn wait_measured(child: Child) -> Usage {
    let pid = child.id() as libc::pid_t;
    let done = Arc::new(AtomicBool::new(false));
    let peak_kib = Arc::new(AtomicU64::new(0));
    let poller = {
        let (done, peak_kib) = (done.clone(), peak_kib.clone());
        std::thread::spawn(move || {
            let path = format!("/proc/{pid}/status");
            while !done.load(Ordering::Relaxed) {
                if let Some(kib) = std::fs::read_to_string(&path).ok().and_then(|s| vm_hwm(&s)) {
                    peak_kib.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(POLL);
            }
        })
    };
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is the caller's own unreaped child; both pointers are to
    // live locals.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wait_error = std::io::Error::last_os_error();
    done.store(true, Ordering::Relaxed);
    poller.join().expect("the memory poller");
    assert_eq!(reaped, pid, "wait4 on pid {pid}: {wait_error}");
    // Reaped: dropping the handle neither waits nor signals.
    drop(child);
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let peak = peak_kib.load(Ordering::Relaxed);
    assert!(peak > 0, "no reading of pid {pid}'s memory while it ran");
    Usage {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        cpu_secs: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        peak_rss_mb: peak as f64 / 1024.0,
    }
}

/// `VmHWM` in KiB from the text of `/proc/<pid>/status` (absent once the
/// process has exited).
fn vm_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_childs_own_not_the_parents() {
        // The parent holds 200 MiB while it starts a child that holds little.
        let held = vec![1u8; 200 << 20];
        let child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let usage = wait_measured(child);
        assert!(usage.status.success());
        assert!(
            usage.peak_rss_mb < 50.0,
            "sleep peaked at {:.0} MiB: the parent's {} MiB leaked in",
            usage.peak_rss_mb,
            held.len() >> 20
        );
        assert!(held.iter().all(|&b| b == 1));
    }

    #[test]
    fn reads_vm_hwm() {
        let status = "Name:\tweir\nVmPeak:\t  9 kB\nVmHWM:\t   34100 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(vm_hwm(status), Some(34100));
        assert_eq!(vm_hwm("Name:\tweir\nState:\tZ (zombie)\n"), None);
    }
}
