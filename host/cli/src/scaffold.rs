//! `weir plugin new`: writes a sink project that builds on its own, outside
//! any Cargo workspace: a Rust crate against the weir SDK (a small, real
//! JSON Lines sink with native unit tests), a pipeline from the built-in
//! generator into it, a `weir plugin test` config with its reader, and a
//! README with the commands. The files are the templates under
//! `templates/rust/`, compiled into the binary.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The languages `weir plugin new` knows of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// What `weir plugin new` was asked to write.
pub struct NewSink {
    /// The crate's name, also the pipeline's and the sink's.
    pub name: String,
    pub lang: Lang,
    /// The project's folder; `./<name>` when absent.
    pub dir: Option<PathBuf>,
    /// The weir SDK's folder; the source tree's this `weir` was built from
    /// when absent.
    pub sdk: Option<PathBuf>,
}

/// A project written.
#[derive(Debug)]
pub struct Created {
    pub dir: PathBuf,
    /// Its files, relative to `dir`, in the order written.
    pub files: Vec<&'static str>,
    /// The component the build makes, relative to `dir`.
    pub wasm: String,
}

/// Each file of a Rust sink project and its template. `{{name}}` is the
/// crate's name, `{{crate}}` the same with `_` for `-` (the component's
/// file name), `{{type}}` the sink's type and `{{sdk}}` the SDK's folder.
const RUST_TEMPLATES: [(&str, &str); 8] = [
    (
        "Cargo.toml",
        include_str!("../templates/rust/Cargo.toml.tmpl"),
    ),
    (
        ".cargo/config.toml",
        include_str!("../templates/rust/cargo-config.toml.tmpl"),
    ),
    (
        ".gitignore",
        include_str!("../templates/rust/gitignore.tmpl"),
    ),
    ("src/lib.rs", include_str!("../templates/rust/lib.rs.tmpl")),
    (
        "pipeline.yaml",
        include_str!("../templates/rust/pipeline.yaml.tmpl"),
    ),
    (
        "plugin-test.yaml",
        include_str!("../templates/rust/plugin-test.yaml.tmpl"),
    ),
    (
        "read_rows.sh",
        include_str!("../templates/rust/read_rows.sh.tmpl"),
    ),
    (
        "README.md",
        include_str!("../templates/rust/README.md.tmpl"),
    ),
];

/// Writes the project, after checking everything it can before writing
/// anything. `Err` is the sentence to print.
pub fn create(request: &NewSink) -> Result<Created, String> {
    match request.lang {
        Lang::Rust => {}
        Lang::Python => {
            return Err(
                "--lang python: `weir plugin new` writes Rust projects only; start a Python \
                 sink from examples/python-sink in the weir source tree (docs/sinks/python.md \
                 shows its build with sdk/python/build-sink)"
                    .into(),
            );
        }
        Lang::Js => {
            return Err(
                "--lang js: `weir plugin new` writes Rust projects only; start a JavaScript \
                 sink from examples/js-sink in the weir source tree (docs/sinks/javascript.md \
                 shows its build with sdk/js)"
                    .into(),
            );
        }
    }
    check_crate_name(&request.name)?;
    let dir = request
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&request.name));
    check_missing_or_empty(&dir)?;
    let sdk = sdk_folder(request.sdk.as_deref())?;
    let sdk = sdk.to_str().ok_or_else(|| {
        format!(
            "the SDK folder {} is not UTF-8, which Cargo.toml cannot name",
            sdk.display()
        )
    })?;

    let crate_file = request.name.replace('-', "_");
    let values = [
        ("{{name}}", request.name.clone()),
        ("{{crate}}", crate_file.clone()),
        ("{{type}}", type_name(&request.name)),
        ("{{sdk}}", toml_basic_string_content(sdk)),
    ];
    let mut files = Vec::new();
    for (file, template) in RUST_TEMPLATES {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, render(template, &values))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        files.push(file);
    }
    Ok(Created {
        dir,
        files,
        wasm: format!("target/wasm32-wasip2/release/{crate_file}.wasm"),
    })
}

impl Created {
    /// What was written and the commands that come next, for the terminal.
    pub fn summary(&self) -> String {
        let mut out = format!("created {}:\n", self.dir.display());
        for file in &self.files {
            let _ = writeln!(out, "  {file}");
        }
        let wasm = &self.wasm;
        let commands = [
            format!("cd {}", shell_word(&self.dir.display().to_string())),
            "rustup target add wasm32-wasip2   # once".to_string(),
            "cargo build --release --target wasm32-wasip2".to_string(),
            format!("weir plugin inspect {wasm}"),
            "weir run pipeline.yaml".to_string(),
            format!("weir plugin test {wasm} --config plugin-test.yaml"),
            "cargo test".to_string(),
        ];
        out.push_str("\nnext:\n");
        for command in commands {
            let _ = writeln!(out, "  {command}");
        }
        out
    }
}

/// The template with every placeholder replaced.
fn render(template: &str, values: &[(&str, String)]) -> String {
    values
        .iter()
        .fold(template.to_string(), |text, (placeholder, value)| {
            text.replace(placeholder, value)
        })
}

/// Rust keywords, strict and reserved: none can name a crate.
const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "static", "struct", "super", "trait", "true", "try", "type", "typeof",
    "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Names cargo keeps for itself or Rust's own crates, and the crates the
/// project depends on (a package cannot depend on its own name).
const TAKEN: &[(&str, &str)] = &[
    ("std", "Rust's standard library"),
    ("core", "Rust's core library"),
    ("alloc", "Rust's alloc library"),
    ("proc_macro", "Rust's proc_macro library"),
    ("test", "Rust's test library"),
    ("build", "a folder cargo writes in target/"),
    ("deps", "a folder cargo writes in target/"),
    ("examples", "a folder cargo writes in target/"),
    ("incremental", "a folder cargo writes in target/"),
    ("weir_sdk", "the weir SDK, which the project depends on"),
    (
        "arrow_json",
        "Arrow's JSON writer, which the project depends on",
    ),
];

/// The longest name crates.io takes.
const MAX_NAME_CHARS: usize = 64;

/// A name Cargo takes for a package and weir for a pipeline and a sink:
/// an ASCII letter, then letters, digits, `-` and `_`; not a keyword, not
/// a name Rust or Cargo uses, not a file name Windows reserves.
fn check_crate_name(name: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("`{name}` is not a valid crate name: {why}"));
    let Some(first) = name.chars().next() else {
        return Err("the sink's name is empty: it names the crate, such as `orders-export`".into());
    };
    if !first.is_ascii_alphabetic() {
        return refuse("it must start with a letter (a-z, A-Z)");
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
    {
        return refuse(&format!(
            "{:?} is not allowed; use letters, digits, `-` and `_`",
            bad
        ));
    }
    if name.len() > MAX_NAME_CHARS {
        return refuse(&format!("it is longer than {MAX_NAME_CHARS} characters"));
    }
    let as_crate = name.replace('-', "_");
    if KEYWORDS.contains(&as_crate.as_str()) {
        return refuse("it is a Rust keyword");
    }
    if let Some((_, what)) = TAKEN
        .iter()
        .find(|(taken, _)| taken.eq_ignore_ascii_case(&as_crate))
    {
        return refuse(&format!("it is the name of {what}"));
    }
    let lower = name.to_ascii_lowercase();
    let windows_device = ["con", "prn", "aux", "nul"].contains(&lower.as_str())
        || ((lower.starts_with("com") || lower.starts_with("lpt"))
            && lower.len() == 4
            && lower.as_bytes()[3].is_ascii_digit());
    if windows_device {
        return refuse("Windows reserves it as a file name");
    }
    Ok(())
}

/// Names the generated `src/lib.rs` imports; a sink type of one of these
/// names would clash with it.
const TEMPLATE_NAMES: &[&str] = &[
    "Arc",
    "ArrayRef",
    "ArrowError",
    "Batch",
    "BatchMeta",
    "BinaryArray",
    "CommitRequest",
    "Config",
    "DataType",
    "Field",
    "HashMap",
    "Int64Array",
    "NativeSink",
    "PathBuf",
    "RecordBatch",
    "Result",
    "Schema",
    "Sink",
    "SinkError",
    "StringArray",
    "Table",
];

/// The sink's type name: the crate name in UpperCamelCase (`orders-export`
/// -> `OrdersExport`), with `Plugin` added when that is a name the
/// generated code uses already.
fn type_name(name: &str) -> String {
    let camel: String = name
        .split(['-', '_'])
        .filter(|word| !word.is_empty())
        .map(|word| {
            let mut chars = word.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase());
            first.into_iter().chain(chars).collect::<String>()
        })
        .collect();
    if TEMPLATE_NAMES.contains(&camel.as_str()) {
        format!("{camel}Plugin")
    } else {
        camel
    }
}

/// `folder` does not exist yet, or is an empty folder.
fn check_missing_or_empty(folder: &Path) -> Result<(), String> {
    match std::fs::read_dir(folder) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(format!(
                "{} exists and is not empty: name another folder with --dir, or empty it",
                folder.display()
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) if folder.exists() && !folder.is_dir() => Err(format!(
            "{} exists and is not a folder: name another folder with --dir",
            folder.display()
        )),
        Err(e) => Err(format!("cannot read {}: {e}", folder.display())),
    }
}

/// The weir SDK's folder, absolute: `given`, or else the `sdk` folder of
/// the source tree this `weir` was built from, when it is still there (the
/// SDK is not on a registry).
fn sdk_folder(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(given) = given {
        let folder = given
            .canonicalize()
            .map_err(|e| format!("--sdk {}: {e}", given.display()))?;
        check_sdk(&folder).map_err(|why| format!("--sdk {}: {why}", given.display()))?;
        return Ok(folder);
    }
    let built_from = built_from_sdk();
    match built_from.canonicalize() {
        Ok(folder) if check_sdk(&folder).is_ok() => Ok(folder),
        _ => Err(format!(
            "no weir SDK at {}, where the source tree this weir was built from kept it, and \
             the SDK is not on a registry: pass --sdk PATH, the `sdk` folder of a weir \
             source tree",
            built_from.display()
        )),
    }
}

/// The `sdk` folder of the source tree this binary was built from.
fn built_from_sdk() -> PathBuf {
    // This crate is host/cli in that tree.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap_or(Path::new("/"))
        .join("sdk")
}

/// `folder` holds the weir-sdk crate.
fn check_sdk(folder: &Path) -> Result<(), String> {
    let manifest = folder.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    if text
        .lines()
        .any(|line| line.trim() == r#"name = "weir-sdk""#)
    {
        Ok(())
    } else {
        Err(format!(
            "{} is not the weir-sdk crate's manifest",
            manifest.display()
        ))
    }
}

/// `text` escaped for the inside of a TOML basic string ("...").
fn toml_basic_string_content(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// `word` as one word of a POSIX shell command line.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./+:=@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, dir: &Path) -> NewSink {
        NewSink {
            name: name.into(),
            lang: Lang::Rust,
            dir: Some(dir.to_path_buf()),
            sdk: None,
        }
    }

    #[test]
    fn writes_every_file_with_the_placeholders_filled() {
        let folder = tempfile::tempdir().unwrap();
        let dir = folder.path().join("orders-export");
        let created = create(&request("orders-export", &dir)).expect("created");
        assert_eq!(created.files.len(), RUST_TEMPLATES.len());
        assert_eq!(
            created.wasm,
            "target/wasm32-wasip2/release/orders_export.wasm"
        );
        for file in &created.files {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            assert!(!text.contains("{{"), "{file} keeps a placeholder:\n{text}");
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"orders-export\""), "{manifest}");
        let sdk = built_from_sdk().canonicalize().unwrap();
        assert!(
            manifest.contains(&format!("weir-sdk = {{ path = \"{}\" }}", sdk.display())),
            "{manifest}"
        );
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("pub struct OrdersExport {"), "{lib}");
        assert!(lib.contains("export_sink!(OrdersExport)"), "{lib}");
        let pipeline = std::fs::read_to_string(dir.join("pipeline.yaml")).unwrap();
        assert!(
            pipeline.contains("plugin: target/wasm32-wasip2/release/orders_export.wasm"),
            "{pipeline}"
        );
        let summary = created.summary();
        assert!(
            summary.contains(&format!("cd {}", dir.display())),
            "{summary}"
        );
        assert!(
            summary.contains("weir plugin test target/wasm32-wasip2/release/orders_export.wasm"),
            "{summary}"
        );
    }

    #[test]
    fn an_empty_folder_is_used_and_a_folder_with_files_refused() {
        let folder = tempfile::tempdir().unwrap();
        create(&request("sink-a", folder.path())).expect("an empty folder is used");
        let refused = create(&request("sink-b", folder.path())).unwrap_err();
        assert!(
            refused.contains(&folder.path().display().to_string()) && refused.contains("not empty"),
            "{refused}"
        );
        let file = folder.path().join("Cargo.toml");
        let refused = create(&request("sink-c", &file)).unwrap_err();
        assert!(
            refused.contains(&file.display().to_string()) && refused.contains("not a folder"),
            "{refused}"
        );
    }

    #[test]
    fn names_that_cannot_name_a_crate_are_refused_saying_why() {
        let folder = tempfile::tempdir().unwrap();
        let too_long = "a".repeat(65);
        for (name, why) in [
            ("", "empty"),
            ("9lives", "start with a letter"),
            ("my sink", "' ' is not allowed"),
            ("orders.export", "'.' is not allowed"),
            ("fn", "keyword"),
            ("self", "keyword"),
            ("test", "Rust's test library"),
            ("weir-sdk", "the weir SDK"),
            ("arrow_json", "JSON writer"),
            ("con", "Windows"),
            ("lpt1", "Windows"),
            (too_long.as_str(), "longer than 64"),
        ] {
            let dir = folder.path().join("project");
            let refused = create(&request(name, &dir)).unwrap_err();
            assert!(refused.contains(why), "{name:?}: {refused}");
            assert!(!dir.exists(), "{name:?}: wrote something");
        }
        for name in ["a", "orders-export", "Orders_2", "console"] {
            check_crate_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn type_names_do_not_clash_with_the_code_around_them() {
        assert_eq!(type_name("orders-export"), "OrdersExport");
        assert_eq!(type_name("my__sink-2"), "MySink2");
        assert_eq!(type_name("sink"), "SinkPlugin");
        assert_eq!(type_name("native-sink"), "NativeSinkPlugin");
    }

    #[test]
    fn python_and_javascript_point_at_their_examples() {
        let folder = tempfile::tempdir().unwrap();
        for (lang, example) in [
            (Lang::Python, "examples/python-sink"),
            (Lang::Js, "examples/js-sink"),
        ] {
            let dir = folder.path().join("project");
            let refused = create(&NewSink {
                lang,
                ..request("my-sink", &dir)
            })
            .unwrap_err();
            assert!(refused.contains(example), "{refused}");
            assert!(!dir.exists());
        }
    }

    #[test]
    fn a_folder_that_is_not_the_sdk_is_refused_naming_it() {
        let folder = tempfile::tempdir().unwrap();
        let refused = create(&NewSink {
            sdk: Some(folder.path().to_path_buf()),
            ..request("my-sink", &folder.path().join("project"))
        })
        .unwrap_err();
        assert!(
            refused.starts_with(&format!("--sdk {}", folder.path().display())),
            "{refused}"
        );
        let missing = folder.path().join("missing");
        let refused = create(&NewSink {
            sdk: Some(missing.clone()),
            ..request("my-sink", &folder.path().join("project"))
        })
        .unwrap_err();
        assert!(
            refused.starts_with(&format!("--sdk {}", missing.display())),
            "{refused}"
        );
    }

    #[test]
    fn toml_strings_and_shell_words_are_escaped() {
        assert_eq!(toml_basic_string_content(r#"C:\a "b""#), r#"C:\\a \"b\""#);
        assert_eq!(shell_word("./my-sink"), "./my-sink");
        assert_eq!(shell_word("my sink's"), r"'my sink'\''s'");
    }

    /// The project is built with the flags the workspace builds its own
    /// sinks with: the same speed, and in a shared target folder the same
    /// compiled dependencies.
    #[test]
    fn the_project_builds_with_the_workspace_s_wasm_flags() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let ours = std::fs::read_to_string(workspace.join(".cargo/config.toml")).unwrap();
        let theirs = RUST_TEMPLATES
            .iter()
            .find(|(file, _)| *file == ".cargo/config.toml")
            .unwrap()
            .1;
        assert_eq!(
            wasm_rustflags(theirs),
            wasm_rustflags(&ours),
            "templates/rust/cargo-config.toml.tmpl and .cargo/config.toml differ"
        );
    }

    /// The project's Arrow crates are the workspace's version.
    #[test]
    fn the_project_uses_the_workspace_s_arrow() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
        let arrow = manifest
            .lines()
            .find_map(|line| line.strip_prefix("arrow-array = "))
            .expect("the workspace names arrow-array");
        let template = RUST_TEMPLATES[0].1;
        assert!(
            template.contains(&format!("arrow-json = {arrow}")),
            "the template's arrow-json is not {arrow}"
        );
    }

    /// The `rustflags` of `[target.wasm32-wasip2]`, without comments and
    /// layout.
    fn wasm_rustflags(config: &str) -> Vec<String> {
        let section = config
            .split("[target.wasm32-wasip2]")
            .nth(1)
            .expect("a [target.wasm32-wasip2] table");
        let list = section
            .split("rustflags = [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .expect("rustflags");
        list.split(',')
            .map(|flag| flag.trim().trim_matches('"').to_string())
            .filter(|flag| !flag.is_empty())
            .collect()
    }
}
