//! What a guest may read of a host error. A host function that fails hands
//! the sink text: a blob call's error message, a DNS failure's code, the
//! debug string of a WASI stream error. That text says what failed and
//! nothing of the host's insides: never an error's `Debug` form, which for
//! a wasmtime or anyhow error ends in the host's stack backtrace when
//! `RUST_BACKTRACE` is set (its frames name the host's source paths), and
//! always one bounded line. Every such text goes through [`for_guest`].

use std::fmt;

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::WasiView;

/// The interface whose `to-debug-string` wasmtime answers with `{:?}`.
const IO_ERROR: &str = "wasi:io/error@0.2.12";

/// The longest text a guest gets of one host error, in characters.
const MAX_CHARS: usize = 1024;

/// The text a guest may see of `error`: its message and, for a wasmtime
/// error, the messages of its causes (its alternate `Display`), on one
/// line, cut at [`MAX_CHARS`]. A backtrace some `Display` carries
/// anyway is cut off with what follows it.
pub fn for_guest(error: &dyn fmt::Display) -> String {
    let full = format!("{error:#}");
    let message = match full.to_ascii_lowercase().find("stack backtrace") {
        Some(at) => &full[..at],
        None => &full[..],
    };
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX_CHARS) {
        Some((at, _)) => format!("{} [cut]", &line[..at]),
        None => line,
    }
}

/// Replaces `wasi:io/error`'s `to-debug-string` in `linker`: wasmtime
/// answers it with the error's `Debug` form, backtrace included, and every
/// failed WASI stream (a socket's, an HTTP body's) hands the guest such an
/// error. The replacement answers with [`for_guest`].
pub fn add_to_linker<T: WasiView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let replaced = linker.instance(IO_ERROR).and_then(|mut error| {
        error.func_wrap(
            "[method]error.to-debug-string",
            |mut store, (error,): (Resource<wasmtime::Error>,)| {
                let table = store.data_mut().ctx().table;
                Ok((for_guest(table.get(&error)?),))
            },
        )
    });
    linker.allow_shadowing(false);
    replaced
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose `Display` carries a backtrace, as some do.
    struct Confessing;

    impl fmt::Display for Confessing {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "connection reset\n\nStack backtrace:\n   0: weir_runtime::x\n             \
                 at /root/.cargo/registry/src/x.rs:1:2\n   1: std::rt\n             \
                 at /rustc/abc/library/std/src/rt.rs:3:4"
            )
        }
    }

    #[test]
    fn a_backtrace_never_reaches_the_guest() {
        assert_eq!(for_guest(&Confessing), "connection reset");
    }

    #[test]
    fn a_wasmtime_error_gives_its_causes_and_not_its_debug_form() {
        let error = wasmtime::Error::msg("reset by peer").context("reading the body");
        assert_eq!(for_guest(&error), "reading the body: reset by peer");
    }

    #[test]
    fn the_text_is_one_bounded_line() {
        let long = format!("first\nsecond\t{}", "x ".repeat(5000));
        let text = for_guest(&long);
        assert!(text.starts_with("first second x x"), "{text}");
        assert!(text.ends_with(" [cut]"), "{text}");
        assert!(text.chars().count() <= MAX_CHARS + 6, "{}", text.len());
        assert!(!text.contains('\n'));
    }
}
