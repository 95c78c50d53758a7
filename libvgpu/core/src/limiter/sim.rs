//! The policy against a simulated GPU: virtual time, one in-order queue per stream, kernels of
//! one process running side by side while they fit (each takes a fraction of the GPU), one
//! process's context on the GPU at a time (its pending work first, another's when it has none
//! or its time slice is up), launch and synchronize costs like a real driver, sleeps that
//! overshoot like Linux timer slack, and any number of threads and processes scheduled as
//! discrete events. Checks that every launch pattern gets min(cap, u0) of the GPU and
//! min(1, cap/u0) of its uncapped throughput.

use super::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

const LAUNCH_CPU_NS: u64 = 2_500;
const LAUNCH_LATENCY_NS: u64 = 3_000;
const SYNC_RETURN_NS: u64 = 4_000;
const SLEEP_OVERSHOOT_NS: u64 = 60_000;
const PAUSE_NS: u64 = 1_500;
/// A launch blocks while its stream holds more than this much work, as a real driver blocks when
/// its queue is full.
const DRIVER_QUEUE_NS: u64 = 20_000_000;
/// How long one process's context keeps the GPU while another's has work waiting (a guess:
/// the driver's default is not documented; every test here passes with 0.5 ms as with 2 ms).
const TIMESLICE_NS: u64 = 2_000_000;
const T0: u64 = 1_000_000_000;
const SEC: u64 = 1_000_000_000;
/// Results are kept per window of this length. NVML's own samples are 200 ms apart on an H100
/// (`nvmlDeviceGetSamples`), but the reading `nvmlDeviceGetUtilizationRates` gives each second
/// (what `bench/py/share.py` judges) covers less: 8 threads under a cap of 25 read 18-35 where
/// the 200 ms samples of the same seconds read 21-31.
const WIN: u64 = SEC / 10;
const WINS_PER_SEC: usize = (SEC / WIN) as usize;

/// Work queued on one stream of the simulated GPU, in order.
enum Item {
    Kernel { arrive: u64, dur: u64, frac: u64 },
    Event { arrive: u64, id: u64 },
}

impl Item {
    fn arrive(&self) -> u64 {
        match *self {
            Item::Kernel { arrive, .. } | Item::Event { arrive, .. } => arrive,
        }
    }
}

#[derive(Default)]
struct Stream {
    proc: usize,
    /// Not yet finished; the head may be running.
    q: VecDeque<Item>,
    running: bool,
    /// GPU time of its kernels not yet started.
    waiting_ns: u64,
    /// When its last finished item finished.
    done_at: u64,
}

/// The device, run lazily: kernels start when the simulation reaches them, so work a process
/// queues while its context is on the GPU joins what runs there before other processes'.
#[derive(Default)]
struct Gpu {
    /// Host time: the latest any thread acted at.
    now: u64,
    /// Device time: everything before it is decided (never ahead of `now`).
    t: u64,
    streams: BTreeMap<u64, Stream>,
    /// Running kernels: (end, fraction of the GPU in per-mille, stream).
    running: Vec<(u64, u64, u64)>,
    /// The process whose context the GPU runs, and since when.
    resident: Option<(usize, u64)>,
    /// When each recorded event completed (`u64::MAX`: not yet).
    events: HashMap<u64, u64>,
    next_ev: u64,
    /// (start, end, process) of every kernel started.
    kernels: Vec<(u64, u64, usize)>,
}

impl Gpu {
    fn stream(&mut self, key: u64, proc: usize) -> &mut Stream {
        self.streams.entry(key).or_insert_with(|| Stream { proc, ..Default::default() })
    }

    fn launch(&mut self, key: u64, proc: usize, arrive: u64, dur: u64, frac: u64) {
        let st = self.stream(key, proc);
        st.q.push_back(Item::Kernel { arrive, dur, frac });
        st.waiting_ns += dur;
    }

    fn record(&mut self, key: u64, proc: usize, arrive: u64) -> u64 {
        self.next_ev += 1;
        let id = self.next_ev;
        self.events.insert(id, u64::MAX);
        self.stream(key, proc).q.push_back(Item::Event { arrive, id });
        id
    }

    /// GPU time still queued on a stream (what a driver's queue holds).
    fn queued_ns(&self, key: u64) -> u64 {
        let Some(st) = self.streams.get(&key) else { return 0 };
        let running_left = self.running.iter().find(|k| k.2 == key).map_or(0, |k| k.0 - self.t);
        running_left + st.waiting_ns
    }

    /// When the last of these streams finished its work, if all have.
    fn drained(&self, keys: impl Iterator<Item = u64>) -> Option<u64> {
        let mut at = 0;
        for k in keys {
            match self.streams.get(&k) {
                Some(st) if !st.q.is_empty() => return None,
                Some(st) => at = at.max(st.done_at),
                None => {}
            }
        }
        Some(at)
    }

    /// The next time after `t` the device changes: a kernel ends or queued work arrives.
    fn next_change(&self) -> Option<u64> {
        let ends = self.running.iter().map(|k| k.0);
        let arrivals = self.streams.values().filter(|st| !st.running).filter_map(|st| st.q.front()).map(Item::arrive).filter(|&a| a > self.t);
        ends.chain(arrivals).min()
    }

    /// Run the device up to `to`.
    fn advance(&mut self, to: u64) {
        loop {
            self.start_ready();
            match self.next_change() {
                Some(n) if n <= to => {
                    self.t = n;
                    let (done, left): (Vec<_>, Vec<_>) = self.running.iter().partition(|k| k.0 <= n);
                    self.running = left;
                    for (end, _, key) in done {
                        let st = self.streams.get_mut(&key).expect("a running kernel's stream");
                        st.q.pop_front();
                        st.running = false;
                        st.done_at = end;
                    }
                }
                _ => break,
            }
        }
        self.t = self.t.max(to);
    }

    /// At `t`: complete the events that reached their stream's head (whichever context is on the
    /// GPU: with events held until their process is resident, the first of two containers capped
    /// 30 / 60 got 50.8% here, where an H100 gave them 29.2 / 60.7), and start what may run.
    /// One process's context is on the GPU at a time: its arrived kernels run side by side
    /// while they fit; another's start when it has nothing running and none arrived, or when
    /// its `TIMESLICE_NS` is up (at a kernel's end: the simulator does not preempt).
    fn start_ready(&mut self) {
        let t = self.t;
        for st in self.streams.values_mut() {
            while !st.running {
                match st.q.front() {
                    Some(&Item::Event { arrive, id }) if arrive <= t => {
                        self.events.insert(id, t);
                        st.q.pop_front();
                        st.done_at = t;
                    }
                    _ => break,
                }
            }
        }
        // (arrival, stream, process, duration, fraction) of every kernel that may start now.
        let mut ready: Vec<(u64, u64, usize, u64, u64)> = self
            .streams
            .iter()
            .filter(|(_, st)| !st.running)
            .filter_map(|(&k, st)| match st.q.front() {
                Some(&Item::Kernel { arrive, dur, frac }) if arrive <= t => Some((arrive, k, st.proc, dur, frac)),
                _ => None,
            })
            .collect();
        if ready.is_empty() {
            return;
        }
        ready.sort();
        // A slice counts from when another process's work waits, not from when ours began.
        if let Some((p, since)) = self.resident.as_mut() {
            if ready.iter().all(|r| r.2 == *p) {
                *since = t;
            }
        }
        let expired = |res: Option<(usize, u64)>| res.is_some_and(|(p, since)| t - since >= TIMESLICE_NS && ready.iter().any(|r| r.2 != p));
        if self.running.is_empty() {
            let stay = self.resident.is_some_and(|(p, _)| ready.iter().any(|r| r.2 == p)) && !expired(self.resident);
            if !stay {
                let avoid = self.resident.filter(|_| expired(self.resident)).map(|(p, _)| p);
                let next = ready.iter().find(|r| Some(r.2) != avoid).unwrap_or(&ready[0]).2;
                self.resident = Some((next, t));
            }
        } else if expired(self.resident) {
            return; // let the context's kernels drain, then switch
        }
        let (p, _) = self.resident.expect("a resident context");
        let mut used: u64 = self.running.iter().map(|k| k.1).sum();
        for &(_, key, proc, dur, frac) in ready.iter().filter(|r| r.2 == p) {
            if used + frac > 1000 {
                continue;
            }
            used += frac;
            self.running.push((t + dur, frac, key));
            let st = self.streams.get_mut(&key).expect("a ready kernel's stream");
            st.running = true;
            st.waiting_ns -= dur;
            self.kernels.push((t, t + dur, proc));
        }
    }
}
type World = Rc<RefCell<Gpu>>;

struct SimEvents(World);
impl Events for SimEvents {
    type Ev = u64;
    fn poll(&mut self, ev: u64) -> EventState {
        let g = self.0.borrow();
        let t = g.events[&ev];
        if g.now >= t {
            EventState::Done(t)
        } else {
            EventState::Pending
        }
    }
    fn release(&mut self, ev: u64) {
        self.0.borrow_mut().events.remove(&ev);
    }
}

/// How one simulated thread submits work.
#[derive(Clone)]
struct Pattern {
    /// Kernel lengths, cycled (or drawn from, when `random`).
    kernel_ns: Vec<u64>,
    random: bool,
    /// Streams this thread round-robins over.
    streams: u64,
    /// Synchronize after this many launches (0 = never).
    sync_every: u64,
    /// CPU time after each launch (host work between kernels), cycled like `kernel_ns` (a step
    /// whose phases differ in how much host work each kernel takes); empty: none.
    cpu_ns: Vec<u64>,
    /// CPU time after each synchronize, the GPU idle (the host side of a training step).
    sync_cpu_ns: u64,
    /// Fraction of the GPU one kernel occupies (per mille): two 500s of one process run at once.
    frac: u64,
    /// The synchronize is hooked (`cuStreamSynchronize`, `cuEventSynchronize`); false: the
    /// thread busy-polls `cuStreamQuery`, which the hook does not see.
    sync_hooked: bool,
}

impl Pattern {
    fn fixed(kernel_ns: u64, sync_every: u64) -> Self {
        Pattern { kernel_ns: vec![kernel_ns], random: false, streams: 1, sync_every, cpu_ns: Vec::new(), sync_cpu_ns: 0, frac: 1000, sync_hooked: true }
    }
}

struct Thread {
    proc: usize,
    /// Blocked in a synchronize since this host time, until its streams drain.
    waiting: Option<u64>,
    pat: Pattern,
    /// Stream keys of this thread.
    base: u64,
    ready: u64,
    launches: u64,
    syncing: bool,
    /// When its latest synchronize was entered.
    sync_entered: u64,
    rng: u64,
}

struct Proc {
    meter: Meter<u64>,
    evs: SimEvents,
}

/// Run the threads (each `(process, pattern)`) for `secs` virtual seconds under `cap`.
/// Returns per `WIN` (kernels completed, busy ns) summed over every thread.
fn simulate(cap: CapPercent, threads: &[(usize, Pattern)], secs: u64) -> Vec<(u64, u64)> {
    let nproc = threads.iter().map(|t| t.0).max().unwrap_or(0) + 1;
    simulate_containers(&[cap], &vec![0; nproc], threads, secs).remove(0)
}

/// Like `simulate`, with the processes in containers: process `p` belongs to container
/// `container_of[p]`, capped at `caps[container]`, each container with its own bucket. With more
/// than one container every meter knows another tenant is there (as the glue learns from NVML).
/// Returns per container the per-`WIN` (kernels completed, busy ns) of its processes.
fn simulate_containers(caps: &[CapPercent], container_of: &[usize], threads: &[(usize, Pattern)], secs: u64) -> Vec<Vec<(u64, u64)>> {
    let w: World = Rc::new(RefCell::new(Gpu { now: T0, ..Default::default() }));
    let states: Vec<SharedDeviceState> = caps.iter().map(|_| SharedDeviceState::default()).collect();
    let maps: Vec<BusyMap> = caps.iter().map(|_| BusyMap::default()).collect();
    let buckets: Vec<Bucket> = states.iter().zip(&maps).map(|(s, m)| Bucket::new(s, m)).collect();
    let nproc = container_of.len();
    let mut procs: Vec<Proc> = (0..nproc)
        .map(|i| {
            let mut meter = Meter::default();
            meter.owner = i as u64 + 1;
            meter.contended = caps.len() > 1;
            Proc { meter, evs: SimEvents(w.clone()) }
        })
        .collect();
    let mut ths: Vec<Thread> = threads
        .iter()
        .enumerate()
        .map(|(i, (p, pat))| Thread {
            proc: *p,
            waiting: None,
            pat: pat.clone(),
            base: (i as u64 + 1) << 16,
            ready: T0,
            launches: 0,
            syncing: false,
            sync_entered: 0,
            rng: 0x9E37_79B9_7F4A_7C15 ^ i as u64,
        })
        .collect();
    let end = T0 + secs * SEC;
    loop {
        let (i, t) = ths.iter().enumerate().map(|(i, t)| (i, t.ready)).min_by_key(|x| x.1).unwrap();
        // The device first, up to the time the next thread acts at (its turn, or the host time
        // launches moved past it), waking the threads it drains.
        let (change, host) = {
            let g = w.borrow();
            (g.next_change(), g.now)
        };
        if let Some(c) = change.filter(|&c| c <= t.max(host).min(end)) {
            let mut g = w.borrow_mut();
            g.advance(c);
            wake(&g, &mut ths);
            continue;
        }
        if t >= end {
            break;
        }
        let th = &mut ths[i];
        let p = &mut procs[th.proc];
        let bucket = &buckets[container_of[th.proc]];
        let cap = caps[container_of[th.proc]];
        let now = {
            let mut g = w.borrow_mut();
            g.now = g.now.max(t);
            let now = g.now;
            g.advance(now);
            now
        };
        if th.syncing {
            th.syncing = false;
            p.meter.synced(&mut p.evs, bucket, th.sync_entered, now);
            // The host's own work after the synchronize returned.
            th.ready = now + th.pat.sync_cpu_ns;
            continue;
        }
        let key = th.base + th.launches % th.pat.streams;
        match p.meter.gate(&mut p.evs, bucket, cap, key, now) {
            Step::Wait(ns) => {
                // Like the glue: an event now closes the launches without one.
                if p.meter.wants_flush_event(key) {
                    let ev = w.borrow_mut().record(key, th.proc, now + LAUNCH_LATENCY_NS);
                    p.meter.flushed(key, ev, now);
                }
                // Timer slack varies from wake-up to wake-up (and from thread to thread).
                let jitter = xorshift(&mut th.rng) % SLEEP_OVERSHOOT_NS;
                th.ready = now + if ns < SPIN_WAIT_NS { PAUSE_NS } else { ns - SPIN_WAIT_NS + SLEEP_OVERSHOOT_NS / 2 + jitter };
            }
            Step::Go => {
                let queued = w.borrow().queued_ns(key);
                if queued > DRIVER_QUEUE_NS {
                    th.ready = now + (queued - DRIVER_QUEUE_NS);
                    continue;
                }
                let dur = if th.pat.random {
                    let (lo, hi) = (th.pat.kernel_ns[0], th.pat.kernel_ns[1]);
                    lo + xorshift(&mut th.rng) % (hi - lo)
                } else {
                    th.pat.kernel_ns[(th.launches % th.pat.kernel_ns.len() as u64) as usize]
                };
                // Its kind, as the glue names it: one kernel function per length (the random
                // patterns: one function whose length varies, as test_streams --random).
                let kind = kinds::kernel_kind(if th.pat.random { 1 } else { dur }, 1);
                let want_start = p.meter.wants_start_event(key, now);
                let (start_ev, ev) = {
                    let mut g = w.borrow_mut();
                    let arrive = now + LAUNCH_LATENCY_NS;
                    let start_ev = want_start.then(|| g.record(key, th.proc, arrive));
                    g.now += LAUNCH_CPU_NS;
                    g.launch(key, th.proc, arrive, dur, th.pat.frac);
                    // Like the glue: an end event when a start event was recorded, else at
                    // most one per EVENT_SPACING_NS per stream.
                    let ev = (start_ev.is_some() || p.meter.wants_end_event(key, kind, now)).then(|| g.record(key, th.proc, arrive));
                    (start_ev, ev)
                };
                p.meter.launched_kind(key, kind, start_ev, ev, now, &mut p.evs);
                th.launches += 1;
                let cpu = match th.pat.cpu_ns.len() {
                    0 => 0,
                    n => th.pat.cpu_ns[((th.launches - 1) % n as u64) as usize],
                };
                let after = w.borrow().now + cpu;
                if th.pat.sync_every > 0 && th.launches.is_multiple_of(th.pat.sync_every) {
                    // Blocks until every stream of this thread is done (`wake`).
                    th.waiting = Some(after);
                    th.ready = u64::MAX;
                } else {
                    th.ready = after;
                }
            }
        }
    }
    let kernels = w.borrow().kernels.clone();
    (0..caps.len())
        .map(|c| {
            let ks: Vec<(u64, u64)> = kernels.iter().filter(|k| container_of[k.2] == c).map(|k| (k.0, k.1)).collect();
            per_window(ks, threads.iter().any(|t| t.1.random), end, secs)
        })
        .collect()
}

/// Return the threads blocked in a synchronize whose streams the device drained.
fn wake(g: &Gpu, ths: &mut [Thread]) {
    for th in ths.iter_mut() {
        let Some(from) = th.waiting else { continue };
        if let Some(done) = g.drained((0..th.pat.streams).map(|s| th.base + s)) {
            th.waiting = None;
            th.sync_entered = from;
            th.ready = from.max(done + SYNC_RETURN_NS + xorshift(&mut th.rng) % 20_000);
            th.syncing = th.pat.sync_hooked;
            if !th.syncing {
                th.ready += th.pat.sync_cpu_ns;
            }
        }
    }
}

/// Per `WIN` (kernels completed, or GPU work done when `weighted`; busy ns of their union).
fn per_window(mut ks: Vec<(u64, u64)>, weighted: bool, end: u64, secs: u64) -> Vec<(u64, u64)> {
    let mut out = vec![(0u64, 0u64); secs as usize * WINS_PER_SEC];
    for &(s, e) in ks.iter() {
        if e > T0 && e <= end {
            // Throughput: kernels, or GPU work done when kernel lengths vary.
            out[((e - 1 - T0) / WIN) as usize].0 += if weighted { (e - s) / 1000 } else { 1 };
        }
    }
    // Utilization: the union of kernel time (kernels running side by side count once).
    ks.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ks {
        match merged.last_mut() {
            Some(m) if s <= m.1 => m.1 = m.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    for &(s, e) in merged.iter() {
        let mut t = s.max(T0);
        while t < e.min(end) {
            let win = (t - T0) / WIN;
            let seg_end = (T0 + (win + 1) * WIN).min(e).min(end);
            out[win as usize].1 += seg_end - t;
            t = seg_end;
        }
    }
    out
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Mean kernels per window and utilization (%) from second `from` on.
fn summarize(v: &[(u64, u64)], from: usize) -> (f64, f64) {
    let from = from * WINS_PER_SEC;
    let n = (v.len() - from) as f64;
    let k = v[from..].iter().map(|x| x.0).sum::<u64>() as f64 / n;
    let u = v[from..].iter().map(|x| x.1).sum::<u64>() as f64 / n / WIN as f64 * 100.0;
    (k, u)
}

/// Capped vs uncapped: utilization within 3 points of min(cap, u0), every NVML sample (`WIN`) within 8,
/// throughput within 5% of min(1, cap/u0).
fn check(name: &str, threads: &[(usize, Pattern)], secs: u64, caps: &[u32]) {
    let base = simulate(None, threads, secs);
    let (k0, u0) = summarize(&base, 1);
    let print = std::env::var_os("SIM_PRINT").is_some(); // the figures, for exploring
    if print {
        eprintln!("{name}: u0 {u0:.1}");
    }
    for &cap in caps {
        let got = simulate(Some(cap), threads, secs);
        let (k, u) = summarize(&got, 2);
        if print {
            eprintln!("{name}: cap {cap} utilization {u:.1} throughput {:.3}", k / k0);
        }
        let want_u = (cap as f64).min(u0);
        let want_k = (cap as f64 / u0).min(1.0);
        assert!((u - want_u).abs() <= 3.0, "{name}, cap {cap}: utilization {u:.1}% (uncapped {u0:.1}%)");
        assert!(
            ((k / k0) / want_k - 1.0).abs() <= 0.05,
            "{name}, cap {cap}: throughput {:.3} of uncapped, want {want_k:.3} (utilization {u:.1}%)",
            k / k0
        );
        let samples: Vec<f64> = got.iter().map(|s| (s.1 as f64 / WIN as f64 * 1000.0).round() / 10.0).collect();
        for (i, su) in samples.iter().enumerate().skip(2 * WINS_PER_SEC) {
            assert!((su - want_u).abs() <= 8.0, "{name}, cap {cap}: sample {i} at {su:.1}% ({samples:?})");
        }
    }
}

#[rstest::rstest]
fn one_stream_delivers_the_cap(
    #[values(10_000, 100_000, 1_000_000, 10_000_000)] kernel_ns: u64,
    #[values(1, 100, 0)] sync_every: u64,
) {
    let secs = if kernel_ns >= 1_000_000 { 8 } else { 4 };
    check(&format!("{kernel_ns} ns, sync every {sync_every}"), &[(0, Pattern::fixed(kernel_ns, sync_every))], secs, &[10, 25, 50, 75, 90, 95, 97]);
}

#[rstest::rstest]
fn threads_on_their_own_streams_share_one_cap(#[values(2, 4, 8)] n: usize) {
    let threads: Vec<_> = (0..n).map(|_| (0, Pattern::fixed(1_000_000, 1))).collect();
    check(&format!("{n} threads"), &threads, 6, &[25, 50]);
}

#[rstest::rstest]
fn many_threads_hold_the_cap_in_every_sample(#[values(25, 50)] cap: u32) {
    // Eight threads of half-GPU kernels, a synchronize after each (`test_streams --threads 8`
    // on an H100): any thread finding another stream's work queued went in debt beside it, so
    // all eight kept launching until the debt reached `BESIDE_DEBT_NS`, then all waited. The
    // bursts read 45.9-53.9% in 100 ms windows under a cap of 50 here, and 18-35% in an
    // H100's one-a-second readings under a cap of 25.
    let threads: Vec<_> = (0..8).map(|_| (0, Pattern { frac: 500, ..Pattern::fixed(1_000_000, 1) })).collect();
    let got = simulate(Some(cap), &threads, 6);
    let samples: Vec<f64> = got.iter().skip(2 * WINS_PER_SEC).map(|s| s.1 as f64 / WIN as f64 * 100.0).collect();
    let worst = samples.iter().map(|u| (u - cap as f64).abs()).fold(0.0, f64::max);
    assert!(worst <= 3.0, "cap {cap}: a 100 ms window {worst:.1} points off ({samples:.1?})");
}

#[rstest::rstest]
fn threads_whose_kernels_run_side_by_side_keep_their_overlap(#[values(2, 4)] n: usize) {
    // Half-GPU kernels (as 4 blocks of 256 threads per SM are on an H100): uncapped, two run at
    // once; capped, the throughput must still be cap x the uncapped one.
    let threads: Vec<_> = (0..n).map(|_| (0, Pattern { frac: 500, ..Pattern::fixed(1_000_000, 1) })).collect();
    check(&format!("{n} threads, half-GPU kernels"), &threads, 6, &[25, 50]);
}

#[rstest::rstest]
fn async_round_robin_over_streams(#[values(2, 4, 8)] streams: u64) {
    let pat = Pattern { streams, ..Pattern::fixed(1_000_000, 0) };
    check(&format!("{streams} streams"), &[(0, pat)], 6, &[25, 50]);
}

#[rstest::rstest]
fn async_streams_whose_kernels_run_side_by_side_keep_their_overlap(#[values(2, 4)] streams: u64) {
    // An H100 once ran 2 streams of half-GPU 1 ms kernels at 0.465 of uncapped under a cap of
    // 50 (want 0.502), utilization on the cap. The simulation never lost that much (0.494 before
    // `Meter::runs_beside_queued_work`, 0.498 after): a guard, not a reproduction.
    let pat = Pattern { streams, frac: 500, ..Pattern::fixed(1_000_000, 0) };
    check(&format!("{streams} async streams, half-GPU kernels"), &[(0, pat)], 6, &[25, 50]);
}

#[rstest::rstest]
fn threads_polling_their_streams_keep_their_overlap(#[values(2, 4)] n: usize) {
    // Synchronizing by busy-polling cuStreamQuery (not hooked): an H100 once gave 2 threads
    // 0.213 and 0.236 of uncapped under a cap of 25 (want 0.252); here 0.253 (a guard).
    let threads: Vec<_> = (0..n).map(|_| (0, Pattern { frac: 500, sync_hooked: false, ..Pattern::fixed(1_000_000, 1) })).collect();
    check(&format!("{n} threads polling, half-GPU kernels"), &threads, 6, &[25, 50]);
}

#[test]
fn random_kernel_lengths() {
    let pat = Pattern { kernel_ns: vec![10_000, 5_000_000], random: true, ..Pattern::fixed(0, 1) };
    check("10 us..5 ms", &[(0, pat)], 8, &[25, 50]);
}

#[rstest::rstest]
fn short_kernels_of_random_length_synchronized_each(#[values(1, 2)] n: usize) {
    // Launches right after a synchronize get spaced end events: kernels of 5-150 us must still
    // be charged what they ran, the short and the long alike (charged their mean estimate, the
    // long ones were cut short: 27% busy and 0.330 of uncapped throughput under a cap of 25).
    let pat = Pattern { kernel_ns: vec![5_000, 150_000], random: true, ..Pattern::fixed(0, 1) };
    let threads: Vec<_> = (0..n).map(|_| (0, pat.clone())).collect();
    check(&format!("{n} threads, 5..150 us, sync each"), &threads, 6, &[25, 50, 75]);
}

#[test]
fn cpu_time_between_kernels_is_not_charged() {
    // u0 about 50%: a 25% cap halves the throughput, a 75% cap does not slow it.
    let pat = Pattern { cpu_ns: vec![1_000_000], ..Pattern::fixed(1_000_000, 1) };
    check("1 ms kernel + 1 ms CPU", &[(0, pat)], 6, &[25, 75]);
}

#[test]
fn processes_share_one_cap() {
    let threads: Vec<_> = (0..4).map(|p| (p, Pattern::fixed(500_000, 1))).collect();
    check("4 processes", &threads, 6, &[25, 50]);
}

fn four_processes_of_two_threads(frac: u64) {
    // Four processes of two threads, a synchronize after each 1 ms kernel (issue 10's program 10).
    let threads: Vec<_> = (0..8).map(|i| (i / 2, Pattern { frac, ..Pattern::fixed(1_000_000, 1) })).collect();
    check(&format!("4 processes x 2 threads, {frac}/1000 of the GPU each"), &threads, 6, &[25, 50]);
}

#[test]
fn processes_of_two_threads_of_whole_gpu_kernels_hold_every_sample() {
    // At the edge of the bound: 100 ms windows read 20-33 under a cap of 25 and 44-55 under 50
    // (each process commits its own queue bound when the budget reopens, 8 ms at once from four
    // processes, and a window holds two to four such bursts); 34 while a time slice counted
    // from when its process got the GPU rather than from when another's work arrived.
    four_processes_of_two_threads(1000);
}

#[test]
fn processes_of_two_threads_of_half_gpu_kernels_keep_their_pairs() {
    // Each process's two kernels run side by side uncapped. The GPU runs the pending work of the
    // process whose context it runs before another's, so resumed together after a budget
    // closing they keep their pairs (0.228 / 0.460 of uncapped throughput under caps 25 / 50
    // when the simulator placed kernels first come first served across processes; resuming
    // the processes in turns fixed that here and failed cap 50 on an H100 in 3 of 3 runs).
    four_processes_of_two_threads(500);
}

#[test]
fn holds_are_bounded() {
    // A 10 s kernel under a 1% cap: the gate never holds a launch longer than MAX_HOLD_NS.
    struct Virt(u64);
    impl Clock for Virt {
        fn now_ns(&self) -> u64 {
            self.0
        }
        fn sleep_ns(&mut self, ns: u64) {
            self.0 += ns + SLEEP_OVERSHOOT_NS;
        }
        fn pause(&mut self) {
            self.0 += PAUSE_NS;
        }
    }
    let state = SharedDeviceState::default();
    let map = BusyMap::default();
    let bucket = Bucket::new(&state, &map);
    let w: World = Rc::new(RefCell::new(Gpu::default()));
    let mut evs = SimEvents(w.clone());
    let mut m: Meter<u64> = Meter::default();
    let mut clk = Virt(T0);
    w.borrow_mut().events.insert(1, T0 + 10 * SEC);
    m.launched(7, None, Some(1), T0, &mut evs);
    state.tokens_ns.store(-(10 * SEC as i64), Relaxed);
    let held = hold(&mut clk, |now| {
        w.borrow_mut().now = now;
        m.gate(&mut evs, &bucket, Some(1), 7, now)
    });
    assert!((MAX_HOLD_NS..MAX_HOLD_NS + 1_000_000).contains(&held), "held {held} ns");
}

#[test]
fn refill_is_rate_limited_and_clamped() {
    let state = SharedDeviceState::default();
    let map = BusyMap::default();
    let b = Bucket::new(&state, &map);
    b.refill(1_000, 50); // first use starts the clock
    assert_eq!(b.balance(), 0);
    b.refill(1_000 + 20_000, 50); // too soon: skipped
    assert_eq!(b.balance(), 0);
    b.refill(1_000 + 2_000_000, 50);
    assert_eq!(b.balance(), 1_000_000);
    b.refill(1_000 + 1_000_000_000, 50);
    assert_eq!(b.balance(), BURST_NS, "uncapped, the bucket keeps a burst");
    b.refill_to(1_000 + 2_000_000_000, 50, save_ns(50));
    assert_eq!(b.balance(), SAVE_MAX_NS, "capped at 50, at most SAVE_MAX_NS");
    assert_eq!(save_ns(10), 10_000_000, "cap% of SAVE_WINDOW_NS");
    assert_eq!(save_ns(1), BURST_NS, "at least a burst");
}

#[test]
fn a_slowed_interval_pays_its_share_but_counts_whole() {
    let state = SharedDeviceState::default();
    let map = BusyMap::default();
    let b = Bucket::new(&state, &map);
    assert_eq!(b.charge(T0, T0 + 1_000_000, 500, T0 + 1_000_000, 1), 1_000_000);
    assert_eq!(state.window_busy_ns.load(Relaxed), 1_000_000);
    assert_eq!(state.tokens_ns.load(Relaxed), -500_000);
}

#[test]
fn a_context_switch_between_processes_is_charged_an_idle_gap_is_not() {
    let state = SharedDeviceState::default();
    let map = BusyMap::default();
    let b = Bucket::new(&state, &map);
    let ms = 1_000_000;
    assert_eq!(b.charge(T0, T0 + ms, 1000, T0 + ms, 1), ms);
    // Process 2's kernel starts 50 us after process 1's ended: the switch is busy time.
    assert_eq!(b.charge(T0 + ms + 50_000, T0 + 2 * ms, 1000, T0 + 2 * ms, 2), ms);
    // Process 2 again after a 50 us gap of its own: idle, not charged.
    assert_eq!(b.charge(T0 + 2 * ms + 50_000, T0 + 3 * ms, 1000, T0 + 3 * ms, 2), ms - 50_000);
    // Process 1 after a 500 us gap: idle whoever ran before.
    assert_eq!(b.charge(T0 + 3 * ms + 500_000, T0 + 4 * ms, 1000, T0 + 4 * ms, 1), ms - 500_000);
}

/// Like PyTorch eager training: tiny elementwise kernels, mid-size and large GEMMs, Python time
/// between launches, a synchronize (loss.item()) every so many launches.
fn training_step(cpu_ns: u64, sync_every: u64) -> Pattern {
    let kernels = vec![8_000, 8_000, 8_000, 300_000, 20_000, 8_000, 1_500_000, 20_000, 8_000, 60_000];
    Pattern { kernel_ns: kernels, cpu_ns: vec![cpu_ns], ..Pattern::fixed(0, sync_every) }
}

#[rstest::rstest]
fn a_training_step_of_mixed_kernels(
    #[values((12_000, 120), (40_000, 120), (12_000, 0), (150_000, 30))] cpu_and_sync: (u64, u64),
) {
    // With spaced events, the 40 us and the deep-async variants were charged 3-6% more than they
    // ran until a launch about to wait closed its stream's launches with an event.
    let (cpu_ns, sync_every) = cpu_and_sync;
    check(&format!("mixed step, {cpu_ns} ns CPU per launch, sync every {sync_every}"), &[(0, training_step(cpu_ns, sync_every))], 8, &[25, 50]);
}

#[rstest::rstest]
fn a_training_step_with_host_time_after_its_synchronize(#[values(5_000_000, 20_000_000)] host_ns: u64) {
    // GPT-2 training on an H100 (u0 66%: the host prepares the next step while the GPU is
    // idle) got 0.352 of its uncapped throughput under a cap of 25, 0.378 wanted.
    let pat = Pattern { sync_cpu_ns: host_ns, ..training_step(12_000, 120) };
    check(&format!("mixed step, {host_ns} ns of host time after each synchronize"), &[(0, pat)], 8, &[25, 50]);
}

#[rstest::rstest]
fn a_long_idle_saves_no_more_than_a_sample_can_hide(#[values(25, 50, 75, 90)] cap: u32) {
    // 400 ms of 1 ms kernels, then 150 ms of host time with the GPU idle. Saving cap% of 100 ms
    // let the first 200 ms after the idle read 1.5 x cap (a review's finding): NVML's one-a-
    // second reading covers a 200 ms sample, so no 200 ms may read more than 8 points over the
    // cap, nor any second more than 3.
    let pat = Pattern { sync_cpu_ns: 150_000_000, ..Pattern::fixed(1_000_000, 400) };
    assert_no_burst_past(cap, &simulate(Some(cap), &[(0, pat)], 8));
}

/// After the first second: no 200 ms reads more than 8 points over `cap`, no second more than 3
/// (NVML's one-a-second reading covers about a 200 ms sample).
fn assert_no_burst_past(cap: u32, got: &[(u64, u64)]) {
    let pct = |ws: &[(u64, u64)]| 100.0 * ws.iter().map(|w| w.1).sum::<u64>() as f64 / (ws.len() as u64 * WIN) as f64;
    for (span, over) in [(2, 8.0), (WINS_PER_SEC, 3.0)] {
        for (i, ws) in got.windows(span).enumerate().skip(WINS_PER_SEC) {
            let u = pct(ws);
            assert!(u <= cap as f64 + over, "cap {cap}: {span} windows from {i} read {u:.1}%");
        }
    }
}

#[rstest::rstest]
fn a_cap_above_the_programs_use_does_not_slow_it(
    #[values((12_000, 120), (40_000, 120), (12_000, 0), (150_000, 30))] cpu_and_sync: (u64, u64),
) {
    // Under a cap it never reaches, a program runs at its uncapped speed: the queue bound must
    // not starve the GPU behind an estimate the big kernels inflated (an H100 ran GPT-2 training
    // at 0.86 of its speed under a cap of 99).
    let (cpu_ns, sync_every) = cpu_and_sync;
    check(&format!("mixed step at cap 99, {cpu_ns} ns CPU per launch, sync every {sync_every}"), &[(0, training_step(cpu_ns, sync_every))], 6, &[99]);
}

/// A step in two phases, as a transformer's training step looks from the host: `gemms` GEMMs of
/// 1 ms that the host launches in 10 us each (it runs far ahead of the GPU), then `small`
/// elementwise kernels of 5 us that take it 25 us each (the GPU waits on it), a synchronize, 1 ms
/// of host time. Uncapped, the host's slow phase runs while the GPU still works through the GEMMs.
fn two_phase_step(gemms: usize, small: usize) -> Pattern {
    let (mut kernel_ns, mut cpu_ns) = (vec![1_000_000; gemms], vec![10_000; gemms]);
    kernel_ns.extend(vec![5_000; small]);
    cpu_ns.extend(vec![25_000; small]);
    Pattern { kernel_ns, cpu_ns, sync_cpu_ns: 1_000_000, ..Pattern::fixed(0, (gemms + small) as u64) }
}

/// 20 GEMMs, then 300 small kernels (7.5 ms of host time).
fn phased_step() -> Pattern {
    two_phase_step(20, 300)
}

// The queue bound once counted each launch at its stream's recent mean GPU time per launch: the
// small kernels launched behind the GEMMs were counted at the GEMMs' 1 ms, so the host was held
// while the GPU still had 10+ ms queued, and the GPU then idled while the host worked through
// them (71.1% busy against 95.5% uncapped at cap 99; max(2 ms, balance) 84.1%). GPT-2 training
// on an H100 ran at 0.74-1.02 of its speed under a cap of 99 (sessions 18-21); on an H200 the
// bound held its launching thread 2.38 s of 45 s, 315 small launches pending read as 134 ms.
// Two changes pass it (95.5%), neither alone: each launch is valued by its kind (`kinds`), and
// the target counts the refill at the cap while the queue drains, min(balance / (1 - cap),
// save). On an H100 GPT-2 at cap 99 then ran 1.076x as fast (session 22). At cap 25 the step still gets
// 20.6% (a batch of small kernels spans the host's time between them; the calibration to NVML
// takes that out on a GPU, the simulator does not model it).
#[test]
fn a_cap_above_a_phased_programs_use_does_not_slow_it() {
    check("phased step", &[(0, phased_step())], 6, &[99]);
}

/// The phased step with a longer slow phase than the bucket saves (12 ms): 40 GEMMs, then 800
/// small kernels (20 ms of host time). Uncapped, the host runs 40 ms ahead of the GPU and its slow
/// phase is hidden behind the GEMMs.
fn deep_phased_step() -> Pattern {
    two_phase_step(40, 800)
}

// The queue may hold what the bucket can pay while the GPU drains it, balance / (1 - cap), but
// no more than the bucket saves (12 ms): on an H100, GPT-2 at cap 99 had 12.0 ms queued at the
// end of its run and was still held 2.87 s of 45 s (session 22). A host that needs more than
// that ahead of the GPU to hide its slow phase idled the GPU under a cap it never reaches: 78.8%
// busy of 97.7% at cap 99. The queue may now run deeper where that adds at most 1 point to a
// 100-ms reading, while the container's budget has not closed for a second
// (`meter::queue_ceiling_ns`): 97.8%. Without that condition one stream of 1 ms kernels
// synchronizing every 100 read 86.6-99.4 per 100 ms at cap 97 (`one_stream_delivers_the_cap`).
#[test]
fn a_cap_above_a_deep_phased_programs_use_does_not_slow_it() {
    check("deep phased step", &[(0, deep_phased_step())], 6, &[99]);
}

#[test]
#[ignore = "open, issue 10: a phased step gets 20.6% at cap 25 (its batches of small kernels span host time); see the comment above"]
fn a_phased_program_holds_caps_under_its_use() {
    check("phased step", &[(0, phased_step())], 8, &[25, 50, 75]);
}

#[rstest::rstest]
fn two_saturating_containers_each_get_their_cap(#[values((30, 60), (50, 50), (25, 25))] caps: (u32, u32)) {
    // Two containers (one process each, 1 ms kernels, synchronize after each) on one GPU. An
    // H100 ran both at 44.4% of one process's uncapped throughput whatever the caps (30/60 and
    // 50/50): the solo time of a stream was the shortest interval it ever measured, so one
    // collapsed interval made every later one look slowed and charged a fifth of it. A solo time
    // learned only while alone under-ran them instead (19.8% and 35.5% here): started together,
    // they never were; the shortest per-launch time stands in until then.
    let pat = Pattern::fixed(1_000_000, 1);
    let (solo, _) = summarize(&simulate(None, &[(0, pat.clone())], 4), 1);
    let got = simulate_containers(&[Some(caps.0), Some(caps.1)], &[0, 1], &[(0, pat.clone()), (1, pat)], 8);
    for (c, cap) in [caps.0, caps.1].into_iter().enumerate() {
        let (k, u) = summarize(&got[c], 2);
        let share = 100.0 * k / solo;
        assert!((share - cap as f64).abs() <= 3.0, "caps {caps:?}: container {c} got {share:.1}% of one process's throughput ({u:.1}% busy), cap {cap}");
    }
}

#[test]
fn a_thread_synchronizing_beside_asynchronous_ones_is_woken() {
    // Process 0 synchronizes after each 1 us half-GPU kernel, process 1's two threads launch
    // without synchronizing. The device ran only up to the next thread's turn, not to the host
    // time that thread acted at (launches move it a few us ahead): a stream that drained in
    // between woke nobody, and process 0 completed 1 kernel in 2 s (review).
    let syncer = Pattern { frac: 500, ..Pattern::fixed(1_000, 1) };
    let launcher = Pattern { frac: 500, ..Pattern::fixed(1_000, 0) };
    let got = simulate_containers(&[None, None], &[0, 1], &[(0, syncer), (1, launcher.clone()), (1, launcher)], 2);
    let k0: u64 = got[0].iter().map(|w| w.0).sum();
    assert!(k0 > 1000, "process 0 completed {k0} kernels in 2 s");
}

/// Host pauses of a framework's step (Python, the allocator, the garbage collector): one every
/// 15 launches.
const JITTER_NS: u64 = 400_000;

/// A step shaped like GPT-2 124M training on an H100 as the GPU showed it (session 20: about 1,290
/// launches a step, per-launch estimates of 17-50 us in most ticks, 135-323 us right after the
/// LM head's GEMMs; u0 80-93%): a host-bound forward (kernels of 5-180 us, 25 us of host each),
/// the LM head (3 ms), a GPU-bound backward (kernels twice the forward's, 10 us of host each) with
/// two 3 ms GEMMs first, an optimizer of 30 kernels, a synchronize and 4 ms of host time, and a
/// host pause of `JITTER_NS` every 15 launches.
fn gpt2_like_step() -> Pattern {
    let layer = [10_000u64, 120_000, 5_000, 100_000, 50_000, 10_000, 10_000, 180_000, 20_000, 180_000, 10_000, 5_000, 5_000, 5_000, 5_000];
    let (mut kernel_ns, mut cpu_ns) = (Vec::new(), Vec::new());
    // `n` layers, `host_ns` of host time after each kernel but the last, which pauses.
    let layers = |kernel_ns: &mut Vec<u64>, cpu_ns: &mut Vec<u64>, n, host_ns| {
        for _ in 0..n {
            kernel_ns.extend(layer);
            cpu_ns.extend([host_ns; 14]);
            cpu_ns.push(JITTER_NS);
        }
    };
    layers(&mut kernel_ns, &mut cpu_ns, 12, 25_000);
    kernel_ns.extend([3_000_000, 200_000, 20_000]);
    cpu_ns.extend([25_000; 3]);
    kernel_ns.extend([3_000_000, 3_000_000]);
    cpu_ns.extend([10_000; 2]);
    layers(&mut kernel_ns, &mut cpu_ns, 24, 10_000);
    kernel_ns.extend([150_000; 30]);
    cpu_ns.extend([15_000; 30]);
    let n = kernel_ns.len() as u64;
    Pattern { kernel_ns, cpu_ns, sync_cpu_ns: 4_000_000, ..Pattern::fixed(0, n) }
}

// The simulator's form of GPT-2's slowdown under a cap it never reaches (issue 10). Without the
// host pauses a flat 2 ms queue bound passed (0.969 at cap 99); with them it took away the cushion
// a program's host keeps ahead of the GPU, and each pause idled the GPU: 83.0% busy at cap 99
// against 89.0% uncapped (0.933). Without a bound it runs at 0.999 but cap 25's 100 ms samples
// swing 17.7-33.2, as GPT-2's 1-s samples did on the H100 (19..34, session 20). The bound of
// max(2 ms, the bucket's balance) passes all three caps (0.993; 48.8; 24.7). On an H100 it did
// not make GPT-2 at cap 99 measurably faster (1.038x the 2 ms bound over 11 paired rounds, session
// 21): this step guards the balance, it is not the whole of GPT-2 (valuing queued work per launch
// kind, `phased_step`, made it 1.076x faster paired, session 22). `SIM_PRINT=1` prints the figures.
#[test]
fn a_cap_above_a_gpt2_like_programs_use_does_not_slow_it() {
    check("gpt2-like step", &[(0, gpt2_like_step())], 8, &[99, 50, 25]);
}

#[rstest::rstest]
fn four_processes_after_a_long_idle_stay_near_the_cap(#[values(25, 50, 95)] cap: u32) {
    // Four processes of one container, each its own queue bound, after an idle in which the
    // shared bucket saved: together they must not burst past what the samples allow (a guard for
    // any queue bound that grows with the bucket's balance, as branch queue-balance's does; with
    // no bound under a cap, 200 ms read 57.5% at cap 25 and 62.5% at cap 50).
    let pat = Pattern { sync_cpu_ns: 150_000_000, ..Pattern::fixed(1_000_000, 400) };
    let threads: Vec<(usize, Pattern)> = (0..4).map(|p| (p, pat.clone())).collect();
    assert_no_burst_past(cap, &simulate(Some(cap), &threads, 8));
}

/// Batch-1 decoding in eager mode, as GPT-2 124M looks from the host: per token 12 layers of 15
/// kernels of 4-25 us, each after 45 us of Python, a synchronize per 16-token request, 1 ms of
/// host time after it (uncapped about 16% busy; on an H200 such inference read 10-16%).
fn eager_inference() -> Pattern {
    let layer = [6_000u64, 12_000, 4_000, 25_000, 5_000, 4_000, 8_000, 20_000, 4_000, 20_000, 6_000, 4_000, 4_000, 4_000, 5_000];
    let kernel_ns: Vec<u64> = (0..12).flat_map(|_| layer).collect();
    let n = kernel_ns.len() as u64 * 16;
    Pattern { kernel_ns, cpu_ns: vec![45_000], sync_cpu_ns: 1_000_000, ..Pattern::fixed(0, n) }
}

// Under caps above its use, eager inference must keep its speed. Its kernels are paced by the
// host: spaced events spanned the host's gaps, and an H200 ran it at 0.33-0.72 of its speed
// under caps of 25 and 50 (own measure 56.3% for NVML's 9.3% at cap 50, session 37). A guard, not
// a reproduction: the simulator models neither NVML's calibration nor what an event costs, and
// bb6a088's rule (an end event per paced launch while held) passes it too (0.998, 0.996).
#[test]
fn a_cap_above_eager_inferences_use_does_not_slow_it() {
    check("eager inference", &[(0, eager_inference())], 6, &[50, 25]);
}
