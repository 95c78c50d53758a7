//! Mock NVML (`libnvidia-ml.so.1`) over the shared simulated GPU of `mock_gpu`.
//!
//! Reads only: device identity, memory (every live process's charges, contexts included),
//! utilization from the kernel timeline's busy buckets, and the process list. Signatures, struct
//! layouts and return codes follow `nvml.h` (as bound by nvml-wrapper-sys 0.8). Every export runs
//! under `mock_gpu::faults::guarded` (MOCK_NVML_FAULT / MOCK_NVML_DELAY, panics caught).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use mock_gpu::{now_ns, realtime_us, GpuState, BUCKET_NS, MAX_DEVICES, RING};
use std::ffi::{c_char, c_uint, CStr};
use std::sync::atomic::{AtomicU32, Ordering::*};

type Ret = u32;
const NVML_SUCCESS: Ret = 0;
const NVML_ERROR_UNINITIALIZED: Ret = 1;
const NVML_ERROR_INVALID_ARGUMENT: Ret = 2;
const NVML_ERROR_NOT_SUPPORTED: Ret = 3;
const NVML_ERROR_NOT_FOUND: Ret = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: Ret = 7;
const NVML_ERROR_DRIVER_NOT_LOADED: Ret = 9;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: Ret = 25;
const NVML_ERROR_UNKNOWN: Ret = 999;

/// NVML_STRUCT_VERSION(Memory, 2): sizeof(nvmlMemory_v2_t) | 2 << 24.
const NVML_MEMORY_V2: u32 = std::mem::size_of::<MemoryV2>() as u32 | (2 << 24);
/// `nvmlDeviceGetUtilizationRates`: the busy share of the `READING_NS` before the latest multiple
/// of `SAMPLE_NS` (an H100: a 20 ms pulse reads 20, a 5 ms pulse 5, and the reading changes every
/// 200 ms; `bench/py/reading_window.py`). A one-a-second observer sees a tenth of each second.
const READING_NS: u64 = 100_000_000;
/// Process utilization samples cover at most the last second.
const PROCESS_SPAN_NS: u64 = 1_000_000_000;
/// `nvmlDeviceGetSamples`' GPU utilization: one sample per this period (an H100's), each the
/// busy share of the period it ends, kept as long as the busy history (`RING` buckets).
const SAMPLE_NS: u64 = 200_000_000;
const SAMPLE_HISTORY_NS: u64 = (RING as u64 - 1) * BUCKET_NS;
/// How long after its period a sample becomes visible (env `MOCK_NVML_SAMPLE_LAG_MS`, default 0):
/// a real driver hands samples over some time after the period they cover.
fn sample_lag_ns() -> u64 {
    static LAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LAG.get_or_init(|| match std::env::var("MOCK_NVML_SAMPLE_LAG_MS") {
        Err(_) => 0,
        Ok(v) => v.trim().parse::<u64>().map(|ms| ms.saturating_mul(1_000_000)).unwrap_or_else(|e| {
            eprintln!("[mock-gpu] error: MOCK_NVML_SAMPLE_LAG_MS={v:?}: {e}; using 0");
            0
        }),
    })
}
/// Wall-clock microseconds at monotonic `t` by one offset taken once per process: a sample keeps
/// the timestamp it was given, call after call, as NVML's do.
fn wall_us_at(t: u64) -> u64 {
    static OFFSET_NS: std::sync::OnceLock<i128> = std::sync::OnceLock::new();
    let off = *OFFSET_NS.get_or_init(|| realtime_us() as i128 * 1000 - now_ns() as i128);
    ((t as i128 + off).max(0) / 1000) as u64
}
/// `nvmlSamplingType_t` NVML_GPU_UTILIZATION_SAMPLES, `nvmlValueType_t` NVML_VALUE_TYPE_UNSIGNED_INT.
const GPU_UTILIZATION_SAMPLES: i32 = 1;
const VALUE_TYPE_UNSIGNED_INT: i32 = 1;
const DRIVER_VERSION: &str = "580.65.06";
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

#[repr(C)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct MemoryV2 {
    version: u32,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `nvmlSample_t` (its `nvmlValue_t` union as raw bytes).
#[repr(C)]
pub struct Sample {
    time_stamp: u64,
    sample_value: u64,
}

#[repr(C)]
pub struct Utilization {
    gpu: u32,
    memory: u32,
}

#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: u32,
    bus: u32,
    device: u32,
    pci_device_id: u32,
    pci_sub_system_id: u32,
    bus_id: [c_char; 32],
}

#[repr(C)]
pub struct ProcessInfoV1 {
    pid: u32,
    used_gpu_memory: u64,
}

/// nvmlProcessInfo_v2_t, which is also nvmlProcessInfo_t (taken by the `_v3` queries).
#[repr(C)]
pub struct ProcessInfoV2 {
    pid: u32,
    used_gpu_memory: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

#[repr(C)]
pub struct ProcessUtilizationSample {
    pid: u32,
    time_stamp: u64,
    sm_util: u32,
    mem_util: u32,
    enc_util: u32,
    dec_util: u32,
}

pub type Device = *const u8;

/// Device handles point into this array; the offset is the index.
static HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

fn guard(name: &'static str, calls: &std::sync::atomic::AtomicU64, f: impl FnOnce() -> Ret) -> Ret {
    // Not a OnceLock: a child forked during its first initialization would wait on it forever.
    static INJ: std::sync::atomic::AtomicPtr<mock_gpu::Injection> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    let inj = mock_gpu::lazy_leak(&INJ, || mock_gpu::Injection::from_env("MOCK_NVML"));
    trace(name);
    mock_gpu::faults::guarded(inj, name, calls, NVML_ERROR_UNKNOWN, f)
}

/// `MOCK_NVML_TRACE=PATH`: each call appends `pid name unix_ms` to PATH (which NVML calls a hooked
/// process makes, and when it makes none: `gpu-tests/tests/monitor_nvml.rs`).
fn trace(name: &str) {
    static PATH: std::sync::atomic::AtomicPtr<Option<std::path::PathBuf>> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
    let path = mock_gpu::lazy_leak(&PATH, || std::env::var_os("MOCK_NVML_TRACE").map(Into::into));
    if let Some(p) = path {
        use std::io::Write;
        // One write per line (O_APPEND): lines of several processes do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(p) {
            let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            let _ = f.write_all(format!("{} {name} {ms}\n", std::process::id()).as_bytes());
        }
    }
}

macro_rules! nvml_exports {
    ($( fn $name:ident $sig:tt $body:block )*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name $sig -> Ret {
            static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            guard(stringify!($name), &CALLS, || $body)
        }
    )*};
}

type R<T> = Result<T, Ret>;

fn rc(r: R<()>) -> Ret {
    r.err().unwrap_or(NVML_SUCCESS)
}

fn state() -> R<&'static GpuState> {
    if INIT_COUNT.load(Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    mock_gpu::shared().map_err(|_| NVML_ERROR_DRIVER_NOT_LOADED)
}

/// The initialized state and the index of `dev`.
fn device(dev: Device) -> R<(&'static GpuState, usize)> {
    let st = state()?;
    let i = (dev as usize).wrapping_sub(HANDLES.as_ptr() as usize);
    if dev.is_null() || i >= st.device_count() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((st, i))
}

unsafe fn out<T>(p: *mut T, v: T) -> R<()> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    p.write(v);
    Ok(())
}

/// NVML string outputs: INSUFFICIENT_SIZE when the text and its NUL do not fit.
unsafe fn out_str(dst: *mut c_char, len: c_uint, s: &str) -> R<()> {
    if dst.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, dst, s.len());
    *dst.add(s.len()) = 0;
    Ok(())
}

fn fill_str<const N: usize>(s: &str) -> [c_char; N] {
    let mut a = [0 as c_char; N];
    for (d, b) in a.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    a
}

fn handle(i: usize) -> Device {
    HANDLES[i..].as_ptr()
}

fn init() -> Ret {
    match mock_gpu::shared() {
        Ok(_) => {
            INIT_COUNT.fetch_add(1, AcqRel);
            NVML_SUCCESS
        }
        Err(e) => {
            eprintln!("[mock-nvml] error: {e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        }
    }
}

fn bus_id(st: &GpuState, d: usize) -> String {
    format!("00000000:{:02X}:00.0", st.device(d).pci_bus)
}

/// Processes with a context or memory on device `d`: (pid, used bytes).
fn processes(st: &GpuState, d: usize) -> Vec<(u32, u64)> {
    st.live_slots()
        .into_iter()
        .filter_map(|(s, pid)| {
            let sd = st.slot_dev(s, d);
            let used = sd.used.load(Acquire);
            (used > 0 || sd.contexts.load(Acquire) > 0).then_some((pid as u32, used))
        })
        .collect()
}

/// NVML's size-query protocol for process lists.
unsafe fn running<T>(dev: Device, count: *mut c_uint, infos: *mut T, make: impl Fn(u32, u64) -> T) -> Ret {
    rc((|| {
        let (st, d) = device(dev)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let procs = processes(st, d);
        let room = *count as usize;
        *count = procs.len() as c_uint;
        if room < procs.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        if !procs.is_empty() && infos.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for (i, (pid, used)) in procs.into_iter().enumerate() {
            infos.add(i).write(make(pid, used));
        }
        Ok(())
    })())
}

unsafe fn no_processes(dev: Device, count: *mut c_uint) -> Ret {
    rc(device(dev).and_then(|_| out(count, 0)))
}

unsafe fn by_index(index: c_uint, dev: *mut Device) -> Ret {
    rc((|| {
        let st = state()?;
        if index as usize >= st.device_count() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        out(dev, handle(index as usize))
    })())
}

unsafe fn by_pci(id: *const c_char, dev: *mut Device) -> Ret {
    rc((|| {
        let st = state()?;
        if id.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let want = CStr::from_ptr(id).to_string_lossy().to_ascii_uppercase();
        let want_bus = want.split(':').rev().nth(1).and_then(|b| u32::from_str_radix(b, 16).ok());
        let d = (0..st.device_count()).find(|&d| Some(st.device(d).pci_bus) == want_bus).ok_or(NVML_ERROR_NOT_FOUND)?;
        out(dev, handle(d))
    })())
}

unsafe fn pci_info(dev: Device, pci: *mut PciInfo) -> Ret {
    rc((|| {
        let (st, d) = device(dev)?;
        let bus = st.device(d).pci_bus;
        out(
            pci,
            PciInfo {
                bus_id_legacy: fill_str(&format!("0000:{bus:02X}:00.0")),
                domain: 0,
                bus,
                device: 0,
                pci_device_id: 0x2330_10DE,
                pci_sub_system_id: 0x16C1_10DE,
                bus_id: fill_str(&bus_id(st, d)),
            },
        )
    })())
}

nvml_exports! {
    fn nvmlInit_v2() { init() }
    fn nvmlInit() { init() }
    fn nvmlInitWithFlags(_flags: c_uint) { init() }
    fn nvmlShutdown() {
        match INIT_COUNT.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1)) {
            Ok(_) => NVML_SUCCESS,
            Err(_) => NVML_ERROR_UNINITIALIZED,
        }
    }
    fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) {
        rc(state().and_then(|_| out_str(version, len, DRIVER_VERSION)))
    }
    fn nvmlSystemGetCudaDriverVersion(v: *mut i32) {
        rc(state().and_then(|_| out(v, 13000)))
    }
    fn nvmlSystemGetCudaDriverVersion_v2(v: *mut i32) {
        rc(state().and_then(|_| out(v, 13000)))
    }
    fn nvmlDeviceGetCount_v2(n: *mut c_uint) {
        rc(state().and_then(|st| out(n, st.device_count() as c_uint)))
    }
    fn nvmlDeviceGetCount(n: *mut c_uint) {
        rc(state().and_then(|st| out(n, st.device_count() as c_uint)))
    }
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, dev: *mut Device) {
        by_index(index, dev)
    }
    fn nvmlDeviceGetHandleByIndex(index: c_uint, dev: *mut Device) {
        by_index(index, dev)
    }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut Device) {
        rc((|| {
            let st = state()?;
            if uuid.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            let want = CStr::from_ptr(uuid).to_string_lossy().to_ascii_lowercase();
            let d = (0..st.device_count()).find(|&d| st.uuid_string(d).to_ascii_lowercase() == want).ok_or(NVML_ERROR_NOT_FOUND)?;
            out(dev, handle(d))
        })())
    }
    fn nvmlDeviceGetHandleByPciBusId_v2(id: *const c_char, dev: *mut Device) {
        by_pci(id, dev)
    }
    fn nvmlDeviceGetHandleByPciBusId(id: *const c_char, dev: *mut Device) {
        by_pci(id, dev)
    }
    fn nvmlDeviceGetName(dev: Device, name: *mut c_char, len: c_uint) {
        rc(device(dev).and_then(|(st, d)| out_str(name, len, &st.device_name(d))))
    }
    fn nvmlDeviceGetUUID(dev: Device, uuid: *mut c_char, len: c_uint) {
        rc(device(dev).and_then(|(st, d)| out_str(uuid, len, &st.uuid_string(d))))
    }
    fn nvmlDeviceGetIndex(dev: Device, index: *mut c_uint) {
        rc(device(dev).and_then(|(_, d)| out(index, d as c_uint)))
    }
    fn nvmlDeviceGetMinorNumber(dev: Device, minor: *mut c_uint) {
        rc(device(dev).and_then(|(_, d)| out(minor, d as c_uint)))
    }
    fn nvmlDeviceGetCudaComputeCapability(dev: Device, major: *mut i32, minor: *mut i32) {
        rc(device(dev).and_then(|(st, _)| {
            if major.is_null() || minor.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            out(major, st.header().cc_major as i32)?;
            out(minor, st.header().cc_minor as i32)
        }))
    }
    fn nvmlDeviceGetNumGpuCores(dev: Device, cores: *mut c_uint) {
        rc(device(dev).and_then(|(st, d)| out(cores, st.device(d).sms * 128)))
    }
    fn nvmlDeviceGetPciInfo_v3(dev: Device, pci: *mut PciInfo) {
        pci_info(dev, pci)
    }
    fn nvmlDeviceGetPciInfo_v2(dev: Device, pci: *mut PciInfo) {
        pci_info(dev, pci)
    }
    fn nvmlDeviceGetMemoryInfo(dev: Device, mem: *mut Memory) {
        rc(device(dev).and_then(|(st, d)| {
            let total = st.device(d).total_mem;
            let used = st.device_used_now(d).min(total);
            out(mem, Memory { total, free: total - used, used })
        }))
    }
    fn nvmlDeviceGetMemoryInfo_v2(dev: Device, mem: *mut MemoryV2) {
        rc(device(dev).and_then(|(st, d)| {
            if mem.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            if (*mem).version != NVML_MEMORY_V2 {
                return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
            }
            let total = st.device(d).total_mem;
            let used = st.device_used_now(d).min(total);
            // The simulated driver keeps no memory of its own: reserved is 0.
            out(mem, MemoryV2 { version: NVML_MEMORY_V2, total, reserved: 0, free: total - used, used })
        }))
    }
    fn nvmlDeviceGetUtilizationRates(dev: Device, util: *mut Utilization) {
        rc(device(dev).and_then(|(st, d)| {
            let end = now_ns() / SAMPLE_NS * SAMPLE_NS;
            let busy = st.device_busy_ns(d, end.saturating_sub(READING_NS), end);
            out(util, Utilization { gpu: (busy * 100 / READING_NS).min(100) as u32, memory: 0 })
        }))
    }
    fn nvmlDeviceGetSamples(dev: Device, kind: i32, last_seen: u64, value_type: *mut i32, count: *mut c_uint, samples: *mut Sample) {
        rc((|| {
            let (st, d) = device(dev)?;
            if count.is_null() || value_type.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            if kind != GPU_UTILIZATION_SAMPLES {
                return Err(NVML_ERROR_NOT_SUPPORTED);
            }
            let now = now_ns();
            // Periods end on multiples of SAMPLE_NS of the monotonic clock; stamped in wall time.
            let newest = now.saturating_sub(sample_lag_ns()) / SAMPLE_NS * SAMPLE_NS;
            let list: Vec<Sample> = (0..=SAMPLE_HISTORY_NS / SAMPLE_NS)
                .rev()
                .filter_map(|k| newest.checked_sub(k * SAMPLE_NS))
                .filter(|&end| end >= SAMPLE_NS)
                .map(|end| (end, wall_us_at(end)))
                .filter(|&(_, ts)| ts > last_seen)
                .map(|(end, ts)| Sample {
                    time_stamp: ts,
                    sample_value: (st.device_busy_ns(d, end - SAMPLE_NS, end) * 100 / SAMPLE_NS).min(100),
                })
                .collect();
            *value_type = VALUE_TYPE_UNSIGNED_INT;
            if samples.is_null() {
                *count = list.len() as c_uint;
                return Ok(());
            }
            if list.is_empty() {
                *count = 0;
                return Err(NVML_ERROR_NOT_FOUND);
            }
            // As NVML: as many as the buffer holds (oldest first), the count says how many.
            let n = list.len().min(*count as usize);
            for (i, s) in list.into_iter().take(n).enumerate() {
                samples.add(i).write(s);
            }
            *count = n as c_uint;
            Ok(())
        })())
    }
    fn nvmlDeviceGetProcessUtilization(dev: Device, samples: *mut ProcessUtilizationSample, count: *mut c_uint, last_seen: u64) {
        rc((|| {
            let (st, d) = device(dev)?;
            if count.is_null() {
                return Err(NVML_ERROR_INVALID_ARGUMENT);
            }
            let (now, now_us) = (now_ns(), realtime_us());
            if last_seen >= now_us {
                return Err(NVML_ERROR_NOT_FOUND);
            }
            // Samples cover (last_seen, now], at most the last second.
            let span = ((now_us - last_seen).saturating_mul(1000)).min(PROCESS_SPAN_NS);
            let t0 = now - span;
            let list: Vec<ProcessUtilizationSample> = st
                .live_slots()
                .into_iter()
                .filter_map(|(s, pid)| {
                    let busy = st.busy_ns(s, d, t0, now);
                    (busy > 0).then(|| ProcessUtilizationSample {
                        pid: pid as u32,
                        time_stamp: now_us,
                        sm_util: (busy * 100 / span.max(1)).min(100) as u32,
                        mem_util: 0,
                        enc_util: 0,
                        dec_util: 0,
                    })
                })
                .collect();
            let room = *count as usize;
            *count = list.len() as c_uint;
            if list.is_empty() {
                return Err(NVML_ERROR_NOT_FOUND);
            }
            if samples.is_null() || room < list.len() {
                return Err(NVML_ERROR_INSUFFICIENT_SIZE);
            }
            for (i, s) in list.into_iter().enumerate() {
                samples.add(i).write(s);
            }
            Ok(())
        })())
    }
    fn nvmlDeviceGetComputeRunningProcesses(dev: Device, count: *mut c_uint, infos: *mut ProcessInfoV1) {
        running(dev, count, infos, |pid, used_gpu_memory| ProcessInfoV1 { pid, used_gpu_memory })
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2(dev: Device, count: *mut c_uint, infos: *mut ProcessInfoV2) {
        running(dev, count, infos, info_v2)
    }
    fn nvmlDeviceGetComputeRunningProcesses_v3(dev: Device, count: *mut c_uint, infos: *mut ProcessInfoV2) {
        running(dev, count, infos, info_v2)
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(dev: Device, count: *mut c_uint, _infos: *mut ProcessInfoV2) {
        no_processes(dev, count)
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(dev: Device, count: *mut c_uint, _infos: *mut ProcessInfoV2) {
        no_processes(dev, count)
    }
}

fn info_v2(pid: u32, used_gpu_memory: u64) -> ProcessInfoV2 {
    ProcessInfoV2 { pid, used_gpu_memory, gpu_instance_id: NO_INSTANCE, compute_instance_id: NO_INSTANCE }
}

/// NVML error strings (static, NUL-terminated).
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static str = match result {
        0 => "Success\0",
        1 => "Uninitialized\0",
        2 => "Invalid Argument\0",
        3 => "Not Supported\0",
        4 => "Insufficient Permissions\0",
        5 => "Already Initialized\0",
        6 => "Not Found\0",
        7 => "Insufficient Size\0",
        9 => "Driver Not Loaded\0",
        13 => "Function Not Found\0",
        25 => "Argument version mismatch\0",
        999 => "Unknown Error\0",
        _ => "Unknown Error\0",
    };
    s.as_ptr() as *const c_char
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<Memory>(), 24);
        assert_eq!(std::mem::size_of::<MemoryV2>(), 40);
        assert_eq!(NVML_MEMORY_V2, 0x0200_0028);
        assert_eq!(std::mem::size_of::<PciInfo>(), 16 + 20 + 32);
        assert_eq!(std::mem::size_of::<ProcessInfoV1>(), 16);
        assert_eq!(std::mem::size_of::<ProcessInfoV2>(), 24);
        assert_eq!(std::mem::size_of::<ProcessUtilizationSample>(), 32);
        assert_eq!(std::mem::size_of::<Utilization>(), 8);
    }

    #[test]
    fn strings_fit_or_say_so() {
        let mut buf = [0 as c_char; 4];
        assert_eq!(unsafe { out_str(buf.as_mut_ptr(), 4, "abc") }, Ok(()));
        assert_eq!(unsafe { out_str(buf.as_mut_ptr(), 4, "abcd") }, Err(NVML_ERROR_INSUFFICIENT_SIZE));
        let a: [c_char; 4] = fill_str("abcdef");
        assert_eq!(a, [97, 98, 99, 0]);
    }

    #[test]
    fn calls_before_init_are_uninitialized() {
        let mut n = 0;
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, NVML_ERROR_UNINITIALIZED);
        assert_eq!(unsafe { nvmlShutdown() }, NVML_ERROR_UNINITIALIZED);
    }
}
