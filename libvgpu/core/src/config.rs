//! Configuration from the HAMi env contract, parsed once (design.md "Config").
//!
//! Every problem becomes one [`ConfigProblem`] in [`Config::problems`] (the caller logs each as one
//! line) and a fail-closed value:
//! * memory limit malformed/empty -> that device is capped at 0 bytes (every allocation is refused);
//!   an explicit `0` means "no cap" (HAMi's meaning of a zero limit);
//! * SM limit malformed/empty/out of range -> 1%;
//! * soft SM limit malformed or below the hard cap -> ignored (soft only ever grants more);
//! * `CUDA_OVERSUBSCRIBE`/`CUDA_MEMORY_OVERSUBSCRIBE` malformed -> false (limit clamped to physical);
//! * `CUDA_DISABLE_CONTROL` malformed -> false (control stays on);
//! * `GPU_CORE_UTILIZATION_POLICY` unknown -> `force` (the cap always applies);
//! * `CUDA_TASK_PRIORITY` malformed -> 1 (the default, HAMi's low priority);
//! * log level malformed/out of range -> 2; region path empty -> default path;
//! * `VGPU_PRIORITY_LINGER_US` malformed or over 5000 -> 0 (no linger: the program's own
//!   behaviour);
//! * `VGPU_CONTEXT_RESERVE` malformed -> 512 MiB; `CUDA_VISIBLE_DEVICES`: parsing stops at the
//!   first invalid entry (what the CUDA driver does).
//!
//! Per-device values are indexed by the *visible* device index (the program's device ordinal).

use crate::size::{parse_size, SizeSpec};
use crate::MAX_DEVICES;
use std::collections::HashMap;
use std::fmt;

pub const DEFAULT_REGION_PATH: &str = "/tmp/cudevshr.cache";
pub const DEFAULT_CONTEXT_RESERVE: u64 = 512 << 20;
pub const DEFAULT_LOG_LEVEL: u8 = 2;
pub const DEFAULT_PRIORITY: i32 = 1;
/// How long a higher-priority process keeps its context on the GPU after each synchronize
/// while a lower priority shares the GPU (`policy::linger`).
pub const DEFAULT_LINGER_US: u32 = 300;
pub const MAX_LINGER_US: u32 = 5000;

/// One bad env value: the caller prints it as one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    pub var: String,
    pub value: String,
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.var, self.value, self.message)
    }
}

/// Memory limit of one device as configured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemLimit {
    /// No variable set (or an explicit 0): no cap.
    Unset,
    Spec(SizeSpec),
    /// Malformed value: capped at 0 bytes (fail closed).
    Blocked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UtilPolicy {
    /// Cap while the monitor says the GPU is contended (HAMi `utilization_switch`), or always when
    /// no monitor runs.
    Default,
    /// Always cap, even when the monitor says uncontended.
    Force,
    /// Never cap compute.
    Disable,
}

/// One entry of `CUDA_VISIBLE_DEVICES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VisibleDevice {
    Index(u32),
    /// `GPU-...`/`MIG-...` UUID or a unique prefix of one.
    Uuid(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub mem: [MemLimit; MAX_DEVICES],
    /// Percent, 0 = no cap (0 and 100 both mean no cap; stored as given, malformed -> 1).
    pub sm: [u32; MAX_DEVICES],
    /// Whether a variable names device d's memory / SM cap (any value, malformed too). Unnamed,
    /// the process states no intent for the container's caps (`RegionInit::no_intent_mem`).
    pub mem_named: [bool; MAX_DEVICES],
    pub sm_named: [bool; MAX_DEVICES],
    pub soft_sm: [Option<u32>; MAX_DEVICES],
    pub oversubscribe: bool,
    pub disable_control: bool,
    pub policy: UtilPolicy,
    pub priority: i32,
    /// `VGPU_PRIORITY_LINGER_US` (0: off).
    pub linger_us: u32,
    pub log_level: u8,
    pub region_path: String,
    /// `GPU_DEVICES_UUID` entries (empty when unset).
    pub devices_uuid: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES` as parsed; `None` when unset (all devices visible in driver order).
    pub visible_devices: Option<Vec<VisibleDevice>>,
    pub context_reserve: SizeSpec,
    pub problems: Vec<ConfigProblem>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mem: [MemLimit::Unset; MAX_DEVICES],
            sm: [0; MAX_DEVICES],
            mem_named: [false; MAX_DEVICES],
            sm_named: [false; MAX_DEVICES],
            soft_sm: [None; MAX_DEVICES],
            oversubscribe: false,
            disable_control: false,
            policy: UtilPolicy::Default,
            priority: DEFAULT_PRIORITY,
            linger_us: DEFAULT_LINGER_US,
            log_level: DEFAULT_LOG_LEVEL,
            region_path: DEFAULT_REGION_PATH.to_string(),
            devices_uuid: Vec::new(),
            visible_devices: None,
            context_reserve: SizeSpec::Bytes(DEFAULT_CONTEXT_RESERVE),
            problems: Vec::new(),
        }
    }
}

/// Env reader that remembers problems once per variable (a global fallback is read for 16 devices).
struct Reader<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<ConfigProblem>,
    reported: HashMap<String, ()>,
}

impl Reader<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.get)(var)
    }
    fn problem(&mut self, var: &str, value: &str, message: impl Into<String>) {
        if self.reported.insert(var.to_string(), ()).is_none() {
            self.problems.push(ConfigProblem {
                var: var.to_string(),
                value: value.to_string(),
                message: message.into(),
            });
        }
    }
    /// First variable of `vars` that is set: (name, value).
    fn first(&self, vars: &[String]) -> Option<(String, String)> {
        vars.iter().find_map(|v| self.get(v).map(|val| (v.clone(), val)))
    }
    fn bool(&mut self, vars: &[&str], default: bool, safe: bool) -> bool {
        let names: Vec<String> = vars.iter().map(|s| s.to_string()).collect();
        match self.first(&names) {
            None => default,
            Some((var, val)) => match parse_bool(&val) {
                Some(b) => b,
                None => {
                    self.problem(&var, &val, format!("expected true/false/1/0/yes/no; using {safe}"));
                    safe
                }
            },
        }
    }
}

/// true/false/1/0/yes/no/on/off, any case, surrounding whitespace ignored.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn parse_percent_int(s: &str) -> Result<u32, &'static str> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty");
    }
    if !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected an integer percentage 0..=100");
    }
    match t.parse::<u64>() {
        Ok(v) if v <= 100 => Ok(v as u32),
        _ => Err("out of range (0..=100)"),
    }
}

fn per_dev(i: usize, names: &[&str]) -> Vec<String> {
    // `NAME_i` entries are written with a trailing '_'; the rest are global fallbacks.
    names
        .iter()
        .map(|n| if n.ends_with('_') { format!("{n}{i}") } else { n.to_string() })
        .collect()
}

/// `0`, `000`, `0.0`, `0g`, `0.00MiB`: every digit zero (the unit does not matter).
fn is_literal_zero(val: &str) -> bool {
    let digits: Vec<char> = val.trim().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    digits.iter().any(|c| c.is_ascii_digit()) && digits.iter().all(|c| *c == '0' || *c == '.')
}

impl Config {
    /// Parse from an env lookup (tests pass a map).
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Config {
        let mut r = Reader { get, problems: Vec::new(), reported: HashMap::new() };
        let mut c = Config::default();

        for i in 0..MAX_DEVICES {
            let vars = per_dev(
                i,
                &["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_MEM_LIMIT_", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_MEM_LIMIT"],
            );
            let named = r.first(&vars);
            c.mem_named[i] = named.is_some();
            c.mem[i] = match named {
                None => MemLimit::Unset,
                Some((var, val)) => match parse_size(&val) {
                    // HAMi: an explicit 0 means no cap. Only a literal zero does: a nonzero
                    // value that rounds down to 0 bytes must not silently uncap the device.
                    Ok(SizeSpec::Bytes(0)) if is_literal_zero(&val) => MemLimit::Unset,
                    Ok(SizeSpec::Bytes(0)) => {
                        r.problem(&var, &val, String::from("rounds down to 0 bytes; device capped at 0 bytes"));
                        MemLimit::Blocked
                    }
                    Ok(spec @ SizeSpec::Percent(_)) if spec.resolve(u64::MAX) == 0 => {
                        r.problem(&var, &val, String::from("rounds down to 0 bytes of any device; device capped at 0 bytes"));
                        MemLimit::Blocked
                    }
                    Ok(spec) => MemLimit::Spec(spec),
                    Err(e) => {
                        r.problem(&var, &val, format!("{}; device capped at 0 bytes", e.reason));
                        MemLimit::Blocked
                    }
                },
            };

            let vars = per_dev(
                i,
                &["CUDA_DEVICE_SM_LIMIT_", "CUDA_DEVICE_SM_LIMIT", "CUDA_CORE_LIMIT_", "CUDA_CORE_LIMIT"],
            );
            let named = r.first(&vars);
            c.sm_named[i] = named.is_some();
            c.sm[i] = match named {
                None => 0,
                Some((var, val)) => match parse_percent_int(&val) {
                    Ok(v) => v,
                    Err(why) => {
                        r.problem(&var, &val, format!("{why}; SM cap set to 1%"));
                        1
                    }
                },
            };

            let vars = per_dev(i, &["CUDA_CORE_SOFT_LIMIT_", "CUDA_CORE_SOFT_LIMIT"]);
            c.soft_sm[i] = match r.first(&vars) {
                None => None,
                Some((var, val)) => match parse_percent_int(&val) {
                    Ok(0) => None,
                    Ok(v) => {
                        let hard = c.sm[i];
                        if hard != 0 && hard < 100 && v < hard {
                            r.problem(&var, &val, format!("below the hard SM cap {hard}%; ignored"));
                            None
                        } else {
                            Some(v)
                        }
                    }
                    Err(why) => {
                        r.problem(&var, &val, format!("{why}; ignored"));
                        None
                    }
                },
            };
        }

        c.oversubscribe = r.bool(&["CUDA_OVERSUBSCRIBE", "CUDA_MEMORY_OVERSUBSCRIBE"], false, false);
        c.disable_control = r.bool(&["CUDA_DISABLE_CONTROL"], false, false);

        if let Some(val) = r.get("GPU_CORE_UTILIZATION_POLICY") {
            c.policy = match val.trim().to_ascii_lowercase().as_str() {
                "default" | "" => UtilPolicy::Default,
                "force" => UtilPolicy::Force,
                "disable" => UtilPolicy::Disable,
                _ => {
                    r.problem("GPU_CORE_UTILIZATION_POLICY", &val, "expected default/force/disable; using force");
                    UtilPolicy::Force
                }
            };
        }

        if let Some(val) = r.get("CUDA_TASK_PRIORITY") {
            match val.trim().parse::<i32>() {
                Ok(p) => c.priority = p,
                Err(_) => r.problem("CUDA_TASK_PRIORITY", &val, "expected an integer; using 1"),
            }
        }

        if let Some(val) = r.get("VGPU_PRIORITY_LINGER_US") {
            match val.trim().parse::<u32>() {
                Ok(us) if us <= MAX_LINGER_US => c.linger_us = us,
                _ => {
                    r.problem("VGPU_PRIORITY_LINGER_US", &val, format!("expected 0..={MAX_LINGER_US} microseconds; no linger"));
                    c.linger_us = 0;
                }
            }
        }

        for var in ["LIBCUDA_LOG_LEVEL", "LOGGER_LEVEL"] {
            if let Some(val) = r.get(var) {
                match val.trim().parse::<u8>() {
                    Ok(l) if l <= 4 => c.log_level = l,
                    _ => r.problem(var, &val, "expected 0..=4; using 2"),
                }
                break;
            }
        }

        if let Some(val) = r.get("CUDA_DEVICE_MEMORY_SHARED_CACHE") {
            if val.trim().is_empty() {
                r.problem("CUDA_DEVICE_MEMORY_SHARED_CACHE", &val, format!("empty; using {DEFAULT_REGION_PATH}"));
            } else if !val.starts_with('/') {
                // Resolved against each process's working directory, processes in different
                // directories would each keep a region, and a cap, of their own.
                r.problem(
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                    &val,
                    format!("not an absolute path; using {DEFAULT_REGION_PATH}"),
                );
            } else {
                c.region_path = val;
            }
        }

        if let Some(val) = r.get("GPU_DEVICES_UUID") {
            c.devices_uuid = val.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        }

        if let Some(val) = r.get("CUDA_VISIBLE_DEVICES") {
            let mut list = Vec::new();
            for entry in val.split(',') {
                let e = entry.trim();
                if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
                    match e.parse::<u32>() {
                        Ok(n) => list.push(VisibleDevice::Index(n)),
                        Err(_) => {
                            r.problem("CUDA_VISIBLE_DEVICES", &val, format!("index {e:?} too large; list ends there"));
                            break;
                        }
                    }
                } else if (e.starts_with("GPU-") || e.starts_with("MIG-")) && e.len() > 4 {
                    list.push(VisibleDevice::Uuid(e.to_string()));
                } else {
                    // CUDA itself stops at the first invalid entry; an empty variable hides all devices.
                    if !(val.trim().is_empty() && list.is_empty()) {
                        r.problem("CUDA_VISIBLE_DEVICES", &val, format!("invalid entry {e:?}; list ends there"));
                    }
                    break;
                }
            }
            c.visible_devices = Some(list);
        }

        if let Some(val) = r.get("VGPU_CONTEXT_RESERVE") {
            match parse_size(&val) {
                Ok(s) => c.context_reserve = s,
                Err(e) => r.problem("VGPU_CONTEXT_RESERVE", &val, format!("{}; using 512MiB", e.reason)),
            }
        }

        c.problems = r.problems;
        c
    }

    /// Parse from the process environment (non-UTF-8 values count as malformed).
    pub fn from_process_env() -> Config {
        Config::from_env(&|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Memory cap of visible device `dev` with `physical` bytes (0 = unknown); `None` = no cap.
    /// Without oversubscription a cap is clamped to the physical size when that is known.
    pub fn mem_limit(&self, dev: usize, physical: u64) -> Option<u64> {
        let limit = match self.mem.get(dev)? {
            MemLimit::Unset => return None,
            MemLimit::Blocked => return Some(0),
            MemLimit::Spec(s) => s.resolve(physical),
        };
        Some(within_device(limit, physical, self.oversubscribe))
    }

    /// SM cap in percent (1..=99), `None` = no cap (0, 100, unset, or policy `disable`).
    pub fn sm_limit(&self, dev: usize) -> Option<u32> {
        if self.policy == UtilPolicy::Disable {
            return None;
        }
        match *self.sm.get(dev)? {
            0 | 100.. => None,
            v => Some(v),
        }
    }

    /// Soft SM cap (used while the GPU is otherwise idle), only when a hard cap applies.
    pub fn soft_sm_limit(&self, dev: usize) -> Option<u32> {
        let hard = self.sm_limit(dev)?;
        self.soft_sm.get(dev).copied().flatten().map(|s| s.max(hard))
    }

    /// Whether the cap applies even when the monitor says the GPU is uncontended.
    pub fn cap_when_uncontended(&self) -> bool {
        self.policy == UtilPolicy::Force
    }

    /// Context reserve in bytes for a device of `physical` bytes.
    pub fn context_reserve(&self, physical: u64) -> u64 {
        self.context_reserve.resolve(physical)
    }
}

/// A memory cap as a device of `physical` bytes (0 = unknown) holds it: never above the device
/// unless the process oversubscribes. For the environment's caps and for those set at run time
/// (`shrreg-tool --set-mem-limit`), which NVML shows.
pub fn within_device(limit: u64, physical: u64, oversubscribe: bool) -> u64 {
    if oversubscribe || physical == 0 {
        limit
    } else {
        limit.min(physical)
    }
}

#[cfg(test)]
mod zero_tests {
    use super::*;

    #[test]
    fn only_a_literal_zero_uncaps() {
        for v in ["0", "000", "0g", "0.0g", "0.00MiB"] {
            let get = |k: &str| (k == "CUDA_DEVICE_MEMORY_LIMIT").then(|| v.to_string());
            let c = Config::from_env(&get);
            assert_eq!(c.mem[0], MemLimit::Unset, "{v}");
            assert!(c.problems.is_empty(), "{v}");
        }
        for v in ["0.0001k", "0.4", "0.000001m"] {
            let get = |k: &str| (k == "CUDA_DEVICE_MEMORY_LIMIT").then(|| v.to_string());
            let c = Config::from_env(&get);
            if let Ok(SizeSpec::Bytes(0)) = parse_size(v) {
                assert_eq!(c.mem[0], MemLimit::Blocked, "{v} must fail closed");
                assert_eq!(c.problems.len(), 1, "{v}");
            } else {
                assert_ne!(c.mem[0], MemLimit::Unset, "{v}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn nvml_shows_no_more_than_the_device_unless_oversubscribed() {
        assert_eq!(within_device(100 * GIB, 8 * GIB, false), 8 * GIB);
        assert_eq!(within_device(100 * GIB, 8 * GIB, true), 100 * GIB);
        assert_eq!(within_device(4 * GIB, 8 * GIB, false), 4 * GIB);
        assert_eq!(within_device(100 * GIB, 0, false), 100 * GIB, "the device's size unknown");
    }

    fn cfg(vars: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_env(&move |k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]);
        assert!(c.problems.is_empty());
        for d in 0..MAX_DEVICES {
            assert_eq!(c.mem_limit(d, 8 * GIB), None);
            assert_eq!(c.sm_limit(d), None);
            assert_eq!(c.soft_sm_limit(d), None);
        }
        assert_eq!(c.region_path, DEFAULT_REGION_PATH);
        assert_eq!(c.log_level, 2);
        assert_eq!(c.priority, 1);
        assert_eq!(c.context_reserve(80 * GIB), 512 * MIB);
        assert_eq!(c.visible_devices, None);
        assert!(!c.oversubscribe && !c.disable_control);
        assert_eq!(c.mem_limit(16, 1), None);
        assert_eq!(c.sm_limit(99), None);
    }

    #[rstest]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m")], 0, Some(3000 * MIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT", "2g")], 5, Some(2 * GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT", "2g"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")], 1, Some(GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT", "2g"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")], 0, Some(2 * GIB), 0)]
    #[case(&[("CUDA_MEM_LIMIT_2", "1g"), ("CUDA_DEVICE_MEMORY_LIMIT", "3g")], 2, Some(GIB), 0)]
    #[case(&[("CUDA_MEM_LIMIT_2", "1g"), ("CUDA_DEVICE_MEMORY_LIMIT_2", "3g")], 2, Some(3 * GIB), 0)]
    #[case(&[("CUDA_MEM_LIMIT", "1g"), ("CUDA_DEVICE_MEMORY_LIMIT", "3g")], 0, Some(3 * GIB), 0)]
    #[case(&[("CUDA_MEM_LIMIT", "1g")], 15, Some(GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "50%")], 0, Some(4 * GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")], 0, None, 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "100g")], 0, Some(8 * GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "100g"), ("CUDA_OVERSUBSCRIBE", "true")], 0, Some(100 * GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "100g"), ("CUDA_MEMORY_OVERSUBSCRIBE", "1")], 0, Some(100 * GIB), 0)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "")], 0, Some(0), 1)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "-1")], 0, Some(0), 1)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "abc")], 0, Some(0), 1)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "99999999999999999999999")], 0, Some(0), 1)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "150%")], 0, Some(0), 1)]
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT", "junk")], 7, Some(0), 1)]
    // a malformed per-device value is not rescued by a valid fallback: first hit wins
    #[case(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "1x"), ("CUDA_DEVICE_MEMORY_LIMIT", "1g")], 0, Some(0), 1)]
    fn memory_limits(
        #[case] vars: &[(&str, &str)],
        #[case] dev: usize,
        #[case] want: Option<u64>,
        #[case] problems: usize,
    ) {
        let c = cfg(vars);
        assert_eq!(c.mem_limit(dev, 8 * GIB), want);
        assert_eq!(c.problems.len(), problems, "{:?}", c.problems);
        for p in &c.problems {
            assert!(p.to_string().contains(&p.var) && p.to_string().contains("capped at 0"));
        }
    }

    #[test]
    fn global_problem_reported_once() {
        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "bad")]);
        assert_eq!(c.problems.len(), 1);
        assert!((0..MAX_DEVICES).all(|d| c.mem_limit(d, GIB) == Some(0)));
    }

    #[rstest]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30")], 0, Some(30), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT_1", "40"), ("CUDA_DEVICE_SM_LIMIT", "30")], 1, Some(40), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_CORE_LIMIT_0", "40")], 0, Some(30), 0)]
    #[case(&[("CUDA_CORE_LIMIT_0", "40"), ("CUDA_CORE_LIMIT", "20")], 0, Some(40), 0)]
    #[case(&[("CUDA_CORE_LIMIT", "20")], 3, Some(20), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "0")], 0, None, 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "100")], 0, None, 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", " 50 ")], 0, Some(50), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "")], 0, Some(1), 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "-5")], 0, Some(1), 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "101")], 0, Some(1), 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "99999999999999999999")], 0, Some(1), 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "50%")], 0, Some(1), 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "12.5")], 0, Some(1), 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("GPU_CORE_UTILIZATION_POLICY", "disable")], 0, None, 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("GPU_CORE_UTILIZATION_POLICY", "FORCE")], 0, Some(30), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("GPU_CORE_UTILIZATION_POLICY", "bogus")], 0, Some(30), 1)]
    fn sm_limits(
        #[case] vars: &[(&str, &str)],
        #[case] dev: usize,
        #[case] want: Option<u32>,
        #[case] problems: usize,
    ) {
        let c = cfg(vars);
        assert_eq!(c.sm_limit(dev), want);
        assert_eq!(c.problems.len(), problems, "{:?}", c.problems);
    }

    #[test]
    fn policy_values() {
        assert_eq!(cfg(&[]).policy, UtilPolicy::Default);
        assert!(cfg(&[("GPU_CORE_UTILIZATION_POLICY", "force")]).cap_when_uncontended());
        assert!(!cfg(&[("GPU_CORE_UTILIZATION_POLICY", "default")]).cap_when_uncontended());
        // unknown policy fails closed to force
        assert!(cfg(&[("GPU_CORE_UTILIZATION_POLICY", "off")]).cap_when_uncontended());
    }

    #[rstest]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_CORE_SOFT_LIMIT", "60")], Some(60), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_CORE_SOFT_LIMIT_0", "70"), ("CUDA_CORE_SOFT_LIMIT", "60")], Some(70), 0)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_CORE_SOFT_LIMIT", "20")], None, 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_CORE_SOFT_LIMIT", "x")], None, 1)]
    #[case(&[("CUDA_DEVICE_SM_LIMIT", "30"), ("CUDA_CORE_SOFT_LIMIT", "0")], None, 0)]
    #[case(&[("CUDA_CORE_SOFT_LIMIT", "60")], None, 0)]
    fn soft_limits(#[case] vars: &[(&str, &str)], #[case] want: Option<u32>, #[case] problems: usize) {
        let c = cfg(vars);
        assert_eq!(c.soft_sm_limit(0), want);
        assert_eq!(c.problems.len(), problems, "{:?}", c.problems);
    }

    #[rstest]
    #[case("true", true, 0)]
    #[case("TRUE", true, 0)]
    #[case("1", true, 0)]
    #[case("Yes", true, 0)]
    #[case("false", false, 0)]
    #[case("0", false, 0)]
    #[case("no", false, 0)]
    #[case("", false, 1)]
    #[case("maybe", false, 1)]
    #[case("2", false, 1)]
    fn booleans(#[case] v: &str, #[case] want: bool, #[case] problems: usize) {
        let c = cfg(&[("CUDA_OVERSUBSCRIBE", v)]);
        assert_eq!(c.oversubscribe, want);
        assert_eq!(c.problems.len(), problems);
        let c = cfg(&[("CUDA_DISABLE_CONTROL", v)]);
        assert_eq!(c.disable_control, want);
        assert_eq!(c.problems.len(), problems);
        let c = cfg(&[("CUDA_MEMORY_OVERSUBSCRIBE", v)]);
        assert_eq!(c.oversubscribe, want);
    }

    #[rstest]
    #[case(&[], 300, 0)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", "0")], 0, 0)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", " 1000 ")], 1000, 0)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", "5000")], 5000, 0)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", "5001")], 0, 1)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", "-1")], 0, 1)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", "3ms")], 0, 1)]
    #[case(&[("VGPU_PRIORITY_LINGER_US", "")], 0, 1)]
    fn linger(#[case] vars: &[(&str, &str)], #[case] want: u32, #[case] problems: usize) {
        let c = cfg(vars);
        assert_eq!(c.linger_us, want);
        assert_eq!(c.problems.len(), problems);
    }

    #[rstest]
    #[case(&[("CUDA_TASK_PRIORITY", "0")], 0, 0)]
    #[case(&[("CUDA_TASK_PRIORITY", "-3")], -3, 0)]
    #[case(&[("CUDA_TASK_PRIORITY", "x")], 1, 1)]
    #[case(&[("CUDA_TASK_PRIORITY", "")], 1, 1)]
    #[case(&[("CUDA_TASK_PRIORITY", "99999999999")], 1, 1)]
    fn priority(#[case] vars: &[(&str, &str)], #[case] want: i32, #[case] problems: usize) {
        let c = cfg(vars);
        assert_eq!(c.priority, want);
        assert_eq!(c.problems.len(), problems);
    }

    #[rstest]
    #[case(&[("LIBCUDA_LOG_LEVEL", "4")], 4, 0)]
    #[case(&[("LOGGER_LEVEL", "3")], 3, 0)]
    #[case(&[("LIBCUDA_LOG_LEVEL", "0"), ("LOGGER_LEVEL", "4")], 0, 0)]
    #[case(&[("LIBCUDA_LOG_LEVEL", "5")], 2, 1)]
    #[case(&[("LIBCUDA_LOG_LEVEL", "-1")], 2, 1)]
    #[case(&[("LIBCUDA_LOG_LEVEL", "debug")], 2, 1)]
    fn log_level(#[case] vars: &[(&str, &str)], #[case] want: u8, #[case] problems: usize) {
        let c = cfg(vars);
        assert_eq!(c.log_level, want);
        assert_eq!(c.problems.len(), problems);
    }

    #[test]
    fn region_path_and_uuids() {
        let c = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/y.cache"), ("GPU_DEVICES_UUID", "GPU-a, GPU-b,,")]);
        assert_eq!(c.region_path, "/x/y.cache");
        assert_eq!(c.devices_uuid, vec!["GPU-a", "GPU-b"]);
        let c = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", " ")]);
        assert_eq!(c.region_path, DEFAULT_REGION_PATH);
        assert_eq!(c.problems.len(), 1);
        // Relative, each working directory had its own region, and its own cap (a hostile test:
        // two processes in two directories held 1.7 GiB under 1 GiB, no line).
        for rel in ["vgpu.cache", "./vgpu.cache", "../x/vgpu.cache"] {
            let c = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", rel)]);
            assert_eq!(c.region_path, DEFAULT_REGION_PATH, "{rel}");
            assert_eq!(c.problems.len(), 1, "{rel}");
            assert!(c.problems[0].message.contains("absolute"), "{:?}", c.problems);
        }
    }

    /// Whether the env names each device's caps: an unset variable states no intent for the
    /// container (the region keeps its caps); an explicit 0 does (no cap).
    #[test]
    fn which_caps_the_env_names() {
        let c = cfg(&[]);
        assert_eq!((c.mem_named, c.sm_named), ([false; MAX_DEVICES], [false; MAX_DEVICES]));
        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "0"), ("CUDA_DEVICE_SM_LIMIT_1", "0")]);
        assert_eq!(c.mem_named, [true; MAX_DEVICES]);
        assert!(c.sm_named[1] && !c.sm_named[0]);
        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_2", "abc"), ("CUDA_DEVICE_SM_LIMIT", "x")]);
        assert!(c.mem_named[2] && !c.mem_named[0]);
        assert_eq!(c.sm_named, [true; MAX_DEVICES]);
    }

    /// A percentage too small to name a byte of any device caps it at 0 with a line, as a size
    /// that rounds down to 0 bytes does (a hostile test: `0.0001%` blocked the device silently).
    #[test]
    fn a_percentage_rounding_to_nothing_says_so() {
        for v in ["0.0001%", "0.0009%"] {
            let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", v)]);
            assert_eq!(c.mem[0], MemLimit::Blocked, "{v}");
            assert_eq!(c.problems.len(), 1, "{v}: {:?}", c.problems);
        }
        let c = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "0.001%")]);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(c.mem_limit(0, 100_000), Some(1));
    }

    #[rstest]
    #[case("0,1", Some(vec![VisibleDevice::Index(0), VisibleDevice::Index(1)]), 0)]
    #[case("2", Some(vec![VisibleDevice::Index(2)]), 0)]
    #[case("GPU-8a1b,1", Some(vec![VisibleDevice::Uuid("GPU-8a1b".into()), VisibleDevice::Index(1)]), 0)]
    #[case("MIG-xyz", Some(vec![VisibleDevice::Uuid("MIG-xyz".into())]), 0)]
    #[case("", Some(vec![]), 0)]
    #[case("0,x,1", Some(vec![VisibleDevice::Index(0)]), 1)]
    #[case("-1", Some(vec![]), 1)]
    #[case("99999999999", Some(vec![]), 1)]
    fn visible_devices(#[case] v: &str, #[case] want: Option<Vec<VisibleDevice>>, #[case] problems: usize) {
        let c = cfg(&[("CUDA_VISIBLE_DEVICES", v)]);
        assert_eq!(c.visible_devices, want);
        assert_eq!(c.problems.len(), problems, "{:?}", c.problems);
    }

    #[rstest]
    #[case("256m", 256 * MIB, 0)]
    #[case("1%", 80 * GIB / 100, 0)]
    #[case("lots", 512 * MIB, 1)]
    #[case("", 512 * MIB, 1)]
    fn context_reserve(#[case] v: &str, #[case] want: u64, #[case] problems: usize) {
        let c = cfg(&[("VGPU_CONTEXT_RESERVE", v)]);
        assert_eq!(c.context_reserve(80 * GIB), want);
        assert_eq!(c.problems.len(), problems);
    }

    proptest! {
        #[test]
        fn never_panics_never_uncapped(
            mem in ".{0,12}", sm in ".{0,6}", dev in 0usize..16, phys in any::<u64>(),
            per_dev in any::<bool>(), soft in ".{0,4}", b in ".{0,5}",
        ) {
            let mvar = if per_dev { format!("CUDA_DEVICE_MEMORY_LIMIT_{dev}") } else { "CUDA_MEM_LIMIT".into() };
            let c = cfg(&[
                (mvar.as_str(), mem.as_str()), ("CUDA_DEVICE_SM_LIMIT", sm.as_str()),
                ("CUDA_CORE_SOFT_LIMIT", soft.as_str()), ("CUDA_OVERSUBSCRIBE", b.as_str()),
                ("CUDA_VISIBLE_DEVICES", mem.as_str()), ("VGPU_CONTEXT_RESERVE", sm.as_str()),
            ]);
            match parse_size(&mem) {
                Ok(SizeSpec::Bytes(0)) => prop_assert_eq!(c.mem_limit(dev, phys), None),
                Ok(_) => prop_assert!(c.mem_limit(dev, phys).is_some()),
                Err(_) => {
                    prop_assert_eq!(c.mem_limit(dev, phys), Some(0));
                    prop_assert!(c.problems.iter().any(|p| p.var == mvar));
                }
            }
            if parse_percent_int(&sm).is_err() {
                prop_assert_eq!(c.sm_limit(dev), Some(1));
            }
            if let (Some(h), Some(s)) = (c.sm_limit(dev), c.soft_sm_limit(dev)) {
                prop_assert!(s >= h);
            }
        }
    }
}
