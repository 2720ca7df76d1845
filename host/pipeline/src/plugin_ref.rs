//! A sink's `plugin:` names a `.wasm` file, or, under `weir serve`, a
//! plugin uploaded to the host by its digest: `sha256:<64 hex digits>`
//! (docs/serve.md). The host resolves the reference in the tenant's
//! uploads; `weir ctl apply --plugin` uploads a file and writes its
//! reference in. `weir run` has no uploads to look in, so it refuses one.

use std::path::Path;

use crate::config::PipelineConfig;

/// What a reference to an uploaded plugin starts with.
pub const PREFIX: &str = "sha256:";

/// The text after `sha256:` when `plugin` is written as a reference to an
/// uploaded plugin (whether or not a digest follows), `None` for a path.
pub fn uploaded(plugin: &Path) -> Option<&str> {
    plugin.to_str()?.strip_prefix(PREFIX)
}

/// Whether `text` is a sha256 digest as uploads are named: 64 hex digits.
pub fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How a pipeline file names the upload with digest `sha256`.
pub fn reference(sha256: &str) -> String {
    format!("{PREFIX}{}", sha256.to_ascii_lowercase())
}

/// Refuses a pipeline whose sinks name uploaded plugins, for `command`
/// (`weir run`, `weir maintain`): only `weir serve` keeps uploads.
pub fn refuse_uploaded(config: &PipelineConfig, command: &str) -> Result<(), String> {
    for (i, sink) in config.sinks.iter().enumerate() {
        if uploaded(&sink.plugin).is_some() {
            return Err(format!(
                "{}: sinks[{i}].plugin (sink `{}`): `{}`: a sha256: plugin reference names a \
                 plugin uploaded to weir serve; give {command} a file path",
                config.file.display(),
                sink.name,
                sink.plugin.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_reference_is_told_from_a_path() {
        let digest = "ab".repeat(32);
        let written = PathBuf::from(reference(&digest.to_ascii_uppercase()));
        assert_eq!(written, PathBuf::from(format!("sha256:{digest}")));
        assert_eq!(uploaded(&written), Some(digest.as_str()));
        assert!(is_digest(uploaded(&written).unwrap()));
        for path in ["sink.wasm", "/plugins/sha256:x.wasm", "./sha256:x"] {
            assert_eq!(uploaded(Path::new(path)), None, "{path}");
        }
        assert_eq!(uploaded(Path::new("sha256:nope")), Some("nope"));
        for bad in ["nope", &"a".repeat(63), &"g".repeat(64), &"a".repeat(65)] {
            assert!(!is_digest(bad), "{bad}");
        }
    }

    #[test]
    fn weir_run_refuses_a_reference_naming_the_sink() {
        let text = format!(
            "pipeline: p\nsource: {{ generator: {{ seed: 1 }} }}\nsinks:\n  - name: lake\n    \
             plugin: sha256:{}\n    blob_store: {{ url: memory:// }}\n",
            "0".repeat(64)
        );
        let config =
            PipelineConfig::parse(&text, Path::new("p.yaml"), Path::new("."), |_| None).unwrap();
        let error = refuse_uploaded(&config, "weir run").unwrap_err();
        assert!(error.contains("sink `lake`"), "{error}");
        assert!(
            error.contains(
                "a sha256: plugin reference names a plugin uploaded to weir serve; give weir \
                 run a file path"
            ),
            "{error}"
        );
        let path = text.replace(&format!("sha256:{}", "0".repeat(64)), "sink.wasm");
        let config =
            PipelineConfig::parse(&path, Path::new("p.yaml"), Path::new("."), |_| None).unwrap();
        refuse_uploaded(&config, "weir run").unwrap();
    }
}
