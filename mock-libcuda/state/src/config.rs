//! Mock GPU configuration: fixed by the process that creates the state file.
//!
//! Sources, later wins: built-in defaults, `MOCK_GPU_CONFIG` (a file of `KEY=value` lines with the
//! same keys as the environment), then the environment. A malformed value prints one error line
//! naming key and value, and the default stays.

use crate::MAX_DEVICES;

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    pub name: String,
    pub total_mem: u64,
    pub sms: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub devices: Vec<DeviceConfig>,
    /// Device memory a context costs (primary or created).
    pub ctx_mem: u64,
    /// Device memory a context gains when it first loads a module (an H100's primary context
    /// grows from 518 to 537 MiB after creation); default 0.
    pub ctx_growth: u64,
    /// Device memory each context makes the device hold outside the process's own NVML figure
    /// (an H100's device-wide used memory grows ~5.6 MiB more per context than the process's
    /// `used_gpu_memory`); default 0.
    pub ctx_hidden: u64,
    /// Duration of one wave of a kernel other than `vgpu_spin`.
    pub kernel_ns: u64,
    /// Busy time NVML counts after each kernel, memset or copy that no timing event sees (on an
    /// H100 NVML reads 4-8 points above the union of every kernel CUPTI saw for PyTorch
    /// training, `bench/py/gap_probe.py`); default 0.
    pub nvml_tail_ns: u64,
    pub clock_khz: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    /// How much faster than CLOCK_MONOTONIC the GPU's event timer runs, in ppm (a real GPU's
    /// timer and an NTP-slewed host clock differ by up to hundreds); default 0.
    pub timer_ppm: i32,
    /// GPU time a switch between two processes' kernels costs when their work meets (an H100
    /// ran two saturating processes at 44.4% of one's throughput each, 11% lost); default 0.
    pub switch_ns: u64,
    /// Host time each event call (`cuEventRecord`, `cuEventQuery`, `cuEventElapsedTime`) takes,
    /// as the driver's do (an H200: a record about 1.5 us, a query with its elapsed time about
    /// 2.5 us); default 0.
    pub event_call_ns: u64,
    /// Busy time NVML counts for each timing event the GPU reaches (an H200 under a cap read
    /// about 1.1 us more per event recorded after each host-paced 5-20 us kernel); default 0.
    pub nvml_event_ns: u64,
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Parse a size: bytes, or a number (integer or decimal) with k/m/g/t and optional `b`/`ib`,
/// any case, powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(format!("not a size: {s:?}"));
    }
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("unknown size unit in {s:?}")),
    };
    if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
        let bytes = v * mult as f64;
        if !(0.0..1.8e19).contains(&bytes) {
            return Err(format!("size out of range: {s:?}"));
        }
        Ok(bytes as u64)
    } else {
        let v: u64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
        v.checked_mul(mult).ok_or_else(|| format!("size out of range: {s:?}"))
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: vec![DeviceConfig { name: "Mock GPU".into(), total_mem: 8 * GIB, sms: 16 }],
            ctx_mem: 300 * MIB,
            ctx_growth: 0,
            ctx_hidden: 0,
            kernel_ns: 2000,
            nvml_tail_ns: 0,
            clock_khz: 1_000_000,
            cc_major: 9,
            cc_minor: 0,
            timer_ppm: 0,
            switch_ns: 0,
            event_call_ns: 0,
            nvml_event_ns: 0,
        }
    }
}

impl Config {
    /// Build a config from a key lookup; returns the config and one message per malformed value.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut errs = Vec::new();
        let mut c = Config::default();
        let mut bad = |k: &str, v: &str, why: String| errs.push(format!("{k}={v:?}: {why}; using the default"));

        let count = match get("MOCK_GPU_COUNT") {
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                Ok(_) => {
                    bad("MOCK_GPU_COUNT", &v, format!("at most {MAX_DEVICES} devices"));
                    1
                }
                Err(e) => {
                    bad("MOCK_GPU_COUNT", &v, e.to_string());
                    1
                }
            },
            None => 1,
        };
        let mut mem = 8 * GIB;
        if let Some(v) = get("MOCK_GPU_MEM") {
            match parse_size(&v) {
                Ok(m) => mem = m,
                Err(e) => bad("MOCK_GPU_MEM", &v, e),
            }
        }
        let mut sms = 16u32;
        if let Some(v) = get("MOCK_GPU_SMS") {
            match v.trim().parse::<u32>() {
                Ok(n) if n > 0 => sms = n,
                Ok(_) => bad("MOCK_GPU_SMS", &v, "must be > 0".into()),
                Err(e) => bad("MOCK_GPU_SMS", &v, e.to_string()),
            }
        }
        let name = get("MOCK_GPU_NAME").filter(|n| !n.is_empty()).unwrap_or_else(|| "Mock GPU".into());
        if let Some(v) = get("MOCK_GPU_CTX_MEM") {
            match parse_size(&v) {
                Ok(m) => c.ctx_mem = m,
                Err(e) => bad("MOCK_GPU_CTX_MEM", &v, e),
            }
        }
        if let Some(v) = get("MOCK_GPU_CTX_GROWTH") {
            match parse_size(&v) {
                Ok(m) => c.ctx_growth = m,
                Err(e) => bad("MOCK_GPU_CTX_GROWTH", &v, e),
            }
        }
        if let Some(v) = get("MOCK_GPU_CTX_HIDDEN") {
            match parse_size(&v) {
                Ok(m) => c.ctx_hidden = m,
                Err(e) => bad("MOCK_GPU_CTX_HIDDEN", &v, e),
            }
        }
        if let Some(v) = get("MOCK_KERNEL_NS") {
            match v.trim().parse::<u64>() {
                Ok(n) => c.kernel_ns = n,
                Err(e) => bad("MOCK_KERNEL_NS", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_NVML_TAIL_NS") {
            match v.trim().parse::<u64>() {
                Ok(n) => c.nvml_tail_ns = n,
                Err(e) => bad("MOCK_NVML_TAIL_NS", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_GPU_CLOCK_KHZ") {
            match v.trim().parse::<u32>() {
                Ok(n) if n > 0 => c.clock_khz = n,
                Ok(_) => bad("MOCK_GPU_CLOCK_KHZ", &v, "must be > 0".into()),
                Err(e) => bad("MOCK_GPU_CLOCK_KHZ", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_GPU_TIMER_PPM") {
            match v.trim().parse::<i32>() {
                Ok(n) if n.abs() < 1_000_000 => c.timer_ppm = n,
                Ok(_) => bad("MOCK_GPU_TIMER_PPM", &v, "must be within +-999999".into()),
                Err(e) => bad("MOCK_GPU_TIMER_PPM", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_GPU_SWITCH_NS") {
            match v.trim().parse::<u64>() {
                Ok(n) => c.switch_ns = n,
                Err(e) => bad("MOCK_GPU_SWITCH_NS", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_EVENT_CALL_NS") {
            match v.trim().parse::<u64>() {
                Ok(n) if n <= 1_000_000 => c.event_call_ns = n,
                Ok(_) => bad("MOCK_EVENT_CALL_NS", &v, "must be at most 1000000".into()),
                Err(e) => bad("MOCK_EVENT_CALL_NS", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_NVML_EVENT_NS") {
            match v.trim().parse::<u64>() {
                Ok(n) if n <= 1_000_000 => c.nvml_event_ns = n,
                Ok(_) => bad("MOCK_NVML_EVENT_NS", &v, "must be at most 1000000".into()),
                Err(e) => bad("MOCK_NVML_EVENT_NS", &v, e.to_string()),
            }
        }
        if let Some(v) = get("MOCK_GPU_CC") {
            let parsed = v.trim().split_once('.').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            match parsed {
                Some((a, b)) => (c.cc_major, c.cc_minor) = (a, b),
                None => bad("MOCK_GPU_CC", &v, "expected MAJOR.MINOR".into()),
            }
        }
        c.devices = (0..count)
            .map(|i| {
                let key = format!("MOCK_GPU_MEM_{i}");
                let total_mem = match get(&key) {
                    Some(v) => match parse_size(&v) {
                        Ok(m) => m,
                        Err(e) => {
                            bad(&key, &v, e);
                            mem
                        }
                    },
                    None => mem,
                };
                DeviceConfig { name: name.clone(), total_mem, sms }
            })
            .collect();
        (c, errs)
    }

    /// The config of this process's environment (and `MOCK_GPU_CONFIG` file); errors go to stderr.
    pub fn from_env() -> Config {
        let mut file_vals: Vec<(String, String)> = Vec::new();
        let mut errs = Vec::new();
        if let Ok(path) = std::env::var("MOCK_GPU_CONFIG") {
            match std::fs::read_to_string(&path) {
                Ok(text) => file_vals = parse_kv(&text),
                Err(e) => errs.push(format!("MOCK_GPU_CONFIG={path:?}: {e}; ignoring it")),
            }
        }
        let get = |k: &str| {
            std::env::var(k).ok().or_else(|| file_vals.iter().rev().find(|(fk, _)| fk == k).map(|(_, v)| v.clone()))
        };
        let (c, more) = Config::from_lookup(&get);
        errs.extend(more);
        for e in errs {
            eprintln!("[mock-gpu] error: {e}");
        }
        c
    }
}

/// `KEY=value` lines; blank lines and `#` comments skipped.
pub fn parse_kv(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(&|k| m.get(k).cloned())
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8g").unwrap(), 8 << 30);
        assert_eq!(parse_size("300m").unwrap(), 300 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2KB").unwrap(), 2048);
        assert!(parse_size("2x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("1.2.3g").is_err());
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn defaults_and_overrides() {
        let (c, e) = cfg(&[]);
        assert!(e.is_empty());
        assert_eq!(c, Config::default());
        let (c, e) = cfg(&[("MOCK_GPU_COUNT", "2"), ("MOCK_GPU_MEM", "4g"), ("MOCK_GPU_MEM_1", "2g"), ("MOCK_GPU_SMS", "132")]);
        assert!(e.is_empty());
        assert_eq!(c.devices.len(), 2);
        assert_eq!(c.devices[0].total_mem, 4 << 30);
        assert_eq!(c.devices[1].total_mem, 2 << 30);
        assert_eq!(c.devices[1].sms, 132);
        let (c, e) = cfg(&[("MOCK_EVENT_CALL_NS", "1500"), ("MOCK_NVML_EVENT_NS", "1100")]);
        assert!(e.is_empty());
        assert_eq!((c.event_call_ns, c.nvml_event_ns), (1500, 1100));
        let (c, e) = cfg(&[("MOCK_EVENT_CALL_NS", "2000000"), ("MOCK_NVML_EVENT_NS", "-1")]);
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!((c.event_call_ns, c.nvml_event_ns), (0, 0), "a bad value leaves the default");
    }

    #[test]
    fn malformed_values_fall_back_with_one_message_each() {
        let (c, e) = cfg(&[("MOCK_GPU_MEM", "lots"), ("MOCK_GPU_COUNT", "x"), ("MOCK_GPU_CC", "9")]);
        assert_eq!(e.len(), 3, "{e:?}");
        assert_eq!(c.devices.len(), 1);
        assert_eq!(c.devices[0].total_mem, 8 << 30);
        assert_eq!((c.cc_major, c.cc_minor), (9, 0));
    }

    #[test]
    fn kv_file() {
        let kv = parse_kv("# c\nMOCK_GPU_COUNT = 3\n\nMOCK_GPU_NAME=H\n");
        assert_eq!(kv, vec![("MOCK_GPU_COUNT".into(), "3".into()), ("MOCK_GPU_NAME".into(), "H".into())]);
    }
}
