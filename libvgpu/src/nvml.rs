//! NVML virtualization: `nvidia-smi` and monitoring libraries inside the container see the
//! container's devices with total = cap, used = the container's usage (every live process in the
//! region), free = total - used; and process lists filtered to the container's processes.
//!
//! NVML numbers devices physically (all of them, whatever `CUDA_VISIBLE_DEVICES` says); the
//! container's device index is the program's CUDA ordinal, which config and region use. A handle
//! is mapped by UUID (never by NVML's index when a UUID can decide):
//! 1. a process that has initialized CUDA: its own devices (ordinal i = the device whose UUID
//!    `cuDeviceGetUuid(i)` gave);
//! 2. else (NVML-only processes such as nvidia-smi): the UUIDs the container's CUDA processes
//!    recorded in the region;
//! 3. else `CUDA_VISIBLE_DEVICES` (UUID prefixes, or indices compared with NVML's index), else
//!    `GPU_DEVICES_UUID`, else NVML's index; a guess the region contradicts (it records another
//!    UUID at that index) is dropped.
//!
//! Devices that do not map (not visible to the program, e.g. physical GPU 0 under
//! `CUDA_VISIBLE_DEVICES=1`) and uncapped devices are **passed through**: reported unchanged, not
//! hidden. Hiding would renumber NVML's indices and break handle lookups of host tools, the
//! container runtime already hides GPUs the container was not given, and no cap of this process
//! applies to a device it cannot allocate on.
//!
//! Process lists: NVML reports host PIDs. An entry is kept when its PID is the container PID or
//! the recorded host PID of a live slot in the region. Without a shared PID namespace and without
//! recorded host PIDs nothing can be matched and the list comes back empty (the container's own
//! processes are not identifiable without the host PID; other tenants' must not be shown).

use crate::driver;
use crate::ffi::*;
use crate::sys::sig;
use crate::runtime::Runtime;
use std::ffi::c_uint;
use vgpu_core::config::VisibleDevice;
use vgpu_core::region::Region;

/// Container device index of an NVML handle (see the module comment for the order).
fn container_index(rt: &Runtime, h: nvmlDevice_t) -> Option<usize> {
    let uuid = driver::nvml_uuid(h)?;
    if let Some(ps) = rt.proc_if_ready() {
        return ps.devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(&uuid)).map(|d| d.index);
    }
    let region = rt.region_for_read();
    if let Some(r) = region {
        if let Some(i) = (0..r.device_num()).find(|&i| r.uuid(i).eq_ignore_ascii_case(&uuid)) {
            return Some(i);
        }
    }
    let guess = index_from_env(rt.config.visible_devices.as_deref(), &rt.config.devices_uuid, &uuid, || driver::nvml_index(h))?;
    match region {
        // The region records another device at that index: the guess is wrong.
        Some(r) if !r.uuid(guess).is_empty() => None,
        _ => Some(guess),
    }
}

/// Container index of the device `uuid` from the environment alone: its position in
/// `CUDA_VISIBLE_DEVICES` (a UUID prefix, or an index compared with NVML's `nvml_index`), else
/// in `GPU_DEVICES_UUID`, else NVML's index.
fn index_from_env(visible: Option<&[VisibleDevice]>, devices_uuid: &[String], uuid: &str,
    nvml_index: impl Fn() -> Option<u32>) -> Option<usize> {
    if let Some(vis) = visible {
        return vis.iter().position(|v| match v {
            VisibleDevice::Uuid(p) => uuid.len() >= p.len() && uuid[..p.len()].eq_ignore_ascii_case(p),
            VisibleDevice::Index(n) => nvml_index() == Some(*n),
        });
    }
    if !devices_uuid.is_empty() {
        return devices_uuid.iter().position(|u| u.eq_ignore_ascii_case(uuid));
    }
    nvml_index().map(|i| i as usize)
}

/// (cap, container usage) of container device `dev`; `None` when uncapped.
fn cap_and_used(rt: &Runtime, dev: usize, phys_total: u64) -> Option<(u64, u64)> {
    match rt.region_for_read() {
        Some(r) => Some((r.limit(dev)?, crate::runtime::container_used(r, dev))),
        None => Some((rt.config.mem_limit(dev, phys_total)?, 0)),
    }
}

/// Both NVML memory structs.
pub trait NvmlMemory {
    fn physical_total(&self) -> u64;
    fn virtualize(&mut self, cap: u64, used: u64);
}
impl NvmlMemory for nvmlMemory_t {
    fn physical_total(&self) -> u64 {
        self.total
    }
    fn virtualize(&mut self, cap: u64, used: u64) {
        self.total = cap;
        self.used = used;
        self.free = cap.saturating_sub(used);
    }
}
impl NvmlMemory for nvmlMemory_v2_t {
    fn physical_total(&self) -> u64 {
        self.total
    }
    fn virtualize(&mut self, cap: u64, used: u64) {
        self.total = cap;
        self.reserved = 0;
        self.used = used;
        self.free = cap.saturating_sub(used);
    }
}

/// `nvmlDeviceGetMemoryInfo` and `_v2`: total = cap, used = container usage, free = the rest.
pub unsafe fn memory_info<M: NvmlMemory>(rt: &'static Runtime, real: unsafe extern "C" fn(nvmlDevice_t, *mut M) -> nvmlReturn_t,
    h: nvmlDevice_t, mem: *mut M) -> nvmlReturn_t {
    let r = real(h, mem);
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    let m = &mut *mem;
    if let Some((cap, used)) = container_index(rt, h).and_then(|i| cap_and_used(rt, i, m.physical_total())) {
        m.virtualize(cap, used);
    }
    r
}

/// PIDs (container and host) of the region's live processes.
fn container_pids(r: &Region) -> Vec<u32> {
    let mut v = Vec::new();
    for s in r.live_slots() {
        for p in [r.slot_pid(s), r.slot_hostpid(s)] {
            if p > 0 {
                v.push(p as u32);
            }
        }
    }
    v
}

/// Keep the entries whose pid is the container's, compacting in place; returns the new count.
pub fn filter_in_place<T: Copy>(items: &mut [T], pid_of: impl Fn(&T) -> u32, keep: &[u32]) -> usize {
    let mut n = 0;
    for i in 0..items.len() {
        if keep.contains(&pid_of(&items[i])) {
            items[n] = items[i];
            n += 1;
        }
    }
    n
}

unsafe fn filter_processes<T: Copy>(rt: &Runtime, r: nvmlReturn_t, count: *mut c_uint, infos: *mut T, pid_of: impl Fn(&T) -> u32) -> nvmlReturn_t {
    if r != NVML_SUCCESS || count.is_null() || infos.is_null() {
        return r;
    }
    let Some(region) = rt.region_for_read() else { return r };
    let keep = container_pids(region);
    let items = std::slice::from_raw_parts_mut(infos, *count as usize);
    *count = filter_in_place(items, pid_of, &keep) as c_uint;
    r
}

pub unsafe fn compute_processes_v1(rt: &'static Runtime, real: sig::nvmlDeviceGetComputeRunningProcesses, h: nvmlDevice_t,
    count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t {
    let r = real(h, count, infos);
    filter_processes(rt, r, count, infos, |p| p.pid)
}

pub unsafe fn compute_processes(rt: &'static Runtime, real: sig::nvmlDeviceGetComputeRunningProcesses_v3, h: nvmlDevice_t,
    count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t {
    let r = real(h, count, infos);
    filter_processes(rt, r, count, infos, |p| p.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_compacts() {
        let mut v = [1u32, 7, 3, 7, 9];
        let n = filter_in_place(&mut v, |x| *x, &[7, 9]);
        assert_eq!(&v[..n], &[7, 7, 9]);
        assert_eq!(filter_in_place(&mut v[..0], |x| *x, &[7]), 0);
    }

    #[test]
    fn env_index_follows_the_visible_order() {
        use VisibleDevice::{Index, Uuid};
        let (a, b) = ("GPU-aaaa-1", "GPU-bbbb-2");
        // CUDA_VISIBLE_DEVICES=1,0: physical 1 is the container's device 0
        let vis = [Index(1), Index(0)];
        assert_eq!(index_from_env(Some(&vis), &[], b, || Some(1)), Some(0));
        assert_eq!(index_from_env(Some(&vis), &[], a, || Some(0)), Some(1));
        // by UUID prefix, reordered; a device not listed is not the container's
        let vis = [Uuid("GPU-bbbb".into()), Uuid("gpu-AAAA".into())];
        assert_eq!(index_from_env(Some(&vis), &[], b, || Some(1)), Some(0));
        assert_eq!(index_from_env(Some(&vis), &[], a, || Some(0)), Some(1));
        assert_eq!(index_from_env(Some(&[Index(1)]), &[], a, || Some(0)), None);
        // GPU_DEVICES_UUID, then NVML's index
        let list = [b.to_string(), a.to_string()];
        assert_eq!(index_from_env(None, &list, a, || Some(0)), Some(1));
        assert_eq!(index_from_env(None, &list, "GPU-cccc", || Some(2)), None);
        assert_eq!(index_from_env(None, &[], a, || Some(3)), Some(3));
    }
}
