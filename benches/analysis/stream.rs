//! A deterministic synthetic event stream shaped like a CPU training run, for replay benches.
//!
//! Nothing here is recorded from a real program: a seeded generator plays a small training
//! loop and writes the [`Event`]s highwater's collector would hand the analysis. The shape is
//! what matters for the analysis' cost, so it follows what a candle MLP on the CPU does:
//!
//! - **setup**: model parameters (1 KiB – 1 MiB each) inside a span labelled
//!   [`Category::Parameter`], and a pool of small long-lived runtime blocks outside any span;
//! - **iterations**: a top-level `train_step` span with `forward` (16 layer spans × 6 ops; each
//!   op makes short-lived temporaries, some grown by `realloc` like a `Vec`, an output
//!   activation and small blocks kept for backward), `backward` (the same layers in reverse:
//!   gradients allocated, what forward kept freed) and `optimizer` (moment buffers allocated
//!   on the first step and kept, gradients freed);
//! - **three loader threads** that fill batches inside their own `load_batch` spans; the main
//!   thread frees each batch at the end of the step that used it (a cross-thread free);
//! - a little churn of the runtime pool every step, and one 512-byte block leaked per step.
//!
//! Sizes are log-uniform within each kind's range. Addresses come from a toy size-class heap
//! that reuses freed addresses last-in first-out, as real allocators do, so the live map sees
//! address reuse. Timestamps grow by 20–147 ns per event and never repeat.

use std::collections::VecDeque;

use highwater::profile::analysis::{
    DeviceId, Event, EventKind, NameId, ShapeId, SpanSeq, Timeline,
};
use highwater::{Category, SpanLabel, Step};

/// A recorded-looking stream and what a replay needs to know about it.
#[derive(Debug)]
pub struct Stream {
    /// The events, in time order.
    pub events: Vec<Event>,
    /// Names in interning order: `NameId(i)` is `names[i]`.
    pub names: Vec<String>,
    /// Shapes in interning order: `ShapeId(i)` is `shapes[i]`.
    pub shapes: Vec<Vec<u64>>,
    /// Training steps started.
    pub iterations: u64,
}

impl Stream {
    /// Interns this stream's names and shapes into a fresh `timeline`, so the ids in the
    /// events mean what the generator meant.
    ///
    /// # Panics
    ///
    /// If `timeline` had already interned other names (the ids would not line up).
    pub fn prepare(&self, timeline: &mut Timeline) {
        for (index, name) in self.names.iter().enumerate() {
            assert_eq!(timeline.intern_name(name), NameId(index as u32));
        }
        for (index, dims) in self.shapes.iter().enumerate() {
            assert_eq!(timeline.intern_shape(dims), ShapeId(index as u32));
        }
    }

    /// The timestamp just after event `count - 1` (where a replay of a prefix ends).
    pub fn end_ns(&self, count: usize) -> u64 {
        self.events[..count.min(self.events.len())]
            .last()
            .map_or(0, |event| event.ts_ns + 1)
    }

    /// The name behind `id`.
    pub fn name(&self, id: NameId) -> &str {
        &self.names[id.0 as usize]
    }

    /// (most blocks live at once, blocks live at the end) over the first `count` events.
    pub fn live_blocks(&self, count: usize) -> (usize, usize) {
        let (mut live, mut most) = (0usize, 0usize);
        for event in &self.events[..count.min(self.events.len())] {
            match event.kind {
                EventKind::Alloc { .. } => {
                    live += 1;
                    most = most.max(live);
                }
                EventKind::Free { .. } => live = live.saturating_sub(1),
                _ => {}
            }
        }
        (most, live)
    }
}

/// SplitMix64: small, fast, and the same numbers on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// Log-uniform in `lo..=hi` (`0 < lo <= hi`): as many blocks of 16–32 B as of 16–32 KiB.
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let value = lo as f64 * (hi as f64 / lo as f64).powf(unit);
        (value as u64).clamp(lo, hi)
    }
}

/// A toy heap: one free list per power-of-two size class, reused last-in first-out.
#[derive(Debug)]
struct Heap {
    next: u64,
    free: Vec<Vec<u64>>,
}

impl Heap {
    fn new() -> Heap {
        Heap {
            next: 0x5555_0000_0000,
            free: vec![Vec::new(); 64],
        }
    }

    fn class(size: u64) -> usize {
        size.max(16).next_power_of_two().trailing_zeros() as usize
    }

    fn alloc(&mut self, size: u64) -> u64 {
        let class = Heap::class(size);
        self.free[class].pop().unwrap_or_else(|| {
            let addr = self.next;
            self.next += 1 << class;
            addr
        })
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.free[Heap::class(size)].push(addr);
    }
}

/// A live block the generator will free later.
#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
}

/// Thread ids as the collector numbers them: 1 is the training loop, 2–4 load batches.
const MAIN: usize = 0;
const LOADERS: usize = 3;
const LAYERS: usize = 16;
const OPS_PER_LAYER: usize = 6;
const PARAMETERS: usize = 1_500;
const RUNTIME_BLOCKS: usize = 10_000;
/// Batches ready and not yet taken by the training loop, at most.
const READY_BATCHES: usize = 4;

/// Span stack and instance counter of one thread.
#[derive(Debug, Default)]
struct ThreadState {
    next_span: SpanSeq,
    open: Vec<SpanSeq>,
}

/// What a loader thread is doing.
#[derive(Debug)]
enum Loader {
    Idle,
    Loading { left: u32, buffers: Vec<Block> },
}

/// Interned ids the generator uses.
#[derive(Debug)]
struct Ids {
    train_step: NameId,
    forward: NameId,
    backward: NameId,
    optimizer: NameId,
    load_model: NameId,
    load_batch: NameId,
    layers: Vec<NameId>,
    ops: Vec<NameId>,
    grad_ops: Vec<NameId>,
    f32: NameId,
    shapes: Vec<ShapeId>,
}

struct Generator {
    rng: Rng,
    heap: Heap,
    ts: u64,
    events: Vec<Event>,
    target: usize,
    threads: Vec<ThreadState>,
    loaders: Vec<Loader>,
    ready: VecDeque<Vec<Block>>,
    next_tensor: u64,
    ids: Ids,
}

impl Generator {
    fn emit(&mut self, thread: usize, kind: EventKind) {
        self.ts += self.rng.between(20, 147);
        let span = self.threads[thread].open.last().copied().unwrap_or(0);
        self.events.push(Event {
            ts_ns: self.ts,
            thread: thread as u32 + 1,
            span,
            kind,
        });
    }

    /// Before each training-loop event, a loader may take a step of its own.
    fn interleave(&mut self) {
        if self.rng.chance(60) {
            let loader = self.rng.below(LOADERS as u64) as usize;
            self.loader_step(loader);
        }
    }

    fn alloc_on(&mut self, thread: usize, size: u64, category: Category) -> Block {
        let addr = self.heap.alloc(size);
        self.emit(
            thread,
            EventKind::Alloc {
                device: DeviceId::CPU,
                addr,
                size,
                category,
            },
        );
        Block { addr, size }
    }

    fn free_on(&mut self, thread: usize, block: Block) {
        self.emit(
            thread,
            EventKind::Free {
                device: DeviceId::CPU,
                addr: block.addr,
                size: block.size,
            },
        );
        self.heap.free(block.addr, block.size);
    }

    fn alloc(&mut self, size: u64, category: Category) -> Block {
        self.interleave();
        self.alloc_on(MAIN, size, category)
    }

    fn free(&mut self, block: Block) {
        self.interleave();
        self.free_on(MAIN, block);
    }

    /// Grows a block like `Vec` does: in place when its size class still fits, else moved.
    fn realloc(&mut self, block: Block, new_size: u64, category: Category) -> Block {
        self.interleave();
        let new_addr = if Heap::class(new_size) == Heap::class(block.size) {
            block.addr
        } else {
            let moved = self.heap.alloc(new_size);
            self.heap.free(block.addr, block.size);
            moved
        };
        self.emit(
            MAIN,
            EventKind::Realloc {
                old_addr: block.addr,
                old_size: block.size,
                new_addr,
                new_size,
                category,
                released_ns: None,
            },
        );
        Block {
            addr: new_addr,
            size: new_size,
        }
    }

    fn enter_on(&mut self, thread: usize, name: NameId, label: SpanLabel) {
        let state = &mut self.threads[thread];
        state.next_span += 1;
        let id = state.next_span;
        self.emit(thread, EventKind::SpanEnter { id, name, label });
        self.threads[thread].open.push(id);
    }

    fn exit_on(&mut self, thread: usize) {
        if let Some(id) = self.threads[thread].open.pop() {
            self.emit(thread, EventKind::SpanExit { id });
        }
    }

    fn enter(&mut self, name: NameId, label: SpanLabel) {
        self.interleave();
        self.enter_on(MAIN, name, label);
    }

    fn exit(&mut self) {
        self.interleave();
        self.exit_on(MAIN);
    }

    fn op_begin(&mut self, name: NameId) {
        self.interleave();
        self.next_tensor += 1;
        let shape = self.ids.shapes[self.rng.below(self.ids.shapes.len() as u64) as usize];
        let kind = EventKind::OpBegin {
            name,
            output: self.next_tensor,
            shape: Some(shape),
            dtype: Some(self.ids.f32),
        };
        self.emit(MAIN, kind);
    }

    fn op_end(&mut self) {
        self.interleave();
        self.emit(MAIN, EventKind::OpEnd);
    }

    /// One action of loader `index`: open a batch, add a buffer or a temporary, or finish.
    fn loader_step(&mut self, index: usize) {
        let thread = index + 1;
        match &mut self.loaders[index] {
            Loader::Idle => {
                if self.ready.len() < READY_BATCHES {
                    let left = self.rng.between(8, 24) as u32;
                    self.loaders[index] = Loader::Loading {
                        left,
                        buffers: Vec::new(),
                    };
                    let name = self.ids.load_batch;
                    self.enter_on(thread, name, SpanLabel::Plain);
                }
            }
            Loader::Loading { left: 0, .. } => {
                let Loader::Loading { buffers, .. } =
                    std::mem::replace(&mut self.loaders[index], Loader::Idle)
                else {
                    return;
                };
                self.exit_on(thread);
                self.ready.push_back(buffers);
            }
            Loader::Loading { left, .. } => {
                *left -= 1;
                if self.rng.chance(500) {
                    let size = self.rng.log_uniform(1 << 10, 256 << 10);
                    let buffer = self.alloc_on(thread, size, Category::Other);
                    if let Loader::Loading { buffers, .. } = &mut self.loaders[index] {
                        buffers.push(buffer);
                    }
                } else {
                    let size = self.rng.log_uniform(16, 4 << 10);
                    let temp = self.alloc_on(thread, size, Category::Other);
                    self.free_on(thread, temp);
                }
            }
        }
    }

    /// Short-lived work inside an op: temporaries, some grown before they are dropped.
    fn temporaries(&mut self, category: Category) {
        for _ in 0..self.rng.between(8, 24) {
            let size = self.rng.log_uniform(16, 4 << 10);
            let mut temp = self.alloc(size, category);
            if self.rng.chance(200) {
                for _ in 0..self.rng.between(1, 3) {
                    temp = self.realloc(temp, temp.size * 2, category);
                }
            }
            self.free(temp);
        }
    }

    fn run(mut self) -> Stream {
        // Setup: parameters, then the runtime's long-lived small blocks.
        let load_model = self.ids.load_model;
        self.enter(load_model, SpanLabel::Category(Category::Parameter));
        let mut parameters = Vec::with_capacity(PARAMETERS);
        for _ in 0..PARAMETERS {
            let size = self.rng.log_uniform(1 << 10, 1 << 20);
            parameters.push(self.alloc(size, Category::Parameter));
        }
        self.exit();
        let mut runtime = Vec::with_capacity(RUNTIME_BLOCKS);
        for _ in 0..RUNTIME_BLOCKS {
            let size = self.rng.log_uniform(16, 2 << 10);
            runtime.push(self.alloc(size, Category::Other));
        }

        let mut moments: Vec<Block> = Vec::new();
        let mut leaked = Vec::new();
        let mut iterations = 0;
        while self.events.len() < self.target {
            iterations += 1;
            let train_step = self.ids.train_step;
            self.enter(train_step, SpanLabel::Plain);
            let batch = self.ready.pop_front().unwrap_or_default();

            let forward = self.ids.forward;
            self.enter(forward, SpanLabel::Step(Step::Forward));
            let mut saved: Vec<Vec<Block>> = Vec::with_capacity(LAYERS);
            for layer in 0..LAYERS {
                let name = self.ids.layers[layer];
                self.enter(name, SpanLabel::Plain);
                let mut kept = Vec::new();
                for op in 0..OPS_PER_LAYER {
                    let op_name = self.ids.ops[op];
                    self.op_begin(op_name);
                    self.temporaries(Category::Activation);
                    let size = self.rng.log_uniform(4 << 10, 1 << 20);
                    kept.push(self.alloc(size, Category::Activation));
                    for _ in 0..self.rng.between(10, 30) {
                        let size = self.rng.log_uniform(16, 512);
                        kept.push(self.alloc(size, Category::Activation));
                    }
                    self.op_end();
                }
                saved.push(kept);
                self.exit();
            }
            self.exit();

            let backward = self.ids.backward;
            self.enter(backward, SpanLabel::Step(Step::Backward));
            let mut gradients = Vec::new();
            for layer in (0..LAYERS).rev() {
                let name = self.ids.layers[layer];
                self.enter(name, SpanLabel::Plain);
                for op in 0..OPS_PER_LAYER {
                    let op_name = self.ids.grad_ops[op];
                    self.op_begin(op_name);
                    self.temporaries(Category::Gradient);
                    let size = self.rng.log_uniform(4 << 10, 1 << 20);
                    gradients.push(self.alloc(size, Category::Gradient));
                    self.op_end();
                }
                for block in saved.pop().unwrap_or_default().into_iter().rev() {
                    self.free(block);
                }
                self.exit();
            }
            self.exit();

            let optimizer = self.ids.optimizer;
            self.enter(optimizer, SpanLabel::Step(Step::Optimizer));
            if moments.is_empty() {
                for parameter in &parameters {
                    for _ in 0..2 {
                        moments.push(self.alloc(parameter.size, Category::Optimizer));
                    }
                }
            }
            for _ in 0..PARAMETERS / 4 {
                let size = self.rng.log_uniform(16, 4 << 10);
                let temp = self.alloc(size, Category::Optimizer);
                self.free(temp);
            }
            for block in std::mem::take(&mut gradients) {
                self.free(block);
            }
            self.exit();

            for _ in 0..200 {
                let victim = self.rng.below(runtime.len() as u64) as usize;
                let old = runtime[victim];
                self.free(old);
                let size = self.rng.log_uniform(16, 2 << 10);
                runtime[victim] = self.alloc(size, Category::Other);
            }
            leaked.push(self.alloc(512, Category::Other));
            for block in batch {
                self.free(block);
            }
            self.exit();
        }
        self.events.truncate(self.target);
        Stream {
            events: self.events,
            names: Vec::new(),
            shapes: Vec::new(),
            iterations,
        }
    }
}

/// Generates `count` events from `seed`. The same arguments give the same stream everywhere.
pub fn generate(count: usize, seed: u64) -> Stream {
    let mut names: Vec<String> = Vec::new();
    let mut intern = |name: &str| {
        names.push(name.to_string());
        NameId(names.len() as u32 - 1)
    };
    let train_step = intern("train_step");
    let forward = intern("forward");
    let backward = intern("backward");
    let optimizer = intern("optimizer");
    let load_model = intern("load_model");
    let load_batch = intern("load_batch");
    let layers = (0..LAYERS).map(|l| intern(&format!("layer{l}"))).collect();
    let op_names = ["matmul", "add", "gelu", "layer_norm", "dropout", "softmax"];
    let ops = op_names.iter().map(|name| intern(name)).collect();
    let grad_ops = op_names
        .iter()
        .map(|name| intern(&format!("{name}_backward")))
        .collect();
    let f32 = intern("f32");
    let shapes: Vec<Vec<u64>> = vec![vec![64, 512], vec![64, 2048], vec![512, 512], vec![64]];
    let ids = Ids {
        train_step,
        forward,
        backward,
        optimizer,
        load_model,
        load_batch,
        layers,
        ops,
        grad_ops,
        f32,
        shapes: (0..shapes.len() as u32).map(ShapeId).collect(),
    };
    let generator = Generator {
        rng: Rng::new(seed),
        heap: Heap::new(),
        ts: 0,
        events: Vec::with_capacity(count + 100_000),
        target: count,
        threads: (0..=LOADERS).map(|_| ThreadState::default()).collect(),
        loaders: (0..LOADERS).map(|_| Loader::Idle).collect(),
        ready: VecDeque::new(),
        next_tensor: 0,
        ids,
    };
    let mut stream = generator.run();
    stream.names = names;
    stream.shapes = shapes;
    stream
}
