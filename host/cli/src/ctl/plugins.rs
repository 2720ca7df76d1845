//! `weir ctl apply --plugin FILE`: which sinks of the pipeline file run
//! FILE, and the pipeline file's text with those sinks' `plugin:` values
//! replaced by the reference to FILE's upload (`sha256:<digest>`). Only
//! the value is replaced, on its line, so the operator's comments and
//! layout reach the host as written.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Spanned;
use weir_pipeline::plugin_ref;

/// What of a pipeline file is read here: each sink's name and plugin,
/// with where the plugin's value is written. The rest is the host's to
/// check.
#[derive(Deserialize)]
struct PipelineFile {
    #[serde(default)]
    sinks: Vec<SinkEntry>,
}

#[derive(Deserialize)]
struct SinkEntry {
    #[serde(default)]
    name: String,
    plugin: Option<Spanned<String>>,
}

/// One `--plugin` file and the sinks of the pipeline file that run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginUpload {
    /// As the operator gave it.
    pub file: PathBuf,
    /// The sinks whose `plugin:` is this file.
    pub sinks: Vec<String>,
    /// Where each of those sinks' `plugin:` value is written.
    values: Vec<ValueAt>,
}

/// A `plugin:` value as written: its line (from 0) and the bytes of the
/// line it spans, quotes included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ValueAt {
    line: usize,
    start: usize,
    end: usize,
}

/// Finds, for each of `plugins`, the sinks of `pipeline_file` (whose text
/// is `text`) whose `plugin:` path, relative to the pipeline file's folder
/// or absolute, is that same file, and where each such value is written.
/// Refuses a `--plugin` that no sink runs, and a value that is not written
/// as a plain `plugin: VALUE` line.
pub fn sinks_running(
    pipeline_file: &Path,
    text: &str,
    plugins: &[PathBuf],
) -> Result<Vec<PluginUpload>, String> {
    let parsed: PipelineFile = serde_saphyr::from_str(text).map_err(|e| {
        format!(
            "cannot read the pipeline file {} for --plugin: {e}",
            pipeline_file.display()
        )
    })?;
    let folder = pipeline_file.parent().unwrap_or(Path::new("."));
    let mut uploads: Vec<(PathBuf, PluginUpload)> = Vec::new();
    for file in plugins {
        let same = file
            .canonicalize()
            .map_err(|e| format!("--plugin {}: {e}", file.display()))?;
        if uploads.iter().all(|(known, _)| *known != same) {
            let upload = PluginUpload {
                file: file.clone(),
                sinks: Vec::new(),
                values: Vec::new(),
            };
            uploads.push((same, upload));
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    for sink in &parsed.sinks {
        let Some(plugin) = &sink.plugin else { continue };
        if plugin_ref::uploaded(Path::new(&plugin.value)).is_some() {
            continue;
        }
        let Ok(runs) = folder.join(&plugin.value).canonicalize() else {
            continue;
        };
        let Some((_, upload)) = uploads.iter_mut().find(|(same, _)| *same == runs) else {
            continue;
        };
        let line = usize::try_from(plugin.referenced.line())
            .unwrap_or(0)
            .saturating_sub(1);
        let written = lines.get(line).copied().unwrap_or_default();
        let (start, end) = plain_value(written, &plugin.value).ok_or_else(|| {
            format!(
                "{}: sink `{}`: its plugin `{}` is not written as a plain `plugin: VALUE` line \
                 (line {}: `{}`), so --plugin cannot put the uploaded plugin's reference in its \
                 place; write it as `plugin: {}` on a line of its own",
                pipeline_file.display(),
                sink.name,
                plugin.value,
                line + 1,
                written.trim(),
                plugin.value
            )
        })?;
        upload.sinks.push(sink.name.clone());
        upload.values.push(ValueAt { line, start, end });
    }
    let uploads: Vec<PluginUpload> = uploads.into_iter().map(|(_, upload)| upload).collect();
    if let Some(unused) = uploads.iter().find(|u| u.sinks.is_empty()) {
        let named: Vec<String> = parsed
            .sinks
            .iter()
            .map(|sink| match &sink.plugin {
                Some(plugin) => format!("`{}`: {}", sink.name, plugin.value),
                None => format!("`{}`: no plugin", sink.name),
            })
            .collect();
        return Err(format!(
            "--plugin {} is the plugin of no sink of {} (a sink's `plugin:` path is read from \
             the pipeline file's folder); its sinks name {}",
            unused.file.display(),
            pipeline_file.display(),
            if named.is_empty() {
                "no plugin (it has no sinks)".to_string()
            } else {
                named.join(", ")
            }
        ));
    }
    Ok(uploads)
}

/// `text` with the `plugin:` value of every sink of each upload replaced
/// by the reference to its digest; every other byte as it was.
pub fn with_references<'a>(
    text: &str,
    uploads: impl IntoIterator<Item = (&'a PluginUpload, &'a str)>,
) -> String {
    let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    for (upload, sha256) in uploads {
        for at in &upload.values {
            let line = &mut lines[at.line];
            line.replace_range(at.start..at.end, &plugin_ref::reference(sha256));
        }
    }
    lines.concat()
}

/// Where `value` is written on `line` if the line is `plugin: VALUE`
/// (after any indentation and `- `), the value plain or quoted, and
/// nothing after it but spaces and a comment: the bytes of the line the
/// value spans, quotes included.
fn plain_value(line: &str, value: &str) -> Option<(usize, usize)> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut rest = line.trim_start();
    if let Some(item) = rest.strip_prefix('-') {
        rest = item.trim_start();
    }
    let after_key = rest.strip_prefix("plugin")?.trim_start_matches([' ', '\t']);
    let after_colon = after_key.strip_prefix(':')?;
    let token = after_colon.trim_start_matches([' ', '\t']);
    if token.len() == after_colon.len() {
        // `plugin:VALUE` is not a key and a value.
        return None;
    }
    let start = line.len() - token.len();
    let (read, length) = match token.as_bytes().first()? {
        b'"' => double_quoted(token)?,
        b'\'' => single_quoted(token)?,
        _ => {
            let end = token.find(" #").or_else(|| token.find("\t#"));
            let plain = token[..end.unwrap_or(token.len())].trim_end();
            (plain.to_string(), plain.len())
        }
    };
    let after = token[length..].trim_start_matches([' ', '\t']);
    let only_a_comment = after.is_empty() || after.starts_with('#');
    (read == value && only_a_comment).then_some((start, start + length))
}

/// A double-quoted scalar at the start of `token`, read, and its length;
/// `None` for escapes other than `\"` and `\\` (not a plain path).
fn double_quoted(token: &str) -> Option<(String, usize)> {
    let mut read = String::new();
    let mut chars = token.char_indices().skip(1);
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Some((read, at + 1)),
            '\\' => match chars.next()?.1 {
                escaped @ ('"' | '\\') => read.push(escaped),
                _ => return None,
            },
            c => read.push(c),
        }
    }
    None
}

/// A single-quoted scalar at the start of `token`, read (`''` is a quote),
/// and its length.
fn single_quoted(token: &str) -> Option<(String, usize)> {
    let mut read = String::new();
    let mut chars = token.char_indices().skip(1).peekable();
    while let Some((at, c)) = chars.next() {
        if c == '\'' {
            if chars.peek().is_some_and(|(_, next)| *next == '\'') {
                chars.next();
                read.push('\'');
                continue;
            }
            return Some((read, at + 1));
        }
        read.push(c);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipeline file in a temporary folder, with plugin files beside it.
    fn folder(text: &str, plugins: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        for plugin in plugins {
            let path = dir.path().join(plugin);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"\0asm").unwrap();
        }
        let file = dir.path().join("orders.yaml");
        std::fs::write(&file, text).unwrap();
        (dir, file)
    }

    const FILE: &str = "\
# Orders into the lake, and an audit copy.
pipeline: orders
source: { generator: { seed: 1 } }
sinks:
  - name: lake
    plugin: build/lake.wasm   # built by CI
    blob_store: { url: lake }
  - plugin: 'build/lake.wasm'
    name: copy
    blob_store: { url: copy }
  - name: audit
    plugin: \"audit.wasm\"
    blob_store: { url: audit }
";

    #[test]
    fn the_sinks_running_a_file_get_its_reference_and_nothing_else_changes() {
        let (dir, file) = folder(FILE, &["build/lake.wasm", "audit.wasm"]);
        // Named another way than the pipeline file names it: compared as
        // the same file.
        let given = dir.path().join("build/../build/lake.wasm");
        let uploads = sinks_running(&file, FILE, std::slice::from_ref(&given)).unwrap();
        assert_eq!(uploads.len(), 1);
        assert_eq!(uploads[0].file, given);
        assert_eq!(uploads[0].sinks, ["lake", "copy"]);
        let digest = "ab".repeat(32);
        let sent = with_references(FILE, [(&uploads[0], digest.as_str())]);
        let expected = FILE
            .replace(
                "plugin: build/lake.wasm   # built by CI",
                &format!("plugin: sha256:{digest}   # built by CI"),
            )
            .replace(
                "- plugin: 'build/lake.wasm'",
                &format!("- plugin: sha256:{digest}"),
            );
        assert_eq!(sent, expected);
        // The host reads the references where the paths were.
        let read: PipelineFile = serde_saphyr::from_str(&sent).unwrap();
        let plugins: Vec<String> = read
            .sinks
            .iter()
            .map(|s| s.plugin.as_ref().unwrap().value.clone())
            .collect();
        let reference = format!("sha256:{digest}");
        assert_eq!(plugins, [&reference, &reference, "audit.wasm"]);
    }

    #[test]
    fn an_absolute_plugin_path_and_a_double_quoted_one_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("audit.wasm");
        std::fs::write(&plugin, b"\0asm").unwrap();
        let text = FILE.replace("\"audit.wasm\"", &format!("\"{}\"", plugin.display()));
        let file = dir.path().join("orders.yaml");
        let uploads = sinks_running(&file, &text, &[plugin]).unwrap();
        assert_eq!(uploads[0].sinks, ["audit"]);
        let digest = "cd".repeat(32);
        let sent = with_references(&text, [(&uploads[0], digest.as_str())]);
        assert!(
            sent.contains(&format!("    plugin: sha256:{digest}\n")),
            "{sent}"
        );
    }

    #[test]
    fn a_plugin_no_sink_runs_is_refused_naming_the_sinks_plugins() {
        let (dir, file) = folder(FILE, &["build/lake.wasm", "audit.wasm", "other.wasm"]);
        let error = sinks_running(&file, FILE, &[dir.path().join("other.wasm")]).unwrap_err();
        assert!(
            error.contains("other.wasm is the plugin of no sink"),
            "{error}"
        );
        assert!(
            error.contains("`lake`: build/lake.wasm, `copy`: build/lake.wasm, `audit`: audit.wasm"),
            "{error}"
        );
        let missing = sinks_running(&file, FILE, &[dir.path().join("gone.wasm")]).unwrap_err();
        assert!(missing.starts_with("--plugin "), "{missing}");
    }

    #[test]
    fn a_value_not_on_a_plain_plugin_line_is_refused() {
        let flow = "pipeline: orders\nsource: { generator: { seed: 1 } }\nsinks:\n  - { name: lake, \
                    plugin: lake.wasm, blob_store: { url: lake } }\n";
        let next_line = "pipeline: orders\nsource: { generator: { seed: 1 } }\nsinks:\n  - name: \
                         lake\n    plugin:\n      lake.wasm\n    blob_store: { url: lake }\n";
        for text in [flow, next_line] {
            let (dir, file) = folder(text, &["lake.wasm"]);
            let error = sinks_running(&file, text, &[dir.path().join("lake.wasm")]).unwrap_err();
            assert!(
                error.contains("sink `lake`: its plugin `lake.wasm` is not written as a plain"),
                "{error}"
            );
        }
    }

    #[test]
    fn plain_values_are_read_as_yaml_reads_them() {
        assert_eq!(plain_value("    plugin: a.wasm", "a.wasm"), Some((12, 18)));
        assert_eq!(
            plain_value("  - plugin: a.wasm # x", "a.wasm"),
            Some((12, 18))
        );
        assert_eq!(
            plain_value("plugin : 'it''s.wasm'", "it's.wasm"),
            Some((9, 21))
        );
        assert_eq!(
            plain_value("plugin: \"a\\\\b.wasm\"\r", "a\\b.wasm"),
            Some((8, 19))
        );
        assert_eq!(plain_value("plugin: a.wasm#x", "a.wasm#x"), Some((8, 16)));
        for (line, value) in [
            ("plugin:a.wasm", "a.wasm"),
            ("plugins: a.wasm", "a.wasm"),
            ("# plugin: a.wasm", "a.wasm"),
            ("plugin: \"a\\tb\"", "a\tb"),
            ("plugin: 'a.wasm' extra", "a.wasm"),
            ("plugin: a.wasm", "b.wasm"),
        ] {
            assert_eq!(plain_value(line, value), None, "{line}");
        }
    }
}
