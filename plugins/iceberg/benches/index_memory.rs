//! Memory and speed of the upsert key index at 10M keys (set
//! `WEIR_INDEX_KEYS` for another count), for int64 keys and 32-byte text
//! keys, built natively through the same calls a commit makes
//! (`KeyHasher::hash_columns`, then `Index::record_commit`, 1M rows per data
//! file).
//!
//! "bytes/key" is what the index holds once built: its hash table and its
//! file table, counted by a counting allocator (the hashes handed to it are
//! freed before counting). "peak" adds what is live while it grows (the
//! table doubling, one batch of hashes). Rates include hashing the key
//! columns; they are printed against hashing alone, as a ratio.
//!
//! Run: `cargo bench --release -p weir-iceberg-sink --bench index_memory`

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arrow_array::{ArrayRef, Int64Array, StringArray};
use iceberg::spec::{
    FormatVersion, NestedField, PrimitiveType, Schema, SortOrder, TableMetadataBuilder, Type,
    UnboundPartitionSpec,
};
use weir_iceberg_sink::index::{Index, KeyHash};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CHUNK: usize = 65_536;
const ROWS_PER_FILE: usize = 1_000_000;

fn key_column(text: bool, from: usize, to: usize) -> ArrayRef {
    if text {
        Arc::new(StringArray::from_iter_values((from..to).map(|i| {
            format!("{:032x}", (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        })))
    } else {
        Arc::new(Int64Array::from_iter_values((from..to).map(|i| i as i64)))
    }
}

fn main() {
    let keys: usize = std::env::var("WEIR_INDEX_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    for text in [false, true] {
        let label = if text { "text (32 bytes)" } else { "int64" };
        let key_type = if text {
            PrimitiveType::String
        } else {
            PrimitiveType::Long
        };
        let schema = Schema::builder()
            .with_fields(vec![Arc::new(NestedField::required(
                1,
                "id",
                Type::Primitive(key_type),
            ))])
            .with_identifier_field_ids([1])
            .build()
            .unwrap();
        let metadata = TableMetadataBuilder::new(
            schema,
            UnboundPartitionSpec::builder().build(),
            SortOrder::unsorted_order(),
            "file:///bench".into(),
            FormatVersion::V2,
            HashMap::new(),
        )
        .unwrap()
        .build()
        .unwrap()
        .metadata;
        let mut index = Index::empty(&metadata, &[1]).unwrap();

        // Baseline: hashing the key columns alone.
        let start = Instant::now();
        let mut sink = 0u64;
        for from in (0..keys).step_by(CHUNK) {
            let column = key_column(text, from, (from + CHUNK).min(keys));
            for key in index.hasher().hash_columns(&[column]).unwrap() {
                sink ^= key.0;
            }
        }
        let hash_rate = keys as f64 / start.elapsed().as_secs_f64();

        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let start = Instant::now();
        let mut file = 0;
        let mut from = 0;
        while from < keys {
            let to = (from + ROWS_PER_FILE).min(keys);
            let mut hashes: Vec<KeyHash> = Vec::with_capacity(to - from);
            for at in (from..to).step_by(CHUNK) {
                let column = key_column(text, at, (at + CHUNK).min(to));
                hashes.extend(index.hasher().hash_columns(&[column]).unwrap());
            }
            let path = format!(
                "file:///bench/data/{file:05}-0-00000000-0000-0000-0000-000000000000.parquet"
            );
            index
                .record_commit(file as i64 + 1, file as i64 + 1, &[], &[(path, hashes)])
                .unwrap();
            file += 1;
            from = to;
        }
        let build_rate = keys as f64 / start.elapsed().as_secs_f64();
        let held = LIVE.load(Ordering::Relaxed) - base;
        let peak = PEAK.load(Ordering::Relaxed) - base;
        assert_eq!(index.len(), keys);

        let start = Instant::now();
        let mut found = 0usize;
        for from in (0..keys).step_by(CHUNK) {
            let column = key_column(text, from, (from + CHUNK).min(keys));
            for key in index.hasher().hash_columns(&[column]).unwrap() {
                found += usize::from(index.get(&key).is_some());
            }
        }
        let lookup_rate = keys as f64 / start.elapsed().as_secs_f64();
        assert_eq!(found, keys);
        println!(
            "{label}: {keys} keys, {:.1} bytes/key held ({:.2}x the 24-byte entry), peak {:.1} \
             bytes/key while building; build {:.2}M keys/s ({:.2}x hashing alone), lookup \
             {:.2}M keys/s ({:.2}x hashing alone){}",
            held as f64 / keys as f64,
            held as f64 / keys as f64 / 24.0,
            peak as f64 / keys as f64,
            build_rate / 1e6,
            build_rate / hash_rate,
            lookup_rate / 1e6,
            lookup_rate / hash_rate,
            if sink == 42 { " " } else { "" }
        );
    }
}
