//! Why a plugin died, in one line: the trap code, the `exit` status, and
//! the panic message when the guest printed one to its stderr. The guest's
//! stderr goes nowhere else: only its last few KiB are kept, to be quoted.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime::Trap;
use wasmtime_wasi::I32Exit;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// How much of the guest's stderr is kept: the tail, where a panic message
/// ends up right before the trap.
const TAIL_BYTES: usize = 4 << 10;
/// The longest quote of the guest's output in a message.
const QUOTE_CHARS: usize = 500;

/// The guest's stderr: a bounded buffer of what it wrote last. Writes never
/// fail and never block, however much the guest writes.
#[derive(Clone, Default)]
pub(super) struct StderrTail(Arc<Mutex<Vec<u8>>>);

impl StderrTail {
    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets what earlier calls wrote, so only the failing call is quoted.
    pub(super) fn clear(&self) {
        let mut bytes = self.bytes();
        if !bytes.is_empty() {
            bytes.clear();
        }
    }

    fn push(&self, written: &[u8]) {
        let mut bytes = self.bytes();
        let written = &written[written.len().saturating_sub(TAIL_BYTES)..];
        bytes.extend_from_slice(written);
        // Trimmed only past twice the tail, so a chatty guest does not pay a
        // shift on every write.
        if bytes.len() > 2 * TAIL_BYTES {
            let excess = bytes.len() - TAIL_BYTES;
            bytes.drain(..excess);
        }
    }

    /// The guest's panic message, `panicked at <where>: <message>`, if its
    /// last output holds one; else its last line of output, if any.
    fn last_words(&self) -> Option<String> {
        let bytes = self.bytes();
        let text = String::from_utf8_lossy(&bytes);
        if let Some(at) = text.rfind("panicked at ") {
            // Rust prints `panicked at src/lib.rs:1:2:`, then the message on
            // the following lines, then a `note:` about backtraces.
            let words: Vec<&str> = text[at..]
                .lines()
                .map(str::trim)
                .take_while(|line| !line.starts_with("note: "))
                .filter(|line| !line.is_empty())
                .collect();
            return Some(quote(&words.join(" ")));
        }
        let last = text.lines().rev().find(|line| !line.trim().is_empty())?;
        Some(format!("its last output: {}", quote(last.trim())))
    }
}

impl IsTerminal for StderrTail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTail {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for StderrTail {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        written: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(written);
        Poll::Ready(Ok(written.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The cause of a failed call in one line: the trap code (or the `exit`
/// status, or the host error), preceded by the guest's panic message or
/// last output when it left one.
pub(super) fn describe(error: &wasmtime::Error, stderr: &StderrTail) -> String {
    let cause = if let Some(exit) = error.downcast_ref::<I32Exit>() {
        format!("the plugin called exit with status {}", exit.0)
    } else if let Some(trap) = error.downcast_ref::<Trap>() {
        match (trap, shadow_stack_fault(error)) {
            (Trap::StackOverflow, _) => format!("stack overflow ({trap})"),
            (Trap::MemoryOutOfBounds, Some(fault)) => {
                format!("stack overflow (its stack ran below address 0: {fault})")
            }
            _ => trap.to_string(),
        }
    } else {
        // A host error: wasmtime puts its backtrace in a context above the
        // cause, so the cause is the root, not the first line.
        quote(&error.root_cause().to_string())
    };
    match stderr.last_words() {
        Some(words) => format!("{words} ({cause})"),
        None => cause,
    }
}

/// How far below address 0 (as the wrapped address reads) or past 4 GiB a
/// fault may lie and still be a stack pointer that ran below 0: a frame's
/// size and a store's offset, with room for large frames.
const SHADOW_STACK_SLACK: u64 = 64 << 20;

/// The memory fault of `error`, as wasmtime words it, when it lies just
/// under (or, through a store's offset, just past) 4 GiB in a 32-bit
/// memory smaller than that: where a stack pointer lands when it runs
/// below address 0. Rust and C guests keep their shadow stack at the
/// bottom of linear memory, so their stack overflow is this fault, not
/// wasmtime's `StackOverflow`. wasmtime attaches the fault as a context
/// of the trap, "memory fault at wasm address 0x… in linear memory of
/// size 0x…", and exports no type to read it by.
fn shadow_stack_fault(error: &wasmtime::Error) -> Option<String> {
    error.chain().find_map(|cause| {
        let text = cause.to_string();
        let rest = text.strip_prefix("memory fault at wasm address 0x")?;
        let (address, rest) = rest.split_once(' ')?;
        let size = rest.strip_prefix("in linear memory of size 0x")?;
        let address = u64::from_str_radix(address, 16).ok()?;
        let size = u64::from_str_radix(size, 16).ok()?;
        let wrapped = (1u64 << 32).abs_diff(address) <= SHADOW_STACK_SLACK;
        (wrapped && size < address).then_some(text)
    })
}

/// `text` on one line, control characters escaped, at most
/// [`QUOTE_CHARS`] characters.
fn quote(text: &str) -> String {
    let mut quoted = String::new();
    for (count, c) in text.chars().enumerate() {
        if count == QUOTE_CHARS {
            quoted.push_str("...");
            break;
        }
        if c.is_control() {
            quoted.extend(c.escape_default());
        } else {
            quoted.push(c);
        }
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rust_panic_is_quoted_on_one_line() {
        let tail = StderrTail::default();
        tail.push(b"noise\n\nthread '<unnamed>' panicked at src/lib.rs:9:5:\nit broke\nnote: run with `RUST_BACKTRACE=1` for a backtrace\n");
        assert_eq!(
            tail.last_words().unwrap(),
            "panicked at src/lib.rs:9:5: it broke"
        );
    }

    #[test]
    fn only_the_tail_is_kept_and_quotes_are_bounded() {
        let tail = StderrTail::default();
        for _ in 0..10_000 {
            tail.push(&[b'x'; 100]);
        }
        assert!(tail.bytes().len() <= 2 * TAIL_BYTES);
        let words = tail.last_words().unwrap();
        assert!(words.len() < QUOTE_CHARS + 40, "{words}");
        tail.clear();
        assert_eq!(tail.last_words(), None);
    }

    /// A trap as wasmtime reports a memory fault: the trap, with the
    /// fault as its context.
    fn memory_fault(address: u64, size: u64) -> wasmtime::Error {
        wasmtime::Error::new(Trap::MemoryOutOfBounds).context(format!(
            "memory fault at wasm address 0x{address:x} in linear memory of size 0x{size:x}"
        ))
    }

    #[test]
    fn both_kinds_of_stack_overflow_are_named_as_such() {
        let quiet = StderrTail::default();
        let native = wasmtime::Error::new(Trap::StackOverflow);
        assert_eq!(
            describe(&native, &quiet),
            "stack overflow (wasm trap: call stack exhausted)"
        );
        // A stack pointer that ran 16 bytes below 0 wraps to just under 4 GiB.
        for address in [0xffff_fff0, 0x1_0000_0008, (1 << 32) - (8 << 20)] {
            let cause = describe(&memory_fault(address, 0x11_0000), &quiet);
            assert!(
                cause.starts_with("stack overflow (its stack ran below address 0: memory fault at"),
                "{cause}"
            );
        }
    }

    #[test]
    fn other_memory_faults_stay_out_of_bounds_accesses() {
        let quiet = StderrTail::default();
        for (address, size) in [
            (0x20_0000, 0x11_0000),
            ((1 << 31) + 4, 0x11_0000),
            // A memory that really reaches up there.
            (0xffff_fff0, 1 << 32),
        ] {
            let cause = describe(&memory_fault(address, size), &quiet);
            assert_eq!(
                cause, "wasm trap: out of bounds memory access",
                "{address:x}"
            );
        }
        let bare = wasmtime::Error::new(Trap::MemoryOutOfBounds);
        assert_eq!(
            describe(&bare, &quiet),
            "wasm trap: out of bounds memory access"
        );
    }

    #[test]
    fn control_characters_cannot_forge_a_line() {
        assert_eq!(quote("a\nINFO weir: forged"), "a\\nINFO weir: forged");
    }
}
