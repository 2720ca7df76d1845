//! The MySQL source's benchmark: one command, one run, one backlog. It is a
//! benchmark, not a timed test: ignored by default, it prints and asserts
//! nothing about time. `scripts/bench-mysql` builds what it needs and runs
//! it on a MariaDB server of its own; by hand, on this checkout's server
//! (scripts/mariadb):
//!
//! ```text
//! cargo build --release -p weir --features weir/failpoints,weir-source/test-support
//! scripts/build-plugins
//! cargo test --release -p weir-tests --test mysql -- --ignored --nocapture bench::
//! ```
//!
//! Knobs: `WEIR_BENCH_ROWS` (rows inserted, default 1,000,000),
//! `WEIR_BENCH_UPDATED_ROWS` (of those, how many are then updated, default
//! 500,000) and `WEIR_BENCH_TX_ROWS` (rows per transaction, default 100).
//!
//! What it measures, on one table `bench (id bigint primary key, a int, b
//! varchar(64), c decimal(10,2), d datetime(6))`:
//! - streaming a backlog (the inserts, then the updates, each transaction
//!   of `WEIR_BENCH_TX_ROWS` rows): weir from its committed position to the
//!   binlog's end into the WebAssembly null sink (plugins/null: every batch
//!   crosses into the guest and is decoded there, then dropped), against
//!   `mariadb-binlog --read-from-remote-server` reading the same byte range
//!   of the binlog from the server, to /dev/null: once decoding every row to
//!   text (`--base64-output=DECODE-ROWS --verbose`, the work closest to
//!   weir's, which turns every value into the pipeline's; the ratio to
//!   beat), once printing events with their row images as base64 (no row
//!   decoded: reading the stream and little more);
//! - backfilling the table (a fresh pipeline, so no position) into the null
//!   sink, against `mariadb-dump --single-transaction` of the same table,
//!   the plain client's `SELECT *` (`mariadb --quick --batch`) and the
//!   server writing the table itself (`SELECT … INTO OUTFILE`), each to
//!   /dev/null or a scratch file.
//!
//! How to read it: plugin compilation is never timed (the null sink is
//! compiled into a component cache of the benchmark's own first, and every
//! run loads it from there). Each weir run is a separate `weir run` process,
//! so it pays start-up (loading the cached plugin, connecting, the server
//! and privilege checks, reading the tables' columns, registering as a
//! replica or opening the snapshot, shutting down); that start-up is timed
//! apart (the median of three runs of zero rows of the same kind) and
//! subtracted: column `s`, the rates and the ratios are weir's work without
//! start-up; `wall s` and the ratios in brackets include it. The server's
//! tools include their own (small) connection time and are each the median
//! of three runs (they take well under a second, where one run is noisy).
//! Every weir run must report exactly the rows it was given, and the decoded
//! `mariadb-binlog` output must hold one row per insert and per update, or
//! the benchmark fails.
//!
//! What bounds each side is printed after the table: the CPU time of
//! weir's threads by name (polled from /proc while it runs), of the tools,
//! and of the server process (all its threads: on a server of its own, what
//! serving the run cost it), and the CPU per row of weir and of the tool it
//! is compared with, which a shared machine moves less than the wall time.
//! A thread (or a task, such as the binlog reader on the I/O runtime) busy
//! for nearly all of the wall time is the bound. The server is the
//! checkout's (scripts/mariadb); scripts/bench-mysql
//! gives the benchmark one of its own (`WEIR_MARIADB_DIR`,
//! `WEIR_MARIADB_PORT`), as another test writing to the same binlog would be
//! read too.

use crate::common;
use crate::mysql_support::*;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const DB: &str = "weir_bench";
/// The replica ids of the streaming pipeline and of the backfills.
const STREAM_SERVER_ID: u32 = 4401;
const BACKFILL_SERVER_ID: u32 = 4402;
/// How many zero-row runs time a start-up: one is noisy (the machine is
/// shared), the median of three less so. The server's tools run as often.
const RUNS: usize = 3;

fn env_rows(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{var}={text:?} is not a row count")),
        Err(_) => default,
    }
}

/// The CPU time, user and system, of a process (`/proc/<pid>/stat`) or a
/// thread (`/proc/<pid>/task/<tid>/stat`), in seconds.
fn cpu_of(stat_path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // Fields 14 and 15, after the command name in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((user + system) / ticks)
}

/// The server process's CPU time, read before and after each measurement.
struct ServerCpu {
    pid: Option<u32>,
}

impl ServerCpu {
    fn of(maria: &Maria) -> ServerCpu {
        let pid_file = maria.value("", "SELECT @@pid_file");
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse().ok());
        if pid.is_none() {
            println!("the server's pid file {pid_file} is not readable: its CPU time is not shown");
        }
        ServerCpu { pid }
    }

    fn now(&self) -> Option<f64> {
        cpu_of(&format!("/proc/{}/stat", self.pid?))
    }

    /// `f`'s result and the server's CPU seconds while it ran.
    fn during<T>(&self, f: impl FnOnce() -> T) -> (T, Option<f64>) {
        let before = self.now();
        let out = f();
        let used = self.now().zip(before).map(|(after, before)| after - before);
        (out, used)
    }
}

fn cpu_text(cpu: Option<f64>) -> String {
    cpu.map_or("(not seen)".to_string(), |s| format!("{s:.2} CPU-s"))
}

/// What one `weir run` to the end of its backlog took.
struct WeirRun {
    secs: f64,
    /// CPU time of the process, user and system, all threads.
    cpu_secs: f64,
    /// By thread name: how many threads had it, and their CPU seconds.
    threads: BTreeMap<String, (usize, f64)>,
    /// The server process's CPU seconds meanwhile.
    server_cpu: Option<f64>,
    /// The changes the run's report says went through the pipeline.
    changes: u64,
}

impl WeirRun {
    /// The threads that used the most CPU, by name, with their share of
    /// the wall time: 100% is one core's worth. The binlog reader is one
    /// task on the `weir-io` runtime (it moves between that runtime's
    /// threads, but runs on one at a time), the backfill's queries and
    /// conversion run on the pipeline's thread, `weir`.
    fn threads_text(&self) -> String {
        let mut threads: Vec<_> = self.threads.iter().collect();
        threads.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        threads
            .iter()
            .filter(|(_, (_, cpu))| *cpu >= 0.01)
            .take(4)
            .map(|(name, (count, cpu))| {
                let count = if *count == 1 {
                    String::new()
                } else {
                    format!(" ({count} threads)")
                };
                format!(
                    "{name}{count} {cpu:.2} CPU-s = {:.0}% of the wall time",
                    100.0 * cpu / self.secs
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Runs `weir run --json` on `pipeline` until its source is caught up,
/// loading the plugin from `cache`, measuring its CPU time, each thread's
/// (polled from /proc while it runs) and the server's.
fn run_weir(pipeline: &Path, cache: &Path, server: &ServerCpu) -> WeirRun {
    let dir = pipeline.parent().unwrap();
    let stdout_path = dir.join("run.stdout");
    let stderr_path = dir.join("run.stderr");
    let server_before = server.now();
    let started = Instant::now();
    let child = common::weir_command()
        .args(["run", "--json", pipeline.to_str().unwrap()])
        .env("WEIR_LOG", "warn")
        .env("WEIR_COMPONENT_CACHE", cache)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("weir runs");
    let pid = child.id();
    let done = AtomicBool::new(false);
    let (usage, per_thread) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            // The last reading of each thread: its name and CPU seconds.
            let mut seen: BTreeMap<u64, (String, f64)> = BTreeMap::new();
            while !done.load(Ordering::Relaxed) {
                if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                    for task in tasks.flatten() {
                        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok())
                        else {
                            continue;
                        };
                        let path = task.path();
                        let name = std::fs::read_to_string(path.join("comm"))
                            .map(|n| n.trim().to_string())
                            .unwrap_or_default();
                        if let Some(cpu) = cpu_of(path.join("stat").to_str().unwrap()) {
                            seen.insert(tid, (name, cpu));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        let usage = common::measure::wait_measured(child);
        done.store(true, Ordering::Relaxed);
        (usage, sampler.join().unwrap())
    });
    let secs = started.elapsed().as_secs_f64();
    let server_cpu = server.now().zip(server_before).map(|(a, b)| a - b);
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        usage.status.success(),
        "weir run {} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        pipeline.display(),
        usage.status
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("weir run --json printed no report ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    let changes = report["changes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no `changes` in the run report: {report}"));
    let mut threads: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for (name, cpu) in per_thread.into_values() {
        let entry = threads.entry(name).or_default();
        entry.0 += 1;
        entry.1 += cpu;
    }
    WeirRun {
        secs,
        cpu_secs: usage.cpu_secs,
        threads,
        server_cpu,
        changes,
    }
}

/// What one run of one of the server's tools took.
struct ToolRun {
    secs: f64,
    cpu_secs: f64,
    server_cpu: Option<f64>,
}

/// Runs `command` (its output to /dev/null, its errors to a file in
/// `scratch`) `RUNS` times and returns the run of median time, after
/// printing them all.
fn tool_median(
    what: &str,
    server: &ServerCpu,
    scratch: &Path,
    mut command: impl FnMut() -> Command,
) -> ToolRun {
    let stderr_path = scratch.join("tool.stderr");
    let mut runs: Vec<ToolRun> = (0..RUNS)
        .map(|_| {
            let mut command = command();
            let ((usage, secs), server_cpu) = server.during(|| {
                let started = Instant::now();
                let child = command
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&stderr_path).unwrap())
                    .spawn()
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let usage = common::measure::wait_measured(child);
                (usage, started.elapsed().as_secs_f64())
            });
            assert!(
                usage.status.success(),
                "{what} failed ({}): {}",
                usage.status,
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
            ToolRun {
                secs,
                cpu_secs: usage.cpu_secs,
                server_cpu,
            }
        })
        .collect();
    runs.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    let times: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.secs)).collect();
    println!("{what}: {} s, median taken", times.join(", "));
    runs.swap_remove(runs.len() / 2)
}

/// The run of median time among zero-row `runs`, after printing them all.
fn startup_median(what: &str, mut runs: Vec<WeirRun>) -> WeirRun {
    runs.sort_by(|a, b| a.secs.total_cmp(&b.secs));
    let times: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.secs)).collect();
    println!("{what}: {} s, median taken", times.join(", "));
    for run in &runs {
        assert_eq!(
            run.changes, 0,
            "{what}: a start-up run of 0 rows moved rows"
        );
    }
    runs.swap_remove(runs.len() / 2)
}

/// The weir time without start-up; never below a millisecond, so a tiny
/// backlog cannot print an infinite rate.
fn without_startup(run: &WeirRun, startup: &WeirRun) -> f64 {
    (run.secs - startup.secs).max(0.001)
}

/// A pipeline file in `dir` reading `table` of the bench database from
/// the server into the null sink, ending once caught up.
fn pipeline(dir: &Path, maria: &Maria, name: &str, server_id: u32, table: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let yaml = format!(
        "pipeline: {name}\nstate_dir: state\nsource:\n  mysql:\n    host: 127.0.0.1\n    port: {}\n    user: {USER}\n    password: {PASSWORD}\n    server_id: {server_id}\n    tables: [\"{DB}.{table}\"]\n    chunk_rows: 10000\n    heartbeat_ms: 500\n    exit_when_caught_up: true\nbatch: {{ max_rows: 10000, linger_ms: 50, heartbeat_ms: 300 }}\nsinks:\n  - name: out\n    plugin: {}\n    blob_store: {{ url: \"memory://\" }}\n",
        maria.port,
        common::plugin("weir-null-sink").display()
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// The binary log files from `first` to `last`, in order, as the server
/// lists them.
fn binlogs_between(maria: &Maria, first: &str, last: &str) -> Vec<String> {
    let names: Vec<String> = maria
        .rows("", "SHOW BINARY LOGS")
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect();
    let from = names.iter().position(|n| n == first);
    let to = names.iter().position(|n| n == last);
    match (from, to) {
        (Some(from), Some(to)) if from <= to => names[from..=to].to_vec(),
        _ => panic!("the binary logs {first} to {last} are not all on the server: {names:?}"),
    }
}

/// `mariadb-binlog` reading `files` from the server, from `start` in the
/// first to `stop` in the last, as the pipeline's user.
fn mariadb_binlog(maria: &Maria, files: &[String], start: u64, stop: u64) -> Command {
    let mut command = Command::new("mariadb-binlog");
    command.args([
        "--no-defaults",
        "--read-from-remote-server",
        "--protocol=TCP",
        "--host=127.0.0.1",
        &format!("--port={}", maria.port),
        &format!("--user={USER}"),
        &format!("--password={PASSWORD}"),
        &format!("--start-position={start}"),
        &format!("--stop-position={stop}"),
    ]);
    command.args(files);
    command
}

/// The server's command-line client, as `user`.
fn client(maria: &Maria, user: &str, password: &str) -> Command {
    let mut command = Command::new("mariadb");
    command.args([
        "--no-defaults",
        "--protocol=TCP",
        "--host=127.0.0.1",
        &format!("--port={}", maria.port),
        &format!("--user={user}"),
        &format!("--password={password}"),
        "--default-character-set=utf8mb4",
    ]);
    command
}

/// One line of the summary table.
struct Line {
    what: String,
    includes: &'static str,
    /// The whole process, start-up included.
    wall: f64,
    /// What the rate is computed from.
    secs: f64,
    rows: u64,
    ratio: String,
}

#[test]
#[ignore = "a benchmark: run it by hand with --ignored --nocapture (scripts/bench-mysql)"]
fn streaming_and_backfill_against_mariadb_own_tools() {
    let rows = env_rows("WEIR_BENCH_ROWS", 1_000_000);
    let updated = env_rows("WEIR_BENCH_UPDATED_ROWS", 500_000);
    let tx_rows = env_rows("WEIR_BENCH_TX_ROWS", 100);
    assert!(
        tx_rows > 0
            && rows >= tx_rows
            && rows.is_multiple_of(tx_rows)
            && updated.is_multiple_of(tx_rows)
            && updated <= rows,
        "WEIR_BENCH_ROWS and WEIR_BENCH_UPDATED_ROWS must be multiples of WEIR_BENCH_TX_ROWS, \
         the updated rows no more than the rows"
    );
    let changes = rows + updated;
    let maria = server();
    maria.fresh_db(DB);
    let server = ServerCpu::of(&maria);
    let shape = "(id bigint PRIMARY KEY, a int NOT NULL, b varchar(64) NOT NULL, \
                 c decimal(10,2) NOT NULL, d datetime(6) NOT NULL) ENGINE=InnoDB";
    // The backlog, made by the server alone: the inserts, then the updates,
    // `tx_rows` rows per transaction (the sequence engine's table gives the
    // rows of one transaction).
    maria.sql(
        DB,
        &format!(
            "CREATE TABLE bench {shape};\n\
             CREATE TABLE bench_empty {shape};\n\
             DELIMITER //\n\
             CREATE PROCEDURE backlog()\n\
             BEGIN\n\
               DECLARE t BIGINT DEFAULT 0;\n\
               WHILE t * {tx_rows} < {rows} DO\n\
                 START TRANSACTION;\n\
                 INSERT INTO bench SELECT t * {tx_rows} + seq, seq, md5(t * {tx_rows} + seq), \
                   (t % 1000) + 0.5, TIMESTAMP '2024-01-01 00:00:00' + INTERVAL t SECOND \
                   FROM seq_1_to_{tx_rows};\n\
                 COMMIT;\n\
                 SET t = t + 1;\n\
               END WHILE;\n\
               SET t = 0;\n\
               WHILE t * {tx_rows} < {updated} DO\n\
                 START TRANSACTION;\n\
                 UPDATE bench SET a = a + 1, d = d + INTERVAL 1 DAY \
                   WHERE id > t * {tx_rows} AND id <= (t + 1) * {tx_rows};\n\
                 COMMIT;\n\
                 SET t = t + 1;\n\
               END WHILE;\n\
             END//\n\
             DELIMITER ;"
        ),
    );
    let work = tempfile::tempdir().unwrap();
    let null_plugin = common::plugin("weir-null-sink");

    // Compilation, outside every timing: into a cache every run shares.
    let cache = work.path().join("component-cache");
    let started = Instant::now();
    let out = common::weir(
        &[
            "plugin",
            "inspect",
            null_plugin.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", common::text(&out));
    println!(
        "compile the null sink into the shared cache (not counted anywhere): {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // ------------------------------------------------------------ streaming
    // The first run backfills the empty table and commits a position, so
    // the next run streams. The runs after it stream zero rows: their time
    // is a streaming run's start-up.
    let stream = pipeline(
        &work.path().join("stream"),
        &maria,
        "bench_stream",
        STREAM_SERVER_ID,
        "bench",
    );
    assert_eq!(
        run_weir(&stream, &cache, &server).changes,
        0,
        "the table is still empty"
    );
    let stream_startup = startup_median(
        "streaming start-up (runs of 0 rows)",
        (0..RUNS)
            .map(|_| run_weir(&stream, &cache, &server))
            .collect(),
    );

    let (first_file, start) = maria.master_status();
    let started = Instant::now();
    maria.sql(DB, "CALL backlog()");
    let (last_file, stop) = maria.master_status();
    let files = binlogs_between(&maria, &first_file, &last_file);
    let binlog_mb = if files.len() == 1 {
        format!("{:.0} MB of binlog", (stop - start) as f64 / 1e6)
    } else {
        format!("binlog over {} files", files.len())
    };
    println!(
        "prepare the backlog: {rows} inserted rows, then {updated} updated, {tx_rows} per transaction, \
         {binlog_mb} ({first_file}:{start} to {last_file}:{stop}): {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // The range really holds the backlog: every insert and update, decoded
    // (not timed).
    {
        let mut command = mariadb_binlog(&maria, &files, start, stop);
        let mut child = command
            .args(["--base64-output=DECODE-ROWS", "--verbose"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadb-binlog runs");
        let (mut inserts, mut updates) = (0u64, 0u64);
        let insert = format!("### INSERT INTO `{DB}`.`bench`");
        let update = format!("### UPDATE `{DB}`.`bench`");
        for line in std::io::BufReader::new(child.stdout.take().unwrap()).split(b'\n') {
            let line = line.unwrap();
            if line.starts_with(insert.as_bytes()) {
                inserts += 1;
            } else if line.starts_with(update.as_bytes()) {
                updates += 1;
            }
        }
        assert!(child.wait().unwrap().success(), "mariadb-binlog failed");
        assert_eq!(
            (inserts, updates),
            (rows, updated),
            "mariadb-binlog's decoded range holds these inserts and updates"
        );
    }

    let stream_run = run_weir(&stream, &cache, &server);
    println!(
        "weir streaming into the null sink: {:.2} s wall, {:.2} s without start-up",
        stream_run.secs,
        without_startup(&stream_run, &stream_startup)
    );
    assert_eq!(stream_run.changes, changes, "weir streamed the backlog");
    let decoded = tool_median(
        "mariadb-binlog --base64-output=DECODE-ROWS --verbose > /dev/null",
        &server,
        work.path(),
        || {
            let mut command = mariadb_binlog(&maria, &files, start, stop);
            command.args(["--base64-output=DECODE-ROWS", "--verbose"]);
            command
        },
    );
    let events = tool_median(
        "mariadb-binlog > /dev/null (row images as base64)",
        &server,
        work.path(),
        || mariadb_binlog(&maria, &files, start, stop),
    );

    // ------------------------------------------------------------ backfill
    // New pipelines in new folders: nothing committed, so each backfills.
    // First the empty table (start-up), then the backlog's.
    let backfill_startup = startup_median(
        "backfill start-up (backfills of an empty table, each a new pipeline)",
        (0..RUNS)
            .map(|i| {
                let empty = pipeline(
                    &work.path().join(format!("backfill-empty-{i}")),
                    &maria,
                    &format!("bench_backfill_empty_{i}"),
                    BACKFILL_SERVER_ID,
                    "bench_empty",
                );
                run_weir(&empty, &cache, &server)
            })
            .collect(),
    );
    let backfill = pipeline(
        &work.path().join("backfill"),
        &maria,
        "bench_backfill",
        BACKFILL_SERVER_ID,
        "bench",
    );
    let backfill_run = run_weir(&backfill, &cache, &server);
    println!(
        "weir backfill into the null sink: {:.2} s wall, {:.2} s without start-up",
        backfill_run.secs,
        without_startup(&backfill_run, &backfill_startup)
    );
    assert_eq!(backfill_run.changes, rows, "weir backfilled the table");
    let dump = tool_median(
        "mariadb-dump --single-transaction > /dev/null",
        &server,
        work.path(),
        || {
            let mut command = Command::new("mariadb-dump");
            command.args([
                "--no-defaults",
                "--protocol=TCP",
                "--host=127.0.0.1",
                &format!("--port={}", maria.port),
                &format!("--user={USER}"),
                &format!("--password={PASSWORD}"),
                "--default-character-set=utf8mb4",
                "--single-transaction",
                DB,
                "bench",
            ]);
            command
        },
    );
    let select = tool_median(
        "mariadb --quick --batch -e 'SELECT * FROM bench' > /dev/null",
        &server,
        work.path(),
        || {
            let mut command = client(&maria, USER, PASSWORD);
            command.args(["--quick", "--batch", "-e"]);
            command.arg(format!("SELECT * FROM `{DB}`.`bench`"));
            command
        },
    );
    // The server writes the file itself (as its own OS user): a folder it
    // may write to, emptied after each run.
    let outfile_dir = work.path().join("outfile");
    std::fs::create_dir_all(&outfile_dir).unwrap();
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        &outfile_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut outfile_number = 0;
    let outfile = tool_median(
        "SELECT * FROM bench INTO OUTFILE (the server writes a file)",
        &server,
        work.path(),
        || {
            for entry in std::fs::read_dir(&outfile_dir).unwrap().flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
            outfile_number += 1;
            let file = outfile_dir.join(format!("bench-{outfile_number}.txt"));
            let mut command = client(&maria, ADMIN_USER, ADMIN_PASSWORD);
            command.arg("-e");
            command.arg(format!(
                "SELECT * FROM `{DB}`.`bench` INTO OUTFILE '{}'",
                file.display()
            ));
            command
        },
    );
    for entry in std::fs::read_dir(&outfile_dir).unwrap().flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
    maria.sql("", &format!("DROP DATABASE `{DB}`"));

    // ------------------------------------------------------------ summary
    let stream_secs = without_startup(&stream_run, &stream_startup);
    let backfill_secs = without_startup(&backfill_run, &backfill_startup);
    let rate = |rows: u64, secs: f64| rows as f64 / secs;
    // weir's rate over the other's, without weir's start-up and (in
    // brackets) with it, since the start-up is noisy on a shared machine.
    let weir_over = |weir: &WeirRun, weir_secs: f64, other_secs: f64| {
        format!(
            "weir = {:.2} x this ({:.2} wall)",
            other_secs / weir_secs,
            other_secs / weir.secs
        )
    };
    let lines = [
        Line {
            what: "weir stream -> WASM null sink".into(),
            includes: "start-up no, compile no",
            wall: stream_run.secs,
            secs: stream_secs,
            rows: changes,
            ratio: String::new(),
        },
        Line {
            what: "mariadb-binlog, rows decoded".into(),
            includes: "connect yes",
            wall: decoded.secs,
            secs: decoded.secs,
            rows: changes,
            ratio: weir_over(&stream_run, stream_secs, decoded.secs),
        },
        Line {
            what: "mariadb-binlog, rows as base64".into(),
            includes: "connect yes",
            wall: events.secs,
            secs: events.secs,
            rows: changes,
            ratio: weir_over(&stream_run, stream_secs, events.secs),
        },
        Line {
            what: "weir backfill -> WASM null sink".into(),
            includes: "start-up no, compile no",
            wall: backfill_run.secs,
            secs: backfill_secs,
            rows,
            ratio: String::new(),
        },
        Line {
            what: "mariadb-dump --single-transaction".into(),
            includes: "connect yes",
            wall: dump.secs,
            secs: dump.secs,
            rows,
            ratio: weir_over(&backfill_run, backfill_secs, dump.secs),
        },
        Line {
            what: "mariadb --quick SELECT *".into(),
            includes: "connect yes",
            wall: select.secs,
            secs: select.secs,
            rows,
            ratio: weir_over(&backfill_run, backfill_secs, select.secs),
        },
        Line {
            what: "SELECT … INTO OUTFILE".into(),
            includes: "connect yes",
            wall: outfile.secs,
            secs: outfile.secs,
            rows,
            ratio: weir_over(&backfill_run, backfill_secs, outfile.secs),
        },
        Line {
            what: "start-up: stream".into(),
            includes: "compile no",
            wall: stream_startup.secs,
            secs: stream_startup.secs,
            rows: 0,
            ratio: "median of 3, subtracted".into(),
        },
        Line {
            what: "start-up: backfill (new pipeline)".into(),
            includes: "compile no",
            wall: backfill_startup.secs,
            secs: backfill_startup.secs,
            rows: 0,
            ratio: "median of 3, subtracted".into(),
        },
    ];
    println!(
        "\nbacklog: {rows} rows inserted, then {updated} of them updated, {tx_rows} rows per \
         transaction ({changes} changes; bigint, int, varchar(64), decimal(10,2), datetime(6)); \
         the backfill reads the {rows} rows; one run, on this machine; plugin compilation excluded \
         everywhere; `s` is weir's wall time less its start-up (the start-up lines), the tools' \
         wall time (median of 3)"
    );
    println!(
        "| {:<36} | {:<24} | {:>6} | {:>6} | {:>10} | {:<32} |",
        "what", "timing includes", "wall s", "s", "rows/s", "ratio"
    );
    println!(
        "|{:-<38}|{:-<26}|{:->8}|{:->8}|{:->12}|{:-<34}|",
        "", "", "", "", "", ""
    );
    for line in &lines {
        let per_second = if line.rows == 0 {
            "-".to_string()
        } else {
            format!("{:.0}", rate(line.rows, line.secs))
        };
        println!(
            "| {:<36} | {:<24} | {:>6.2} | {:>6.2} | {:>10} | {:<32} |",
            line.what, line.includes, line.wall, line.secs, per_second, line.ratio
        );
    }

    // What bounds each: a thread (or a tool) busy for nearly all of its
    // wall time is the bound; the server's CPU is all its threads'.
    println!(
        "\nwhat bounds each (CPU time while it ran; 100% of the wall time is one core's worth, and a \
         single thread or task near it is the bound; the machine has {} cores):",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "- weir streaming: {:.2} s wall, {:.2} CPU-s in all: {}; the server {}",
        stream_run.secs,
        stream_run.cpu_secs,
        stream_run.threads_text(),
        cpu_text(stream_run.server_cpu)
    );
    for (what, tool) in [
        ("mariadb-binlog, rows decoded", &decoded),
        ("mariadb-binlog, rows as base64", &events),
        ("mariadb-dump", &dump),
        ("mariadb --quick SELECT *", &select),
    ] {
        println!(
            "- {what}: {:.2} s wall, the tool {:.2} CPU-s ({:.0}% of its wall time), the server {}",
            tool.secs,
            tool.cpu_secs,
            100.0 * tool.cpu_secs / tool.secs,
            cpu_text(tool.server_cpu)
        );
    }
    println!(
        "- weir backfill: {:.2} s wall, {:.2} CPU-s in all: {}; the server {}",
        backfill_run.secs,
        backfill_run.cpu_secs,
        backfill_run.threads_text(),
        cpu_text(backfill_run.server_cpu)
    );
    println!(
        "- SELECT … INTO OUTFILE: {:.2} s wall, the server {} (the client only waits)",
        outfile.secs,
        cpu_text(outfile.server_cpu)
    );
    // CPU is less at the mercy of a shared machine than wall time.
    let per_row = |cpu: f64, rows: u64| 1e6 * cpu / rows as f64;
    println!(
        "- CPU per row, the client's own (the server's apart; weir's start-up CPU subtracted): \
         streaming weir {:.2} us, mariadb-binlog decoding {:.2} us (weir = {:.2} x its CPU); \
         backfill weir {:.2} us, mariadb-dump {:.2} us (weir = {:.2} x its CPU)",
        per_row(stream_run.cpu_secs - stream_startup.cpu_secs, changes),
        per_row(decoded.cpu_secs, changes),
        (stream_run.cpu_secs - stream_startup.cpu_secs) / decoded.cpu_secs,
        per_row(backfill_run.cpu_secs - backfill_startup.cpu_secs, rows),
        per_row(dump.cpu_secs, rows),
        (backfill_run.cpu_secs - backfill_startup.cpu_secs) / dump.cpu_secs,
    );
    println!(
        "- start-up: stream {:.2} s ({:.2} CPU-s), backfill {:.2} s ({:.2} CPU-s)",
        stream_startup.secs,
        stream_startup.cpu_secs,
        backfill_startup.secs,
        backfill_startup.cpu_secs
    );
}
