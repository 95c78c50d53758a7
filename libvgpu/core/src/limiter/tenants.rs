//! Is another tenant using the GPU? (decides the contention discount and the soft cap)
//!
//! The device's utilization from NVML minus the container's own is other tenants' work only if
//! there *is* another tenant: NVML also counts busy time the container's events cannot see
//! (memsets and copies: 98-100% with no kernel at all on an H100, `bench/py/engine_probe.py`).
//! Read as a tenant, that gap made the limiter discount its own work (ResNet-50 at cap 50 ran at
//! 81% by NVML). So a tenant is flagged only while NVML lists compute processes beyond the
//! container's own; the utilization difference then says whether it is busy.

/// Points of device utilization beyond our own that mean another tenant is active.
pub const CONTENDED_OTHERS_PCT: i64 = 10;
/// Below this, other tenants are idle (the soft cap may apply).
pub const IDLE_OTHERS_PCT: i64 = 5;
/// Consecutive readings that must agree before the signal changes (NVML's sampling window and
/// ours differ, so one reading can be off).
pub const TENANT_CONFIRM: u8 = 3;

/// One monitor reading of a device.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// NVML's device utilization (every tenant), percent.
    pub device_util: u32,
    /// The container's own utilization, percent.
    pub own_util: u32,
    /// Compute processes NVML lists on the device (`None`: NVML cannot say), and how many live
    /// processes the container has.
    pub device_processes: Option<usize>,
    pub own_processes: usize,
}

/// The signal with hysteresis.
#[derive(Clone, Copy, Debug, Default)]
pub struct TenantSignal {
    contended_run: u8,
    calm_run: u8,
    idle_run: u8,
    busy_run: u8,
    alone_run: u8,
    foreign_run: u8,
    /// Another tenant is busy on the device: waits on our work are charged at our share.
    pub contended: bool,
    /// No other tenant is busy: the soft cap may apply.
    pub others_idle: bool,
    /// NVML lists no compute process beyond the container's own (three readings agreeing): the
    /// device's utilization is the container's (`calibrate`).
    pub alone: bool,
}

impl TenantSignal {
    pub fn update(&mut self, r: Reading) {
        let foreign = r.device_processes.is_none_or(|n| n > r.own_processes);
        let others = if foreign { r.device_util as i64 - r.own_util as i64 } else { 0 };
        let bump = |run: &mut u8, hit: bool| *run = if hit { run.saturating_add(1) } else { 0 };
        bump(&mut self.contended_run, others >= CONTENDED_OTHERS_PCT);
        bump(&mut self.calm_run, others < CONTENDED_OTHERS_PCT);
        bump(&mut self.idle_run, others < IDLE_OTHERS_PCT);
        bump(&mut self.busy_run, others >= IDLE_OTHERS_PCT);
        bump(&mut self.alone_run, !foreign);
        bump(&mut self.foreign_run, foreign);
        if self.alone_run >= TENANT_CONFIRM {
            self.alone = true;
        } else if self.foreign_run >= TENANT_CONFIRM {
            self.alone = false;
        }
        if self.contended_run >= TENANT_CONFIRM {
            self.contended = true;
        } else if self.calm_run >= TENANT_CONFIRM {
            self.contended = false;
        }
        if self.idle_run >= TENANT_CONFIRM {
            self.others_idle = true;
        } else if self.busy_run >= TENANT_CONFIRM {
            self.others_idle = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(sig: &mut TenantSignal, n: usize, device_util: u32, own_util: u32, procs: Option<usize>) {
        for _ in 0..n {
            sig.update(Reading { device_util, own_util, device_processes: procs, own_processes: 1 });
        }
    }

    #[test]
    fn a_gap_with_no_other_process_is_not_a_tenant() {
        // ResNet-50 at cap 50 on an H100: NVML 81, own 56, only our process on the GPU.
        let mut s = TenantSignal::default();
        feed(&mut s, 5, 81, 56, Some(1));
        assert!(!s.contended && s.others_idle && s.alone);
    }

    #[test]
    fn another_busy_process_is_a_tenant_after_three_readings() {
        let mut s = TenantSignal::default();
        feed(&mut s, 2, 90, 30, Some(2));
        assert!(!s.contended, "one or two readings are not enough");
        feed(&mut s, 1, 90, 30, Some(2));
        assert!(s.contended && !s.others_idle);
        // It goes quiet (still listed): calm after three readings.
        feed(&mut s, 3, 31, 30, Some(2));
        assert!(!s.contended && s.others_idle);
    }

    #[test]
    fn without_a_process_list_the_utilization_gap_decides() {
        let mut s = TenantSignal::default();
        feed(&mut s, 3, 90, 30, None);
        assert!(s.contended && !s.alone, "without a list the container is never taken as alone");
    }

    #[test]
    fn one_odd_process_list_does_not_end_being_alone() {
        let mut s = TenantSignal::default();
        feed(&mut s, 3, 60, 50, Some(1));
        assert!(s.alone);
        feed(&mut s, 2, 60, 50, Some(2));
        assert!(s.alone, "a process starting or exiting for a moment");
        feed(&mut s, 1, 60, 50, Some(2));
        assert!(!s.alone, "three readings agree: another tenant");
    }
}
