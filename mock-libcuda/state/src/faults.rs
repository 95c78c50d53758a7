//! Fault and delay injection, parsed once per process from the environment.
//!
//! `MOCK_CUDA_FAULT="cuMemAlloc_v2:3:2,cuLaunchKernel:5*:700"`: the 3rd call of `cuMemAlloc_v2`
//! returns 2; every `cuLaunchKernel` call from the 5th on returns 700 (calls counted per process
//! from 1, per exported name). `MOCK_CUDA_DELAY="cuMemAlloc_v2:1000"` adds 1000 us to each call.
//! The NVML mock reads `MOCK_NVML_FAULT` / `MOCK_NVML_DELAY` the same way.

#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub name: String,
    pub nth: u64,
    pub and_after: bool,
    pub code: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Injection {
    pub faults: Vec<FaultRule>,
    pub delays: Vec<(String, u64)>,
}

impl Injection {
    /// Parse the two variables; a malformed entry prints one error line and is skipped.
    pub fn parse(fault: Option<&str>, delay: Option<&str>, var_prefix: &str) -> Injection {
        let mut inj = Injection::default();
        for item in fault.unwrap_or("").split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match parse_fault(item) {
                Some(r) => inj.faults.push(r),
                None => eprintln!("[mock-gpu] error: {var_prefix}_FAULT entry {item:?} is not NAME:N[*]:CODE; ignored"),
            }
        }
        for item in delay.unwrap_or("").split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.rsplit_once(':').and_then(|(n, us)| Some((n.trim().to_string(), us.trim().parse().ok()?))) {
                Some(d) if !d.0.is_empty() => inj.delays.push(d),
                _ => eprintln!("[mock-gpu] error: {var_prefix}_DELAY entry {item:?} is not NAME:MICROSECONDS; ignored"),
            }
        }
        inj
    }

    pub fn from_env(var_prefix: &str) -> Injection {
        let f = std::env::var(format!("{var_prefix}_FAULT")).ok();
        let d = std::env::var(format!("{var_prefix}_DELAY")).ok();
        Injection::parse(f.as_deref(), d.as_deref(), var_prefix)
    }

    pub fn is_empty(&self) -> bool {
        self.faults.is_empty() && self.delays.is_empty()
    }

    /// The code to return for call number `n` (from 1) of `name`, if a rule fires.
    pub fn fault_for(&self, name: &str, n: u64) -> Option<u32> {
        self.faults
            .iter()
            .find(|r| r.name == name && (r.nth == n || (r.and_after && n >= r.nth)))
            .map(|r| r.code)
    }

    pub fn delay_us(&self, name: &str) -> u64 {
        self.delays.iter().filter(|(n, _)| n == name).map(|(_, us)| *us).sum()
    }

    /// Apply delay then fault for call `n` of `name`: what the guard of an export does.
    pub fn apply(&self, name: &str, n: u64) -> Option<u32> {
        let us = self.delay_us(name);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
        self.fault_for(name, n)
    }
}

/// What every export of the mocks runs: count the call, apply injected delay/fault, then run the
/// body with panics caught (a panic must never unwind into C: it becomes `on_panic`).
pub fn guarded(inj: &Injection, name: &str, calls: &std::sync::atomic::AtomicU64, on_panic: u32, f: impl FnOnce() -> u32) -> u32 {
    if !inj.is_empty() {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if let Some(code) = inj.apply(name, n) {
            return code;
        }
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            eprintln!("[mock-gpu] error: panic inside {name}; returning {on_panic}");
            on_panic
        }
    }
}

fn parse_fault(item: &str) -> Option<FaultRule> {
    let mut parts = item.split(':').map(str::trim);
    let name = parts.next()?.to_string();
    let nth_s = parts.next()?;
    let code: u32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || name.is_empty() {
        return None;
    }
    let (nth_s, and_after) = match nth_s.strip_suffix('*') {
        Some(s) => (s, true),
        None => (nth_s, false),
    };
    let nth: u64 = nth_s.parse().ok().filter(|n| *n >= 1)?;
    Some(FaultRule { name, nth, and_after, code })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_fires() {
        let inj = Injection::parse(Some("cuMemAlloc_v2:3:2, cuLaunchKernel:1:700,cuMemFree_v2:5*:1"), Some("cuInit:10"), "MOCK_CUDA");
        assert_eq!(inj.faults.len(), 3);
        assert_eq!(inj.fault_for("cuMemAlloc_v2", 2), None);
        assert_eq!(inj.fault_for("cuMemAlloc_v2", 3), Some(2));
        assert_eq!(inj.fault_for("cuMemAlloc_v2", 4), None);
        assert_eq!(inj.fault_for("cuLaunchKernel", 1), Some(700));
        assert_eq!(inj.fault_for("cuLaunchKernel_ptsz", 1), None);
        assert_eq!(inj.fault_for("cuMemFree_v2", 4), None);
        assert_eq!(inj.fault_for("cuMemFree_v2", 5), Some(1));
        assert_eq!(inj.fault_for("cuMemFree_v2", 500), Some(1));
        assert_eq!(inj.delay_us("cuInit"), 10);
        assert_eq!(inj.delay_us("cuMemAlloc_v2"), 0);
    }

    #[test]
    fn guard_counts_faults_and_catches_panics() {
        let inj = Injection::parse(Some("f:2:7"), None, "T");
        let calls = std::sync::atomic::AtomicU64::new(0);
        assert_eq!(guarded(&inj, "f", &calls, 999, || 0), 0);
        assert_eq!(guarded(&inj, "f", &calls, 999, || 0), 7);
        assert_eq!(guarded(&inj, "f", &calls, 999, || panic!("boom")), 999);
    }

    #[test]
    fn malformed_entries_are_skipped() {
        let inj = Injection::parse(Some("x,cuA:0:1,cuB:1:notacode,cuC:2:3:4,cuD:1:2"), Some("cuE,cuF:x"), "MOCK_CUDA");
        assert_eq!(inj.faults, vec![FaultRule { name: "cuD".into(), nth: 1, and_after: false, code: 2 }]);
        assert!(inj.delays.is_empty());
        assert!(Injection::parse(None, None, "MOCK_CUDA").is_empty());
    }
}
