//! Compiling plugins in a child process bounded by CPU time.
//!
//! Cranelift cannot be interrupted, and a plugin can be made slow to
//! compile (one huge function). Compiled on a thread of the host, such a
//! plugin could only be given up after a wall-clock time, and ran on
//! detached; and a wall-clock bound fails an honest plugin on a loaded
//! machine. So a host that can (the `weir` binary, which calls
//! [`compile_in_child_processes`] at start) compiles each plugin in a child
//! process of its own executable, started with [`COMPILE_ARG`]: the kernel
//! ends it once it has used `limits.compile_cpu_ms` of CPU time
//! (`RLIMIT_CPU`, counted in whole seconds, all its threads together),
//! whatever else the machine is doing, and the host kills it at the
//! wall-clock backstop `limits.compile_timeout_ms` or when the host itself
//! dies (`PR_SET_PDEATHSIG`). Nothing of a compile outlives its bound.
//!
//! The child builds its engine with the host's settings
//! ([`super::engine::config`]) and writes the artifact to its standard
//! output; the host deserializes it with its own engine, which refuses an
//! artifact of other settings.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use wasmtime::Engine;

use super::engine::{CompileLimits, EngineError, config};

/// The first argument that makes the `weir` binary a compiling child.
pub const COMPILE_ARG: &str = "__compile-plugin";

/// The most of a child's error output kept for the message.
const MAX_CHILD_ERROR_BYTES: u64 = 64 << 10;

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Makes every engine of this process compile plugins in child processes
/// of `program`, which must answer [`COMPILE_ARG`] with [`child_main`].
/// Without it (library users, unit tests) plugins compile on a thread,
/// bounded by wall-clock time only.
pub fn compile_in_child_processes(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// The program that compiles plugins, when compiles run in child processes.
pub(crate) fn child_program() -> Option<&'static Path> {
    PROGRAM.get().map(PathBuf::as_path)
}

/// The child's side: `COMPILE_ARG --pool-slots N|none --plugin PATH`, the
/// wasm on standard input, the artifact on standard output; a plugin that
/// does not compile exits 1 with the reason on standard error. The path
/// only names the compile in a process list.
pub fn child_main(args: &[String]) -> ExitCode {
    let pool_slots = match args {
        [flag, slots, plugin, _] if flag == "--pool-slots" && plugin == "--plugin" => {
            match slots.as_str() {
                "none" => None,
                n => match n.parse::<usize>() {
                    Ok(n) => Some(n),
                    Err(_) => return child_error(&format!("bad --pool-slots {slots:?}")),
                },
            }
        }
        _ => return child_error("usage: weir __compile-plugin --pool-slots N|none --plugin PATH"),
    };
    let mut wasm = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut wasm) {
        return child_error(&format!("reading the plugin: {e}"));
    }
    let engine = match Engine::new(&config(pool_slots)) {
        Ok(engine) => engine,
        Err(e) => return child_error(&format!("cannot configure the engine: {e:#}")),
    };
    match engine.precompile_component(&wasm) {
        Ok(artifact) => match std::io::stdout().lock().write_all(&artifact) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => child_error(&format!("writing the artifact: {e}")),
        },
        Err(e) => child_error(&format!("{e:#}")),
    }
}

fn child_error(message: &str) -> ExitCode {
    eprint!("{message}");
    ExitCode::from(1)
}

/// Compiles `wasm` (the plugin at `path`) in a child process of `program`
/// within `limits`, for an engine of `pool_slots`. `Ok(None)` when no child
/// can be started (the binary was replaced or removed since the host
/// started): the caller compiles in process, with a warning.
pub(crate) fn compile_in_child(
    program: &Path,
    pool_slots: Option<usize>,
    path: &Path,
    wasm: &[u8],
    limits: &CompileLimits,
) -> Result<Option<Vec<u8>>, EngineError> {
    let failed = |detail: String| EngineError::Compile {
        path: path.to_path_buf(),
        detail,
    };
    let cpu_seconds = cpu_seconds(limits.cpu);
    let mut command = Command::new(program);
    command
        .arg(COMPILE_ARG)
        .arg("--pool-slots")
        .arg(pool_slots.map_or_else(|| "none".to_string(), |n| n.to_string()))
        .arg("--plugin")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec the closure calls only setrlimit and
    // prctl, which are async-signal-safe system calls, and allocates nothing.
    unsafe {
        command.pre_exec(move || bound_this_process(cpu_seconds));
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            tracing::warn!(
                program = %program.display(),
                %error,
                "cannot start a compiling process; compiling in process, bounded by the clock only"
            );
            return Ok(None);
        }
    };
    let (mut stdin, mut stdout, stderr) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let started = Instant::now();
    let deadline = started + limits.timeout;
    let (ended, killed_at_deadline, artifact, error_text) = std::thread::scope(|scope| {
        // A child that ends early (a bad plugin) closes its input: the
        // write's error then says nothing the exit status does not.
        scope.spawn(move || {
            let _ = stdin.write_all(wasm);
        });
        let artifact = scope.spawn(move || {
            let mut bytes = Vec::new();
            stdout.read_to_end(&mut bytes).map(|_| bytes)
        });
        let error_text = scope.spawn(move || {
            let mut text = String::new();
            let _ = stderr.take(MAX_CHILD_ERROR_BYTES).read_to_string(&mut text);
            text
        });
        let mut killed_at_deadline = false;
        let ended = loop {
            match reap(&child) {
                Ok(Some(ended)) => break Ok(ended),
                Ok(None) if Instant::now() >= deadline && !killed_at_deadline => {
                    let _ = child.kill();
                    killed_at_deadline = true;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(e);
                }
            }
        };
        (
            ended,
            killed_at_deadline,
            artifact.join().expect("the reader does not panic"),
            error_text.join().expect("the reader does not panic"),
        )
    });
    let (status, cpu_used) =
        ended.map_err(|e| failed(format!("waiting for the compiling process: {e}")))?;
    let wall = started.elapsed();
    if killed_at_deadline {
        return Err(EngineError::CompileTimeout {
            path: path.to_path_buf(),
            limit: limits.timeout,
        });
    }
    // SIGXCPU at the soft limit, SIGKILL at the hard one a second later; a
    // SIGKILL short of the bound is someone else's (the OOM killer's).
    let ended_by_cpu_bound = match status.signal() {
        Some(libc::SIGXCPU) => true,
        Some(libc::SIGKILL) => cpu_used >= Duration::from_secs(cpu_seconds),
        _ => false,
    };
    if ended_by_cpu_bound {
        return Err(EngineError::CompileCpu {
            path: path.to_path_buf(),
            limit: limits.cpu,
            seconds: cpu_seconds,
        });
    }
    if let Some(signal) = status.signal() {
        return Err(failed(format!(
            "the compiling process ended on signal {signal} after {:.1}s of CPU time{}",
            cpu_used.as_secs_f64(),
            match error_text.trim() {
                "" => String::new(),
                text => format!(": {text}"),
            }
        )));
    }
    if !status.success() {
        return Err(failed(error_text.trim().to_string()));
    }
    tracing::info!(
        plugin = %path.display(),
        wall_seconds = format!("{:.2}", wall.as_secs_f64()),
        cpu_seconds = format!("{:.2}", cpu_used.as_secs_f64()),
        "compiled the plugin in a child process"
    );
    artifact
        .map(Some)
        .map_err(|e| failed(format!("reading the compiled plugin: {e}")))
}

/// The child's exit status and the CPU time it used (user and system, all
/// its threads), once it has ended; reaped here, since `Child::try_wait`
/// does not say what it used.
fn reap(
    child: &std::process::Child,
) -> std::io::Result<Option<(std::process::ExitStatus, Duration)>> {
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for this process's own child, with valid pointers.
    let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    match reaped {
        0 => Ok(None),
        r if r == pid => {
            let time = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec.max(0) as u64)
                    + Duration::from_micros(t.tv_usec.max(0) as u64)
            };
            let cpu = time(usage.ru_utime) + time(usage.ru_stime);
            Ok(Some((std::process::ExitStatus::from_raw(status), cpu)))
        }
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The CPU bound in the kernel's whole seconds, rounded up.
fn cpu_seconds(cpu: Duration) -> u64 {
    cpu.as_millis().div_ceil(1000).max(1) as u64
}

/// In the child, before exec: the CPU bound, no core file when it is hit,
/// and death with the thread that started it (the host's compiling thread
/// waits for it, so this is the host going away).
fn bound_this_process(cpu_seconds: u64) -> std::io::Result<()> {
    let cpu = libc::rlimit {
        rlim_cur: cpu_seconds as libc::rlim_t,
        rlim_max: (cpu_seconds + 1) as libc::rlim_t,
    };
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on this process, with valid pointers.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_CPU, &cpu) != 0
            || libc::setrlimit(libc::RLIMIT_CORE, &no_core) != 0
            || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_bound_is_rounded_up_to_whole_seconds() {
        assert_eq!(cpu_seconds(Duration::from_millis(100)), 1);
        assert_eq!(cpu_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(cpu_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(cpu_seconds(Duration::from_secs(120)), 120);
    }
}
