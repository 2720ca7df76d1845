//! Loading a sink plugin: read and pin the `.wasm`, check what it imports and
//! exports before anything runs, and pre-instantiate it; and inspecting one
//! for `weir plugin inspect`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::{InstancePre, Linker, types::ComponentItem};

use super::budget::{Claim, Exhausted};
use super::capability::network::{self, NetworkGrants};
use super::capability::{self, Import, ImportGrants};
use super::engine::{CompileLimits, EngineError, InstancePool, WasmEngine, digest, slots_needed};
use super::guest_error;
use super::host_state::HostState;
use super::tenant::TenantShare;
use super::types::OptionalExport;
use super::wit;

/// Why a plugin cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be read.
    #[error("cannot read plugin {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than the host compiles.
    #[error(
        "plugin {path} is {} MiB, more than the {} MiB a plugin may be (limits.max_plugin_mb)",
        .size.div_ceil(1 << 20),
        .limit >> 20
    )]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    /// The file is not the one the pipeline pinned.
    #[error(
        "plugin {path} has sha256 {actual}, but the pipeline pins {expected}; \
         update the pin if this plugin is the one you meant"
    )]
    Pin {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    /// The file is not a WebAssembly component.
    #[error("plugin {path} is not a WebAssembly component weir can load: {detail}")]
    NotAComponent { path: PathBuf, detail: String },
    /// The component does not speak the contract, or imports what weir
    /// does not grant.
    #[error("plugin {path} {detail}")]
    Contract { path: PathBuf, detail: String },
    /// The engine cannot compile or cache it.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What `weir plugin inspect` reports, and what loading checks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginInfo {
    /// Where it was read from.
    pub path: PathBuf,
    /// The sha256 of its bytes, as lowercase hex; what a pipeline pins.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// The `weir:sink` package version the plugin was built against.
    pub wit_version: String,
    /// The optional exports it has (`positions`, `maintenance`).
    pub capabilities: Vec<OptionalExport>,
    /// The kinds of network access it imports (`http`, `tcp`): its sink's
    /// entry must grant them (`grants.http`, `grants.tcp`) before it loads,
    /// unless the plugin declares them optional.
    pub network: Vec<String>,
    /// The kinds of network access the plugin declares it uses only when
    /// its configuration asks for them (`weir_sdk::optional_network!`): it
    /// loads without their grant, and every request it makes is then
    /// refused by the grant check, naming the key to add.
    pub optional_network: Vec<String>,
    /// Every interface it imports.
    pub imports: Vec<String>,
    /// Every interface it exports.
    pub exports: Vec<String>,
}

impl PluginInfo {
    /// Whether the plugin has the optional export `export`.
    pub fn exports(&self, export: OptionalExport) -> bool {
        self.capabilities.contains(&export)
    }

    /// Whether the sink stores positions with its data (exactly-once).
    pub fn positioned(&self) -> bool {
        self.exports(OptionalExport::Positions)
    }
}

/// A loaded, checked and pre-instantiated plugin, ready for instances.
pub struct Plugin {
    /// What the plugin is and speaks.
    pub info: PluginInfo,
    pre: InstancePre<HostState>,
    exports: wit::ExportIndices,
    /// The pool its instances take slots of, and how many each takes.
    pool: Arc<InstancePool>,
    slots: usize,
}

/// What every plugin is checked and instantiated against.
pub type SinkLinker = Linker<HostState>;

/// Builds the linker every plugin is checked and instantiated against: WASI
/// (with nothing ambient: see [`SinkInstance::new`]), the contract's shared
/// types and every capability.
pub fn linker(engine: &WasmEngine) -> Result<SinkLinker, EngineError> {
    let config = |e: wasmtime::Error| EngineError::Config(format!("{e:#}"));
    let mut linker = Linker::new(engine.engine());
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(config)?;
    guest_error::add_to_linker(&mut linker).map_err(config)?;
    network::add_to_linker(&mut linker).map_err(config)?;
    wit::add_to_linker(&mut linker).map_err(config)?;
    Ok(linker)
}

impl Plugin {
    /// Reads, pins, compiles (or loads from the cache), checks and
    /// pre-instantiates a plugin.
    pub fn load(
        engine: &WasmEngine,
        linker: &SinkLinker,
        path: &Path,
        pin: Option<&str>,
        limits: &CompileLimits,
        network: &NetworkGrants,
    ) -> Result<Plugin, LoadError> {
        let wasm = read_bounded(path, limits.max_bytes)?;
        let sha256 = digest(&wasm);
        if let Some(expected) = pin {
            let expected = expected.trim().trim_start_matches("sha256:").to_lowercase();
            if expected != sha256 {
                return Err(LoadError::Pin {
                    path: path.to_path_buf(),
                    expected,
                    actual: sha256,
                });
            }
        }
        check_is_component(path, &wasm)?;
        let component = engine.component(path, &wasm, &sha256, limits)?;
        let info = inspect_component(engine, path, &component, &sha256, &wasm)?;
        check_imports(path, &info, &ImportGrants { network })?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!("cannot be linked against this host: {e:#}"),
            })?;
        let exports = wit::ExportIndices::new(&info.wit_version, &pre, &info.capabilities)
            .map_err(|e| LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!(
                    "does not match {}@{}: {e:#}",
                    wit::PACKAGE,
                    info.wit_version
                ),
            })?;
        Ok(Plugin {
            info,
            pre,
            exports,
            pool: engine.pool().clone(),
            slots: slots_needed(&component),
        })
    }

    /// Takes the slots of the engine's pool one instance needs: from
    /// `tenant`'s share first, then from what the pool leaves tenants, then
    /// from the pool (a sink of no tenant may use the reserve too).
    pub fn take_slot(&self, tenant: Option<&TenantShare>) -> Result<Claim, Exhausted> {
        self.pool.take(self.slots, tenant)
    }

    pub(super) fn pre(&self) -> &InstancePre<HostState> {
        &self.pre
    }

    pub(super) fn exports(&self) -> &wit::ExportIndices {
        &self.exports
    }
}

/// Reads what a component imports and exports, and which contract version
/// and capabilities it speaks. Used by loading and by `weir plugin inspect`.
pub fn inspect(engine: &WasmEngine, path: &Path) -> Result<PluginInfo, LoadError> {
    let limits = CompileLimits::default();
    let wasm = read_bounded(path, limits.max_bytes)?;
    check_is_component(path, &wasm)?;
    let sha256 = digest(&wasm);
    let component = engine.component(path, &wasm, &sha256, &limits)?;
    inspect_component(engine, path, &component, &sha256, &wasm)
}

/// Reads a plugin file, refusing one larger than `max_bytes` before
/// reading it.
fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>, LoadError> {
    let read_error = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_error)?.len();
    if size > max_bytes {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            size,
            limit: max_bytes,
        });
    }
    std::fs::read(path).map_err(read_error)
}

fn inspect_component(
    engine: &WasmEngine,
    path: &Path,
    component: &wasmtime::component::Component,
    sha256: &str,
    wasm: &[u8],
) -> Result<PluginInfo, LoadError> {
    let ty = component.component_type();
    let imports: Vec<String> = ty
        .imports(engine.engine())
        .map(|(name, _)| name.to_string())
        .collect();
    let exports: Vec<String> = ty
        .exports(engine.engine())
        .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentInstance(_)))
        .map(|(name, _)| name.to_string())
        .collect();
    let sink_prefix = format!("{}/sink@", wit::PACKAGE);
    let sink_exports: Vec<&String> = exports
        .iter()
        .filter(|e| e.starts_with(&sink_prefix))
        .collect();
    let wit_version = match sink_exports.as_slice() {
        [] => {
            return Err(LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!(
                    "does not export `{}`; is it a weir sink? (it exports: {})",
                    wit::interface_name("sink", wit::NEWEST),
                    list_or_none(&exports)
                ),
            });
        }
        [one] => one
            .split_once('@')
            .map(|(_, v)| v.to_string())
            .unwrap_or_default(),
        _ => {
            return Err(LoadError::Contract {
                path: path.to_path_buf(),
                detail: format!("exports more than one version of {}/sink", wit::PACKAGE),
            });
        }
    };
    if !wit::speaks(&wit_version) {
        return Err(LoadError::Contract {
            path: path.to_path_buf(),
            detail: format!(
                "was built against {}@{wit_version}, but this host speaks {}; \
                 rebuild it against weir-sdk for {} or upgrade weir",
                wit::PACKAGE,
                wit::spoken(),
                wit::NEWEST
            ),
        });
    }
    let capabilities = OptionalExport::ALL
        .into_iter()
        .filter(|&export| {
            wit::export_name(export, &wit_version).is_some_and(|name| exports.contains(&name))
        })
        .collect();
    Ok(PluginInfo {
        path: path.to_path_buf(),
        sha256: sha256.to_string(),
        size: wasm.len() as u64,
        wit_version,
        capabilities,
        network: network::imported_kinds(&imports),
        optional_network: declared_optional_network(path, wasm)?,
        imports,
        exports,
    })
}

/// Refuses, with a sentence naming it, any import this host does not grant:
/// a `weir:sink` interface must be the shared types or a capability's, in
/// the version the plugin exports; an import a capability provides must
/// pass that capability's check against the sink's grants; anything else
/// must be WASI (with nothing ambient).
fn check_imports(path: &Path, info: &PluginInfo, grants: &ImportGrants) -> Result<(), LoadError> {
    let refuse = |detail: String| LoadError::Contract {
        path: path.to_path_buf(),
        detail,
    };
    for name in &info.imports {
        let granted = match Import::parse(name) {
            Some(import) => {
                if import.package == wit::PACKAGE && import.version != info.wit_version {
                    return Err(refuse(format!(
                        "imports `{name}`, but this host provides {}@{}",
                        wit::PACKAGE,
                        info.wit_version
                    )));
                }
                match capability::provider_of(&import) {
                    Some(_)
                        if network::kind_of(&import).is_some_and(|kind| {
                            info.optional_network.iter().any(|o| o == kind)
                        }) =>
                    {
                        true
                    }
                    Some(provider) => {
                        provider.check_import(&import, grants).map_err(refuse)?;
                        true
                    }
                    None if import.package == wit::PACKAGE => import.interface == "types",
                    None => import.package.starts_with("wasi:"),
                }
            }
            None => false,
        };
        if !granted {
            let interfaces: Vec<String> = capability::contract_interfaces()
                .map(|interface| format!("{}/{interface}", wit::PACKAGE))
                .collect();
            return Err(refuse(format!(
                "imports `{name}`, which weir does not grant to sinks \
                 (granted: {} and WASI without files, sockets or environment)",
                interfaces.join(", ")
            )));
        }
    }
    Ok(())
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join(", ")
    }
}

/// Refuses files that are not components before the compiler sees them, so
/// the operator reads what is wrong rather than a parser's complaint. The
/// header's layer field tells components (1) from core modules (0).
/// The custom section in which a plugin lists the network kinds it uses only
/// when configured to (see `weir_sdk::optional_network!`).
pub const OPTIONAL_NETWORK_SECTION: &str = "weir:optional-network";

/// The kinds a plugin declares optional, from its custom sections (in the
/// component or any module inside it). Only kinds weir knows are accepted,
/// so that a typo does not pass silently.
fn declared_optional_network(path: &Path, wasm: &[u8]) -> Result<Vec<String>, LoadError> {
    let mut kinds: Vec<String> = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        let Ok(wasmparser::Payload::CustomSection(section)) = payload else {
            // The component compiled, so its structure is sound: a payload
            // that does not parse here holds no declaration.
            continue;
        };
        if section.name() != OPTIONAL_NETWORK_SECTION {
            continue;
        }
        let text = std::str::from_utf8(section.data()).unwrap_or_default();
        for kind in text
            .split([',', '\0'])
            .map(str::trim)
            .filter(|k| !k.is_empty())
        {
            if !network::KINDS.contains(&kind) {
                return Err(LoadError::Contract {
                    path: path.to_path_buf(),
                    detail: format!(
                        "declares network kind `{kind}` optional in its `{OPTIONAL_NETWORK_SECTION}` \
                         section; the kinds are {}",
                        network::KINDS.join(", ")
                    ),
                });
            }
            if !kinds.iter().any(|k| k == kind) {
                kinds.push(kind.to_string());
            }
        }
    }
    Ok(kinds)
}

fn check_is_component(path: &Path, wasm: &[u8]) -> Result<(), LoadError> {
    let refuse = |detail: &str| {
        Err(LoadError::NotAComponent {
            path: path.to_path_buf(),
            detail: detail.to_string(),
        })
    };
    if wasm.len() < 8 || wasm[..4] != *b"\0asm" {
        return refuse("it is not WebAssembly (no `\\0asm` header)");
    }
    if wasm[4..8] == [0x01, 0x00, 0x00, 0x00] {
        return refuse(
            "it is a core WebAssembly module, not a component; build it for wasm32-wasip2 \
             (or wrap it with `wasm-tools component new`)",
        );
    }
    if wasm[6..8] != [0x01, 0x00] {
        return refuse(&format!(
            "its header (version and layer bytes {:02x?}) is neither a core module's nor a \
             component's",
            &wasm[4..8]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(imports: &[&str]) -> PluginInfo {
        PluginInfo {
            path: PathBuf::from("sink.wasm"),
            sha256: String::new(),
            size: 0,
            wit_version: "0.1.0".into(),
            capabilities: Vec::new(),
            network: Vec::new(),
            optional_network: Vec::new(),
            imports: imports.iter().map(|i| i.to_string()).collect(),
            exports: vec!["weir:sink/sink@0.1.0".into()],
        }
    }

    #[test]
    fn imports_are_granted_by_capabilities() {
        let path = Path::new("sink.wasm");
        let granted = [
            "weir:sink/types@0.1.0",
            "weir:sink/blobstore@0.1.0",
            "weir:sink/log@0.1.0",
            "wasi:io/streams@0.2.6",
        ];
        let none = ImportGrants {
            network: &NetworkGrants::default(),
        };
        assert!(check_imports(path, &info(&granted), &none).is_ok());
        let refused = |import: &str| match check_imports(path, &info(&[import]), &none) {
            Err(LoadError::Contract { detail, .. }) => detail,
            other => panic!("{import} was not refused: {other:?}"),
        };
        assert_eq!(
            refused("wasi:http/outgoing-handler@0.2.6"),
            "imports `wasi:http/outgoing-handler@0.2.6`, but its sink has no `grants.http`: \
             add the hosts it may reach to the sink's entry, for example \
             `grants.http: [\"https://api.example.com\"]`"
        );
        assert!(refused("wasi:sockets/tcp@0.2.6").contains("has no `grants.tcp`"));
        let web = NetworkGrants::parse(["http://127.0.0.1:8080"], None::<&str>).unwrap();
        let web = ImportGrants { network: &web };
        let http = info(&["wasi:http/outgoing-handler@0.2.6", "wasi:http/types@0.2.6"]);
        assert!(check_imports(path, &http, &web).is_ok());
        let sockets = info(&["wasi:sockets/tcp@0.2.6"]);
        assert!(check_imports(path, &sockets, &web).is_err());
        assert!(
            refused("weir:sink/metrics@0.1.0")
                .contains("granted: weir:sink/blobstore, weir:sink/log and WASI")
        );
        assert!(refused("weir:sink/log@0.2.0").contains("this host provides weir:sink@0.1.0"));
    }

    #[test]
    fn a_kind_declared_optional_loads_without_its_grant_and_only_that_kind() {
        let path = Path::new("sink.wasm");
        let none = ImportGrants {
            network: &NetworkGrants::default(),
        };
        let mut both = info(&["wasi:http/outgoing-handler@0.2.6", "wasi:sockets/tcp@0.2.6"]);
        both.optional_network = vec!["http".into()];
        match check_imports(path, &both, &none) {
            Err(LoadError::Contract { detail, .. }) => {
                assert!(detail.contains("has no `grants.tcp`"), "{detail}")
            }
            other => panic!("tcp was not optional, yet it loaded: {other:?}"),
        }
        both.optional_network.push("tcp".into());
        assert!(check_imports(path, &both, &none).is_ok());
    }

    /// A component-shaped file with custom sections: what the declaration
    /// reader sees, without building a plugin.
    fn with_sections(sections: &[(&str, &[u8])]) -> Vec<u8> {
        let mut wasm = b"\0asm\x0d\x00\x01\x00".to_vec();
        for (name, data) in sections {
            let mut body = vec![name.len() as u8];
            body.extend_from_slice(name.as_bytes());
            body.extend_from_slice(data);
            wasm.push(0);
            wasm.push(body.len() as u8);
            wasm.extend(body);
        }
        wasm
    }

    #[test]
    fn optional_network_is_read_from_its_custom_section_and_checked() {
        let path = Path::new("sink.wasm");
        let read = |wasm: Vec<u8>| declared_optional_network(path, &wasm);
        assert_eq!(read(with_sections(&[])).unwrap(), Vec::<String>::new());
        assert_eq!(
            read(with_sections(&[
                ("producers", b"x"),
                (OPTIONAL_NETWORK_SECTION, b"http, tcp,http"),
            ]))
            .unwrap(),
            vec!["http".to_string(), "tcp".to_string()]
        );
        match read(with_sections(&[(OPTIONAL_NETWORK_SECTION, b"htp")])) {
            Err(LoadError::Contract { detail, .. }) => {
                assert!(
                    detail.contains("declares network kind `htp` optional"),
                    "{detail}"
                )
            }
            other => panic!("a misspelled kind was accepted: {other:?}"),
        }
    }
}
