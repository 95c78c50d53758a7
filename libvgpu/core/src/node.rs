//! Node-level coordination between containers sharing a physical GPU (issue 14).
//!
//! HAMi mounts one node-wide writable directory into every container it manages
//! (`/tmp/vgpulock`; `VGPU_NODE_DIR` overrides it). In it, one small file per physical GPU
//! (`<uuid>.node`) holds one entry per process using that GPU: its container (an id derived from
//! the container's region file), `CUDA_TASK_PRIORITY`, cap, soft cap, a heartbeat, until when it
//! has work queued or running, its latest launch and the container's recent utilization.
//!
//! **Any tenant can write that file.** Nothing here trusts it beyond what a lie may cost:
//! * the file is opened without following a symbolic link (`O_NOFOLLOW`, also on the directory),
//!   used only when it is a regular file of exactly `FILE_SIZE` bytes with our header; anything
//!   else is refused (the caller logs one line and keeps today's behaviour), but a shorter one
//!   with only zeros where the header goes (ours cut short: `: > file`) is sized again; an owner
//!   whose path names another file (deleted, replaced) re-attaches to the one there;
//! * it is never mapped: every access is one `pread`/`pwrite`, so truncating it under us cannot
//!   raise SIGBUS; a short read is a refusal, never a crash;
//! * an entry is believed only with a valid checksum, a heartbeat at most `STALE_NS` old (and not
//!   in the future), a priority clamped to `0..=MAX_PRIORITY`;
//! * what an entry can make others do is hold launches while it claims higher-priority work,
//!   each hold bounded by the limiter's `MAX_HOLD_NS`, withhold the soft cap (never the hard
//!   cap), and keep a lower-priority process at libcuda's timeslice by claiming work beside it
//!   (`may_shorten`): at most the priority advantage a real high-priority tenant would take.
//!   (A tenant that also sets its own channel groups' timeslice short, which the driver allows,
//!   can make a short one of ours switch with it every timeslice: open, README threat model.)
//!
//! Each process owns its entry: it holds an OFD write lock on the entry's lock byte
//! (`LOCK_ENTRY + index`, far beyond the data) for its lifetime, so a claimer that can take the
//! byte knows the owner is gone (the kernel drops the lock when a process dies, SIGKILL included),
//! and only the owner writes the entry (no read-modify-write between processes).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::region::lock;
use crate::regular::OpenError;

/// Where HAMi mounts the node-wide directory.
pub const DEFAULT_DIR: &str = "/tmp/vgpulock";
/// Environment variable overriding `DEFAULT_DIR` (tests; an empty value turns the feature off).
pub const DIR_ENV: &str = "VGPU_NODE_DIR";

pub const MAGIC: [u8; 8] = *b"LVGPUNOD";
pub const VERSION: u32 = 1;
pub const ENTRIES: usize = 64;
pub const ENTRY_SIZE: usize = 64;
pub const HEADER_SIZE: usize = 64;
pub const FILE_SIZE: usize = HEADER_SIZE + ENTRIES * ENTRY_SIZE;

/// An entry whose heartbeat is older than this is ignored (its owner died, froze or lies).
pub const STALE_NS: u64 = 500_000_000;
/// A heartbeat further in the future than this is a lie (or another time namespace): ignored.
pub const FUTURE_NS: u64 = 1_000_000_000;
/// Entries whose owner is gone (lock byte free) are cleared; a claimer may also take one whose
/// heartbeat is this old.
pub const REAP_NS: u64 = 1_000_000_000;
/// Priorities are clamped to `0..=MAX_PRIORITY` (0 = highest, HAMi's `CUDA_TASK_PRIORITY`).
pub const MAX_PRIORITY: i32 = 1000;
/// Declared work: queued estimate plus this, at most `MAX_DECLARE_NS` ahead (then re-declared).
pub const DECLARE_SLACK_NS: u64 = 1_000_000;
pub const MAX_DECLARE_NS: u64 = 200_000_000;
/// After a synchronize found nothing queued, the entry stays busy this much longer: a service
/// answering requests back to back does not let lower priorities slip a kernel in between.
pub const IDLE_GRACE_NS: u64 = 300_000;
/// A lower-priority container whose launches give way (its channel groups could not all be
/// given `LOWER_TIMESLICE_US`) bounds what it keeps queued on the GPU to this estimated GPU time
/// (capped or not), so a higher-priority launch waits behind at most about this much of it. On
/// an H100 beside GPT-2 training, 1 ms gave a service's p99 5.03 ms (alone 2.23), 250 us 3.33 ms,
/// while training kept 0.82 / 0.84 of the GPU time the service left.
pub const LOWER_QUEUE_NS: u64 = 250_000;

/// What a process keeps queued at most on a GPU where a higher-priority container is (`defer`):
/// `LOWER_QUEUE_NS`, unless every channel group of ours runs the timeslice we chose (`all_set`)
/// and that is `LOWER_TIMESLICE_US` (`!shared`) or the higher-priority container has no work now
/// (`!higher_working`). At the short timeslice the GPU switches to the other's work within 50 us
/// whatever we have queued, and a bound only cost us (an H200 GPT-2 training beside a
/// higher-priority container that sent no work kept 0.89 of its rate under a 2 ms bound, 1.00
/// without). At `SHARED_TIMESLICE_US` a request waits up to that long behind each such context
/// with work queued: bounded while the other works (`engaged`), unbounded while it is idle (two
/// trainings beside an idle service did 0.50 of one under the bound, 0.88 at 500 us without it).
pub fn lower_queue_ns(defer: bool, all_set: bool, shared: bool, higher_working: bool) -> Option<u64> {
    (defer && (!all_set || (shared && higher_working))).then_some(LOWER_QUEUE_NS)
}
/// A lower-priority container's channel groups run this timeslice (libcuda's own: 1-2 ms), so
/// the GPU switches to a higher-priority request within about this much of a kernel already
/// running (`rm`). H100, a service beside a training of 20 ms kernels: p99 3.16x alone at
/// libcuda's 2048 us, 1.26x at 200 us, 1.20x at 50 us; the training's rate unchanged.
pub const LOWER_TIMESLICE_US: u64 = 50;
/// A lower-priority process's channel groups run this timeslice while a higher-priority
/// container is on the GPU but the short one is not allowed (another process without higher
/// priority has work there: two contexts at `LOWER_TIMESLICE_US` switch between each other so
/// often that an H200 ran two GPT-2 trainings at almost nothing; at 250 us the pair did 0.65 of
/// one alone, at 500 us 0.88). Shorter than libcuda's (1024 us on an H200): the first request of
/// a higher-priority container after a pause (`ENGAGED_NS`), when these queues are not bounded
/// (`lower_queue_ns`), gets the GPU within about this long per such context, and again after
/// each of its own timeslices until their queues drain.
pub const SHARED_TIMESLICE_US: u64 = 500;
/// Held launches look again this often.
pub const HOLD_POLL_NS: u64 = 100_000;
/// Another container launched this recently (or reports utilization): it has work, no soft cap.
pub const RECENT_NS: u64 = 500_000_000;
/// Lock byte of entry i: `LOCK_ENTRY + i`.
pub const LOCK_ENTRY: i64 = 1 << 40;

const CHECK_SALT: u64 = 0x6c76_6770_756e_6f64;

/// One process's entry (plain values; `encode`/`decode` give the file's bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The container (nonzero): processes with the same id are one container.
    pub container: u64,
    /// CLOCK_MONOTONIC (`clock::now_ns`) of the owner's latest refresh.
    pub heartbeat_ns: u64,
    /// The owner has work queued or running until then (declared; 0 or past = idle).
    pub active_until_ns: u64,
    /// The owner's own latest launch on this GPU (0 = none; `own_activity`).
    pub last_launch_ns: u64,
    pub priority: i32,
    /// Hard SM cap in percent (0 = none).
    pub cap: u32,
    /// Soft SM cap in percent (0 = none).
    pub soft_cap: u32,
    /// The container's recent utilization, percent x 100, while the owner's own latest launch
    /// is at most 2 s old (else 0: `own_activity`).
    pub util_centi: u32,
    /// The owner's pid (in its own namespace; informational).
    pub pid: u32,
}

/// What one entry of a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Free,
    Used(Entry),
    /// Bytes that are not an entry of ours (bad checksum, zero container): ignored.
    Corrupt,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut b = [0u8; ENTRY_SIZE];
        b[0..8].copy_from_slice(&self.container.to_le_bytes());
        b[8..16].copy_from_slice(&self.heartbeat_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.active_until_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.last_launch_ns.to_le_bytes());
        b[32..36].copy_from_slice(&self.priority.to_le_bytes());
        b[36..40].copy_from_slice(&self.cap.to_le_bytes());
        b[40..44].copy_from_slice(&self.soft_cap.to_le_bytes());
        b[44..48].copy_from_slice(&self.util_centi.to_le_bytes());
        b[48..52].copy_from_slice(&self.pid.to_le_bytes());
        let check = fnv(&b[..56]) ^ CHECK_SALT;
        b[56..64].copy_from_slice(&check.to_le_bytes());
        b
    }

    /// The entry in `b` (`ENTRY_SIZE` bytes; anything else is `Corrupt`).
    pub fn decode(b: &[u8]) -> Slot {
        if b.len() != ENTRY_SIZE {
            return Slot::Corrupt;
        }
        if b.iter().all(|&x| x == 0) {
            return Slot::Free;
        }
        let e = Entry {
            container: u64_at(b, 0),
            heartbeat_ns: u64_at(b, 8),
            active_until_ns: u64_at(b, 16),
            last_launch_ns: u64_at(b, 24),
            priority: u32_at(b, 32) as i32,
            cap: u32_at(b, 36),
            soft_cap: u32_at(b, 40),
            util_centi: u32_at(b, 44),
            pid: u32_at(b, 48),
        };
        if e.container == 0 || u32_at(b, 52) != 0 || u64_at(b, 56) != fnv(&b[..56]) ^ CHECK_SALT {
            return Slot::Corrupt;
        }
        Slot::Used(e)
    }
}

/// The header of a fresh file.
pub fn header() -> [u8; HEADER_SIZE] {
    let mut h = [0u8; HEADER_SIZE];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(ENTRIES as u32).to_le_bytes());
    h[16..20].copy_from_slice(&(ENTRY_SIZE as u32).to_le_bytes());
    h
}

/// The entries of a whole file's bytes, or why the file is not one of ours.
pub fn parse(bytes: &[u8]) -> Result<Vec<Slot>, &'static str> {
    if bytes.len() != FILE_SIZE {
        return Err("wrong size");
    }
    if bytes[..HEADER_SIZE] != header() {
        return Err("not a libvgpu node file of this version (bad header)");
    }
    Ok(bytes[HEADER_SIZE..].chunks(ENTRY_SIZE).map(Entry::decode).collect())
}

/// File name for a GPU UUID; `None` for a UUID that is not a plain name.
pub fn file_name(uuid: &str) -> Option<String> {
    let ok = !uuid.is_empty() && uuid.len() <= 96 && uuid.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    ok.then(|| format!("{uuid}.node"))
}

/// The directory to use: `VGPU_NODE_DIR` (empty = off; any bytes, a path need not be UTF-8),
/// else `DEFAULT_DIR`.
pub fn dir_from(value: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    match value {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => Some(PathBuf::from(DEFAULT_DIR)),
    }
}

/// A container id from its region file's identity (device, inode): unique on the host while the
/// file exists, the same for every process of the container. Never 0.
pub fn container_id(dev: u64, ino: u64) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&dev.to_le_bytes());
    b[8..].copy_from_slice(&ino.to_le_bytes());
    fnv(&b).max(1)
}

// ---- policy (pure) ---------------------------------------------------------------------------

/// The entry is believed: fresh heartbeat, not from the future.
pub fn live(e: &Entry, now: u64) -> bool {
    e.heartbeat_ns <= now.saturating_add(FUTURE_NS) && now.saturating_sub(e.heartbeat_ns) <= STALE_NS
}

pub fn priority_of(e: &Entry) -> i32 {
    e.priority.clamp(0, MAX_PRIORITY)
}

/// It declares work queued or running now.
pub fn busy(e: &Entry, now: u64) -> bool {
    e.active_until_ns > now
}

/// A time an entry gave (0: never) lies at most `window_ns` before `now` (a future one does not).
fn within(t: u64, now: u64, window_ns: u64) -> bool {
    t != 0 && t <= now && now - t <= window_ns
}

/// It has work by any sign: declared, a launch within `RECENT_NS`, or recent utilization.
fn has_work(e: &Entry, now: u64) -> bool {
    busy(e, now) || within(e.last_launch_ns, now, RECENT_NS) || e.util_centi >= 500
}

/// A higher-priority container counts as working this long after its latest launch or declared
/// work: a service answering a request at least this often keeps lower-priority queues bounded
/// (`lower_queue_ns`) between its requests. After a longer pause, its first request meets them
/// unbounded (its launch path declares that work at once, so the next ones of the burst do not).
pub const ENGAGED_NS: u64 = 5_000_000_000;

/// It works or worked lately: declared work now or that ended within `ENGAGED_NS` (the launch
/// path writes it at each request; the latest launch only reaches the entry at the owner's next
/// monitor tick), a launch within `ENGAGED_NS`, or utilization.
fn engaged(e: &Entry, now: u64) -> bool {
    has_work(e, now) || within(e.last_launch_ns, now, ENGAGED_NS) || within(e.active_until_ns, now, ENGAGED_NS)
}

/// May the process owning entry `mine` (priority `my_priority`) give its channel groups
/// `LOWER_TIMESLICE_US`? Only while every other process with work on the GPU (of any container,
/// its own included: each has its own context) has a higher priority. Two contexts that both run
/// the short timeslice switch between each other every `LOWER_TIMESLICE_US`: on an H200, two
/// GPT-2 trainings whose groups were all at 50 us made almost no progress for minutes (GPU 99%
/// busy), where at libcuda's timeslice the pair did 1.15x one alone. A higher-priority one runs
/// libcuda's timeslice, so one short context beside it costs nothing of the kind.
///
/// Entries say what each process did itself (`own_activity`), so an idle process of a busy
/// container does not count. A slot that is not a live entry but whose lock byte a live process
/// holds (`owned`: a tenant zeroed or garbled it, or its owner is frozen with work queued)
/// counts as one with work: it cannot be told apart from one.
pub fn may_shorten(slots: &[Slot], mine: usize, my_priority: i32, now: u64, owned: impl Fn(usize) -> bool) -> bool {
    let me = my_priority.clamp(0, MAX_PRIORITY);
    slots.iter().enumerate().all(|(i, s)| match s {
        _ if i == mine => true,
        Slot::Used(e) if live(e, now) => priority_of(e) < me || !has_work(e, now),
        // Stale (frozen, or detached after a read error, or an orphan's descriptor): judged by
        // what it said at its last heartbeat, if a live process still holds it.
        Slot::Used(e) => !owned(i) || priority_of(e) < me || !has_work(e, e.heartbeat_ns),
        _ => !owned(i),
    })
}

/// One GPU of a process, as the short-timeslice decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuView {
    /// A live higher-priority container is there.
    pub higher: bool,
    /// We launched there within `RECENT_NS` (our groups there may have work queued).
    pub active: bool,
    /// `may_shorten` there; `None`: no usable node entry (nobody there would see us short).
    pub may: Option<bool>,
}

/// Shorten our channel groups (they are not told apart by GPU)? While a higher-priority
/// container is on some GPU of ours, and every GPU we work on allows it. A GPU we do not work on
/// gives no opinion: a data-parallel rank sees every GPU of its pod but runs on its own, and the
/// other ranks' work there would otherwise keep every rank long.
pub fn shorten_everywhere(gpus: &[GpuView]) -> bool {
    gpus.iter().any(|g| g.higher) && gpus.iter().all(|g| !g.active || g.may == Some(true))
}

/// The timeslice our channel groups should run (`None`: libcuda's own): `LOWER_TIMESLICE_US`
/// where `shorten_everywhere` allows it; else `SHARED_TIMESLICE_US` while a higher-priority
/// container is on a GPU we work on; else libcuda's (a data-parallel rank beside an
/// equal-priority peer on its own GPU, the service on another GPU it does not use).
pub fn group_timeslice_us(gpus: &[GpuView]) -> Option<u64> {
    if shorten_everywhere(gpus) {
        Some(LOWER_TIMESLICE_US)
    } else if gpus.iter().any(|g| g.higher && g.active) {
        Some(SHARED_TIMESLICE_US)
    } else {
        None
    }
}

/// This process's latest launch on one GPU for its entry: `gated_ns`, its latest gated launch
/// there (the launch path knows the GPU), or `now` when it made ungated launches since the last
/// tick (`launched`) and those can only have been on this GPU (`single_gpu`) or the process has
/// no gated launches to tell GPUs apart (`!gated`).
pub fn own_last_launch(gated_ns: u64, launched: bool, single_gpu: bool, gated: bool, now: u64) -> u64 {
    gated_ns.max(if launched && (single_gpu || !gated) { now } else { 0 })
}

/// A process's own figures for its entry on one GPU: its latest launch there (never moving back
/// from `prev_last_launch_ns`), and the container's utilization only while that launch is at
/// most 2 s old (the container's figures in every entry would make each idle process of a busy
/// container look busy to `may_shorten`). Containers' views (`peers`, `turn`, `containers`)
/// merge their processes' entries, so they still see the container's latest launch.
pub fn own_activity(prev_last_launch_ns: u64, own_last_launch_ns: u64, container_util_centi: u32, now: u64) -> (u64, u32) {
    let last = prev_last_launch_ns.max(own_last_launch_ns);
    let fresh = last != 0 && now.saturating_sub(last) <= 2_000_000_000;
    (last, if fresh { container_util_centi.min(10_000) } else { 0 })
}

/// What a process learns about the other containers on its GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peers {
    /// A live container of higher priority (lower number) is on the GPU: hold while it is busy.
    pub higher: bool,
    /// ... and it has work queued or running now.
    pub higher_busy: bool,
    /// ... and it worked lately (`engaged`): a service between requests still counts.
    pub higher_working: bool,
    /// A live container of lower priority is on the GPU: declare our work so it can hold.
    pub lower: bool,
    /// Other live containers seen.
    pub others: usize,
    /// Entries ignored as corrupt.
    pub corrupt: usize,
}

/// Peers of container `me` at priority `my_priority`.
pub fn peers(slots: &[Slot], me: u64, my_priority: i32, now: u64) -> Peers {
    let mine = my_priority.clamp(0, MAX_PRIORITY);
    let mut p = Peers::default();
    let mut seen: Vec<u64> = Vec::new();
    for s in slots {
        let e = match s {
            Slot::Free => continue,
            Slot::Corrupt => {
                p.corrupt += 1;
                continue;
            }
            Slot::Used(e) => e,
        };
        if e.container == me || !live(e, now) {
            continue;
        }
        if !seen.contains(&e.container) {
            seen.push(e.container);
        }
        let prio = priority_of(e);
        if prio < mine {
            p.higher = true;
            p.higher_busy |= busy(e, now);
            p.higher_working |= engaged(e, now);
        } else if prio > mine {
            p.lower = true;
        }
    }
    p.others = seen.len();
    p
}

/// Capped containers of one priority that all have work take turns on the GPU within this
/// period, each for its cap's share of it: side by side, the GPU time-slices their contexts and
/// every switch costs GPU time (an H100 ran two saturating containers at 44.4% of one's
/// throughput each, capped 50/50 or 30/60).
pub const TURN_PERIOD_NS: u64 = 40_000_000;
/// A container takes part in the turns while it launched this recently: as long as it counts as
/// busy for the soft cap (a few monitor ticks, so a late heartbeat does not break the turns).
pub const TURN_RECENT_NS: u64 = RECENT_NS;
/// Launches run this long after they are made (a kernel or two): a container launches this much
/// ahead of its part of the period (`Turn::wait_ns`).
pub const TURN_LEAD_NS: u64 = 2_000_000;

/// Our part of each `TURN_PERIOD_NS` (host CLOCK_MONOTONIC, shared by every container of the
/// node): from `offset_ns` for `len_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turn {
    pub offset_ns: u64,
    pub len_ns: u64,
}

impl Turn {
    /// How long a launch at `now` waits for our part of the period (0: it is ours now). Launches
    /// go `TURN_LEAD_NS` ahead of the part they run in: ours queue just before it begins (the
    /// GPU switches as soon as the previous container's last kernel ends) and stop as long
    /// before it ends (our last kernel ends about when the next container's part begins).
    pub fn wait_ns(&self, now: u64) -> u64 {
        let pos = (now + TURN_LEAD_NS) % TURN_PERIOD_NS;
        let from = self.offset_ns;
        if pos >= from && pos < from + self.len_ns {
            return 0;
        }
        (from + TURN_PERIOD_NS - pos) % TURN_PERIOD_NS
    }
}

/// Our turn, when container `me` (priority `my_priority`, hard and soft cap `my_caps`) shares
/// the GPU with other live containers of its priority that have a hard cap (1..=99) and launched
/// within `TURN_RECENT_NS`: ordered by container id, each gets its share of the period, one after
/// another: its hard cap, plus, where the file accounts for the GPU (`share_spare`, as for
/// `soft_ceiling`), its part of what the hard caps leave (`policy::caps::soft_shares`). `None`:
/// we are not capped, no such other container is there, or the hard caps add up to more than 100.
pub fn turn(slots: &[Slot], me: u64, my_priority: i32, my_caps: (Option<u32>, Option<u32>), share_spare: bool, now: u64) -> Option<Turn> {
    let my_cap = my_caps.0.filter(|c| (1..100).contains(c))?;
    let mine = my_priority.clamp(0, MAX_PRIORITY);
    let my_soft = if share_spare { my_caps.1.unwrap_or(0) } else { 0 };
    let mut parts: Vec<(u64, u32, u32)> = vec![(me, my_cap, my_soft)];
    for s in slots {
        let Slot::Used(e) = s else { continue };
        let recent = within(e.last_launch_ns, now, TURN_RECENT_NS);
        if e.container == me || !live(e, now) || priority_of(e) != mine || !(1..100).contains(&e.cap) || !recent {
            continue;
        }
        join(&mut parts, e, if share_spare { e.soft_cap } else { 0 });
    }
    if parts.len() < 2 {
        return None;
    }
    // Caps adding up past 100 (an overcommitted GPU, or an entry that lies): no turns, or a
    // liar claiming a large cap would shrink our part below our cap.
    if parts.iter().map(|p| p.1 as u64).sum::<u64>() > 100 {
        return None;
    }
    parts.sort();
    let shares = crate::policy::caps::soft_shares(&parts.iter().map(|p| (p.1, p.2)).collect::<Vec<_>>());
    let mut offset = 0;
    for (p, share) in parts.iter().zip(shares) {
        let len = TURN_PERIOD_NS * share as u64 / 100;
        if p.0 == me {
            return Some(Turn { offset_ns: offset, len_ns: len });
        }
        offset += len;
    }
    None
}

/// Add entry `e`'s container (hard cap `e.cap`, soft cap `soft`) to `parts` (container, hard,
/// soft) for `policy::caps::soft_shares`: a container seen in several entries takes the largest
/// of each (an uncapped process of it: the whole GPU, `policy::caps::reserved`).
fn join(parts: &mut Vec<(u64, u32, u32)>, e: &Entry, soft: u32) {
    use crate::policy::caps::reserved;
    match parts.iter_mut().find(|p| p.0 == e.container) {
        Some(p) => (p.1, p.2) = (reserved(p.1).max(reserved(e.cap)), p.2.max(soft)),
        None => parts.push((e.container, e.cap, soft)),
    }
}

/// Until when to declare work: what we have queued (estimated), plus slack, bounded.
pub fn declare_until(now: u64, queued_est_ns: u64) -> u64 {
    now + queued_est_ns.min(MAX_DECLARE_NS) + DECLARE_SLACK_NS
}

/// How far our soft cap may reach now (`policy::effective_cap`'s ceiling): with a node view
/// that accounts for the GPU, our share of the spare (`soft_ceiling`); else all of it while NVML
/// sees no other tenant busy, nothing otherwise (the rule without a node file).
pub fn soft_ceiling_now(node: Option<u32>, nvml_others_idle: bool) -> u32 {
    node.unwrap_or(if nvml_others_idle { 100 } else { 0 })
}

/// Does the node file account for every process NVML lists on the GPU (`listed`; `None`: NVML
/// cannot say)? Only then may the spare be shared by the file: a tenant missing from it (no node
/// directory mounted, a full file, a process not under libvgpu, an entry gone stale) would lose
/// its hard cap to the spare the others hand out among themselves.
pub fn accounts_for(slots: &[Slot], listed: Option<usize>, now: u64) -> bool {
    let entries = slots.iter().filter(|s| matches!(s, Slot::Used(e) if live(e, now))).count();
    listed.is_some_and(|n| n <= entries)
}

/// Our share (`policy::caps::soft_shares`, 100 when no other container has work) among the live
/// containers with work on the GPU, `me` (hard and soft cap `my_caps`) counted as one of them;
/// `None` when the file does not account for the GPU (`accounts_for`). Each other container
/// takes its entries' largest caps (an uncapped process of it: the whole GPU). The containers
/// are ordered by id, so those that see the same work compute the same split (one that has just
/// started counts itself before the others see its work: a tick or two). A lying entry can take
/// the spare from us, never our hard cap.
pub fn soft_ceiling(slots: &[Slot], me: u64, my_caps: (u32, u32), now: u64, listed: Option<usize>) -> Option<u32> {
    if !accounts_for(slots, listed, now) {
        return None;
    }
    let mut parts: Vec<(u64, u32, u32)> = vec![(me, my_caps.0, my_caps.1)];
    for s in slots {
        let Slot::Used(e) = s else { continue };
        if e.container == me || !live(e, now) || !has_work(e, now) {
            continue;
        }
        join(&mut parts, e, e.soft_cap);
    }
    if parts.len() == 1 {
        return Some(100);
    }
    parts.sort_by_key(|p| p.0);
    let caps: Vec<(u32, u32)> = parts.iter().map(|p| (p.1, p.2)).collect();
    let mine = parts.iter().position(|p| p.0 == me).unwrap_or(0);
    Some(crate::policy::caps::soft_shares(&caps)[mine])
}

/// May a claimer take entry `s` once it holds the entry's lock byte (so no owner lives)?
/// Free, corrupt and dead entries yes; a live-looking one only when its heartbeat is old.
pub fn claimable(s: &Slot, now: u64) -> bool {
    match s {
        Slot::Used(e) => !live(e, now) || now.saturating_sub(e.heartbeat_ns) > REAP_NS,
        _ => true,
    }
}

/// Per-container summary for the tools: entries of one container merged (live ones only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerView {
    pub container: u64,
    pub priority: i32,
    pub cap: u32,
    pub soft_cap: u32,
    pub util_centi: u32,
    pub busy: bool,
    pub processes: usize,
    pub last_launch_ns: u64,
}

pub fn containers(slots: &[Slot], now: u64) -> Vec<ContainerView> {
    let mut out: Vec<ContainerView> = Vec::new();
    for s in slots {
        let Slot::Used(e) = s else { continue };
        if !live(e, now) {
            continue;
        }
        match out.iter_mut().find(|c| c.container == e.container) {
            Some(c) => {
                c.priority = c.priority.min(priority_of(e));
                c.cap = c.cap.max(e.cap);
                c.soft_cap = c.soft_cap.max(e.soft_cap);
                c.util_centi = c.util_centi.max(e.util_centi.min(10_000));
                c.busy |= busy(e, now);
                c.processes += 1;
                c.last_launch_ns = c.last_launch_ns.max(e.last_launch_ns);
            }
            None => out.push(ContainerView {
                container: e.container,
                priority: priority_of(e),
                cap: e.cap,
                soft_cap: e.soft_cap,
                util_centi: e.util_centi.min(10_000),
                busy: busy(e, now),
                processes: 1,
                last_launch_ns: e.last_launch_ns,
            }),
        }
    }
    out.sort_by_key(|c| (c.priority, c.container));
    out
}

// ---- the file ----------------------------------------------------------------------------------

/// Why a node file is not used.
#[derive(Debug)]
pub enum NodeError {
    /// The directory does not exist: the feature is off (no message).
    NoDir,
    /// Anything else: one line for the log; the caller keeps today's behaviour.
    Refused(String),
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeError::NoDir => write!(f, "no node directory"),
            NodeError::Refused(s) => f.write_str(s),
        }
    }
}

/// An open node file (one GPU). Only `pread`/`pwrite`: never mapped.
pub struct NodeFile {
    file: File,
    pub path: PathBuf,
}

fn refused(path: &Path, why: impl std::fmt::Display) -> NodeError {
    NodeError::Refused(format!("node file {}: {why}; node-level coordination is off for this GPU", path.display()))
}

/// Why opening failed, for the line: a permission error says which access this uid lacks (a
/// file another tenant's uid made, 0644 or 000), as "Permission denied" alone does not.
pub fn open_failure(e: &io::Error, write: bool, euid: u32) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => format!("uid {euid} may not {} it ({e})", if write { "read and write" } else { "read" }),
        _ => e.to_string(),
    }
}

fn cstr(s: &[u8]) -> std::ffi::CString {
    std::ffi::CString::new(s).unwrap_or_default()
}

impl NodeFile {
    /// Open `<dir>/<uuid>.node`, creating it when absent and `write` is set. Nothing follows a
    /// symbolic link (the directory itself included); a file that is not exactly ours is refused.
    pub fn open(dir: &Path, uuid: &str, write: bool) -> Result<NodeFile, NodeError> {
        use std::os::unix::ffi::OsStrExt;
        let name = file_name(uuid).ok_or_else(|| refused(&dir.join("?"), format!("GPU UUID {uuid:?} is not a plain name")))?;
        let path = dir.join(&name);
        let d = cstr(dir.as_os_str().as_bytes());
        // SAFETY: valid C string; the descriptor is closed below.
        let dfd = unsafe { libc::open(d.as_ptr(), libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_PATH) };
        if dfd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => NodeError::NoDir,
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => refused(dir, "the directory is a symbolic link or not a directory"),
                _ => refused(dir, e),
            });
        }
        // SAFETY: dfd is ours.
        let _dir = unsafe { File::from_raw_fd(dfd) };
        let n = cstr(name.as_bytes());
        let access = if write { libc::O_RDWR } else { libc::O_RDONLY };
        let (file, created) = crate::regular::open(Some(dfd), &n, access, write, 0o666).map_err(|e| match e {
            OpenError::Io(e) if e.raw_os_error() == Some(libc::ENOENT) && !write => NodeError::NoDir,
            // SAFETY: trivial syscall.
            OpenError::Io(e) => refused(&path, open_failure(&e, write, unsafe { libc::geteuid() })),
            OpenError::Symlink => refused(&path, "is a symbolic link; not following it"),
            OpenError::NotRegular => refused(&path, "not a regular file"),
            OpenError::Unsteady => refused(&path, "keeps appearing and disappearing"),
        })?;
        let meta = file.metadata().map_err(|e| refused(&path, e))?;
        let nf = NodeFile { file, path };
        if created {
            // Every tenant writes this file (HAMi runs containers under any uid).
            // SAFETY: valid descriptor.
            unsafe { libc::fchmod(nf.file.as_raw_fd(), 0o666) };
        }
        match meta.len() {
            len if len as usize == FILE_SIZE => {
                let mut h = [0u8; HEADER_SIZE];
                nf.file.read_exact_at(&mut h, 0).map_err(|e| refused(&nf.path, e))?;
                if h.iter().all(|&b| b == 0) && write {
                    nf.init()?; // a creator died between sizing and the header: same bytes
                } else if h != header() {
                    return Err(refused(&nf.path, "not a libvgpu node file of this version (bad header)"));
                }
            }
            // Empty (a creator died before sizing it), or cut short under its owners.
            len if write && len < FILE_SIZE as u64 && nf.cut_short(len) => nf.init()?,
            0 => return Err(refused(&nf.path, "empty")),
            len => return Err(refused(&nf.path, format!("{len} bytes, expected {FILE_SIZE}"))),
        }
        if write {
            nf.allocate()?; // made sparse elsewhere: our entry's write must not meet a full disk
        }
        Ok(nf)
    }

    /// Real blocks for the whole file (sized too), so writing an entry cannot fail on a full disk.
    fn allocate(&self) -> Result<(), NodeError> {
        crate::regular::allocate(&self.file, FILE_SIZE as u64).map_err(|e| refused(&self.path, format!("cannot allocate its blocks ({e})")))
    }

    /// Size the file and write the header (idempotent: racing initializers write the same bytes).
    fn init(&self) -> Result<(), NodeError> {
        self.allocate()?;
        self.file.write_all_at(&header(), 0).map_err(|e| refused(&self.path, e))
    }

    /// Is this file (`len` bytes, fewer than ours) one of ours cut short: only zeros where the
    /// header goes? (`: > file` under running owners, whose heartbeats then write their entries
    /// past the end, zeros up to them; or a creator that died before sizing it.)
    fn cut_short(&self, len: u64) -> bool {
        let mut h = vec![0u8; (len as usize).min(HEADER_SIZE)];
        self.file.read_exact_at(&mut h, 0).is_ok() && h.iter().all(|&b| b == 0)
    }

    /// Size and head again a file cut short under us (`cut_short`; the same bytes as racing
    /// repairers write, entries written since are kept). `false`: it is not that, or sizing failed.
    pub fn repair(&self) -> bool {
        matches!(self.file.metadata(), Ok(m) if m.len() < FILE_SIZE as u64 && self.cut_short(m.len())) && self.init().is_ok()
    }

    /// Does the path name another file than ours now (deleted, or another moved there)? One
    /// `lstat`. An owner left on the old file would no longer see newcomers, nor they it.
    pub fn replaced(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(ours) = self.file.metadata() else { return false };
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) => (m.dev(), m.ino()) != (ours.dev(), ours.ino()),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        }
    }

    /// Every entry, or why the file is no longer usable (truncated, overwritten).
    pub fn read(&self) -> Result<Vec<Slot>, String> {
        let mut buf = vec![0u8; FILE_SIZE];
        match self.file.read_at(&mut buf, 0) {
            Ok(n) if n == FILE_SIZE => parse(&buf).map_err(str::to_owned),
            Ok(n) => Err(format!("truncated ({n} bytes)")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Write entry `idx` (ours: we hold its lock byte). A failed write is reported, never fatal.
    pub fn write(&self, idx: usize, e: &Entry) -> bool {
        idx < ENTRIES && self.file.write_all_at(&e.encode(), (HEADER_SIZE + idx * ENTRY_SIZE) as u64).is_ok()
    }

    /// Free entry `idx` (ours, or one whose lock byte we took): readers drop it at once. Its lock
    /// byte stays with whoever holds it.
    pub fn clear(&self, idx: usize) {
        let _ = self.file.write_all_at(&[0u8; ENTRY_SIZE], (HEADER_SIZE + idx * ENTRY_SIZE) as u64);
    }

    /// Take an entry for this process: lock its byte (held until the file is closed), then use it
    /// if it is free, corrupt or dead. `Ok(None)` when every entry is taken; why, where the file
    /// went bad meanwhile.
    pub fn claim(&self, now: u64) -> Result<Option<usize>, String> {
        let fd = self.file.as_raw_fd();
        for idx in 0..ENTRIES {
            if !lock::try_lock(fd, true, LOCK_ENTRY + idx as i64).unwrap_or(false) {
                continue;
            }
            let slots = self.read().inspect_err(|_| lock::unlock(fd, LOCK_ENTRY + idx as i64))?;
            if claimable(&slots[idx], now) {
                self.clear(idx);
                return Ok(Some(idx));
            }
            lock::unlock(fd, LOCK_ENTRY + idx as i64);
        }
        Ok(None)
    }

    /// Does another process hold entry `idx`'s lock byte (a live owner, whatever the entry says)?
    pub fn owned_elsewhere(&self, idx: usize) -> bool {
        idx < ENTRIES && lock::held_by_other(self.file.as_raw_fd(), LOCK_ENTRY + idx as i64)
    }

    /// Clear entries whose owner is gone (their lock byte can be taken). Never waits.
    pub fn reap(&self, own: Option<usize>) -> usize {
        let Ok(slots) = self.read() else { return 0 };
        let fd = self.file.as_raw_fd();
        let mut n = 0;
        for (idx, s) in slots.iter().enumerate() {
            if Some(idx) == own || *s == Slot::Free {
                continue;
            }
            if lock::try_lock(fd, true, LOCK_ENTRY + idx as i64).unwrap_or(false) {
                self.clear(idx);
                lock::unlock(fd, LOCK_ENTRY + idx as i64);
                n += 1;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests;
