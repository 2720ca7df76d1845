//! Byte comparison for sinks built as WebAssembly.
//!
//! Rust compares byte slices (`==` and `Ord` on strings and `[u8]`, hash-map
//! look-ups by string key, sorting paths, Parquet's dictionary encoder)
//! through the C library's `memcmp` and `bcmp`. Those of the wasm32-wasip2 C
//! library compare one byte at a time: `memcmp` was the Iceberg sink's
//! hottest function as a component, and a few percent of the Parquet sink's
//! time, against a fraction of that natively. The versions here compare
//! eight bytes at a time, and take the C library's place in every sink that
//! links this crate (the linker resolves a symbol from the first archive
//! that defines it, and the Rust crates come before the C library).
//!
//! They must not compare slices themselves: that would call `memcmp`.

use core::ptr::read_unaligned;

/// Orders the `n` bytes at `a` against those at `b` as unsigned bytes:
/// negative, zero or positive as the first byte that differs is lower in
/// `a`, or none differs, or it is higher in `a`.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
pub(crate) unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, and the caller vouches for `n` bytes.
        let (x, y) = unsafe {
            (
                read_unaligned(a.add(i).cast::<u64>()),
                read_unaligned(b.add(i).cast::<u64>()),
            )
        };
        if x != y {
            // Read as big-endian, the first byte in memory is the most
            // significant: the numbers order as the bytes do.
            return if u64::from_be(x) < u64::from_be(y) {
                -1
            } else {
                1
            };
        }
        i += 8;
    }
    while i < n {
        // SAFETY: `i < n`.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// Zero when the `n` bytes at `a` and `b` are equal, one otherwise.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
pub(crate) unsafe fn differ(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: as in `compare`.
        let unequal = unsafe {
            read_unaligned(a.add(i).cast::<u64>()) != read_unaligned(b.add(i).cast::<u64>())
        };
        if unequal {
            return 1;
        }
        i += 8;
    }
    while i < n {
        // SAFETY: `i < n`.
        if unsafe { *a.add(i) != *b.add(i) } {
            return 1;
        }
        i += 1;
    }
    0
}

/// The C library's `memcmp`, for the WebAssembly build.
///
/// # Safety
/// As [`compare`].
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's promise is `compare`'s.
    unsafe { compare(a, b, n) }
}

/// The C library's `bcmp` (equality only), for the WebAssembly build.
///
/// # Safety
/// As [`differ`].
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's promise is `differ`'s.
    unsafe { differ(a, b, n) }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::{compare, differ};

    fn ordering(a: &[u8], b: &[u8]) -> Ordering {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices hold `a.len()` bytes.
        unsafe { compare(a.as_ptr(), b.as_ptr(), a.len()) }.cmp(&0)
    }

    fn equal(a: &[u8], b: &[u8]) -> bool {
        // SAFETY: as above.
        unsafe { differ(a.as_ptr(), b.as_ptr(), a.len()) == 0 }
    }

    /// Every length up to three words, a difference at every offset, in
    /// both directions, with bytes whose top bit is set (unsigned order)
    /// and at unaligned starts.
    #[test]
    fn orders_bytes_as_unsigned_at_every_length_offset_and_alignment() {
        let base: Vec<u8> = (0..40u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(1))
            .collect();
        for start in 0..4 {
            for len in 0..=(base.len() - start) {
                let a = &base[start..start + len];
                assert_eq!(ordering(a, a), Ordering::Equal, "len {len}");
                assert!(equal(a, a));
                for at in 0..len {
                    for (low, high) in [(a[at], 0xff), (0x00, a[at]), (0x7f, 0x80)] {
                        if low == high {
                            continue;
                        }
                        let mut x = a.to_vec();
                        let mut y = a.to_vec();
                        x[at] = low;
                        y[at] = high;
                        // A later byte that would order the other way must not count.
                        if at + 1 < len {
                            x[at + 1] = 0xff;
                            y[at + 1] = 0x00;
                        }
                        assert_eq!(ordering(&x, &y), x.cmp(&y), "len {len}, at {at}");
                        assert_eq!(ordering(&y, &x), y.cmp(&x), "len {len}, at {at}");
                        assert!(!equal(&x, &y), "len {len}, at {at}");
                    }
                }
            }
        }
    }
}
