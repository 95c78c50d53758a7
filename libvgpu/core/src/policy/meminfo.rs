//! The virtual device the container sees: total = the cap (never more than the physical device),
//! used = the container's usage, free = what is left of the cap (never more than physically free).
//! Uncapped devices (and devices the hook does not control) are reported unchanged: the callers
//! pass `None` caps through.

/// `cuMemGetInfo`: (free, total) the program should see, from the physical values.
pub fn virtual_info(phys_free: u64, phys_total: u64, cap: u64, used: u64) -> (u64, u64) {
    let total = cap.min(phys_total);
    let free = total.saturating_sub(used).min(phys_free);
    (free, total)
}

/// `cuDeviceTotalMem`: the cap, at most the physical total.
pub fn virtual_total(phys_total: u64, cap: u64) -> u64 {
    cap.min(phys_total)
}

/// A value of a legacy 32-bit API (`cuMemGetInfo`, `cuDeviceTotalMem`), computed at full width.
pub fn clamp_u32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

/// NVML's memory figures of a virtualized device (`nvmlDeviceGetMemoryInfo[_v2]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlMemory {
    pub total: u64,
    pub used: u64,
    pub free: u64,
    /// `_v2`'s driver-reserved memory: none of the container's cap.
    pub reserved: u64,
}

/// NVML's view: total = the cap (the cap as set: NVML readers compare it with the limit they
/// configured), used = the container's usage, free = the rest.
pub fn nvml_memory(cap: u64, used: u64) -> NvmlMemory {
    NvmlMemory { total: cap, used, free: cap.saturating_sub(used), reserved: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    const GIB: u64 = 1 << 30;

    #[test]
    fn virtualization() {
        // 4 GiB cap on an 80 GiB device, 1 GiB used by the container, plenty physically free.
        assert_eq!(virtual_info(70 * GIB, 80 * GIB, 4 * GIB, GIB), (3 * GIB, 4 * GIB));
        // physically nearly full: free is the physical free
        assert_eq!(virtual_info(GIB / 2, 80 * GIB, 4 * GIB, GIB), (GIB / 2, 4 * GIB));
        // over the cap (cap lowered at run time): free saturates at 0
        assert_eq!(virtual_info(70 * GIB, 80 * GIB, 4 * GIB, 5 * GIB), (0, 4 * GIB));
        // oversubscribed cap above physical: total is physical
        assert_eq!(virtual_info(70 * GIB, 80 * GIB, 100 * GIB, 0), (70 * GIB, 80 * GIB));
        assert_eq!(virtual_total(80 * GIB, 4 * GIB), 4 * GIB);
        assert_eq!(virtual_total(80 * GIB, 100 * GIB), 80 * GIB);
    }

    #[test]
    fn legacy_values_clamp() {
        assert_eq!(clamp_u32(4 * GIB), u32::MAX);
        assert_eq!(clamp_u32(3 * GIB), 3 * GIB as u32);
    }

    #[test]
    fn nvml_shows_the_cap() {
        assert_eq!(nvml_memory(4 * GIB, GIB), NvmlMemory { total: 4 * GIB, used: GIB, free: 3 * GIB, reserved: 0 });
        assert_eq!(nvml_memory(4 * GIB, 5 * GIB).free, 0);
    }

    proptest! {
        #[test]
        fn the_virtual_device_is_within_the_cap_and_the_physical_device(pf in any::<u64>(), pt in any::<u64>(),
                                                                         cap in any::<u64>(), used in any::<u64>()) {
            let pf = pf.min(pt);
            let (free, total) = virtual_info(pf, pt, cap, used);
            prop_assert!(total <= cap && total <= pt);
            prop_assert!(free <= total && free <= pf);
            prop_assert!(free <= total.saturating_sub(used));
            prop_assert_eq!(total, virtual_total(pt, cap));
            let m = nvml_memory(cap, used);
            prop_assert_eq!(m.free + m.used.min(cap), cap);
        }
    }
}
