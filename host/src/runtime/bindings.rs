//! Host-side bindings for each released version of the sink WIT package.
//!
//! One module per version (each frozen under `wit/since_vX.Y.Z/`), so a
//! host keeps loading plugins built against older versions after a new one
//! is added beside them.

pub mod v0_1_0 {
    wasmtime::component::bindgen!({
        path: "../wit/since_v0.1.0",
        world: "positioned-sink-plugin",
    });

    pub use self::exports::weir::sink::positions;
    pub use self::exports::weir::sink::sink;
    pub use self::weir::sink::blobstore;
    pub use self::weir::sink::log;
    pub use self::weir::sink::types;

    /// The package's version, as it appears in import and export names.
    pub const VERSION: &str = "0.1.0";
    pub const SINK_EXPORT: &str = "weir:sink/sink@0.1.0";
    pub const POSITIONS_EXPORT: &str = "weir:sink/positions@0.1.0";
}
