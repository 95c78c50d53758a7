//! Shared code of `shrreg-tool` and `vgpu-smi`: region path resolution, a snapshot model of a
//! region (live processes only), renderers (table, JSON, Prometheus text), quiet output on closed
//! pipes. Links only `vgpu-core`, never the hook library.

use std::fmt::Write as _;
use std::path::PathBuf;
use vgpu_core::region::{Region, RegionError};
use vgpu_core::size::format_size_approx;
use vgpu_core::MAX_DEVICES;

/// `eprintln!` that cannot panic: a closed or failing stderr is ignored, so the tool still ends
/// with its documented exit status (`eprintln!` panics, exit 101, when stderr is a closed pipe).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::stderr_line(&format!($($arg)*))
    };
}

/// One line to stderr, written at once; errors (a closed pipe) are ignored.
pub fn stderr_line(s: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{s}\n").as_bytes());
}

/// `--file PATH`, else `CUDA_DEVICE_MEMORY_SHARED_CACHE`, else the default path: the variable
/// resolved by the library's own `Config`, so both open the same file (a value that is not UTF-8
/// names the path of its lossy conversion there; said here in one line on stderr, from `tool`).
pub fn region_path(tool: &str, flag: Option<&str>) -> PathBuf {
    if let Some(p) = flag {
        return PathBuf::from(p);
    }
    const VAR: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
    let cfg = vgpu_core::config::Config::from_process_env();
    let path = cfg.region_path;
    if std::env::var_os(VAR).is_some_and(|v| v.to_str().is_none()) {
        errln!("{tool}: warning: {VAR} is not valid UTF-8; using {path:?} (its lossy conversion, as the library does)");
    }
    // Empty or relative: the library's own line, so the tool's fallback is never silent.
    for p in cfg.problems.iter().filter(|p| p.var == VAR) {
        errln!("{tool}: warning: {p}");
    }
    PathBuf::from(path)
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
    /// Containers in the node file of this GPU (`VGPU_NODE_DIR`, default `/tmp/vgpulock`), when
    /// there is one: priority, caps and recent utilization of everyone sharing the GPU.
    pub node: Vec<NodeContainer>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeContainer {
    /// Container id (hex), as every process of that container writes it.
    pub id: String,
    /// This region's own container.
    pub own: bool,
    pub priority: i32,
    pub sm_limit: Option<u32>,
    pub soft_sm_limit: Option<u32>,
    pub util_percent: f64,
    /// Work queued or running right now (declared for lower priorities).
    pub busy: bool,
    pub processes: usize,
}

/// The live containers in the node file of GPU `uuid` (read-only: never created or written;
/// a missing, foreign or corrupt file shows nothing).
fn node_view(uuid: &str, own: Option<u64>) -> Vec<NodeContainer> {
    let Some(dir) = vgpu_core::node::dir_from(std::env::var_os(vgpu_core::node::DIR_ENV).as_deref()) else { return vec![] };
    let Ok(file) = vgpu_core::node::NodeFile::open(&dir, uuid, false) else { return vec![] };
    let Ok(slots) = file.read() else { return vec![] };
    let pct = |p: u32| (p > 0 && p < 100).then_some(p);
    vgpu_core::node::containers(&slots, vgpu_core::clock::now_ns())
        .into_iter()
        .map(|c| NodeContainer {
            id: format!("{:016x}", c.container),
            own: Some(c.container) == own,
            priority: c.priority,
            sm_limit: pct(c.cap),
            soft_sm_limit: pct(c.soft_cap),
            util_percent: c.util_centi as f64 / 100.0,
            busy: c.busy,
            processes: c.processes,
        })
        .collect()
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
    // Only processes that are alive: a slot whose owner died without cleaning up is not shown.
    let slots: Vec<_> = r.live_slots().filter(|&s| r.slot_owner_alive(s)).collect();
    let own = r.path().and_then(|p| std::fs::symlink_metadata(p).ok()).map(|m| {
        use std::os::unix::fs::MetadataExt;
        vgpu_core::node::container_id(m.dev(), m.ino())
    });
    let devices = (0..shown_devices(r))
        .map(|d| {
            let usage: Vec<_> = slots.iter().map(|&s| (s, r.proc_usage(s, d))).collect();
            let procs = usage
                .iter()
                .filter_map(|&(s, u)| {
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
            DeviceView {
                index: d,
                uuid: r.uuid(d),
                physical: r.physical_total(d),
                limit: r.limit(d),
                used: usage.iter().map(|(_, u)| u.total).sum(),
                sm_limit: r.sm_limit(d),
                soft_sm_limit: r.soft_sm_limit(d),
                util_percent: r.recent_util_centi(d) as f64 / 100.0,
                procs,
                node: node_view(&r.uuid(d), own),
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
    let line = "+-----+------------------------------------------+-----------------------+----------+----------+";
    let _ = writeln!(o, "vgpu-smi  region {}{}", v.path, if v.suspended { "  [SUSPENDED]" } else { "" });
    let _ = writeln!(o, "{line}");
    let _ = writeln!(o, "| GPU | UUID                                     |     Memory used / cap |     Util |   SM cap |");
    let _ = writeln!(o, "{line}");
    for d in &v.devices {
        let cap = d.limit.map_or_else(|| "unlimited".to_string(), |l| format!("{}MiB", l / MIB));
        let mem = format!("{}MiB / {}", d.used.div_ceil(MIB), cap);
        let _ = writeln!(
            o,
            "| {:>3} | {:<40} | {:>21} | {:>7.1}% | {:>8} |",
            d.index,
            if d.uuid.is_empty() { "-" } else { &d.uuid },
            mem,
            d.util_percent,
            opt_pct(d.sm_limit)
        );
    }
    let _ = writeln!(o, "{line}");
    let _ = writeln!(o, "| Processes:                                                                                    |");
    let _ = writeln!(o, "| GPU |      PID |   Slot |       Memory |  SM util | Launches                                   |");
    let mut any = false;
    for d in &v.devices {
        for p in &d.procs {
            any = true;
            let _ = writeln!(
                o,
                "| {:>3} | {:>8} | {:>6} | {:>9}MiB | {:>7}% | {:<42} |",
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
        let _ = writeln!(o, "|  No running processes found                                                                   |");
    }
    let _ = writeln!(o, "{line}");
    if v.devices.iter().any(|d| !d.node.is_empty()) {
        let _ = writeln!(o, "| Containers on the GPU (node file):                                                            |");
        let _ = writeln!(o, "| GPU | Container        | Prio |   SM cap |  Soft cap |     Util | Busy | Procs                   |");
        for d in &v.devices {
            for c in &d.node {
                let _ = writeln!(
                    o,
                    "| {:>3} | {:<16} | {:>4} | {:>8} | {:>9} | {:>7.1}% | {:<4} | {:<23} |",
                    d.index,
                    c.id,
                    c.priority,
                    opt_pct(c.sm_limit),
                    opt_pct(c.soft_sm_limit),
                    c.util_percent,
                    if c.busy { "yes" } else { "no" },
                    format!("{}{}", c.processes, if c.own { " (this container)" } else { "" })
                );
            }
        }
        let _ = writeln!(o, "{line}");
    }
    o
}

// ---------- JSON ----------

pub fn to_json(v: &RegionView) -> serde_json::Value {
    use serde_json::json;
    let devices: Vec<_> = v
        .devices
        .iter()
        .map(|d| {
            let procs: Vec<_> = d
                .procs
                .iter()
                .map(|p| {
                    json!({
                        "slot": p.slot,
                        "pid": p.pid,
                        "hostpid": p.hostpid,
                        "used_bytes": p.used,
                        "context_bytes": p.context,
                        "module_bytes": p.module,
                        "data_bytes": p.data,
                        "sm_util_percent": p.sm_util,
                        "launches": p.launches,
                    })
                })
                .collect();
            json!({
                "index": d.index,
                "uuid": d.uuid,
                "physical_bytes": (d.physical != 0).then_some(d.physical),
                "memory_limit_bytes": d.limit,
                "memory_used_bytes": d.used,
                "sm_limit_percent": d.sm_limit,
                "soft_sm_limit_percent": d.soft_sm_limit,
                "utilization_percent": d.util_percent,
                "processes": procs,
                "node_containers": d.node.iter().map(|c| json!({
                    "container": c.id,
                    "own": c.own,
                    "priority": c.priority,
                    "sm_limit_percent": c.sm_limit,
                    "soft_sm_limit_percent": c.soft_sm_limit,
                    "utilization_percent": c.util_percent,
                    "busy": c.busy,
                    "processes": c.processes,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "region": v.path,
        "layout_version": format!("{}.{}", v.major, v.minor),
        "suspended": v.suspended,
        "priority": v.priority,
        "utilization_switch": v.utilization_switch,
        "recent_kernel": v.recent_kernel,
        "last_kernel_time": v.last_kernel_time,
        "limits_epoch": v.limits_epoch,
        "process_count": v.proc_count,
        "devices": devices,
    })
}

// ---------- Prometheus ----------

/// Escape a Prometheus label value (backslash, double quote, newline).
pub fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One gauge family: HELP, TYPE and its series (`labels` without braces, may be empty).
fn family(o: &mut String, name: &str, help: &str, rows: Vec<(String, String)>) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} gauge");
    for (l, val) in rows {
        if l.is_empty() {
            let _ = writeln!(o, "{name} {val}");
        } else {
            let _ = writeln!(o, "{name}{{{l}}} {val}");
        }
    }
}

/// Prometheus text exposition with HAMi's current metric names (HAMi #1644; see
/// hami-contract.md): `hami_vgpu_memory_used_bytes`, `hami_vgpu_memory_limit_bytes`,
/// `hami_vgpu_memory_{context,module,buffer}_bytes`, `hami_container_device_utilization_ratio`,
/// `hami_container_last_kernel_elapsed_seconds`, labelled `vdevice_index` and `device_uuid` (the
/// pod labels HAMi's node monitor adds are unknown inside a container). Values are never put in
/// labels. `now_unix` is the current time (for the elapsed-seconds gauge).
pub fn render_metrics(v: &RegionView, now_unix: u64) -> String {
    let mut o = String::new();
    let labels = |d: &DeviceView| format!("vdevice_index=\"{}\",device_uuid=\"{}\"", d.index, escape_label(&d.uuid));
    let per_dev = |f: &dyn Fn(&DeviceView) -> String| v.devices.iter().map(|d| (labels(d), f(d))).collect::<Vec<_>>();
    let sum = |d: &DeviceView, f: fn(&ProcView) -> u64| d.procs.iter().map(f).sum::<u64>().to_string();
    family(&mut o, "hami_vgpu_memory_used_bytes", "Device memory used by the container's live processes (bytes)", per_dev(&|d| d.used.to_string()));
    family(&mut o, "hami_vgpu_memory_limit_bytes", "Device memory limit of the container (bytes; the physical size when uncapped)", per_dev(&|d| d.limit.unwrap_or(d.physical).to_string()));
    family(&mut o, "hami_vgpu_memory_context_bytes", "Device memory used by CUDA contexts (bytes)", per_dev(&|d| sum(d, |p| p.context)));
    family(&mut o, "hami_vgpu_memory_module_bytes", "Device memory used by loaded modules (bytes)", per_dev(&|d| sum(d, |p| p.module)));
    family(&mut o, "hami_vgpu_memory_buffer_bytes", "Device memory used by allocations (bytes)", per_dev(&|d| sum(d, |p| p.data)));
    family(&mut o, "hami_container_device_utilization_ratio", "The container's SM utilization of the device over the last seconds (0..1; 0 when nothing launches)", per_dev(&|d| format!("{}", d.util_percent / 100.0)));
    let elapsed = if v.last_kernel_time == 0 { vec![] } else { per_dev(&|_| now_unix.saturating_sub(v.last_kernel_time).to_string()) };
    family(&mut o, "hami_container_last_kernel_elapsed_seconds", "Seconds since the container's latest kernel launch (absent before the first)", elapsed);
    family(&mut o, "vgpu_device_sm_limit_percent", "SM utilization cap (percent; 100 when uncapped)", per_dev(&|d| d.sm_limit.unwrap_or(100).to_string()));
    family(
        &mut o,
        "vgpu_process_memory_used_bytes",
        "Device memory used by one live process of the container (bytes)",
        v.devices.iter().flat_map(|d| d.procs.iter().map(move |p| (format!("{},pid=\"{}\"", labels(d), p.pid), p.used.to_string()))).collect(),
    );
    family(&mut o, "vgpu_suspended", "1 when the container's launches are suspended", vec![(String::new(), (v.suspended as u8).to_string())]);
    let node = |f: &dyn Fn(&NodeContainer) -> String| {
        v.devices.iter().flat_map(|d| d.node.iter().map(move |c| (format!("device_uuid=\"{}\",container=\"{}\"", escape_label(&d.uuid), c.id), f(c)))).collect::<Vec<_>>()
    };
    family(&mut o, "vgpu_node_container_priority", "CUDA_TASK_PRIORITY of each container in the GPU's node file (0 = highest)", node(&|c| c.priority.to_string()));
    family(&mut o, "vgpu_node_container_sm_limit_percent", "SM cap of each container in the GPU's node file (percent; 100 when uncapped)", node(&|c| c.sm_limit.unwrap_or(100).to_string()));
    family(&mut o, "vgpu_node_container_utilization_ratio", "Recent SM utilization of each container in the GPU's node file (0..1)", node(&|c| format!("{}", c.util_percent / 100.0)));
    family(&mut o, "vgpu_node_container_busy", "1 while the container declares work queued or running", node(&|c| (c.busy as u8).to_string()));
    o
}

/// The names HAMi's monitor used before #1644 (`vgpu-smi --legacy-metrics`), as they were:
/// `Device_memory_desc_of_container` carries the byte counts in its labels, as it did there.
pub fn render_legacy_metrics(v: &RegionView) -> String {
    let mut o = String::new();
    let labels = |d: &DeviceView| format!("vdeviceid=\"{}\",deviceuuid=\"{}\"", d.index, escape_label(&d.uuid));
    let per_dev = |f: &dyn Fn(&DeviceView) -> String| v.devices.iter().map(|d| (labels(d), f(d))).collect::<Vec<_>>();
    family(&mut o, "vGPU_device_memory_usage_in_bytes", "vGPU device memory used by the container (bytes)", per_dev(&|d| d.used.to_string()));
    family(&mut o, "vGPU_device_memory_limit_in_bytes", "vGPU device memory limit (bytes; physical size when uncapped)", per_dev(&|d| d.limit.unwrap_or(d.physical).to_string()));
    let desc = v
        .devices
        .iter()
        .map(|d| {
            let sum = |f: fn(&ProcView) -> u64| d.procs.iter().map(f).sum::<u64>();
            let l = format!("{},context=\"{}\",module=\"{}\",data=\"{}\",offset=\"0\"", labels(d), sum(|p| p.context), sum(|p| p.module), sum(|p| p.data));
            (l, d.used.to_string())
        })
        .collect();
    family(&mut o, "Device_memory_desc_of_container", "Container device memory breakdown (bytes) by kind", desc);
    family(&mut o, "Device_utilization_desc_of_container", "Container SM utilization of the device (percent)", per_dev(&|d| format!("{}", d.util_percent)));
    family(&mut o, "Device_last_kernel_of_container", "Unix time of the container's latest kernel launch (seconds)", per_dev(&|_| v.last_kernel_time.to_string()));
    o
}

/// Write to stdout; a closed pipe (`| head`) ends the tool quietly with status 0.
pub fn emit(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        errln!("error: writing output failed: {e}");
        std::process::exit(1);
    }
}

/// Parse the command line: `--help` prints and exits 0; an error prints one line and exits 2.
pub fn parse_args(cli: clap::Command) -> clap::ArgMatches {
    let name = cli.get_name().to_string();
    match cli.try_get_matches() {
        Ok(m) => m,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            let text = e.render().to_string();
            emit(&text);
            if !text.ends_with('\n') {
                emit("\n");
            }
            std::process::exit(0);
        }
        Err(e) => {
            errln!("{name}: error: {} (see --help)", one_line(&e));
            std::process::exit(2);
        }
    }
}

/// One line for a command-line error from clap (its own rendering spans several lines).
pub fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
    first.trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_escaping() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
