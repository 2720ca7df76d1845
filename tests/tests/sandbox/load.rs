//! What a plugin can do to the host around its calls: hold memory in
//! several linear memories, make the host compile a huge function, or be
//! given a root from which it could rewrite the pipeline file or a plugin.
//! Each is refused with a sentence that names the sink or the file and the
//! limit or the fix.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use wasm_encoder::{
    BlockType, CodeSection, Component, Function, FunctionSection, Instruction, Module,
    ModuleSection, TypeSection, ValType,
};
use weir_test_support::with_extra_memories;

const SEED: u64 = 9;
const CHANGES: u64 = 300;

fn write_plugin(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn run(pipeline: &Path) -> (std::process::Output, String) {
    let out = weir(&["run", pipeline.to_str().unwrap()], &[]);
    let report = text(&out);
    (out, report)
}

fn assert_mentions(report: &str, needles: &[&str]) {
    for needle in needles {
        assert!(report.contains(needle), "missing {needle:?} in: {report}");
    }
}

#[test]
fn the_memory_limit_holds_across_several_memories() {
    let dir = tempfile::tempdir().unwrap();
    let honest = std::fs::read(plugin("weir-fixture-positioned")).unwrap();
    // Two memories of 40 MiB each: either fits a 64 MiB limit alone,
    // together they do not.
    let wasm = with_extra_memories(&honest, 2, 40);
    let path = write_plugin(dir.path(), "two-memories.wasm", &wasm);
    let sink_with = |memory_mb| {
        SinkBuilder::new("many", &path)
            .blob_store(&sink_root(dir.path(), "many"))
            .limits(memory_mb, 30_000)
            .retries(1)
    };

    // Control: with room for both, the same plugin runs and is exact, so
    // the refusal below is the limit and not a broken component.
    let roomy = workload(SEED, CHANGES, 100)
        .name("roomy")
        .sink(sink_with(128))
        .write_in(dir.path());
    let (out, report) = run(&roomy);
    assert!(out.status.success(), "{report}");
    assert_positioned_exact(
        &sink_root(dir.path(), "many"),
        &expected_state(SEED, CHANGES),
    );

    std::fs::remove_dir_all(sink_root(dir.path(), "many")).unwrap();
    let tight = workload(SEED, CHANGES, 100)
        .name("tight")
        .sink(sink_with(64))
        .write_in(dir.path());
    let (out, report) = run(&tight);
    assert!(!out.status.success(), "{report}");
    assert_mentions(&report, &["`many`", "memory limit of 64 MiB"]);
    for (table, position) in positions_of(&status(&tight), "many") {
        assert_eq!(position, None, "`many` advanced on {table}");
    }
}

/// A component of one core module with one function that is valid,
/// useless, and slow to compile on any machine: `ops` additions between
/// `locals` locals picked at random, in small blocks each left by a
/// conditional branch, and every local summed at the end. Every local is
/// live across every block, so the compiler's work grows with blocks times
/// live values (a straight chain of additions compiles in milliseconds,
/// however long: CI compiled eight of 300,000 within half a second). One
/// function, because functions are what a compiler spreads over cores.
fn compile_bomb(ops: u32, locals: u32) -> Vec<u8> {
    const BLOCK_OPS: u32 = 16;
    let mut types = TypeSection::new();
    types.ty().function([], [ValType::I32]);
    let mut declared = FunctionSection::new();
    declared.function(0);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut pick = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % u64::from(locals)) as u32
    };
    let mut body = Function::new([(locals, ValType::I32)]);
    for i in 0..ops {
        if i % BLOCK_OPS == 0 {
            if i > 0 {
                body.instruction(&Instruction::End);
            }
            body.instruction(&Instruction::Block(BlockType::Empty));
            body.instruction(&Instruction::LocalGet(pick()));
            body.instruction(&Instruction::BrIf(0));
        }
        body.instruction(&Instruction::LocalGet(pick()));
        body.instruction(&Instruction::LocalGet(pick()));
        body.instruction(&Instruction::I32Add);
        body.instruction(&Instruction::LocalSet(pick()));
    }
    if ops > 0 {
        body.instruction(&Instruction::End);
    }
    body.instruction(&Instruction::LocalGet(0));
    for local in 1..locals {
        body.instruction(&Instruction::LocalGet(local));
        body.instruction(&Instruction::I32Add);
    }
    body.instruction(&Instruction::End);
    let mut code = CodeSection::new();
    code.function(&body);
    let mut module = Module::new();
    module.section(&types).section(&declared).section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

#[test]
fn a_plugin_slow_to_compile_is_given_up_at_its_limit() {
    // The clock's bound alone (the CPU's is two minutes).
    compile_bomb_is_stopped(
        |bomb| bomb.compile_timeout_ms(500),
        &[
            "compiling took longer than 0.5s",
            "limits.compile_timeout_ms = 500",
        ],
        Duration::from_secs(20),
    );
}

/// The same plugin under its CPU bound alone (the clock's is ten minutes):
/// the kernel ends the compiling process once it has used its second.
#[test]
fn a_plugin_slow_to_compile_is_ended_by_its_cpu_bound_with_its_process_gone() {
    compile_bomb_is_stopped(
        |bomb| bomb.compile_cpu_ms(1_000).compile_timeout_ms(600_000),
        &[
            "compiling used more than 1s of CPU time",
            "limits.compile_cpu_ms = 1000",
        ],
        Duration::from_secs(60),
    );
}

/// Runs a sink whose plugin is about 1 MB of code that took 28 s to
/// compile on a 2-core development machine (given all the time it needed)
/// under the compile limits `limit` sets: the run must fail saying `why`,
/// within `within` (the host gave up at the limit rather than waiting the
/// compile out), and no compile of it may run on.
fn compile_bomb_is_stopped(
    limit: impl FnOnce(SinkBuilder) -> SinkBuilder,
    why: &[&str],
    within: Duration,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_plugin(dir.path(), "bomb.wasm", &compile_bomb(100_000, 2_000));
    let bomb = limit(SinkBuilder::new("bomb", &path).blob_store(&sink_root(dir.path(), "bomb")));
    let pipeline = workload(SEED, CHANGES, 100).sink(bomb).write_in(dir.path());
    let started = Instant::now();
    let (out, report) = run(&pipeline);
    let took = started.elapsed();
    assert!(!out.status.success(), "{report}");
    assert_mentions(&report, &["bomb.wasm"]);
    assert_mentions(&report, why);
    assert!(took < within, "the run took {took:?}: {report}");
    assert_no_compile_of(&path);
}

/// A plugin whose compile needs well under its CPU bound, compiled while
/// busy threads leave it a fraction of a core: it takes longer than the
/// bound on the clock (where a wall-clock bound would have failed it) and
/// still compiles. The plugin is no sink, so the run then stops on the
/// contract, not on the compile. A run the busy threads did not slow past
/// the bound shows nothing: it is tried again with more of them (the
/// machine's other work takes some of their share), and only when none is
/// slowed enough is the test inconclusive.
#[test]
fn a_compile_slowed_by_a_busy_machine_past_its_cpu_bound_on_the_clock_still_compiles() {
    // Twice what the compile needs alone: on a loaded machine its CPU time
    // grows too (a CI run measured more than 3 s).
    const CPU_BOUND_MS: u64 = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let path = write_plugin(dir.path(), "slow.wasm", &compile_bomb(8_000, 2_000));
    let slow = SinkBuilder::new("slow", &path)
        .blob_store(&sink_root(dir.path(), "slow"))
        .compile_cpu_ms(CPU_BOUND_MS);
    let pipeline = workload(SEED, CHANGES, 100).sink(slow).write_in(dir.path());
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut tried = Vec::new();
    for (attempt, hogs_per_core) in [4, 8, 16].into_iter().enumerate() {
        let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let hogs: Vec<_> = (0..cores * hogs_per_core)
            .map(|_| {
                let busy = busy.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while busy.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        // A cache of its own for each attempt: the plugin must be compiled,
        // not loaded.
        let cache = dir.path().join(format!("component-cache-{attempt}"));
        let out = weir(
            &["run", pipeline.to_str().unwrap()],
            &[
                ("WEIR_LOG", "info"),
                ("WEIR_COMPONENT_CACHE", cache.to_str().unwrap()),
            ],
        );
        let report = text(&out);
        busy.store(false, std::sync::atomic::Ordering::Relaxed);
        for hog in hogs {
            hog.join().unwrap();
        }
        assert!(!out.status.success(), "{report}");
        assert!(
            !report.contains("cannot compile plugin"),
            "the compile failed: {report}"
        );
        let (wall, cpu) = compile_times(&report).unwrap_or_else(|| {
            panic!("no compile was reported: {report}");
        });
        assert!(
            cpu < CPU_BOUND_MS as f64 / 1000.0,
            "the compile used {cpu} s of CPU, not well under the bound: {report}"
        );
        if wall > CPU_BOUND_MS as f64 / 1000.0 {
            println!(
                "compiled in {wall} s on the clock, {cpu} s of CPU, under a {CPU_BOUND_MS} ms \
                 CPU bound ({hogs_per_core} busy threads a core)"
            );
            return;
        }
        tried.push(format!(
            "{hogs_per_core} busy threads a core: {wall} s on the clock, {cpu} s of CPU"
        ));
    }
    panic!(
        "inconclusive: the busy threads never slowed the compile past {CPU_BOUND_MS} ms on the \
         clock, so no run shows anything: {}",
        tried.join("; ")
    );
}

/// The wall and CPU seconds of the compile the run's log reports.
fn compile_times(report: &str) -> Option<(f64, f64)> {
    let line = report
        .lines()
        .find(|l| l.contains("compiled the plugin in a child process"))?;
    // Without the terminal's colour codes, which may sit around each name.
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            plain.push(c);
        }
    }
    let line = plain.as_str();
    let field = |name: &str| -> Option<f64> {
        let at = line.find(&format!("{name}="))? + name.len() + 1;
        line[at..]
            .trim_start_matches('"')
            .split(|c: char| c != '.' && !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((field("wall_seconds")?, field("cpu_seconds")?))
}

/// No compiling process of `plugin` is left (they name it in their
/// arguments).
fn assert_no_compile_of(plugin: &Path) {
    let needle = plugin.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains("__compile-plugin") && c.contains(&needle))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "a compile of {needle} is still running: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_plugin_over_the_size_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = plugin("weir-fixture-positioned");
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 1 << 20, "the fixture is only {size} bytes");
    let pipeline = workload(SEED, CHANGES, 100)
        .sink(sink("big", "weir-fixture-positioned", dir.path()).max_plugin_mb(1))
        .write_in(dir.path());
    let (out, report) = run(&pipeline);
    assert!(!out.status.success(), "{report}");
    assert_mentions(
        &report,
        &["`big`", "limits.max_plugin_mb", "more than the 1 MiB"],
    );
}

#[test]
fn a_root_holding_the_pipeline_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("shared");
    std::fs::create_dir_all(&root).unwrap();
    // The state folder elsewhere, so only the pipeline file is at stake.
    let state = dir.path().join("state");
    let pipeline = workload(SEED, CHANGES, 100)
        .state_dir(state.to_str().unwrap())
        .sink(sink("greedy", "weir-fixture-positioned", dir.path()).blob_store(&root))
        .write(&root.join("pipeline.yaml"));
    let before = std::fs::read(&pipeline).unwrap();
    let (out, report) = run(&pipeline);
    assert!(!out.status.success(), "{report}");
    assert_mentions(
        &report,
        &[
            "sinks[0].blob_store.url",
            "`greedy`",
            "contains the pipeline file",
        ],
    );
    assert_eq!(std::fs::read(&pipeline).unwrap(), before);
    assert!(
        !root.join("public.customers").exists() && !sink_root(dir.path(), "greedy").exists(),
        "the sink wrote before the refusal"
    );
}

#[test]
fn a_root_holding_a_plugin_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = sink_root(dir.path(), "greedy");
    std::fs::create_dir_all(&root).unwrap();
    let inside = root.join("honest.wasm");
    std::fs::copy(plugin("weir-fixture-positioned"), &inside).unwrap();
    let pipeline = workload(SEED, CHANGES, 100)
        .sink(sink("greedy", "weir-fixture-positioned", dir.path()))
        .sink(SinkBuilder::new("honest", &inside).blob_store(&sink_root(dir.path(), "honest")))
        .write_in(dir.path());
    let (out, report) = run(&pipeline);
    assert!(!out.status.success(), "{report}");
    assert_mentions(
        &report,
        &["`greedy`", "contains the plugin of sink `honest`"],
    );
}
