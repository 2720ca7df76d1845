//! Logging into the host's log, tagged with the sink's name.
//!
//! Inside WebAssembly messages go to the host; natively they go to standard
//! error with a level prefix. Log what helps an operator: what was written
//! where, and why something failed. Do not log row contents.

/// How important a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Step-by-step detail, off by default.
    Trace,
    /// Detail for debugging a sink.
    Debug,
    /// Normal operation worth a line: a commit, an object written.
    Info,
    /// Something odd that the sink could handle.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    /// The level's name in lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Writes one message at `level`.
pub fn log(level: Level, message: impl AsRef<str>) {
    imp::log(level, message.as_ref())
}

/// Writes one message at [`Level::Trace`].
pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message)
}

/// Writes one message at [`Level::Debug`].
pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message)
}

/// Writes one message at [`Level::Info`].
pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message)
}

/// Writes one message at [`Level::Warn`].
pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message)
}

/// Writes one message at [`Level::Error`].
pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;
    use crate::__private::sink_plugin::weir::sink::log as wit;

    pub fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        wit::log(level, message);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::Level;

    /// Natively, trace and debug stay quiet unless `WEIR_SDK_LOG=debug`
    /// (or `trace`): a benchmark or test run should not drown in them.
    pub fn log(level: Level, message: &str) {
        let verbose = std::env::var("WEIR_SDK_LOG").unwrap_or_default();
        let shown = match level {
            Level::Trace => verbose == "trace",
            Level::Debug => verbose == "debug" || verbose == "trace",
            _ => true,
        };
        if shown {
            eprintln!("[{}] {message}", level.as_str().to_uppercase());
        }
    }
}
