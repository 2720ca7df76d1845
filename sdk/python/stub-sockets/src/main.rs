//! `weir-stub-sockets IN.wasm OUT.wasm`: composes a component with a stub
//! that exports every `wasi:sockets` interface the component imports, each
//! function trapping when called.
//!
//! Why: componentize-py links CPython's socket support into every
//! component, so a Python sink imports `wasi:sockets/*` even when it never
//! opens a socket, and the weir host only links those interfaces for a sink
//! whose pipeline entry has `grants.tcp`. With the stub inside, the sink
//! imports no network interface and loads like any other sink; a sink that
//! does call into `socket` traps (the host reports it and advances nothing).

use std::path::Path;

use anyhow::{Context, Result, bail};
use wac_graph::types::Package;
use wac_graph::{CompositionGraph, EncodeOptions};
use wit_component::{ComponentEncoder, StringEncoding};
use wit_parser::decoding::{DecodedWasm, decode};
use wit_parser::{LiftLowerAbi, ManglingAndAbi, WorldItem};

const SOCKETS_PACKAGE: &str = "wasi:sockets";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: weir-stub-sockets IN.wasm OUT.wasm");
    };
    let component = std::fs::read(input).with_context(|| format!("cannot read {input}"))?;
    let stubbed = stub_sockets(&component).with_context(|| input.clone())?;
    write_atomically(Path::new(output), &stubbed)
}

/// The component with its `wasi:sockets` imports served by a trapping stub;
/// the component unchanged when it imports none.
fn stub_sockets(component: &[u8]) -> Result<Vec<u8>> {
    let DecodedWasm::Component(mut resolve, world) =
        decode(component).context("not a WebAssembly component")?
    else {
        bail!("a WIT package, not a component");
    };
    let socket_imports: Vec<String> = resolve.worlds[world]
        .imports
        .iter()
        .filter(|(_, item)| matches!(item, WorldItem::Interface { .. }))
        .map(|(key, _)| resolve.name_world_key(key))
        .filter(|name| {
            name.split_once('/')
                .is_some_and(|(p, _)| p == SOCKETS_PACKAGE)
        })
        .collect();
    if socket_imports.is_empty() {
        return Ok(component.to_vec());
    }

    // A world that exports exactly those interfaces; parsing it adds the
    // imports they depend on (wasi:io for streams and pollables), which the
    // composition then shares with the component's own imports.
    let exports: String = socket_imports
        .iter()
        .map(|name| format!("    export {name};\n"))
        .collect();
    let text = format!("package weir:socket-stub;\n\nworld stub {{\n{exports}}}\n");
    let package = resolve
        .push_str("socket-stub.wit", &text)
        .context("cannot describe the socket stub")?;
    let stub_world = resolve
        .select_world(&[package], Some("stub"))
        .context("cannot find the socket stub's world")?;

    // A core module whose every function is `unreachable`, wrapped as a
    // component of that world.
    let mut module = wit_component::dummy_module(
        &resolve,
        stub_world,
        ManglingAndAbi::Legacy(LiftLowerAbi::Sync),
    );
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        stub_world,
        StringEncoding::UTF8,
    )?;
    let stub = ComponentEncoder::default()
        .module(&module)?
        .validate(true)
        .encode()
        .context("cannot encode the socket stub")?;

    let mut graph = CompositionGraph::new();
    let sink = Package::from_bytes("sink", None, component.to_vec(), graph.types_mut())?;
    let sink = graph.register_package(sink)?;
    let stub = Package::from_bytes("socket-stub", None, stub, graph.types_mut())?;
    let stub = graph.register_package(stub)?;
    wac_graph::plug(&mut graph, vec![stub], sink).context("cannot plug the socket stub")?;
    let composed = graph
        .encode(EncodeOptions::default())
        .context("cannot encode the composed component")?;
    Ok(composed)
}

/// Writes through a temporary file, so a failed run never leaves half a
/// component where a build expects a whole one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let temporary = path.with_extension("wasm.tmp");
    std::fs::write(&temporary, bytes)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, path)
        .with_context(|| format!("cannot move {} to {}", temporary.display(), path.display()))
}
