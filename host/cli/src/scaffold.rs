//! `weir plugin new`: writes a sink project that builds on its own, outside
//! the weir source tree and any Cargo workspace: a small, real JSON Lines
//! sink against the weir SDK of the chosen language (Rust: a crate with
//! native unit tests; Python and JavaScript: a module and a `build.sh` that
//! runs the SDK's own build tool), a pipeline from the built-in generator
//! into it, a `weir plugin test` config with its reader, and a README with
//! the commands. The files are the templates under `templates/<lang>/`,
//! compiled into the binary.

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
    /// The project's name, also the pipeline's and the sink's (and the
    /// Rust crate's).
    pub name: String,
    pub lang: Lang,
    /// The project's folder; `./<name>` when absent.
    pub dir: Option<PathBuf>,
    /// The `sdk` folder of a weir source tree (the Rust SDK; the Python
    /// and JavaScript ones are its `python` and `js` folders); the source
    /// tree's this `weir` was built from when absent.
    pub sdk: Option<PathBuf>,
}

/// A project written.
#[derive(Debug)]
pub struct Created {
    pub dir: PathBuf,
    pub lang: Lang,
    /// Its files, relative to `dir`, in the order written.
    pub files: Vec<String>,
    /// The component the build makes, relative to `dir`.
    pub wasm: String,
    /// The SDK folder the project builds with (`sdk`, `sdk/python` or
    /// `sdk/js` of a weir source tree), absolute.
    pub sdk: PathBuf,
}

/// One file of a project: its path in the project (which may hold
/// placeholders) and its template.
type Template = (&'static str, &'static str);

/// Each file of a Rust sink project and its template. `{{name}}` is the
/// crate's name, `{{crate}}` the same with `_` for `-` (the component's
/// file name), `{{type}}` the sink's type and `{{sdk}}` the SDK's folder
/// (inside a TOML string).
const RUST_TEMPLATES: [Template; 8] = [
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

/// Each file of a Python sink project and its template. `{{crate}}` is
/// also the module's name, `{{type}}` the sink's class, `{{sdk}}` the
/// Python SDK's folder and `{{tree}}` its source tree's, each as one
/// shell word.
const PYTHON_TEMPLATES: [Template; 7] = [
    (
        "src/{{crate}}.py",
        include_str!("../templates/python/sink.py.tmpl"),
    ),
    (
        "build.sh",
        include_str!("../templates/python/build.sh.tmpl"),
    ),
    (
        ".gitignore",
        include_str!("../templates/python/gitignore.tmpl"),
    ),
    (
        "pipeline.yaml",
        include_str!("../templates/python/pipeline.yaml.tmpl"),
    ),
    (
        "plugin-test.yaml",
        include_str!("../templates/python/plugin-test.yaml.tmpl"),
    ),
    (
        "read_rows.py",
        include_str!("../templates/python/read_rows.py.tmpl"),
    ),
    (
        "README.md",
        include_str!("../templates/python/README.md.tmpl"),
    ),
];

/// Each file of a JavaScript sink project and its template. `{{type}}` is
/// the sink's class and `{{sdk}}` the JavaScript SDK's folder, as one
/// shell word.
const JS_TEMPLATES: [Template; 7] = [
    ("src/sink.js", include_str!("../templates/js/sink.js.tmpl")),
    ("build.sh", include_str!("../templates/js/build.sh.tmpl")),
    (".gitignore", include_str!("../templates/js/gitignore.tmpl")),
    (
        "pipeline.yaml",
        include_str!("../templates/js/pipeline.yaml.tmpl"),
    ),
    (
        "plugin-test.yaml",
        include_str!("../templates/js/plugin-test.yaml.tmpl"),
    ),
    (
        "read_rows.sh",
        include_str!("../templates/js/read_rows.sh.tmpl"),
    ),
    ("README.md", include_str!("../templates/js/README.md.tmpl")),
];

fn templates(lang: Lang) -> &'static [Template] {
    match lang {
        Lang::Rust => &RUST_TEMPLATES,
        Lang::Python => &PYTHON_TEMPLATES,
        Lang::Js => &JS_TEMPLATES,
    }
}

/// Writes the project, after checking everything it can before writing
/// anything. `Err` is the sentence to print.
pub fn create(request: &NewSink) -> Result<Created, String> {
    let lang = request.lang;
    check_name(&request.name, lang)?;
    let dir = request
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&request.name));
    check_missing_or_empty(&dir)?;
    let sdk = sdk_folder(request.sdk.as_deref(), lang)?;
    let sdk_text = sdk.to_str().ok_or_else(|| {
        format!(
            "the SDK folder {} is not UTF-8, which {} cannot name",
            sdk.display(),
            if lang == Lang::Rust {
                "Cargo.toml"
            } else {
                "build.sh"
            }
        )
    })?;

    let crate_file = request.name.replace('-', "_");
    let mut values = vec![
        ("{{name}}", request.name.clone()),
        ("{{crate}}", crate_file.clone()),
        ("{{type}}", type_name(&request.name, lang)),
    ];
    match lang {
        Lang::Rust => values.push(("{{sdk}}", toml_basic_string_content(sdk_text))),
        Lang::Python => {
            values.push(("{{sdk}}", shell_word(sdk_text)));
            // sdk/python of the tree: checked to be UTF-8 with it.
            let tree = sdk.ancestors().nth(2).unwrap_or(Path::new("/"));
            values.push(("{{tree}}", shell_word(&tree.to_string_lossy())));
        }
        Lang::Js => values.push(("{{sdk}}", shell_word(sdk_text))),
    }
    let mut files = Vec::new();
    for (file, template) in templates(lang) {
        let file = render(file, &values);
        let path = dir.join(&file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, render(template, &values))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        if file == "build.sh" {
            make_executable(&path)?;
        }
        files.push(file);
    }
    let wasm = match lang {
        Lang::Rust => format!("target/wasm32-wasip2/release/{crate_file}.wasm"),
        Lang::Python | Lang::Js => format!("target/{crate_file}.wasm"),
    };
    Ok(Created {
        dir,
        lang,
        files,
        wasm,
        sdk,
    })
}

/// Makes `path` executable (`./build.sh`), as `chmod +x` does.
#[cfg(unix)]
fn make_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut permissions = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .permissions();
    permissions.set_mode(permissions.mode() | 0o111);
    std::fs::set_permissions(path, permissions)
        .map_err(|e| format!("cannot make {} executable: {e}", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}

impl Created {
    /// What was written and the commands that come next, for the terminal.
    pub fn summary(&self) -> String {
        let mut out = format!("created {}:\n", self.dir.display());
        for file in &self.files {
            let _ = writeln!(out, "  {file}");
        }
        let wasm = &self.wasm;
        let sdk = shell_word(&self.sdk.to_string_lossy());
        let mut commands = vec![format!(
            "cd {}",
            shell_word(&self.dir.display().to_string())
        )];
        match self.lang {
            Lang::Rust => commands.extend([
                "rustup target add wasm32-wasip2   # once".to_string(),
                "cargo build --release --target wasm32-wasip2".to_string(),
            ]),
            Lang::Python => {
                let tree = self.sdk.ancestors().nth(2).unwrap_or(Path::new("/"));
                commands.extend([
                    format!(
                        "{}/scripts/setup   # once: componentize-py into that tree's .venv (README.md)",
                        shell_word(&tree.to_string_lossy())
                    ),
                    "./build.sh".to_string(),
                ]);
            }
            Lang::Js => commands.extend([
                format!("(cd {sdk} && npm ci)   # once, unless that tree's scripts/setup did"),
                "./build.sh".to_string(),
            ]),
        }
        commands.extend([
            format!("weir plugin inspect {wasm}"),
            "weir run pipeline.yaml".to_string(),
            format!("weir plugin test {wasm} --config plugin-test.yaml"),
        ]);
        if self.lang == Lang::Rust {
            commands.push("cargo test".to_string());
        }
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

/// Names a project in any language takes, for its folder, its pipeline
/// and its sink: an ASCII letter, then letters, digits, `-` and `_`, not a
/// file name Windows reserves; and what its language adds (see
/// [`check_crate_name`] and [`check_python_module`]).
fn check_name(name: &str, lang: Lang) -> Result<(), String> {
    let what = match lang {
        Lang::Rust => "crate name",
        Lang::Python | Lang::Js => "sink name",
    };
    let refuse = |why: &str| Err(format!("`{name}` is not a valid {what}: {why}"));
    let Some(first) = name.chars().next() else {
        let names = match lang {
            Lang::Rust => "the crate",
            Lang::Python | Lang::Js => "the project, its pipeline and its sink",
        };
        return Err(format!(
            "the sink's name is empty: it names {names}, such as `orders-export`"
        ));
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
    let lower = name.to_ascii_lowercase();
    let windows_device = ["con", "prn", "aux", "nul"].contains(&lower.as_str())
        || ((lower.starts_with("com") || lower.starts_with("lpt"))
            && lower.len() == 4
            && lower.as_bytes()[3].is_ascii_digit());
    if windows_device {
        return refuse("Windows reserves it as a file name");
    }
    match lang {
        Lang::Rust => check_crate_name(name).or_else(|why| refuse(&why)),
        Lang::Python => check_python_module(&name.replace('-', "_")).or_else(|why| refuse(&why)),
        // The name is only in file names, strings and the class name,
        // which `type_name` keeps clear of the code around it.
        Lang::Js => Ok(()),
    }
}

/// What a crate's name must not be, beyond [`check_name`]: a keyword, or a
/// name Rust or Cargo uses.
fn check_crate_name(name: &str) -> Result<(), String> {
    let as_crate = name.replace('-', "_");
    if KEYWORDS.contains(&as_crate.as_str()) {
        return Err("it is a Rust keyword".into());
    }
    if let Some((_, what)) = TAKEN
        .iter()
        .find(|(taken, _)| taken.eq_ignore_ascii_case(&as_crate))
    {
        return Err(format!("it is the name of {what}"));
    }
    Ok(())
}

/// Python's keywords: none can name a module that is imported.
const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// The modules of Python's standard library (`sys.stdlib_module_names` of
/// CPython 3.11 to 3.14, without the private ones): a sink module of one
/// of these names clashes with it (componentize-py then imports the
/// standard library's, which exports no sink, and the build fails).
#[rustfmt::skip]
const PYTHON_STDLIB: &[&str] = &[
    "abc", "aifc", "annotationlib", "antigravity", "argparse", "array", "ast", "asynchat",
    "asyncio", "asyncore", "atexit", "audioop", "base64", "bdb", "binascii", "bisect", "builtins",
    "bz2", "cProfile", "calendar", "cgi", "cgitb", "chunk", "cmath", "cmd", "code", "codecs",
    "codeop", "collections", "colorsys", "compileall", "compression", "concurrent", "configparser",
    "contextlib", "contextvars", "copy", "copyreg", "crypt", "csv", "ctypes", "curses",
    "dataclasses", "datetime", "dbm", "decimal", "difflib", "dis", "distutils", "doctest", "email",
    "encodings", "ensurepip", "enum", "errno", "faulthandler", "fcntl", "filecmp", "fileinput",
    "fnmatch", "fractions", "ftplib", "functools", "gc", "genericpath", "getopt", "getpass",
    "gettext", "glob", "graphlib", "grp", "gzip", "hashlib", "heapq", "hmac", "html", "http",
    "idlelib", "imaplib", "imghdr", "imp", "importlib", "inspect", "io", "ipaddress", "itertools",
    "json", "keyword", "lib2to3", "linecache", "locale", "logging", "lzma", "mailbox", "mailcap",
    "marshal", "math", "mimetypes", "mmap", "modulefinder", "msilib", "msvcrt", "multiprocessing",
    "netrc", "nis", "nntplib", "nt", "ntpath", "nturl2path", "numbers", "opcode", "operator",
    "optparse", "os", "ossaudiodev", "pathlib", "pdb", "pickle", "pickletools", "pipes", "pkgutil",
    "platform", "plistlib", "poplib", "posix", "posixpath", "pprint", "profile", "pstats", "pty",
    "pwd", "py_compile", "pyclbr", "pydoc", "pydoc_data", "pyexpat", "queue", "quopri", "random",
    "re", "readline", "reprlib", "resource", "rlcompleter", "runpy", "sched", "secrets", "select",
    "selectors", "shelve", "shlex", "shutil", "signal", "site", "smtpd", "smtplib", "sndhdr",
    "socket", "socketserver", "spwd", "sqlite3", "sre_compile", "sre_constants", "sre_parse",
    "ssl", "stat", "statistics", "string", "stringprep", "struct", "subprocess", "sunau",
    "symtable", "sys", "sysconfig", "syslog", "tabnanny", "tarfile", "telnetlib", "tempfile",
    "termios", "textwrap", "this", "threading", "time", "timeit", "tkinter", "token", "tokenize",
    "tomllib", "trace", "traceback", "tracemalloc", "tty", "turtle", "turtledemo", "types",
    "typing", "unicodedata", "unittest", "urllib", "uu", "uuid", "venv", "warnings", "wave",
    "weakref", "webbrowser", "winreg", "winsound", "wsgiref", "xdrlib", "xml", "xmlrpc", "zipapp",
    "zipfile", "zipimport", "zlib", "zoneinfo",
];

/// Modules the component needs besides the standard library: the SDK's,
/// and the bindings componentize-py generates (it also keeps every name
/// starting with `componentize_py`).
const PYTHON_TAKEN: &[(&str, &str)] = &[
    ("weir_sdk", "weir's Python SDK"),
    ("wit_world", "the bindings componentize-py generates"),
];

/// What the name of a Python sink's module (`src/<module>.py`, the name
/// with `_` for `-`) must not be: a keyword, or the name of a module the
/// component needs.
fn check_python_module(module: &str) -> Result<(), String> {
    if PYTHON_KEYWORDS.contains(&module) {
        return Err(format!("its module, `{module}`, would be a Python keyword"));
    }
    if PYTHON_STDLIB.contains(&module) {
        return Err(format!(
            "its module, `{module}`, would clash with the Python standard library's module of that name"
        ));
    }
    if module.starts_with("componentize_py") {
        return Err(format!(
            "its module, `{module}`, would take a name componentize-py keeps for its own modules"
        ));
    }
    if let Some((_, what)) = PYTHON_TAKEN.iter().find(|(taken, _)| *taken == module) {
        return Err(format!("its module, `{module}`, would hide {what}"));
    }
    Ok(())
}

/// Names the generated Rust `src/lib.rs` imports; a sink type of one of these
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

/// Capitalised names the generated Python module uses: the export `Sink`
/// and the built-in exceptions it catches.
const PYTHON_TEMPLATE_NAMES: &[&str] = &["Sink", "TypeError", "ValueError"];

/// Capitalised names the generated `src/sink.js` uses: the global `Map`.
const JS_TEMPLATE_NAMES: &[&str] = &["Map"];

/// The sink's type (or class) name: the project's name in UpperCamelCase
/// (`orders-export` -> `OrdersExport`), with `Plugin` added when that is a
/// name the generated code uses already.
fn type_name(name: &str, lang: Lang) -> String {
    let camel: String = name
        .split(['-', '_'])
        .filter(|word| !word.is_empty())
        .map(|word| {
            let mut chars = word.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase());
            first.into_iter().chain(chars).collect::<String>()
        })
        .collect();
    let taken = match lang {
        Lang::Rust => TEMPLATE_NAMES,
        Lang::Python => PYTHON_TEMPLATE_NAMES,
        Lang::Js => JS_TEMPLATE_NAMES,
    };
    if taken.contains(&camel.as_str()) {
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

/// The folder of the weir SDK for `lang`, absolute: in the `sdk` folder
/// `given`, or else in the one of the source tree this `weir` was built
/// from, when it is still there (the SDKs are not on a registry). Rust's
/// is that `sdk` folder, Python's its `python` folder, JavaScript's its
/// `js` folder.
fn sdk_folder(given: Option<&Path>, lang: Lang) -> Result<PathBuf, String> {
    if let Some(given) = given {
        let folder = given
            .canonicalize()
            .map_err(|e| format!("--sdk {}: {e}", given.display()))?;
        return language_sdk(&folder, lang)
            .map_err(|why| format!("--sdk {}: {why}", given.display()));
    }
    let built_from = built_from_sdk();
    let no_tree = || {
        format!(
            "no weir SDK at {}, where the source tree this weir was built from kept it, and \
             the SDK is not on a registry: pass --sdk PATH, the `sdk` folder of a weir \
             source tree",
            built_from.display()
        )
    };
    let Ok(folder) = built_from.canonicalize() else {
        return Err(no_tree());
    };
    match lang {
        Lang::Rust => language_sdk(&folder, lang).map_err(|_| no_tree()),
        Lang::Python | Lang::Js => language_sdk(&folder, lang).map_err(|why| {
            format!(
                "the weir source tree this weir was built from has no {} SDK ({why}), and \
                 the SDK is not on a registry: pass --sdk PATH, the `sdk` folder of a weir \
                 source tree that has it",
                language(lang)
            )
        }),
    }
}

/// The language's name in a sentence.
fn language(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
    }
}

/// The folder of the SDK for `lang` in the `sdk` folder `sdk`, checked to
/// hold what a project's build uses; `Err` names what is missing.
fn language_sdk(sdk: &Path, lang: Lang) -> Result<PathBuf, String> {
    let (folder, needed): (PathBuf, &[&str]) = match lang {
        Lang::Rust => {
            check_sdk(sdk)?;
            return Ok(sdk.to_path_buf());
        }
        // build-sink, the package it bundles, and the contract it builds
        // against (beside the sdk folder).
        Lang::Python => (
            sdk.join("python"),
            &[
                "build-sink",
                "weir_sdk/__init__.py",
                "../../wit/since_v0.1.0/sink.wit",
            ],
        ),
        // build.mjs, the SDK it bundles, and the contract.
        Lang::Js => (
            sdk.join("js"),
            &[
                "scripts/build.mjs",
                "src/index.js",
                "../../wit/since_v0.1.0/sink.wit",
            ],
        ),
    };
    if !folder.is_dir() {
        return Err(format!(
            "{} is missing: there is no {} SDK",
            folder.display(),
            language(lang)
        ));
    }
    for file in needed {
        let mut path = folder.clone();
        for part in file.split('/') {
            if part == ".." {
                path.pop();
            } else {
                path.push(part);
            }
        }
        if !path.is_file() {
            return Err(format!(
                "{} is missing, which a {} sink's build needs",
                path.display(),
                language(lang)
            ));
        }
    }
    Ok(folder)
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
            check_name(name, Lang::Rust).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn python_module_names_that_would_clash_are_refused_saying_why() {
        let folder = tempfile::tempdir().unwrap();
        for (name, why) in [
            ("", "it names the project"),
            ("9lives", "start with a letter"),
            ("my.sink", "'.' is not allowed"),
            ("con", "Windows"),
            ("import", "`import`, would be a Python keyword"),
            ("None", "Python keyword"),
            (
                "json",
                "`json`, would clash with the Python standard library's",
            ),
            ("email", "standard library"),
            ("weir-sdk", "`weir_sdk`, would hide weir's Python SDK"),
            ("wit_world", "componentize-py"),
            ("componentize-py-runtime", "componentize-py keeps"),
        ] {
            let dir = folder.path().join("project");
            let refused = create(&NewSink {
                lang: Lang::Python,
                ..request(name, &dir)
            })
            .unwrap_err();
            assert!(refused.contains(why), "{name:?}: {refused}");
            assert!(!dir.exists(), "{name:?}: wrote something");
        }
        // Rust's keywords and Cargo's names are no concern of Python's or
        // JavaScript's.
        for name in ["orders-export", "fn", "build", "json-out", "Orders_2"] {
            check_name(name, Lang::Python).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for name in ["fn", "json", "import", "weir-sdk"] {
            check_name(name, Lang::Js).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let refused = check_name("my sink", Lang::Js).unwrap_err();
        assert!(refused.contains("not a valid sink name"), "{refused}");
    }

    #[test]
    fn type_names_do_not_clash_with_the_code_around_them() {
        assert_eq!(type_name("orders-export", Lang::Rust), "OrdersExport");
        assert_eq!(type_name("my__sink-2", Lang::Rust), "MySink2");
        assert_eq!(type_name("sink", Lang::Rust), "SinkPlugin");
        assert_eq!(type_name("native-sink", Lang::Rust), "NativeSinkPlugin");
        assert_eq!(type_name("sink", Lang::Python), "SinkPlugin");
        assert_eq!(type_name("value_error", Lang::Python), "ValueErrorPlugin");
        assert_eq!(type_name("native-sink", Lang::Python), "NativeSink");
        assert_eq!(type_name("map", Lang::Js), "MapPlugin");
        assert_eq!(type_name("sink", Lang::Js), "Sink");
    }

    /// The Python and JavaScript projects: every file, every placeholder
    /// filled, the SDK named by its absolute path in `build.sh` (which is
    /// executable) and the same component path everywhere.
    #[test]
    fn python_and_js_projects_have_every_file_with_the_placeholders_filled() {
        let folder = tempfile::tempdir().unwrap();
        let sdk = built_from_sdk().canonicalize().unwrap();
        for (lang, sink, sdk_folder, templates) in [
            (
                Lang::Python,
                "src/orders_export.py",
                sdk.join("python"),
                &PYTHON_TEMPLATES,
            ),
            (Lang::Js, "src/sink.js", sdk.join("js"), &JS_TEMPLATES),
        ] {
            let dir = folder.path().join(format!("{lang:?}"));
            let created = create(&NewSink {
                lang,
                ..request("orders-export", &dir)
            })
            .expect("created");
            assert_eq!(created.files.len(), templates.len());
            assert!(
                created.files.iter().any(|f| f == sink),
                "{:?}",
                created.files
            );
            assert_eq!(created.wasm, "target/orders_export.wasm");
            assert_eq!(created.sdk, sdk_folder);
            for file in &created.files {
                let text = std::fs::read_to_string(dir.join(file)).unwrap();
                assert!(!text.contains("{{"), "{file} keeps a placeholder:\n{text}");
            }
            let code = std::fs::read_to_string(dir.join(sink)).unwrap();
            assert!(code.contains("class OrdersExport"), "{code}");
            let build = std::fs::read_to_string(dir.join("build.sh")).unwrap();
            let sdk_line = format!("sdk={}", shell_word(sdk_folder.to_str().unwrap()));
            assert!(build.lines().any(|line| line == sdk_line), "{build}");
            assert!(build.contains("target/orders_export.wasm"), "{build}");
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir.join("build.sh"))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o100, 0o100, "build.sh is not executable");
            }
            for file in ["pipeline.yaml", "plugin-test.yaml", "README.md"] {
                let text = std::fs::read_to_string(dir.join(file)).unwrap();
                assert!(
                    text.contains("target/orders_export.wasm"),
                    "{file}:\n{text}"
                );
            }
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
            assert!(readme.contains("./build.sh"), "{readme}");
            let summary = created.summary();
            for command in [
                format!("cd {}", dir.display()),
                "./build.sh".to_string(),
                "weir plugin inspect target/orders_export.wasm".to_string(),
                "weir run pipeline.yaml".to_string(),
                "weir plugin test target/orders_export.wasm --config plugin-test.yaml".to_string(),
            ] {
                assert!(summary.contains(&command), "{command}: {summary}");
            }
            assert!(!summary.contains("cargo"), "{summary}");
        }
        let python = std::fs::read_to_string(folder.path().join("Python/src/orders_export.py"));
        assert!(
            python
                .unwrap()
                .contains("Sink = weir_sdk.export_sink(OrdersExport)")
        );
        let js = std::fs::read_to_string(folder.path().join("Js/src/sink.js")).unwrap();
        assert!(
            js.contains("export const { sink } = exportSink(new OrdersExport());"),
            "{js}"
        );
        let tree = sdk.parent().unwrap().to_str().unwrap();
        let readme = std::fs::read_to_string(folder.path().join("Python/README.md")).unwrap();
        assert!(
            readme.contains(&format!("{}/scripts/setup", shell_word(tree))),
            "{readme}"
        );
    }

    /// A fake weir source tree at a path a shell must quote, with the
    /// files the checks look for: each `build.sh` runs the SDK's tool by
    /// that path, from the project's folder, and says where the component
    /// goes.
    #[cfg(unix)]
    #[test]
    fn build_sh_runs_the_sdk_s_own_tool_by_its_quoted_path() {
        use std::os::unix::fs::PermissionsExt;
        let folder = tempfile::tempdir().unwrap();
        let tree = folder.path().join("a weir's tree");
        let sdk = tree.join("sdk");
        let write = |path: &Path, text: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o111)).unwrap();
        };
        // Each prints the folder it runs in and its arguments.
        let echo = "#!/bin/sh\necho \"$PWD\" \"$@\"\n";
        write(&sdk.join("python/build-sink"), echo);
        write(&sdk.join("python/weir_sdk/__init__.py"), "");
        write(&sdk.join("js/scripts/build.mjs"), "");
        write(&sdk.join("js/src/index.js"), "");
        write(&tree.join("wit/since_v0.1.0/sink.wit"), "");
        let bin = folder.path().join("bin");
        write(&bin.join("node"), echo);
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );

        for (lang, expected) in [
            (Lang::Python, "src my_sink target/my_sink.wasm".to_string()),
            (
                Lang::Js,
                format!(
                    "{}/js/scripts/build.mjs src/sink.js -o target/my_sink.wasm",
                    sdk.canonicalize().unwrap().display()
                ),
            ),
        ] {
            let dir = folder.path().join(format!("project {lang:?}"));
            create(&NewSink {
                lang,
                sdk: Some(sdk.clone()),
                ..request("my-sink", &dir)
            })
            .expect("created");
            // Run from elsewhere: build.sh goes to its own folder.
            let out = std::process::Command::new(dir.join("build.sh"))
                .current_dir(folder.path())
                .env("PATH", &path)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{lang:?}: {said}");
            let dir = dir.canonicalize().unwrap();
            assert_eq!(
                said.trim_end(),
                format!("{} {expected}", dir.display()),
                "{lang:?}"
            );
        }
    }

    #[test]
    fn an_sdk_folder_without_the_language_s_sdk_is_refused_naming_what_is_missing() {
        let folder = tempfile::tempdir().unwrap();
        let sdk = folder.path().join("sdk");
        std::fs::create_dir_all(sdk.join("python")).unwrap();
        let canonical = sdk.canonicalize().unwrap();
        for (lang, missing) in [
            (Lang::Python, canonical.join("python/build-sink")),
            (Lang::Js, canonical.join("js")),
        ] {
            let dir = folder.path().join("project");
            let refused = create(&NewSink {
                lang,
                sdk: Some(sdk.clone()),
                ..request("my-sink", &dir)
            })
            .unwrap_err();
            assert!(
                refused.starts_with(&format!(
                    "--sdk {}: {} is missing",
                    sdk.display(),
                    missing.display()
                )),
                "{refused}"
            );
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
