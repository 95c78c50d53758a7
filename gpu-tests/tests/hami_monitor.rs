//! What HAMi's node monitor sees (issue 5): a live region read as plain file bytes at the
//! published v1 offsets (`hami-contract.md`), little-endian, without locks and without any of
//! our own structs, while hooked samples run: one holding memory under a memory cap, one
//! launching under an SM cap. The sums the monitor exports must match what the processes hold.

mod common;
mod hook_util;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{tool, Bg, Json, Scratch};
use hook_util::{hooked, num, MIB};
use serial_test::serial;

const GIB: u64 = 1 << 30;

// shared_region_t, layout version 1.
const MAGIC: i32 = 19_920_718;
const V1_SIZE: usize = 2_008_952;
const OFF_MAJOR: usize = 4;
const OFF_DEVICE_NUM: usize = 56;
const OFF_UUIDS: usize = 64;
const UUID_LEN: usize = 96;
const OFF_LIMIT: usize = 1600;
const OFF_SM_LIMIT: usize = 1728;
const OFF_PROCS: usize = 1856;
const SLOT_SIZE: usize = 1960;
const OFF_PROC_NUM: usize = 2_008_896;
const OFF_PRIORITY: usize = 2_008_908;
const OFF_LAST_KERNEL_TIME: usize = 2_008_912;
// proc slot
const SLOT_PID: usize = 0;
const SLOT_HOSTPID: usize = 4;
const SLOT_USED: usize = 8; // used[16], 8 x u64 each: context, module, data, offset, total, ...
const USED_STRIDE: usize = 64;
const SLOT_DEVICE_UTIL: usize = 1160; // device_util[16], 6 x u64 each: dec, enc, sm, ...
const UTIL_STRIDE: usize = 48;
const SLOT_STATUS: usize = 1928;

fn i32_at(b: &[u8], off: usize) -> i32 {
    i32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// One process as the monitor reads it for device `dev`.
#[derive(Debug)]
struct MonitorProc {
    pid: i32,
    hostpid: i32,
    context: u64,
    module: u64,
    data: u64,
    total: u64,
    sm_util: u64,
}

/// The monitor's loop: every slot in `procs[0..proc_num]` with `status != 0`.
fn monitor_procs(b: &[u8], dev: usize) -> Vec<MonitorProc> {
    let n = i32_at(b, OFF_PROC_NUM);
    assert!((0..=1024).contains(&n), "proc_num {n}");
    (0..n as usize)
        .map(|i| OFF_PROCS + i * SLOT_SIZE)
        .filter(|&base| i32_at(b, base + SLOT_STATUS) != 0)
        .map(|base| {
            let used = base + SLOT_USED + dev * USED_STRIDE;
            MonitorProc {
                pid: i32_at(b, base + SLOT_PID),
                hostpid: i32_at(b, base + SLOT_HOSTPID),
                context: u64_at(b, used),
                module: u64_at(b, used + 8),
                data: u64_at(b, used + 16),
                total: u64_at(b, used + 32),
                sm_util: u64_at(b, base + SLOT_DEVICE_UTIL + dev * UTIL_STRIDE + 16),
            }
        })
        .collect()
}

#[test]
#[serial(mock_gpu_timing)]
fn a_live_region_read_at_the_v1_offsets_shows_what_the_processes_hold() {
    let s = Scratch::new("hami-mon");
    let env = [("CUDA_DEVICE_MEMORY_LIMIT", "3g"), ("CUDA_DEVICE_SM_LIMIT", "40")];
    let mut c = hooked("test_alloc_paths", &s, None);
    c.args(["--path", "mem_alloc", "--size", "512m", "--hold", "--hold-seconds", "30"]).envs(env);
    let mut holder = Bg::spawn(c, "holder");
    // cuMemGetInfo's used under the hook: the container's usage, so far only the holder's.
    let held = num(&holder.wait_line("holding=1", Duration::from_secs(10)), "used");
    let mut c = hooked("test_runtime_launch", &s, None);
    c.args(["--us", "1000", "--seconds", "0", "--sync-every", "1"]).envs(env);
    let mut run = Bg::spawn(c, "test_runtime_launch");
    run.wait_line("second=2 ", Duration::from_secs(10));

    let b = std::fs::read(s.region()).expect("read the region file");
    let smi = Json::parse(&tool(&s, "vgpu-smi", &["--json"]));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();

    assert_eq!(i32_at(&b, 0), MAGIC, "initialized_flag");
    assert_eq!(u32_at(&b, OFF_MAJOR), 1, "major_version");
    assert!(b.len() >= V1_SIZE, "file is {} bytes", b.len());

    // Limits as the environment set them.
    assert_eq!(u64_at(&b, OFF_LIMIT), 3 * GIB, "limit[0]");
    assert_eq!(u64_at(&b, OFF_SM_LIMIT), 40, "sm_limit[0]");
    assert_eq!(u64_at(&b, OFF_DEVICE_NUM), 1, "device_num");
    let uuid = &b[OFF_UUIDS..OFF_UUIDS + UUID_LEN];
    let uuid = String::from_utf8_lossy(&uuid[..uuid.iter().position(|&c| c == 0).unwrap_or(UUID_LEN)]).into_owned();
    let d = &smi.get("devices").arr()[0];
    assert!(matches!(d.get("uuid"), Json::Str(u) if *u == uuid) && uuid.starts_with("GPU-"), "uuids[0] {uuid:?}, vgpu-smi {d:?}");

    // Processes.
    let procs = monitor_procs(&b, 0);
    let (hp, lp) = (holder.pid(), run.pid());
    let mut pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
    pids.sort();
    let mut want = vec![hp, lp];
    want.sort();
    assert_eq!(pids, want, "live slots in procs[0..proc_num]: {procs:?}");
    let h = procs.iter().find(|p| p.pid == hp).unwrap();
    let l = procs.iter().find(|p| p.pid == lp).unwrap();
    assert_eq!((h.hostpid, l.hostpid), (hp, lp), "hostpid (one PID namespace on the mock)");
    assert_eq!(h.total, held, "holder's used[0].total vs its cuMemGetInfo used");
    assert!(h.data >= 512 * MIB && h.context > 0, "holder by kind: {h:?}");
    assert!(h.total >= h.context + h.module + h.data, "holder's total below its parts: {h:?}");
    assert!(l.total > 0 && l.context > 0, "launcher: {l:?}");
    assert!(l.sm_util > 0 && l.sm_util <= 100, "launcher's sm_util: {l:?}");
    assert_eq!(h.sm_util, 0, "the holder launches nothing: {h:?}");

    // The monitor's sums equal the container's usage as the tools show it.
    let sum: u64 = procs.iter().map(|p| p.total).sum();
    assert_eq!(sum, d.get("memory_used_bytes").num() as u64, "sum of used[0].total vs vgpu-smi {d:?}");
    for p in d.get("processes").arr() {
        let pid = p.get("pid").num() as i32;
        let m = procs.iter().find(|q| q.pid == pid).unwrap_or_else(|| panic!("vgpu-smi process {pid} not in the v1 slots"));
        assert_eq!(p.get("used_bytes").num() as u64, m.total, "process {pid}");
        assert_eq!(p.get("data_bytes").num() as u64, m.data, "process {pid}");
        assert_eq!(p.get("context_bytes").num() as u64, m.context, "process {pid}");
    }

    let last = u64_at(&b, OFF_LAST_KERNEL_TIME);
    assert!(last <= now + 1 && now - last <= 5, "last_kernel_time {last}, now {now}");

    run.stop();
    holder.stop();
}

/// What HAMi's v1 reader exports for device 0, read from the raw bytes: (sum of `used[0].total`
/// over slots with `status != 0`, pid -> (total, smUtil), limit[0], priority, last_kernel_time).
type HamiView = (u64, Vec<(i32, u64, u64)>, u64, i32, u64);

fn hami_view(region: &std::path::Path) -> HamiView {
    let b = std::fs::read(region).expect("read the region file");
    let mut procs: Vec<(i32, u64, u64)> = monitor_procs(&b, 0).iter().map(|p| (p.pid, p.total, p.sm_util)).collect();
    procs.sort();
    let sum = procs.iter().map(|p| p.1).sum();
    (sum, procs, u64_at(&b, OFF_LIMIT), i32_at(&b, OFF_PRIORITY), u64_at(&b, OFF_LAST_KERNEL_TIME))
}

/// The same fields from `vgpu-smi --json`.
fn smi_view(s: &Scratch) -> HamiView {
    let j: serde_json::Value = serde_json::from_str(&tool(s, "vgpu-smi", &["--json"])).unwrap();
    let d = &j["devices"][0];
    let mut procs: Vec<(i32, u64, u64)> = d["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pid"].as_i64().unwrap() as i32, p["used_bytes"].as_u64().unwrap(), p["sm_util_percent"].as_u64().unwrap()))
        .collect();
    procs.sort();
    let limit = d["memory_limit_bytes"].as_u64().or(d["physical_bytes"].as_u64()).unwrap_or(0);
    (d["memory_used_bytes"].as_u64().unwrap(), procs, limit, j["priority"].as_i64().unwrap() as i32, j["last_kernel_time"].as_u64().unwrap())
}

/// HAMi's reader and vgpu-smi agree at this moment: raw bytes before and after the tool run must
/// be equal (nothing moved meanwhile) and equal the tool's view; retried while values move.
fn agree(s: &Scratch, moment: &str) -> HamiView {
    for _ in 0..20 {
        let before = hami_view(&s.region());
        let smi = smi_view(s);
        let after = hami_view(&s.region());
        if before == after {
            assert_eq!(before, smi, "{moment}: HAMi's v1 reader (left) vs vgpu-smi --json (right)");
            return before;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!("{moment}: the region never held still for a comparison");
}

#[test]
#[serial(mock_gpu_timing)]
fn hami_reader_matches_vgpu_smi_through_start_run_exit() {
    let s = Scratch::new("hami-seq");
    let env = [("CUDA_DEVICE_MEMORY_LIMIT", "3g"), ("CUDA_DEVICE_SM_LIMIT", "40"), ("CUDA_TASK_PRIORITY", "0")];
    let mut c = hooked("test_alloc_paths", &s, None);
    c.args(["--path", "mem_alloc", "--size", "512m", "--hold", "--hold-seconds", "60"]).envs(env);
    let mut holder = Bg::spawn(c, "holder");
    holder.wait_line("holding=1", Duration::from_secs(10));
    let v = agree(&s, "holder started");
    assert_eq!((v.1.len(), v.2, v.3), (1, 3 * GIB, 0), "{v:?}");
    let mut c = hooked("test_runtime_launch", &s, None);
    c.args(["--us", "1000", "--seconds", "0", "--sync-every", "1"]).envs(env);
    let mut run = Bg::spawn(c, "test_runtime_launch");
    run.wait_line("second=2 ", Duration::from_secs(10));
    let v = agree(&s, "launcher running");
    assert_eq!(v.1.len(), 2, "{v:?}");
    assert!(v.4 > 0, "last_kernel_time while launching: {v:?}");
    run.stop();
    let v = agree(&s, "launcher exited");
    assert_eq!(v.1.len(), 1, "an exited process is still counted: {v:?}");
    holder.stop();
    let v = agree(&s, "all exited");
    assert_eq!((v.0, v.1.len()), (0, 0), "no process left, yet: {v:?}");
}
