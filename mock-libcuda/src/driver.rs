//! Process-local driver model: contexts, allocations, streams, events, modules, graphs, pools.
//! Everything device-wide (memory capacity, the kernel timeline, busy time) lives in `mock_gpu`.

use crate::ffi::*;
use mock_gpu::{now_ns, GpuState, MAX_DEVICES};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::Mutex;

pub type R<T> = Result<T, CUresult>;

pub const MIB2: u64 = 2 << 20;
/// Unfinished launches a stream may hold before the next launch blocks.
pub const MAX_QUEUED: usize = 1024;

pub fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// What a device allocation of `size` bytes costs: 512-byte granules below 2 MiB, whole 2 MiB
/// pages above (the driver's large-page granularity).
pub fn charge_size(size: u64) -> u64 {
    if size >= MIB2 {
        round_up(size, MIB2)
    } else {
        round_up(size, 512)
    }
}

#[derive(Default)]
pub struct Stream {
    pub ctx: u64,
    pub last_end: u64,
    pending: VecDeque<u64>,
    pub capture: Option<u64>,
}

pub struct Ctx {
    pub dev: usize,
    pub primary: bool,
    /// Memory the context gained at its first module load (`MOCK_GPU_CTX_GROWTH`).
    pub grown: u64,
    pub default_stream: Stream,
    /// When the work of its destroyed streams ends: a destroy returns at once, the work still
    /// runs, and a context synchronize waits for it (as on a GPU).
    pub destroyed_until: u64,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Kind {
    Device,
    Managed,
    Pool(u64),
}

#[derive(Clone, Copy)]
pub struct Alloc {
    pub dev: usize,
    pub size: u64,
    /// Address space taken (the size rounded to the driver's granularity).
    pub charged: u64,
    /// Device memory charged: `charged`, except managed memory past what the device had free.
    pub resident: u64,
    pub ctx: u64,
    pub kind: Kind,
}

pub struct Event {
    pub stamp: Option<u64>,
    pub flags: u32,
    /// The spin its record was queued behind, if one was still running: a spin's end is known
    /// only when its word moves, and the event completes after it, as on a GPU.
    pub behind: Option<Linger>,
}

impl Event {
    /// What a wait for it waits until, where it was recorded.
    pub fn until(&self) -> Option<Until> {
        self.stamp.map(|at| Until { at, spins: self.behind.into_iter().collect() })
    }
}

/// When some work ends: at `at`, or later where spins it waits for still run (their words can
/// move while a wait goes on, which ends them).
pub struct Until {
    pub at: u64,
    pub spins: Vec<Linger>,
}

impl Until {
    /// The end as far as the spins' words tell now.
    pub fn ends(&self) -> u64 {
        self.spins.iter().map(Linger::ends_at).fold(self.at, u64::max)
    }
}

impl From<u64> for Until {
    fn from(at: u64) -> Self {
        Until { at, spins: Vec::new() }
    }
}

pub struct Func {
    pub name: String,
    pub nparams: usize,
}

/// libvgpu's `vgpu_linger` spin: one thread that runs until `end` unless the word at `word`
/// (registered host memory) stops holding `gen`. The mock gives it no GPU time and no part of
/// the device (what it buys on a GPU, the context staying on, is not modelled); it keeps the
/// order a GPU gives it: it starts after its stream's work, and a context synchronize waits for
/// it until its word moves.
#[derive(Clone, Copy)]
pub struct Linger {
    pub ctx: u64,
    pub stream: u64,
    pub start: u64,
    pub end: u64,
    pub word: usize,
    pub gen: u32,
}

impl Linger {
    /// When it ends, as far as is known now: at its start if the word has moved.
    pub fn ends_at(&self) -> u64 {
        // SAFETY: `word` lies in host memory registered with this process (checked at launch),
        // which the program keeps while it can still be read (libvgpu's are static).
        let now_word = unsafe { std::ptr::read_volatile(self.word as *const u32) };
        if now_word != self.gen {
            self.start
        } else {
            self.end
        }
    }
}

/// A kernel as a graph node: its size, and its cost per wave.
#[derive(Clone, Copy)]
pub struct Node {
    pub blocks: u64,
    pub wave_ns: u64,
    /// Threads per block (how much of an SM a block takes).
    pub threads: u64,
}

#[derive(Default)]
pub struct Pool {
    pub dev: usize,
    pub reserved: u64,
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub threshold: u64,
    pub is_default: bool,
}

pub struct Phys {
    pub dev: usize,
    pub size: u64,
    pub released: bool,
    pub maps: u32,
    /// References taken by `cuMemRetainAllocationHandle` (each needs its own `cuMemRelease`).
    pub retains: u32,
}

pub struct Mapping {
    pub size: u64,
    pub handle: u64,
}

#[derive(Default)]
pub struct Primary {
    pub handle: u64,
    pub refs: u32,
    pub flags: u32,
}

#[derive(Default)]
pub struct Proc {
    gen: u64,
    pub st: Option<&'static GpuState>,
    next: u64,
    pub ctxs: HashMap<u64, Ctx>,
    pub primary: [Primary; MAX_DEVICES],
    pub allocs: BTreeMap<u64, Alloc>,
    pub host: HashSet<usize>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, Vec<u64>>,
    pub funcs: HashMap<u64, Func>,
    pub graphs: HashMap<u64, Vec<Node>>,
    pub execs: HashMap<u64, Vec<Node>>,
    pub pools: HashMap<u64, Pool>,
    pub default_pool: [u64; MAX_DEVICES],
    pub current_pool: [u64; MAX_DEVICES],
    pub reserves: BTreeMap<u64, u64>,
    next_reserve: u64,
    pub phys: HashMap<u64, Phys>,
    pub maps: BTreeMap<u64, Mapping>,
    pub arrays: HashMap<u64, Alloc>,
    /// Graph memory (`crate::graphmem`): alloc nodes per graph and per executable graph, the
    /// per-device graph memory pool, and the addresses graph allocations hand out.
    pub graph_mem: HashMap<u64, crate::graphmem::GraphMem>,
    pub exec_mem: HashMap<u64, crate::graphmem::ExecMem>,
    pub graph_pool: [crate::graphmem::GraphPool; MAX_DEVICES],
    pub graph_ptrs: BTreeMap<u64, u64>,
    /// Host memory registered (`cuMemHostRegister`): start -> (length, context).
    pub registered: BTreeMap<usize, (usize, u64)>,
    pub lingers: Vec<Linger>,
}

/// The per-process driver state behind its lock. Not a plain `static Mutex`: a child forked while
/// another thread of the parent holds the lock would inherit it locked forever. The child handler
/// (registered at load time) forgets the inherited lock and state instead; the first use in the
/// child builds a fresh one, so the child starts like a process that never called the driver.
static PROC: AtomicPtr<Mutex<Option<Proc>>> = AtomicPtr::new(std::ptr::null_mut());

#[used]
#[link_section = ".init_array"]
static REGISTER_ATFORK: extern "C" fn() = register_atfork;

extern "C" fn register_atfork() {
    // SAFETY: registering a plain function; no prepare/parent handlers (nothing is taken at fork).
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
}

/// In the child (one thread, the forking one): drop the inherited lock and state (leaked, never
/// touched again) and the forking thread's context stack, whose handles belong to the parent.
extern "C" fn after_fork_child() {
    PROC.store(std::ptr::null_mut(), SeqCst);
    WAITING.store(0, SeqCst);
    let _ = STACK.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.clear();
        }
    });
}

fn proc_lock() -> &'static Mutex<Option<Proc>> {
    mock_gpu::lazy_leak(&PROC, || Mutex::new(None))
}

/// Threads blocked on the process lock right now. A real query reads a completion word and takes
/// no lock; ours does, so a thread polling in a tight loop must give way, but only to a thread
/// that is waiting (`exports::not_ready_pause`, for event queries).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Whether another thread is blocked on the process lock.
pub fn others_waiting() -> bool {
    WAITING.load(Relaxed) > 0
}

fn lock_proc() -> std::sync::MutexGuard<'static, Option<Proc>> {
    let m = proc_lock();
    match m.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            WAITING.fetch_add(1, Relaxed);
            let g = m.lock().unwrap_or_else(|e| e.into_inner());
            WAITING.fetch_sub(1, Relaxed);
            g
        }
    }
}

thread_local! {
    /// This thread's context stack (top = current).
    pub static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

pub fn current_handle() -> Option<u64> {
    STACK.with(|s| s.borrow().last().copied())
}

/// Run `f` on the process state (fresh after a fork, like a driver that cannot survive one).
pub fn with<T>(f: impl FnOnce(&mut Proc) -> T) -> T {
    let mut g = lock_proc();
    let gen = mock_gpu::fork_generation();
    if g.as_ref().is_none_or(|p| p.gen != gen) {
        *g = Some(Proc { gen, next_reserve: 0x6000_0000_0000, ..Default::default() });
    }
    f(g.as_mut().expect("just set"))
}

/// `with`, requiring cuInit to have succeeded.
pub fn with_init<T>(f: impl FnOnce(&mut Proc, &'static GpuState) -> R<T>) -> R<T> {
    with(|p| {
        let st = p.st.ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        f(p, st)
    })
}

/// Result of an operation that may have to wait for the simulated GPU, outside the lock.
pub enum Step {
    Done,
    WaitThen(u64),
}

/// Write through an out pointer, rejecting NULL.
pub unsafe fn out<T>(p: *mut T, v: T) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    p.write(v);
    Ok(())
}

pub fn h(x: u64) -> Handle {
    x as Handle
}

impl Proc {
    fn handle(&mut self, kind: u64) -> u64 {
        self.next += 1;
        (kind << 40) | (self.next << 4)
    }

    /// Physical index of device ordinal `d` (after `CUDA_VISIBLE_DEVICES`: `crate::visible`).
    pub fn dev(&self, st: &GpuState, d: CUdevice) -> R<usize> {
        crate::visible::physical(st, d).ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The calling thread's current context.
    pub fn cur(&self) -> R<(u64, usize)> {
        let c = current_handle().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let ctx = self.ctxs.get(&c).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        Ok((c, ctx.dev))
    }

    pub fn ctx_known(&self, c: u64) -> R<()> {
        self.ctxs.contains_key(&c).then_some(()).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    // ---- contexts -------------------------------------------------------------------------

    pub fn create_ctx(&mut self, st: &GpuState, d: usize, primary: bool) -> R<u64> {
        if !st.try_charge(d, st.header().ctx_mem) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        st.add_context(d, 1);
        let c = self.handle(0xC7);
        self.ctxs.insert(c, Ctx { dev: d, primary, grown: 0, default_stream: Stream { ctx: c, ..Default::default() }, destroyed_until: 0 });
        Ok(c)
    }

    /// Destroy a context and everything allocated in it (the driver frees a context's memory).
    pub fn destroy_ctx(&mut self, st: &GpuState, c: u64) {
        let Some(ctx) = self.ctxs.remove(&c) else { return };
        let dead: Vec<u64> = self.allocs.iter().filter(|(_, a)| a.ctx == c).map(|(&p, _)| p).collect();
        for p in dead {
            let _ = self.free(st, p);
        }
        let arrays: Vec<u64> = self.arrays.iter().filter(|(_, a)| a.ctx == c).map(|(&k, _)| k).collect();
        for a in arrays {
            if let Some(a) = self.arrays.remove(&a) {
                st.uncharge(a.dev, a.charged);
            }
        }
        self.streams.retain(|_, s| s.ctx != c);
        self.registered.retain(|_, r| r.1 != c);
        self.lingers.retain(|l| l.ctx != c);
        st.uncharge(ctx.dev, st.header().ctx_mem + ctx.grown);
        st.add_context(ctx.dev, -1);
        STACK.with(|s| s.borrow_mut().retain(|&x| x != c));
    }

    pub fn retain_primary(&mut self, st: &GpuState, d: usize) -> R<u64> {
        if self.primary[d].handle == 0 || !self.ctxs.contains_key(&self.primary[d].handle) {
            self.primary[d].handle = self.create_ctx(st, d, true)?;
            self.primary[d].refs = 0;
        }
        self.primary[d].refs += 1;
        Ok(self.primary[d].handle)
    }

    pub fn release_primary(&mut self, st: &GpuState, d: usize, reset: bool) -> R<()> {
        let pc = &mut self.primary[d];
        if pc.refs == 0 && !reset {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        pc.refs = if reset { 0 } else { pc.refs - 1 };
        if pc.refs == 0 && pc.handle != 0 {
            let c = std::mem::take(&mut pc.handle);
            self.destroy_ctx(st, c);
        }
        Ok(())
    }

    // ---- memory ---------------------------------------------------------------------------

    pub fn alloc(&mut self, st: &GpuState, ctx: u64, d: usize, size: u64, kind: Kind) -> R<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let charged = charge_size(size);
        let pool_kind = matches!(kind, Kind::Pool(_));
        let resident = match kind {
            // Unified memory may exceed the device: what does not fit stays on the host.
            Kind::Managed => st.charge_up_to(d, charged),
            Kind::Pool(_) => 0,
            _ if st.try_charge(d, charged) => charged,
            _ => return Err(CUDA_ERROR_OUT_OF_MEMORY),
        };
        let align = if charged >= MIB2 { MIB2 } else { 512 };
        let Some(ptr) = st.alloc_va(d, charged, align) else {
            if !pool_kind {
                st.uncharge(d, resident);
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        self.allocs.insert(ptr, Alloc { dev: d, size, charged, resident, ctx, kind });
        Ok(ptr)
    }

    pub fn free(&mut self, st: &GpuState, ptr: u64) -> R<()> {
        let a = self.allocs.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        st.free_va(a.dev, ptr, a.charged);
        match a.kind {
            Kind::Pool(pool) => {
                if let Some(p) = self.pools.get_mut(&pool) {
                    p.used = p.used.saturating_sub(a.charged);
                }
            }
            _ => st.uncharge(a.dev, a.resident),
        }
        Ok(())
    }

    /// Whether `[ptr, ptr+len)` lies in one allocation or one mapping of this process.
    pub fn check_range(&self, ptr: u64, len: u64) -> R<()> {
        let end = ptr.checked_add(len).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let inside = |base: u64, size: u64| ptr >= base && end <= base + size;
        let in_alloc = self.allocs.range(..=ptr).next_back().is_some_and(|(&b, a)| inside(b, a.size));
        let in_map = self.maps.range(..=ptr).next_back().is_some_and(|(&b, m)| inside(b, m.size));
        let in_graph = self.graph_ptrs.range(..=ptr).next_back().is_some_and(|(&b, &s)| inside(b, s));
        (in_alloc || in_map || in_graph).then_some(()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    pub fn charge_object(&mut self, st: &GpuState, bytes: u64) -> R<u64> {
        let (c, d) = self.cur()?;
        let charged = charge_size(bytes);
        if !st.try_charge(d, charged) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let a = self.handle(0xA7);
        self.arrays.insert(a, Alloc { dev: d, size: bytes, charged, resident: charged, ctx: c, kind: Kind::Device });
        Ok(a)
    }

    pub fn destroy_object(&mut self, st: &GpuState, a: u64) -> R<()> {
        let a = self.arrays.remove(&a).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        st.uncharge(a.dev, a.charged);
        Ok(())
    }

    // ---- pools ----------------------------------------------------------------------------

    pub fn default_pool(&mut self, d: usize) -> u64 {
        if self.default_pool[d] == 0 {
            let p = self.handle(0x9B);
            self.pools.insert(p, Pool { dev: d, is_default: true, ..Default::default() });
            self.default_pool[d] = p;
        }
        self.default_pool[d]
    }

    pub fn current_pool(&mut self, d: usize) -> u64 {
        match self.current_pool[d] {
            0 => self.default_pool(d),
            p => p,
        }
    }

    pub fn new_pool(&mut self, d: usize) -> u64 {
        let p = self.handle(0x9B);
        self.pools.insert(p, Pool { dev: d, ..Default::default() });
        p
    }

    pub fn alloc_from_pool(&mut self, st: &GpuState, ctx: u64, pool: u64, size: u64) -> R<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = self.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = p.dev;
        let want = charge_size(size);
        let idle = p.reserved - p.used;
        if idle < want {
            let grow = round_up(want - idle, MIB2);
            if !st.try_charge(d, grow) {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            p.reserved += grow;
        }
        p.used += want;
        p.used_high = p.used_high.max(p.used);
        p.reserved_high = p.reserved_high.max(p.reserved);
        let ptr = self.alloc(st, ctx, d, size, Kind::Pool(pool));
        if ptr.is_err() {
            if let Some(p) = self.pools.get_mut(&pool) {
                p.used -= want;
            }
        }
        ptr
    }

    /// Give a pool's idle reserve above `keep` back to the device.
    pub fn trim_pool(&mut self, st: &GpuState, pool: u64, keep: Option<u64>) {
        if let Some(p) = self.pools.get_mut(&pool) {
            let keep = p.used.max(keep.unwrap_or(p.threshold));
            if p.reserved > keep {
                st.uncharge(p.dev, p.reserved - keep);
                p.reserved = keep;
            }
        }
    }

    /// Synchronization points release pool memory above each pool's release threshold.
    pub fn release_pools(&mut self, st: &GpuState) {
        let pools: Vec<u64> = self.pools.keys().copied().collect();
        for p in pools {
            self.trim_pool(st, p, None);
        }
    }

    pub fn destroy_pool(&mut self, st: &GpuState, pool: u64) -> R<()> {
        let p = self.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if p.is_default {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = self.pools.remove(&pool).expect("checked");
        self.allocs.retain(|&ptr, a| {
            let keep = a.kind != Kind::Pool(pool);
            if !keep {
                st.free_va(a.dev, ptr, a.charged);
            }
            keep
        });
        st.uncharge(p.dev, p.reserved);
        for cp in self.current_pool.iter_mut().filter(|cp| **cp == pool) {
            *cp = 0;
        }
        Ok(())
    }

    // ---- virtual memory management ---------------------------------------------------------

    pub fn reserve(&mut self, size: u64, align: u64) -> R<u64> {
        let align = if align == 0 { MIB2 } else { align };
        if size == 0 || !size.is_multiple_of(MIB2) || !align.is_power_of_two() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let start = round_up(self.next_reserve, align.max(MIB2));
        self.next_reserve = start + size;
        self.reserves.insert(start, size);
        Ok(start)
    }

    pub fn in_reserve(&self, ptr: u64, size: u64) -> bool {
        self.reserves.range(..=ptr).next_back().is_some_and(|(&b, &s)| ptr + size <= b + s)
    }

    pub fn create_phys(&mut self, st: &GpuState, d: usize, size: u64) -> R<u64> {
        if size == 0 || !size.is_multiple_of(MIB2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !st.try_charge(d, size) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let hd = self.handle(0x9F);
        self.phys.insert(hd, Phys { dev: d, size, released: false, maps: 0, retains: 0 });
        Ok(hd)
    }

    /// Physical memory is freed once released and unmapped everywhere.
    pub fn drop_phys_if_done(&mut self, st: &GpuState, hd: u64) {
        if self.phys.get(&hd).is_some_and(|p| p.released && p.retains == 0 && p.maps == 0) {
            let p = self.phys.remove(&hd).expect("checked");
            st.uncharge(p.dev, p.size);
        }
    }

    // ---- modules and launches ---------------------------------------------------------------

    /// A context's first module load makes it grow (as real contexts do after creation): charged
    /// on its device when it fits.
    pub fn grow_current_ctx(&mut self, st: &GpuState) {
        let growth = st.header().ctx_growth;
        let Ok((c, d)) = self.cur() else { return };
        if let Some(ctx) = self.ctxs.get_mut(&c) {
            if growth > 0 && ctx.grown == 0 && st.try_charge(d, growth) {
                ctx.grown = growth;
            }
        }
    }

    pub fn load_module(&mut self, image: &[u8]) -> R<u64> {
        let entries = parse_ptx(image).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let m = self.handle(0x30);
        let mut funcs = Vec::new();
        for (name, nparams) in entries {
            let f = self.handle(0xF0);
            self.funcs.insert(f, Func { name, nparams });
            funcs.push(f);
        }
        self.modules.insert(m, funcs);
        Ok(m)
    }

    pub fn unload_module(&mut self, m: u64) -> R<()> {
        let funcs = self.modules.remove(&m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        for f in funcs {
            self.funcs.remove(&f);
        }
        Ok(())
    }

    /// Validate a launch and price it (per-wave cost and block count).
    #[allow(clippy::too_many_arguments)] // the launch's own parameters
    pub unsafe fn price(
        &self,
        st: &GpuState,
        f: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shmem: u32,
        params: *mut *mut std::ffi::c_void,
        extra: *mut *mut std::ffi::c_void,
    ) -> R<Node> {
        let func = self.funcs.get(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if grid.contains(&0) || block.contains(&0) || threads > 1024 || block[2] > 64 || shmem > 232_448 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if grid[1] > 65535 || grid[2] > 65535 || (!params.is_null() && !extra.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if func.nparams > 0 && params.is_null() && extra.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = st.header();
        let wave_ns = if func.name.starts_with("vgpu_spin") {
            let cycles = first_param_u64(params, extra).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            (cycles as u128 * 1_000_000 / h.clock_khz.max(1) as u128).min(u64::MAX as u128) as u64
        } else {
            h.kernel_ns
        };
        Ok(Node { blocks: grid.iter().map(|&g| g as u64).product(), wave_ns, threads })
    }

    pub fn node_duration(st: &GpuState, d: usize, n: Node) -> u64 {
        let per_wave = st.device(d).sms.max(1) as u64 * 4;
        n.blocks.div_ceil(per_wave).saturating_mul(n.wave_ns)
    }

    /// Does the kernel fit in half the GPU (2048 resident threads per SM)? Then another such
    /// kernel of the process can run beside it.
    pub fn node_is_half(st: &GpuState, d: usize, n: Node) -> bool {
        n.blocks.saturating_mul(n.threads) <= st.device(d).sms.max(1) as u64 * 1024
    }

    /// Resolve a stream handle (0 / legacy / per-thread = the current context's default stream).
    pub fn stream_mut(&mut self, s: u64) -> R<&mut Stream> {
        if s == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD {
            let (c, _) = self.cur()?;
            return Ok(&mut self.ctxs.get_mut(&c).expect("current").default_stream);
        }
        self.streams.get_mut(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn stream_dev(&mut self, s: u64) -> R<(u64, usize)> {
        let c = self.stream_mut(s)?.ctx;
        let d = self.ctxs.get(&c).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.dev;
        Ok((c, d))
    }

    /// Put priced work on a stream: into its capture graph, or onto the device timeline. Waits
    /// (returned, to be slept outside the lock) while the stream holds MAX_QUEUED unfinished launches.
    pub fn submit(&mut self, st: &GpuState, s: u64, nodes: &[Node]) -> R<Step> {
        let (_, d) = self.stream_dev(s)?;
        if let Some(g) = self.stream_mut(s)?.capture {
            self.graphs.get_mut(&g).ok_or(CUDA_ERROR_INVALID_HANDLE)?.extend_from_slice(nodes);
            return Ok(Step::Done);
        }
        let now = now_ns();
        let stream = self.stream_mut(s)?;
        while stream.pending.front().is_some_and(|&e| e <= now) {
            stream.pending.pop_front();
        }
        if stream.pending.len() + nodes.len() > MAX_QUEUED {
            let idx = (stream.pending.len() + nodes.len() - MAX_QUEUED).min(stream.pending.len()) - 1;
            return Ok(Step::WaitThen(stream.pending[idx]));
        }
        for &n in nodes {
            let earliest = self.stream_mut(s)?.last_end;
            let (_, end) = st.enqueue_kernel(d, Self::node_duration(st, d, n), earliest, Self::node_is_half(st, d, n));
            let stream = self.stream_mut(s)?;
            stream.pending.push_back(end);
            stream.last_end = stream.last_end.max(end);
        }
        Ok(Step::Done)
    }

    /// When all work of context `c` ends, its spins included.
    pub fn ctx_idle_at(&self, c: u64) -> Until {
        let own = self.ctxs.get(&c).map_or(0, |x| x.default_stream.last_end.max(x.destroyed_until));
        let at = self.streams.values().filter(|s| s.ctx == c).map(|s| s.last_end).fold(own, u64::max);
        Until { at, spins: self.lingers.iter().filter(|l| l.ctx == c).copied().collect() }
    }

    /// The spins queued on stream `s`: its later records and synchronizes wait for them.
    pub fn spins_on(&self, s: u64) -> Vec<Linger> {
        self.lingers.iter().filter(|l| l.stream == s).copied().collect()
    }

    /// Queue a `vgpu_linger` spin on stream `s`: after the stream's work and any earlier spin
    /// on it. Its word must lie in host memory its context registered, as on a GPU (which faults
    /// otherwise).
    pub fn queue_linger(&mut self, s: u64, word: usize, gen: u32, ns: u64) -> R<()> {
        let (ctx, _) = self.stream_dev(s)?;
        // Registered by this context (without PORTABLE another context cannot map it).
        let registered = self.registered_at(word).is_some_and(|(p, len, c)| word + 4 <= p + len && c == ctx);
        if !registered {
            return Err(CUDA_ERROR_ILLEGAL_ADDRESS);
        }
        let now = now_ns();
        self.lingers.retain(|l| l.ends_at() > now);
        let earlier = self.lingers.iter().filter(|l| l.stream == s).map(Linger::ends_at).max().unwrap_or(0);
        let start = self.stream_mut(s)?.last_end.max(now).max(earlier);
        self.lingers.push(Linger { ctx, stream: s, start, end: start.saturating_add(ns), word, gen });
        Ok(())
    }

    /// The host registration holding address `a`: start, length, context.
    pub fn registered_at(&self, a: usize) -> Option<(usize, usize, u64)> {
        self.registered.range(..=a).next_back().map(|(&p, &(len, c))| (p, len, c)).filter(|&(p, len, _)| a < p + len)
    }

    pub fn new_stream(&mut self) -> R<u64> {
        let (c, _) = self.cur()?;
        let s = self.handle(0x57);
        self.streams.insert(s, Stream { ctx: c, ..Default::default() });
        Ok(s)
    }

    pub fn new_event(&mut self, flags: u32) -> R<u64> {
        self.cur()?;
        if flags & !0xF != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let e = self.handle(0xE7);
        self.events.insert(e, Event { stamp: None, flags, behind: None });
        Ok(e)
    }

    pub fn new_graph(&mut self) -> u64 {
        let g = self.handle(0x6A);
        self.graphs.insert(g, Vec::new());
        g
    }

    pub fn instantiate(&mut self, g: u64) -> R<u64> {
        let nodes = self.graphs.get(&g).ok_or(CUDA_ERROR_INVALID_VALUE)?.clone();
        let x = self.handle(0x6E);
        self.execs.insert(x, nodes);
        self.instantiate_mem(g, x);
        Ok(x)
    }

    pub fn new_node_handle(&mut self) -> u64 {
        self.handle(0x6B)
    }
}

/// First kernel parameter as u64: from `kernelParams[0]` or a packed `extra` buffer.
unsafe fn first_param_u64(params: *mut *mut std::ffi::c_void, extra: *mut *mut std::ffi::c_void) -> Option<u64> {
    if !params.is_null() {
        let p0 = *params;
        return (!p0.is_null()).then(|| (p0 as *const u64).read_unaligned());
    }
    let mut i = 0;
    while !extra.is_null() && i < 16 {
        let key = *extra.add(i) as usize;
        if key == CU_LAUNCH_PARAM_END {
            break;
        }
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER {
            let buf = *extra.add(i + 1);
            return (!buf.is_null()).then(|| (buf as *const u64).read_unaligned());
        }
        i += 2;
    }
    None
}

/// Entry points of a PTX module: (name, parameter count). `None` if the image is not PTX text.
pub fn parse_ptx(image: &[u8]) -> Option<Vec<(String, usize)>> {
    let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
    let text = std::str::from_utf8(&image[..end]).ok()?;
    if !(text.contains(".version") || text.contains(".target") || text.contains(".entry")) {
        return None;
    }
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + ".entry".len()..];
        if !rest.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let body = rest.trim_start();
        let name_len = body.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '.')).unwrap_or(body.len());
        if name_len == 0 {
            continue;
        }
        let name = body[..name_len].to_string();
        let after = body[name_len..].trim_start();
        let nparams = if let Some(list) = after.strip_prefix('(') {
            let close = list.find(')').unwrap_or(list.len());
            list[..close].matches(".param").count()
        } else {
            0
        };
        out.push((name, nparams));
    }
    Some(out)
}

/// Read a NUL-terminated PTX image of unknown length (bounded).
pub unsafe fn image_bytes<'a>(image: *const std::ffi::c_void) -> R<&'a [u8]> {
    if image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = image as *const u8;
    let mut n = 0usize;
    while n < (64 << 20) && *p.add(n) != 0 {
        n += 1;
    }
    Ok(std::slice::from_raw_parts(p, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn ptx_entries_and_params() {
        let ptx = b".version 8.0\n.target sm_90\n.address_size 64\n\
            .visible .entry vgpu_spin(\n .param .u64 vgpu_spin_param_0\n)\n{ ret; }\n\
            .visible .entry add_one(.param .u64 a, .param .u32 n)\n{ ret; }\n\
            .entry noargs\n{ ret; }\0trailing";
        let e = parse_ptx(ptx).unwrap();
        assert_eq!(e, vec![("vgpu_spin".into(), 1), ("add_one".into(), 2), ("noargs".into(), 0)]);
        assert!(parse_ptx(b"\x7fELF\x02\x01").is_none());
        assert_eq!(parse_ptx(b".version 8.0\n").unwrap(), vec![]);
    }

    #[test]
    fn freed_device_addresses_are_reused() {
        let path = std::env::temp_dir().join(format!("mock-driver-unit-va-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let cfg = mock_gpu::Config {
            devices: vec![mock_gpu::DeviceConfig { name: "A".into(), total_mem: 2 << 30, sms: 4 }],
            ..Default::default()
        };
        let st = GpuState::open(&path, &cfg).unwrap();
        st.register().unwrap();
        let mut p = Proc::default();
        // 1100 rounds of 1 GiB: more than the 1 TiB address range of a device.
        for i in 0..1100 {
            let a = p.alloc(&st, 1, 0, 1 << 30, Kind::Device).unwrap_or_else(|e| panic!("round {i}: {e}"));
            p.free(&st, a).unwrap();
        }
        // Pool allocations give their addresses back when the pool is destroyed.
        for _ in 0..600 {
            let pool = p.new_pool(0);
            p.alloc_from_pool(&st, 1, pool, 1 << 30).unwrap();
            p.destroy_pool(&st, pool).unwrap();
        }
        assert!(st.layout().va_owner[0].iter().all(|o| o.load(Relaxed) == 0));
        assert_eq!(st.device_used(0), 0);
        let _ = std::fs::remove_file(&path);
    }

    /// A child forked while another thread holds the process lock gets a fresh, usable state.
    #[test]
    fn forked_child_does_not_inherit_the_lock() {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        STACK.with(|s| s.borrow_mut().push(0xC7 << 40));
        let holder = std::thread::spawn(move || {
            with(|p| {
                p.next = 1000;
                held_tx.send(()).unwrap();
                let _ = done_rx.recv_timeout(std::time::Duration::from_secs(10));
            })
        });
        held_rx.recv().unwrap();
        // SAFETY: the child only takes fresh locks of its own and exits with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let fresh = with(|p| p.next == 0 && p.st.is_none() && p.ctxs.is_empty());
            let stack_clear = current_handle().is_none();
            unsafe { libc::_exit(if fresh && stack_clear { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut status = 0;
        let exited = loop {
            // SAFETY: plain waitpid on our child.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                break true;
            }
            if std::time::Instant::now() > deadline {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        STACK.with(|s| s.borrow_mut().clear());
        assert!(exited, "the child hung on the inherited lock");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
        // The parent keeps its state.
        assert!(with(|p| p.next >= 1000));
    }

    #[test]
    fn charge_rounding() {
        assert_eq!(charge_size(1), 512);
        assert_eq!(charge_size(513), 1024);
        assert_eq!(charge_size(MIB2), MIB2);
        assert_eq!(charge_size(MIB2 + 1), 2 * MIB2);
    }

    #[test]
    fn extra_buffer_param() {
        let v: u64 = 123_456;
        let mut size: usize = 8;
        let mut extra: [*mut std::ffi::c_void; 5] = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as _,
            &v as *const u64 as _,
            CU_LAUNCH_PARAM_BUFFER_SIZE as _,
            &mut size as *mut usize as _,
            CU_LAUNCH_PARAM_END as _,
        ];
        assert_eq!(unsafe { first_param_u64(std::ptr::null_mut(), extra.as_mut_ptr()) }, Some(123_456));
        let mut pv: *mut std::ffi::c_void = &v as *const u64 as _;
        assert_eq!(unsafe { first_param_u64(&mut pv, std::ptr::null_mut()) }, Some(123_456));
    }
}
