//! Shared code of `shrreg-tool` and `vgpu-smi`: region path resolution, a snapshot model of a
//! region, renderers (table, JSON, Prometheus text) and a small JSON emitter. Links only
//! `vgpu-core`, never the hook library.

use std::fmt::Write as _;
use std::path::PathBuf;
use vgpu_core::region::{Region, RegionError};
use vgpu_core::size::format_size_approx;
use vgpu_core::MAX_DEVICES;

/// `--file PATH`, else `CUDA_DEVICE_MEMORY_SHARED_CACHE`, else the default path.
pub fn region_path(flag: Option<&str>) -> PathBuf {
    if let Some(p) = flag {
        return PathBuf::from(p);
    }
    match std::env::var("CUDA_DEVICE_MEMORY_SHARED_CACHE") {
        Ok(p) if !p.trim().is_empty() => PathBuf::from(p),
        _ => PathBuf::from(vgpu_core::config::DEFAULT_REGION_PATH),
    }
}

/// Open for reading: the live file when writable, else a private copy (read-only access).
pub fn open_for_read(path: &std::path::Path) -> Result<Region, RegionError> {
    match Region::open_existing(path) {
        Err(RegionError::PermissionDenied(_)) => Region::snapshot(path),
        other => other,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProcView {
    pub slot: usize,
    pub pid: i32,
    pub hostpid: i32,
    pub context: u64,
    pub module: u64,
    pub data: u64,
    pub used: u64,
    pub sm_util: u64,
    pub launches: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeviceView {
    pub index: usize,
    pub uuid: String,
    pub physical: u64,
    pub limit: Option<u64>,
    pub used: u64,
    pub sm_limit: Option<u32>,
    pub soft_sm_limit: Option<u32>,
    /// Container's occupancy of the device, percent (from the limiter window).
    pub util_percent: f64,
    pub procs: Vec<ProcView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RegionView {
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub suspended: bool,
    pub priority: i32,
    pub utilization_switch: i32,
    pub recent_kernel: i32,
    pub last_kernel_time: u64,
    pub limits_epoch: u64,
    pub proc_count: usize,
    pub devices: Vec<DeviceView>,
}

/// Devices worth showing: `device_num`, extended to any device with a cap or usage.
fn shown_devices(r: &Region) -> usize {
    let mut n = r.device_num();
    for d in 0..MAX_DEVICES {
        if r.limit(d).is_some() || r.sm_limit(d).is_some() || r.device_used(d) > 0 {
            n = n.max(d + 1);
        }
    }
    n
}

pub fn view(r: &Region) -> RegionView {
    let v1 = r.v1();
    let slots: Vec<_> = r.live_slots().collect();
    let devices = (0..shown_devices(r))
        .map(|d| {
            let procs = slots
                .iter()
                .filter_map(|&s| {
                    let u = r.proc_usage(s, d);
                    let sm = r.proc_sm_util(s, d);
                    (u.total > 0 || sm > 0).then(|| ProcView {
                        slot: s.index(),
                        pid: r.slot_pid(s),
                        hostpid: r.slot_hostpid(s),
                        context: u.context,
                        module: u.module,
                        data: u.data,
                        used: u.total,
                        sm_util: sm,
                        launches: r.slot_ext(s).launches.load(std::sync::atomic::Ordering::Relaxed),
                    })
                })
                .collect();
            let util = r.limiter(d).util_centi_percent.load(std::sync::atomic::Ordering::Relaxed);
            DeviceView {
                index: d,
                uuid: r.uuid(d),
                physical: r.physical_total(d),
                limit: r.limit(d),
                used: r.device_used(d),
                sm_limit: r.sm_limit(d),
                soft_sm_limit: r.soft_sm_limit(d),
                util_percent: util.min(10_000) as f64 / 100.0,
                procs,
            }
        })
        .collect();
    RegionView {
        path: r.path().map(|p| p.display().to_string()).unwrap_or_default(),
        major: v1.major_version.load(std::sync::atomic::Ordering::Relaxed),
        minor: v1.minor_version.load(std::sync::atomic::Ordering::Relaxed),
        suspended: r.suspended(),
        priority: r.priority(),
        utilization_switch: r.utilization_switch(),
        recent_kernel: r.recent_kernel(),
        last_kernel_time: r.last_kernel_time(),
        limits_epoch: r.limits_epoch(),
        proc_count: slots.len(),
        devices,
    }
}

fn opt_size(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_string(), format_size_approx)
}

fn opt_pct(v: Option<u32>) -> String {
    v.map_or_else(|| "none".to_string(), |p| format!("{p}%"))
}

/// shrreg-tool --print.
pub fn render_print(v: &RegionView) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "region: {} (layout {}.{})", v.path, v.major, v.minor);
    let _ = writeln!(
        o,
        "state: {}  priority: {}  utilization_switch: {}  recent_kernel: {}  last_kernel_time: {}  processes: {}",
        if v.suspended { "SUSPENDED" } else { "running" },
        v.priority,
        v.utilization_switch,
        v.recent_kernel,
        v.last_kernel_time,
        v.proc_count
    );
    for d in &v.devices {
        let _ = writeln!(
            o,
            "device {}: uuid {}  memory limit {}  used {}  physical {}  sm limit {}  soft sm limit {}  util {:.1}%",
            d.index,
            if d.uuid.is_empty() { "-" } else { &d.uuid },
            opt_size(d.limit),
            format_size_approx(d.used),
            if d.physical == 0 { "unknown".to_string() } else { format_size_approx(d.physical) },
            opt_pct(d.sm_limit),
            opt_pct(d.soft_sm_limit),
            d.util_percent
        );
        for p in &d.procs {
            let _ = writeln!(
                o,
                "  slot {} pid {} hostpid {}: used {} (context {}, module {}, data {})  sm util {}%  launches {}",
                p.slot,
                p.pid,
                p.hostpid,
                format_size_approx(p.used),
                format_size_approx(p.context),
                format_size_approx(p.module),
                format_size_approx(p.data),
                p.sm_util,
                p.launches
            );
        }
    }
    o
}

const MIB: u64 = 1 << 20;

/// vgpu-smi default output: an nvidia-smi-like table.
pub fn render_table(v: &RegionView) -> String {
    let mut o = String::new();
    let line = "+-----+----------------------------------------+-----------------------+----------+----------+";
    let _ = writeln!(o, "vgpu-smi  region {}{}", v.path, if v.suspended { "  [SUSPENDED]" } else { "" });
    let _ = writeln!(o, "{line}");
    let _ = writeln!(o, "| GPU | UUID                                   |     Memory used / cap |     Util |   SM cap |");
    let _ = writeln!(o, "{line}");
    for d in &v.devices {
        let cap = d.limit.map_or_else(|| "unlimited".to_string(), |l| format!("{}MiB", l / MIB));
        let mem = format!("{}MiB / {}", d.used.div_ceil(MIB), cap);
        let _ = writeln!(
            o,
            "| {:>3} | {:<38.38} | {:>21} | {:>7.1}% | {:>8} |",
            d.index,
            if d.uuid.is_empty() { "-" } else { &d.uuid },
            mem,
            d.util_percent,
            opt_pct(d.sm_limit)
        );
    }
    let _ = writeln!(o, "{line}");
    let _ = writeln!(o, "| Processes:                                                                                  |");
    let _ = writeln!(o, "| GPU |      PID |   Slot |       Memory |  SM util | Launches                                 |");
    let mut any = false;
    for d in &v.devices {
        for p in &d.procs {
            any = true;
            let _ = writeln!(
                o,
                "| {:>3} | {:>8} | {:>6} | {:>9}MiB | {:>7}% | {:<40} |",
                d.index,
                p.pid,
                p.slot,
                p.used.div_ceil(MIB),
                p.sm_util,
                p.launches
            );
        }
    }
    if !any {
        let _ = writeln!(o, "|  No running processes found                                                                 |");
    }
    let _ = writeln!(o, "{line}");
    o
}

// ---------- JSON ----------

/// A JSON value; `to_string` emits compact, correctly escaped JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

pub fn escape_json(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl Json {
    pub fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            // JSON has no NaN/inf: emit null for them.
            Json::Float(f) if !f.is_finite() => out.push_str("null"),
            Json::Float(f) => {
                let _ = write!(out, "{f}");
            }
            Json::Str(s) => escape_json(s, out),
            Json::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Obj(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    escape_json(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        self.write(&mut s);
        f.write_str(&s)
    }
}

fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Obj(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn opt_int(v: Option<u64>) -> Json {
    v.map_or(Json::Null, |x| Json::Int(x as i128))
}

pub fn to_json(v: &RegionView) -> Json {
    let devices = v
        .devices
        .iter()
        .map(|d| {
            let procs = d
                .procs
                .iter()
                .map(|p| {
                    obj(vec![
                        ("slot", Json::Int(p.slot as i128)),
                        ("pid", Json::Int(p.pid as i128)),
                        ("hostpid", Json::Int(p.hostpid as i128)),
                        ("used_bytes", Json::Int(p.used as i128)),
                        ("context_bytes", Json::Int(p.context as i128)),
                        ("module_bytes", Json::Int(p.module as i128)),
                        ("data_bytes", Json::Int(p.data as i128)),
                        ("sm_util_percent", Json::Int(p.sm_util as i128)),
                        ("launches", Json::Int(p.launches as i128)),
                    ])
                })
                .collect();
            obj(vec![
                ("index", Json::Int(d.index as i128)),
                ("uuid", Json::Str(d.uuid.clone())),
                ("physical_bytes", if d.physical == 0 { Json::Null } else { Json::Int(d.physical as i128) }),
                ("memory_limit_bytes", opt_int(d.limit)),
                ("memory_used_bytes", Json::Int(d.used as i128)),
                ("sm_limit_percent", opt_int(d.sm_limit.map(u64::from))),
                ("soft_sm_limit_percent", opt_int(d.soft_sm_limit.map(u64::from))),
                ("utilization_percent", Json::Float(d.util_percent)),
                ("processes", Json::Arr(procs)),
            ])
        })
        .collect();
    obj(vec![
        ("region", Json::Str(v.path.clone())),
        ("layout_version", Json::Str(format!("{}.{}", v.major, v.minor))),
        ("suspended", Json::Bool(v.suspended)),
        ("priority", Json::Int(v.priority as i128)),
        ("utilization_switch", Json::Int(v.utilization_switch as i128)),
        ("recent_kernel", Json::Int(v.recent_kernel as i128)),
        ("last_kernel_time", Json::Int(v.last_kernel_time as i128)),
        ("limits_epoch", Json::Int(v.limits_epoch as i128)),
        ("process_count", Json::Int(v.proc_count as i128)),
        ("devices", Json::Arr(devices)),
    ])
}

// ---------- Prometheus ----------

/// Escape a Prometheus label value (backslash, double quote, newline).
pub fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Prometheus text exposition. Names follow HAMi's monitor where the meaning is the same
/// (`vGPU_device_memory_usage_in_bytes`, `vGPU_device_memory_limit_in_bytes`,
/// `Device_memory_desc_of_container`, `Device_utilization_desc_of_container`,
/// `Device_last_kernel_of_container`); the pod labels HAMi adds are unknown inside a container,
/// so series carry `vdeviceid` and `deviceuuid`. Others are prefixed `vgpu_`.
pub fn render_metrics(v: &RegionView) -> String {
    let mut o = String::new();
    let labels = |d: &DeviceView| format!("vdeviceid=\"{}\",deviceuuid=\"{}\"", d.index, escape_label(&d.uuid));
    let mut family = |name: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} gauge");
        for (l, val) in rows {
            let _ = writeln!(o, "{name}{{{l}}} {val}");
        }
    };
    family(
        "vGPU_device_memory_usage_in_bytes",
        "vGPU device memory used by the container (bytes)",
        v.devices.iter().map(|d| (labels(d), d.used.to_string())).collect(),
    );
    family(
        "vGPU_device_memory_limit_in_bytes",
        "vGPU device memory limit (bytes; physical size when uncapped)",
        v.devices.iter().map(|d| (labels(d), d.limit.unwrap_or(d.physical).to_string())).collect(),
    );
    family(
        "Device_memory_desc_of_container",
        "Container device memory breakdown (bytes) by kind",
        v.devices
            .iter()
            .map(|d| {
                let sum = |f: fn(&ProcView) -> u64| d.procs.iter().map(f).sum::<u64>();
                let l = format!(
                    "{},context=\"{}\",module=\"{}\",data=\"{}\",offset=\"0\"",
                    labels(d),
                    sum(|p| p.context),
                    sum(|p| p.module),
                    sum(|p| p.data)
                );
                (l, d.used.to_string())
            })
            .collect(),
    );
    family(
        "Device_utilization_desc_of_container",
        "Container SM utilization of the device (percent)",
        v.devices.iter().map(|d| (labels(d), format!("{}", d.util_percent))).collect(),
    );
    family(
        "Device_last_kernel_of_container",
        "Unix time of the container's latest kernel launch (seconds)",
        v.devices.iter().map(|d| (labels(d), v.last_kernel_time.to_string())).collect(),
    );
    family(
        "vgpu_device_sm_limit_percent",
        "SM utilization cap (percent; 100 when uncapped)",
        v.devices.iter().map(|d| (labels(d), d.sm_limit.unwrap_or(100).to_string())).collect(),
    );
    family(
        "vgpu_process_memory_usage_in_bytes",
        "Device memory used by one process of the container (bytes)",
        v.devices
            .iter()
            .flat_map(|d| d.procs.iter().map(move |p| (d, p)))
            .map(|(d, p)| (format!("{},pid=\"{}\"", labels(d), p.pid), p.used.to_string()))
            .collect(),
    );
    family("vgpu_suspended", "1 when the container's launches are suspended", vec![(String::new(), (v.suspended as u8).to_string())]);
    // `name{}` is valid exposition, but print a bare name for the unlabeled series.
    o.replace("vgpu_suspended{} ", "vgpu_suspended ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_escaping() {
        let j = Json::Obj(vec![
            ("a\"b".into(), Json::Str("x\\y\n\t\u{1}é".into())),
            ("n".into(), Json::Arr(vec![Json::Null, Json::Bool(true), Json::Int(-3), Json::Float(1.5), Json::Float(f64::NAN)])),
        ]);
        assert_eq!(j.to_string(), r#"{"a\"b":"x\\y\n\t\u0001é","n":[null,true,-3,1.5,null]}"#);
    }

    #[test]
    fn label_escaping() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
