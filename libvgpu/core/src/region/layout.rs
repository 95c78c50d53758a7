//! Byte layout of the region file: HAMi's v1 `shared_region_t` (bytes 0..2_008_952, byte for byte,
//! see hami-contract.md) followed by our extension. Every field another process may change at the
//! same time is an atomic (same size and alignment as the plain integer); the two `sem_t` areas of
//! the reference are plain bytes that stay zero.

use crate::limiter::{BusyMap, SharedDeviceState};
use crate::{MAX_DEVICES, MAX_PROCS};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8};

pub const HAMI_MAGIC: i32 = 19_920_718;
pub const HAMI_MAJOR: u32 = 1;
pub const HAMI_MINOR: u32 = 2;
pub const UUID_LEN: usize = 96;
/// Size of HAMi's v1 block; our extension starts here.
pub const V1_SIZE: usize = 2_008_952;
pub const EXT_OFFSET: usize = V1_SIZE;
pub const EXT_MAGIC: [u8; 8] = *b"LVGPUEXT";
pub const EXT_VERSION: u32 = 2;

/// Per-device memory usage of one process (HAMi `device_memory_t`, 64 bytes).
#[repr(C)]
pub struct DeviceMemory {
    pub context_size: AtomicU64,
    pub module_size: AtomicU64,
    pub data_size: AtomicU64,
    pub offset: AtomicU64,
    pub total: AtomicU64,
    pub unused: [AtomicU64; 3],
}

/// Per-device utilization of one process (HAMi `device_util_t`, 48 bytes).
#[repr(C)]
pub struct DeviceUtil {
    pub dec_util: AtomicU64,
    pub enc_util: AtomicU64,
    pub sm_util: AtomicU64,
    pub unused: [AtomicU64; 3],
}

/// HAMi `shrreg_proc_slot_t` (1960 bytes).
#[repr(C)]
pub struct ProcSlot {
    pub pid: AtomicI32,
    pub hostpid: AtomicI32,
    pub used: [DeviceMemory; MAX_DEVICES],
    pub monitorused: [AtomicU64; MAX_DEVICES],
    pub device_util: [DeviceUtil; MAX_DEVICES],
    pub status: AtomicI32,
    _pad: u32,
    pub seqlock: AtomicU64,
    pub unused: [AtomicU64; 2],
}

/// HAMi `shared_region_t`, layout version 1 (2,008,952 bytes).
#[repr(C)]
pub struct SharedRegionV1 {
    pub initialized_flag: AtomicI32,
    pub major_version: AtomicU32,
    pub minor_version: AtomicU32,
    pub sm_init_flag: AtomicI32,
    pub owner_pid: AtomicU64,
    /// The reference's `sem_t`; never used by us, stays zero.
    pub sem: [u8; 32],
    pub device_num: AtomicU64,
    pub uuids: [[AtomicU8; UUID_LEN]; MAX_DEVICES],
    pub limit: [AtomicU64; MAX_DEVICES],
    pub sm_limit: [AtomicU64; MAX_DEVICES],
    pub procs: [ProcSlot; MAX_PROCS],
    pub proc_num: AtomicI32,
    pub utilization_switch: AtomicI32,
    pub recent_kernel: AtomicI32,
    pub priority: AtomicI32,
    pub last_kernel_time: AtomicU64,
    /// The reference's second `sem_t`; stays zero.
    pub sem_2: [u8; 32],
}

/// Extension header at [`EXT_OFFSET`] (8-aligned). Sized so the body that follows starts on a
/// 64-byte boundary of the file (the limiter state is cache-line aligned).
#[repr(C)]
pub struct ExtHeader {
    /// `EXT_MAGIC` as little-endian u64.
    pub magic: AtomicU64,
    pub ext_version: AtomicU32,
    /// Bytes from EXT_OFFSET to the end of the extension (header + body).
    pub ext_size: AtomicU32,
    /// Bumped on every change of a limit or of the suspend flag.
    pub limits_epoch: AtomicU64,
    /// Nonzero: every launch of the container waits (shrreg-tool --suspend).
    pub suspended: AtomicU32,
    pub flags: AtomicU32,
    /// Nonzero: `limit[d]` is a real cap; zero: uncapped (then `limit[d]` shows the physical size).
    pub mem_capped: [AtomicU32; MAX_DEVICES],
    /// Env values that set the live limits (newer-intent rule); `UNCAPPED` = no cap.
    pub configured_limit: [AtomicU64; MAX_DEVICES],
    /// Env SM caps that set `sm_limit` (0 = no cap).
    pub configured_sm_limit: [AtomicU32; MAX_DEVICES],
    /// Soft SM cap (0 = none).
    pub soft_sm_limit: [AtomicU32; MAX_DEVICES],
    /// Physical memory of each device as last reported (0 = unknown).
    pub physical_total: [AtomicU64; MAX_DEVICES],
    pub reserved: [AtomicU64; 13],
}

/// Our per-slot extension (64 bytes), parallel to `procs[]`.
#[repr(C)]
pub struct SlotExt {
    /// Bumped each time the slot is taken or freed: a reused slot is distinguishable.
    pub generation: AtomicU64,
    pub launches: AtomicU64,
    /// Occupancy charged to this process (ns).
    pub busy_ns: AtomicU64,
    /// Latest launch (clock::now_ns).
    pub last_launch_ns: AtomicU64,
    /// Recent utilization, percent x 100.
    pub util_centi: AtomicU32,
    pub priority: AtomicI32,
    /// `SLOT_FLAG_*`.
    pub flags: AtomicU32,
    _pad: u32,
    /// When the slot was registered (clock::now_ns).
    pub registered_ns: AtomicU64,
    /// The owner's start time, in clock ticks since boot (0: unknown): its exited slot is reaped
    /// once that process has ended (`teardown`).
    pub start_ticks: AtomicU64,
}

pub const SLOT_FLAG_HOSTPID_UNKNOWN: u32 = 1;
/// The owner exited (`status` is 0, so readers skip it) but may still hold device memory until
/// the kernel has torn it down: the slot keeps counting against the cap until reaped.
pub const SLOT_FLAG_EXITING: u32 = 2;

/// Extension body (64-aligned).
#[repr(C, align(64))]
pub struct ExtBody {
    pub limiter: [SharedDeviceState; MAX_DEVICES],
    pub slots: [SlotExt; MAX_PROCS],
    /// Per-device busy bitmaps: the union of the container's kernel time (`limiter::busy`).
    pub busy: [BusyMap; MAX_DEVICES],
    pub reserved: [u8; 4096],
}

pub const EXT_HEADER_SIZE: usize = std::mem::size_of::<ExtHeader>();
pub const EXT_BODY_OFFSET: usize = EXT_OFFSET + EXT_HEADER_SIZE;
pub const EXT_SIZE: usize = EXT_HEADER_SIZE + std::mem::size_of::<ExtBody>();
/// Total file size (v1 + extension).
pub const TOTAL_SIZE: usize = EXT_OFFSET + EXT_SIZE;
/// Stored in `configured_limit` for "no cap".
pub const UNCAPPED: u64 = u64::MAX;

const _: () = assert!(std::mem::size_of::<SharedRegionV1>() == V1_SIZE);
const _: () = assert!(std::mem::size_of::<ProcSlot>() == 1960);
const _: () = assert!(EXT_OFFSET.is_multiple_of(8) && std::mem::align_of::<ExtHeader>() == 8);
const _: () = assert!(EXT_BODY_OFFSET.is_multiple_of(64));
const _: () = assert!(std::mem::size_of::<SlotExt>() == 64);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn v1_offsets_match_hami() {
        assert_eq!(size_of::<SharedRegionV1>(), 2_008_952);
        assert_eq!(offset_of!(SharedRegionV1, initialized_flag), 0);
        assert_eq!(offset_of!(SharedRegionV1, major_version), 4);
        assert_eq!(offset_of!(SharedRegionV1, minor_version), 8);
        assert_eq!(offset_of!(SharedRegionV1, sm_init_flag), 12);
        assert_eq!(offset_of!(SharedRegionV1, owner_pid), 16);
        assert_eq!(offset_of!(SharedRegionV1, sem), 24);
        assert_eq!(offset_of!(SharedRegionV1, device_num), 56);
        assert_eq!(offset_of!(SharedRegionV1, uuids), 64);
        assert_eq!(offset_of!(SharedRegionV1, limit), 1600);
        assert_eq!(offset_of!(SharedRegionV1, sm_limit), 1728);
        assert_eq!(offset_of!(SharedRegionV1, procs), 1856);
        assert_eq!(offset_of!(SharedRegionV1, proc_num), 2_008_896);
        assert_eq!(offset_of!(SharedRegionV1, utilization_switch), 2_008_900);
        assert_eq!(offset_of!(SharedRegionV1, recent_kernel), 2_008_904);
        assert_eq!(offset_of!(SharedRegionV1, priority), 2_008_908);
        assert_eq!(offset_of!(SharedRegionV1, last_kernel_time), 2_008_912);
        assert_eq!(offset_of!(SharedRegionV1, sem_2), 2_008_920);
    }

    #[test]
    fn slot_offsets_match_hami() {
        assert_eq!(size_of::<ProcSlot>(), 1960);
        assert_eq!(offset_of!(ProcSlot, pid), 0);
        assert_eq!(offset_of!(ProcSlot, hostpid), 4);
        assert_eq!(offset_of!(ProcSlot, used), 8);
        assert_eq!(size_of::<DeviceMemory>(), 64);
        assert_eq!(offset_of!(DeviceMemory, context_size), 0);
        assert_eq!(offset_of!(DeviceMemory, module_size), 8);
        assert_eq!(offset_of!(DeviceMemory, data_size), 16);
        assert_eq!(offset_of!(DeviceMemory, offset), 24);
        assert_eq!(offset_of!(DeviceMemory, total), 32);
        assert_eq!(offset_of!(ProcSlot, monitorused), 1032);
        assert_eq!(offset_of!(ProcSlot, device_util), 1160);
        assert_eq!(size_of::<DeviceUtil>(), 48);
        assert_eq!(offset_of!(DeviceUtil, sm_util), 16);
        assert_eq!(offset_of!(ProcSlot, status), 1928);
        assert_eq!(offset_of!(ProcSlot, seqlock), 1936);
        assert_eq!(offset_of!(ProcSlot, unused), 1944);
    }

    #[test]
    fn extension_layout() {
        assert_eq!(EXT_OFFSET, 2_008_952);
        assert_eq!(offset_of!(ExtHeader, magic), 0);
        assert_eq!(offset_of!(ExtHeader, ext_version), 8);
        assert_eq!(offset_of!(ExtHeader, ext_size), 12);
        assert_eq!(EXT_BODY_OFFSET % 64, 0);
        assert_eq!(offset_of!(ExtBody, limiter), 0);
        assert_eq!(offset_of!(ExtBody, slots), 16 * 128);
        assert_eq!(EXT_BODY_OFFSET, 2_009_536);
        assert_eq!(TOTAL_SIZE, 2_605_504); // + 16 busy maps of 32 KiB (limiter::busy)
        assert_eq!(u64::from_le_bytes(EXT_MAGIC).to_le_bytes(), *b"LVGPUEXT");
    }
}
