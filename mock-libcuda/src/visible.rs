//! `CUDA_VISIBLE_DEVICES`, as the real driver applies it: the process's device ordinals are the
//! listed devices in list order; NVML (the mock NVML crate) keeps seeing every device by its
//! physical index.
//!
//! - unset: every device, in physical order;
//! - a comma list of physical indices (`1,0`) or UUIDs with their `GPU-` prefix, whole or any
//!   unique prefix (`GPU-8a1b`); whitespace around entries is ignored;
//! - the list ends at the first entry that is not valid (not a number, an index out of range, a
//!   UUID prefix matching no device or several, a device already listed): only the entries before
//!   it are visible, like the driver;
//! - an empty list (`""`, or a first entry that is not valid): no device, `cuInit` answers
//!   `CUDA_ERROR_NO_DEVICE`.
//!
//! Internally the mock keeps physical indices; `Proc::dev` maps an ordinal to its physical index
//! and the calls that return a device (`cuCtxGetDevice*`, `cuDeviceGetByPCIBusId`) map back.

use mock_gpu::GpuState;
use std::sync::OnceLock;

/// Physical indices of the visible devices, in ordinal order, for a `CUDA_VISIBLE_DEVICES` value
/// and the devices' UUID strings (`GPU-...`).
pub fn parse(spec: Option<&str>, uuids: &[String]) -> Vec<usize> {
    let Some(spec) = spec else { return (0..uuids.len()).collect() };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if let Ok(n) = entry.parse::<usize>() {
            (n < uuids.len()).then_some(n)
        } else if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let mut m = (0..uuids.len()).filter(|&d| {
                uuids[d].len() >= entry.len() && uuids[d][..entry.len()].eq_ignore_ascii_case(entry)
            });
            match (m.next(), m.next()) {
                (Some(d), None) => Some(d),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

/// This process's visible devices (read once: the environment of a running process is fixed).
pub fn devices(st: &GpuState) -> &'static [usize] {
    static MAP: OnceLock<Vec<usize>> = OnceLock::new();
    MAP.get_or_init(|| {
        let uuids: Vec<String> = (0..st.device_count()).map(|d| st.uuid_string(d)).collect();
        let spec = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        parse(spec.as_deref(), &uuids)
    })
}

/// Physical index of device ordinal `ordinal`.
pub fn physical(st: &GpuState, ordinal: i32) -> Option<usize> {
    devices(st).get(usize::try_from(ordinal).ok()?).copied()
}

/// Ordinal of physical device `phys` (`None`: not visible to this process).
pub fn ordinal(st: &GpuState, phys: usize) -> Option<i32> {
    devices(st).iter().position(|&d| d == phys).map(|o| o as i32)
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn uuids() -> Vec<String> {
        ["GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-aaaa3333-0000"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn visible_lists() {
        let u = uuids();
        assert_eq!(parse(None, &u), vec![0, 1, 2]);
        assert_eq!(parse(Some("1,0"), &u), vec![1, 0]);
        assert_eq!(parse(Some(" 2 , 0 "), &u), vec![2, 0]);
        assert_eq!(parse(Some("GPU-bbbb,GPU-aaaa3"), &u), vec![1, 2]);
        assert_eq!(parse(Some("gpu-BBBB2222-0000"), &u), vec![1]);
        // the list ends at the first entry that is not valid
        assert_eq!(parse(Some("0,7,1"), &u), vec![0]);
        assert_eq!(parse(Some("1,x,0"), &u), vec![1]);
        assert_eq!(parse(Some("GPU-aaaa,1"), &u), Vec::<usize>::new()); // ambiguous prefix
        assert_eq!(parse(Some("1,1,0"), &u), vec![1]);
        assert_eq!(parse(Some("GPU-ffff"), &u), Vec::<usize>::new());
        assert_eq!(parse(Some(""), &u), Vec::<usize>::new());
        assert_eq!(parse(Some("-1"), &u), Vec::<usize>::new());
    }
}
