//! NVML virtualization: `nvidia-smi` and monitoring libraries inside the container see the
//! container's devices with total = cap, used = the container's usage (every live process in the
//! region), free = total - used; and process lists filtered to the container's processes.
//!
//! Which container device an NVML handle is, and which processes stay listed, is
//! `vgpu_core::policy::devmap`'s decision (its module comment gives the order of the sources).
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
use vgpu_core::policy::devmap::{self, Sources};
use vgpu_core::config::within_device;
use vgpu_core::policy::meminfo::nvml_memory;
use vgpu_core::MAX_DEVICES;

/// Container device index of an NVML handle (`devmap::container_index` decides).
fn container_index(rt: &Runtime, h: nvmlDevice_t) -> Option<usize> {
    let uuid = driver::nvml_uuid(h)?;
    let ps = rt.proc_if_ready();
    let own: Option<Vec<(usize, &str)>> = ps.map(|ps| ps.devices.iter().map(|d| (d.index, d.uuid.as_str())).collect());
    // Read only when no CUDA process state decides (an NVML-only process).
    let region = if ps.is_none() { rt.region_for_read() } else { None };
    let recorded: Option<(Vec<String>, usize)> = region.map(|r| ((0..MAX_DEVICES).map(|i| r.uuid(i)).collect(), r.device_num()));
    let src = Sources {
        own: own.as_deref(),
        region: recorded.as_ref().map(|(u, n)| (u.as_slice(), *n)),
        visible: rt.config.visible_devices.as_deref(),
        devices_uuid: &rt.config.devices_uuid,
    };
    devmap::container_index(&uuid, &src, || driver::nvml_index(h))
}

/// (cap, container usage) of container device `dev`; `None` when uncapped.
fn cap_and_used(rt: &Runtime, dev: usize, phys_total: u64) -> Option<(u64, u64)> {
    match rt.region_for_read() {
        Some(r) => Some((within_device(r.limit(dev)?, phys_total, rt.config.oversubscribe), crate::runtime::container_used(r, dev))),
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
        let m = nvml_memory(cap, used);
        (self.total, self.used, self.free) = (m.total, m.used, m.free);
    }
}
impl NvmlMemory for nvmlMemory_v2_t {
    fn physical_total(&self) -> u64 {
        self.total
    }
    fn virtualize(&mut self, cap: u64, used: u64) {
        let m = nvml_memory(cap, used);
        (self.total, self.reserved, self.used, self.free) = (m.total, m.reserved, m.used, m.free);
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


unsafe fn filter_processes<T: Copy>(rt: &Runtime, r: nvmlReturn_t, count: *mut c_uint, infos: *mut T, pid_of: impl Fn(&T) -> u32) -> nvmlReturn_t {
    if r != NVML_SUCCESS || count.is_null() || infos.is_null() {
        return r;
    }
    let Some(region) = rt.region_for_read() else { return r };
    let keep = devmap::container_pids(region.live_slots().map(|s| (region.slot_pid(s), region.slot_hostpid(s))));
    let items = std::slice::from_raw_parts_mut(infos, *count as usize);
    *count = devmap::filter_in_place(items, pid_of, &keep) as c_uint;
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
