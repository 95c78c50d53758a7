//! NVML virtualization: `nvidia-smi` and monitoring libraries inside the container see the
//! container's devices with total = cap, used = the container's usage (every live process in the
//! region), free = total - used; and process lists filtered to the container's processes.
//!
//! NVML numbers devices physically; a handle is mapped to the container's device index by UUID:
//! against the devices this process got from CUDA when it has initialized CUDA, else against the
//! UUIDs CUDA processes recorded in the region, else via `CUDA_VISIBLE_DEVICES` (UUID prefixes, or
//! indices compared with NVML's index) or `GPU_DEVICES_UUID`; with none of these, NVML's index.
//! Devices that do not map, and uncapped devices, are reported unchanged.
//!
//! Process lists: NVML reports host PIDs. An entry is kept when its PID is the container PID or
//! the recorded host PID of a live slot in the region. Without a shared PID namespace and without
//! recorded host PIDs nothing can be matched and the list comes back empty (the container's own
//! processes are not identifiable without the host PID; other tenants' must not be shown).

use crate::driver;
use crate::ffi::*;
use crate::hooks::table::sig;
use crate::runtime::Runtime;
use std::ffi::c_uint;
use vgpu_core::config::VisibleDevice;
use vgpu_core::region::Region;

/// Container device index of an NVML handle.
fn container_index(rt: &Runtime, h: nvmlDevice_t) -> Option<usize> {
    let uuid = driver::nvml_uuid(h)?;
    if let Some(ps) = rt.proc_if_ready() {
        return ps.devices.iter().position(|d| d.uuid.eq_ignore_ascii_case(&uuid));
    }
    if let Some(r) = rt.region_for_read() {
        if let Some(i) = (0..r.device_num()).find(|&i| r.uuid(i).eq_ignore_ascii_case(&uuid)) {
            return Some(i);
        }
    }
    if let Some(vis) = &rt.config.visible_devices {
        let nvml_idx = driver::nvml_index(h);
        return vis.iter().position(|v| match v {
            VisibleDevice::Uuid(p) => uuid.len() >= p.len() && uuid[..p.len()].eq_ignore_ascii_case(p),
            VisibleDevice::Index(n) => nvml_idx == Some(*n),
        });
    }
    if !rt.config.devices_uuid.is_empty() {
        return rt.config.devices_uuid.iter().position(|u| u.eq_ignore_ascii_case(&uuid));
    }
    driver::nvml_index(h).map(|i| i as usize)
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
}
