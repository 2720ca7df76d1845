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
    let dir = tempfile::tempdir().unwrap();
    // About 1 MB of code that took 28 s to compile on a 2-core development
    // machine (given all the time it needed), against the half second it
    // is given here.
    let path = write_plugin(dir.path(), "bomb.wasm", &compile_bomb(100_000, 2_000));
    let bomb = SinkBuilder::new("bomb", &path)
        .blob_store(&sink_root(dir.path(), "bomb"))
        .compile_timeout_ms(500);
    let pipeline = workload(SEED, CHANGES, 100).sink(bomb).write_in(dir.path());
    let started = Instant::now();
    let (out, report) = run(&pipeline);
    let took = started.elapsed();
    assert!(!out.status.success(), "{report}");
    assert_mentions(
        &report,
        &[
            "bomb.wasm",
            "compiling took longer than 0.5s",
            "limits.compile_timeout_ms = 500",
        ],
    );
    // The host gave up at the limit rather than waiting the compile out.
    assert!(
        took < Duration::from_secs(20),
        "the run took {took:?}: {report}"
    );
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
