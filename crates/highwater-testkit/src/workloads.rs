//! Allocation-heavy workloads of the kind a training binary's data pipeline runs, shared by the
//! workload tests (`tests/recording/workload_*.rs`), the `workload` example and
//! `scripts/compare_profilers.py`:
//!
//! - [`parse_trees`]: `syn` parses real Rust sources several times over, keeping every tree
//!   alive until the last is built: many small blocks, all live at once, freed at the end.
//! - [`json_round_trip`]: a large JSON document parsed to a `serde_json::Value`, walked,
//!   written out again and parsed again.
//! - [`pass_maps`]: threads build `HashMap<String, Vec<u64>>`s and hand them over channels to
//!   the next thread, which frees them.
//! - [`sort_and_count`]: rayon sorts millions of strings in parallel, then folds them into
//!   per-task `HashMap`s that are reduced into one: work stealing moves blocks between threads.
//! - [`alloc_free_loop`]: a tight loop of small allocations freed at once, on one thread or more,
//!   the most events a second a program can make.
//! - [`grow_buffers`]: `Vec`s and `String`s grown one element at a time, so most events are
//!   `realloc`s.
//!
//! Everything is deterministic: the same inputs make the same allocations in every run, so a
//! profiler's peak can be compared with an independent count, and between profilers.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Barrier};

use serde_json::Value;

/// The `.rs` files under `roots`, read in sorted path order so every run parses the same input.
///
/// # Errors
///
/// The first file or directory that cannot be read, with its path.
pub fn rust_sources(roots: &[PathBuf]) -> Result<Vec<String>, String> {
    let mut paths = Vec::new();
    for root in roots {
        collect_rust_files(root, &mut paths)?;
    }
    paths.sort();
    paths
        .iter()
        .map(|path| {
            std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))
        })
        .collect()
}

fn collect_rust_files(dir: &Path, found: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|error| format!("{}: {error}", dir.display()))?
            .path();
        if path.is_dir() {
            collect_rust_files(&path, found)?;
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
    Ok(())
}

/// What [`parse_trees`] built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trees {
    /// Syntax trees alive at once before they were freed.
    pub trees: usize,
    /// Top-level items over all trees.
    pub items: usize,
}

/// Parses every source `copies` times, keeping all the trees alive until the last one is
/// built, then frees them.
///
/// # Errors
///
/// The index of a source that does not parse, and syn's message.
pub fn parse_trees(sources: &[String], copies: usize) -> Result<Trees, String> {
    let mut trees = Vec::with_capacity(sources.len() * copies);
    for _ in 0..copies {
        for (index, source) in sources.iter().enumerate() {
            let tree =
                syn::parse_file(source).map_err(|error| format!("source {index}: {error}"))?;
            trees.push(tree);
        }
    }
    let items = trees.iter().map(|tree| tree.items.len()).sum();
    Ok(Trees {
        trees: trees.len(),
        items,
    })
}

/// A deterministic JSON document of at least `bytes` bytes: an object holding an array of
/// records, each with strings, integers, exact binary fractions, booleans, nulls, a tag array,
/// a number array and a nested object.
pub fn json_document(bytes: usize) -> String {
    let mut random = SplitMix64(0x6a73_6f6e_5f64_6f63);
    let mut text = String::with_capacity(bytes + 1024);
    text.push_str("{\"generator\":\"highwater workload\",\"records\":[");
    let mut id = 0u64;
    while text.len() < bytes {
        if id > 0 {
            text.push(',');
        }
        let tags = 1 + random.below(6);
        let values = random.below(24);
        // Writing into a String cannot fail.
        let _ = write!(
            text,
            "{{\"id\":{id},\"name\":\"record-{id:08x}-{}\",\"active\":{},\"score\":{},\
             \"note\":null,\"tags\":[",
            random.next() % 1_000_000,
            random.below(2) == 1,
            random.below(1 << 20) as f64 / 1024.0,
        );
        for tag in 0..tags {
            let sep = if tag > 0 { "," } else { "" };
            let _ = write!(text, "{sep}\"tag-{}\"", random.below(500));
        }
        text.push_str("],\"values\":[");
        for value in 0..values {
            let sep = if value > 0 { "," } else { "" };
            let _ = write!(text, "{sep}{}", random.next() >> 12);
        }
        let _ = write!(
            text,
            "],\"owner\":{{\"name\":\"user {}\",\"email\":\"u{}@example.org\",\"level\":{},\
             \"groups\":[\"g{}\",\"g{}\"]}}}}",
            random.below(10_000),
            random.below(10_000),
            random.below(100),
            random.below(50),
            random.below(50),
        );
        id += 1;
    }
    text.push_str("]}");
    text
}

/// What [`json_round_trip`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonTrip {
    /// Values in the parsed document (every object, array, string, number, bool and null).
    pub nodes: usize,
    /// Bytes of the re-serialised document.
    pub written_bytes: usize,
}

/// Parses `document` to a `Value`, walks it, writes it out again, parses that and walks it
/// again; both parses are alive at once at the end.
///
/// # Errors
///
/// A document that does not parse, or a round trip that changed the document.
pub fn json_round_trip(document: &str) -> Result<JsonTrip, String> {
    let first: Value =
        serde_json::from_str(document).map_err(|error| format!("first parse: {error}"))?;
    let first_walk = walk(&first);
    let written = serde_json::to_string(&first).map_err(|error| format!("serialise: {error}"))?;
    let second: Value =
        serde_json::from_str(&written).map_err(|error| format!("second parse: {error}"))?;
    let second_walk = walk(&second);
    if first_walk != second_walk || first != second {
        return Err(format!(
            "the round trip changed the document: {first_walk:?} then {second_walk:?}"
        ));
    }
    Ok(JsonTrip {
        nodes: first_walk.nodes,
        written_bytes: written.len(),
    })
}

/// Counts and checksums over a `Value` tree.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Walk {
    nodes: usize,
    string_bytes: usize,
    checksum: u64,
}

fn walk(value: &Value) -> Walk {
    let mut sums = Walk::default();
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        sums.nodes += 1;
        match value {
            Value::Null => {}
            Value::Bool(flag) => sums.checksum = sums.checksum.wrapping_add(u64::from(*flag)),
            Value::Number(number) => {
                let bits = number
                    .as_u64()
                    .or_else(|| number.as_f64().map(f64::to_bits))
                    .unwrap_or(0);
                sums.checksum = sums.checksum.rotate_left(5) ^ bits;
            }
            Value::String(text) => sums.string_bytes += text.len(),
            Value::Array(items) => pending.extend(items),
            Value::Object(fields) => {
                for (key, field) in fields {
                    sums.string_bytes += key.len();
                    pending.push(field);
                }
            }
        }
    }
    sums
}

/// How [`pass_maps`] runs.
#[derive(Debug, Clone, Copy)]
pub struct MapsConfig {
    /// Threads; each hands its maps to the next one round the ring.
    pub threads: usize,
    /// Rounds of build, hand over, free.
    pub rounds: usize,
    /// Maps each thread builds per round.
    pub maps_per_round: usize,
    /// Entries per map.
    pub entries: usize,
}

/// What [`pass_maps`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maps {
    /// Maps built (and freed by another thread).
    pub maps: usize,
    /// Entries over all maps.
    pub entries: usize,
    /// The OS thread ids of the workers, so a test can find their counts.
    pub worker_tids: Vec<u64>,
}

type Map = HashMap<String, Vec<u64>>;

/// Runs `config.threads` workers in a ring. Each round, every worker builds its maps and sends
/// them to the next worker; after all have sent, every worker frees the maps it received.
///
/// The rounds are fenced by barriers and each map is sized up front, so while maps are built
/// no thread frees anything: live bytes only grow until every map of the round exists, and the
/// peak is the same in every interleaving of the threads (a profiler's peak can then be
/// compared exactly with a count kept outside it). The values' `Vec`s grow by `realloc` as
/// they are filled, as real ones do.
pub fn pass_maps(config: MapsConfig) -> Maps {
    let threads = config.threads.max(1);
    let (senders, receivers): (Vec<SyncSender<Map>>, Vec<Receiver<Map>>) = (0..threads)
        // Bounded channels hold their slots from the start: sending allocates nothing.
        .map(|_| sync_channel(config.maps_per_round))
        .unzip();
    let mut senders: Vec<Option<SyncSender<Map>>> = senders.into_iter().map(Some).collect();
    senders.rotate_left(1);
    // Workers and this thread: after the start, this thread only waits in `join`.
    let start = Arc::new(Barrier::new(threads + 1));
    let phase = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = receivers
        .into_iter()
        .zip(senders.iter_mut().map(|sender| sender.take()))
        .enumerate()
        .map(|(worker, (received, next))| {
            let (start, phase) = (Arc::clone(&start), Arc::clone(&phase));
            let next = next.expect("one sender per worker");
            std::thread::spawn(move || {
                let tid = gettid();
                start.wait();
                let mut entries = 0;
                for round in 0..config.rounds {
                    for index in 0..config.maps_per_round {
                        let map = build_map(worker, round, index, config.entries);
                        entries += map.len();
                        next.send(map).expect("the next worker is alive");
                    }
                    phase.wait();
                    for _ in 0..config.maps_per_round {
                        let map = received.try_recv().expect("every map was sent");
                        drop(map);
                    }
                    phase.wait();
                }
                (tid, entries)
            })
        })
        .collect();
    start.wait();
    let done: Vec<(u64, usize)> = workers
        .into_iter()
        .map(|worker| worker.join().expect("a map worker panicked"))
        .collect();
    Maps {
        maps: threads * config.rounds * config.maps_per_round,
        entries: done.iter().map(|(_, entries)| entries).sum(),
        worker_tids: done.iter().map(|(tid, _)| *tid).collect(),
    }
}

/// Map `index` of `worker` in `round`: `entries` keys, each with 1 to 48 numbers pushed one at a
/// time.
fn build_map(worker: usize, round: usize, index: usize, entries: usize) -> Map {
    let mut random = SplitMix64(((worker as u64) << 48) ^ ((round as u64) << 24) ^ index as u64);
    let mut map = HashMap::with_capacity(entries);
    for entry in 0..entries {
        let key = format!("w{worker}-r{round}-m{index}-e{entry}-{:x}", random.next());
        let mut values = Vec::new();
        for _ in 0..1 + random.below(48) {
            values.push(random.next());
        }
        map.insert(key, values);
    }
    map
}

/// How [`sort_and_count`] runs.
#[derive(Debug, Clone, Copy)]
pub struct SortConfig {
    /// Threads of the rayon pool.
    pub threads: usize,
    /// Strings made, sorted and counted.
    pub strings: usize,
}

/// What [`sort_and_count`] did.
#[derive(Debug)]
pub struct Sorted {
    /// Strings sorted.
    pub strings: usize,
    /// Distinct three-letter prefixes counted.
    pub prefixes: usize,
    /// The pool's threads' OS ids.
    pub worker_tids: Vec<u64>,
}

/// Makes `strings` strings in parallel, sorts them with rayon's `par_sort` (a merge sort with
/// one buffer as long as the input), then folds them into per-task `HashMap`s of prefix counts
/// (a key allocated per string, most freed at once as a duplicate) reduced into one map. Every
/// string is freed at the end by the calling thread, though the pool's threads made them.
///
/// The peak is while the sort's buffer and every string are live, whatever the interleaving,
/// so it can be compared exactly with a count kept outside the profiler.
pub fn sort_and_count(config: SortConfig) -> Sorted {
    use rayon::prelude::*;

    // The pool's threads are joined before this returns, so all they do falls inside the
    // caller's measurement (a dropped rayon pool lets its threads exit on their own).
    let mut threads = Vec::new();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.max(1))
        .spawn_handler(|thread| {
            threads.push(std::thread::spawn(|| thread.run()));
            Ok(())
        })
        .build()
        .expect("a rayon pool starts");
    let worker_tids = pool.broadcast(|_| gettid());
    let (strings, prefixes) = pool.install(|| {
        let mut words: Vec<String> = (0..config.strings as u64)
            .into_par_iter()
            .map(|index| {
                let mut random = SplitMix64(index);
                let len = 8 + random.below(24) as usize;
                (0..len)
                    .map(|_| char::from(b'a' + random.below(26) as u8))
                    .collect()
            })
            .collect();
        words.par_sort();
        let counts = words
            .par_iter()
            .fold(HashMap::new, |mut counts: HashMap<String, u64>, word| {
                *counts.entry(word[..3].to_owned()).or_default() += 1;
                counts
            })
            .reduce(HashMap::new, |mut into, from| {
                for (prefix, count) in from {
                    *into.entry(prefix).or_default() += count;
                }
                into
            });
        (words.len(), counts.len())
    });
    drop(pool);
    for thread in threads {
        thread.join().expect("a rayon thread panicked");
    }
    Sorted {
        strings,
        prefixes,
        worker_tids,
    }
}

/// Each of `threads` threads allocates and at once frees `pairs` blocks of 64 to 256 bytes: the
/// most events a second a program can make, nearly all of them short-lived pairs. Returns the
/// threads' OS ids.
pub fn alloc_free_loop(threads: usize, pairs: u64) -> Vec<u64> {
    let start = Arc::new(Barrier::new(threads.max(1)));
    let workers: Vec<_> = (0..threads.max(1))
        .map(|thread| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                let mut random = SplitMix64(thread as u64);
                for _ in 0..pairs {
                    let block: Vec<u8> = Vec::with_capacity(64 + random.below(193) as usize);
                    drop(std::hint::black_box(block));
                }
                gettid()
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|worker| worker.join().expect("a loop thread panicked"))
        .collect()
}

/// What [`grow_buffers`] built.
#[derive(Debug)]
pub struct Grown {
    /// Buffers grown.
    pub buffers: usize,
    /// Bytes of the buffers kept to the end.
    pub kept_bytes: usize,
}

/// `rounds` rounds of growing 64 `Vec<u64>`s and 64 `String`s one element at a time to between
/// one and 4,096 elements, so most of the events are `realloc`s; one buffer in eight is kept
/// to the end, the rest freed when the round ends. Deterministic, on the calling thread.
pub fn grow_buffers(rounds: usize) -> Grown {
    let mut random = SplitMix64(0x5EED);
    let mut kept_numbers: Vec<Vec<u64>> = Vec::new();
    let mut kept_text: Vec<String> = Vec::new();
    let mut buffers = 0;
    for _ in 0..rounds {
        let mut numbers = Vec::with_capacity(64);
        let mut text = Vec::with_capacity(64);
        for _ in 0..64 {
            let mut grown = Vec::new();
            for value in 0..1 + random.below(4096) {
                grown.push(value);
            }
            numbers.push(grown);
            let mut line = String::new();
            for _ in 0..1 + random.below(4096) {
                line.push(char::from(b'a' + random.below(26) as u8));
            }
            text.push(line);
            buffers += 2;
        }
        kept_numbers.extend(numbers.into_iter().step_by(8));
        kept_text.extend(text.into_iter().step_by(8));
    }
    let kept_bytes = kept_numbers.iter().map(|v| v.len() * 8).sum::<usize>()
        + kept_text.iter().map(String::len).sum::<usize>();
    Grown {
        buffers,
        kept_bytes,
    }
}

/// The calling thread's OS id.
#[allow(clippy::disallowed_methods)] // test support: the OS id, as the tests' counts know it
pub fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// SplitMix64: a small, seeded, deterministic generator.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough in `0..bound` for test data.
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}
