//! shrreg-tool: inspect and steer a libvgpu shared region (HAMi-compatible interface).
//!
//! Actions run in the order given, after every value has been checked (against the region that
//! `--create_new` will make, when a change follows it): an invalid value, or a device index the
//! region does not have, changes nothing and fails with one line (exit 1; command-line errors,
//! a change given before `--create_new` among them, exit 2).

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};
use std::process::ExitCode;
use vgpu_core::config::{Config, MemLimit};
use vgpu_core::region::{Region, RegionInit, EXT_VERSION, HAMI_MAJOR, HAMI_MINOR};
use vgpu_core::size::{format_size, parse_size, SizeSpec};
use vgpu_core::MAX_DEVICES;
use vgpu_tools::{emit, errln, parse_args, open_for_read, region_path, render_print, view};

fn cli() -> Command {
    Command::new("shrreg-tool")
        .about("Inspect and steer a container's libvgpu shared region (HAMi v1 layout + libvgpu extension)")
        .disable_version_flag(true)
        .after_help(concat!(
            "Region file: --file PATH, else $CUDA_DEVICE_MEMORY_SHARED_CACHE, else /tmp/cudevshr.cache.\n",
            "Changes reach running processes within about 100 ms. Actions run in the order given, after every\n",
            "value was checked; an invalid value or a device index the region does not have changes nothing.\n",
            "--create_new comes before any change in the same call (it would undo it); changes after it are\n",
            "checked against the region it makes.\n",
            "Exit status: 0 done, 1 invalid value or region problem (one line on stderr), 2 command-line error."
        ))
        .arg(Arg::new("file").long("file").short('f').value_name("PATH").value_parser(clap::builder::NonEmptyStringValueParser::new()).help("Region file (default: see below)"))
        .arg(flag("create_new", "create_new", "Create or reinitialize the region from the environment (refused while in use)").visible_alias("create-new"))
        .arg(flag("print", "print", "Show devices, limits, live processes' usage and the suspend state").short('p'))
        .arg(flag("version", "version", "Show the tool and region layout versions").short('v'))
        .arg(flag("suspend", "suspend", "Pause kernel launches of the container (until --resume)").conflicts_with("resume"))
        .arg(flag("resume", "resume", "Resume kernel launches"))
        .arg(setter("set_sm_limit", "set-sm-limit", "PCT", "Set the SM cap of device DEV: an integer 0..=100 (0 or 100 = no cap)"))
        .arg(setter("set_mem_limit", "set-mem-limit", "SIZE", "Set the memory cap of device DEV: bytes, or k/m/g/t (powers of 1024), or N% of the device; a literal 0 = no cap. Below current use: new allocations are refused, nothing is freed"))
        .group(
            ArgGroup::new("action")
                .args(["create_new", "print", "version", "suspend", "resume", "set_sm_limit", "set_mem_limit"])
                .required(true)
                .multiple(true),
        )
}

fn flag(id: &'static str, long: &'static str, help: &'static str) -> Arg {
    Arg::new(id).long(long).action(ArgAction::SetTrue).help(help)
}

/// `--LONG DEV VALUE`, repeatable (values are checked later, all before anything changes).
fn setter(id: &'static str, long: &'static str, value: &'static str, help: &'static str) -> Arg {
    Arg::new(id)
        .long(long)
        .num_args(2)
        .value_names(["DEV", value])
        .allow_hyphen_values(true)
        .action(ArgAction::Append)
        .help(help)
}

enum Action {
    CreateNew,
    Print,
    Version,
    Suspend(bool),
    SetSm(String, String),
    SetMem(String, String),
}

/// The actions in command-line order.
fn actions(m: &ArgMatches) -> Vec<Action> {
    let mut out: Vec<(usize, Action)> = Vec::new();
    let mut simple = |id: &str, a: fn() -> Action| {
        if m.get_flag(id) {
            if let Some(i) = m.index_of(id) {
                out.push((i, a()));
            }
        }
    };
    simple("create_new", || Action::CreateNew);
    simple("print", || Action::Print);
    simple("version", || Action::Version);
    simple("suspend", || Action::Suspend(true));
    simple("resume", || Action::Suspend(false));
    for (id, make) in [("set_sm_limit", Action::SetSm as fn(String, String) -> Action), ("set_mem_limit", Action::SetMem)] {
        let (Some(vals), Some(idx)) = (m.get_many::<String>(id), m.indices_of(id)) else { continue };
        let vals: Vec<&String> = vals.collect();
        let idx: Vec<usize> = idx.collect();
        for (pair, at) in vals.chunks(2).zip(idx.chunks(2)) {
            out.push((at[0], make(pair[0].clone(), pair[1].clone())));
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, a)| a).collect()
}

/// A change given before `--create_new` would be undone by it: refused (a command-line error).
fn misordered(actions: &[Action]) -> Option<&'static str> {
    let first_create = actions.iter().position(|a| matches!(a, Action::CreateNew))?;
    actions[..first_create].iter().find_map(|a| match a {
        Action::Suspend(true) => Some("--suspend"),
        Action::Suspend(false) => Some("--resume"),
        Action::SetSm(..) => Some("--set-sm-limit"),
        Action::SetMem(..) => Some("--set-mem-limit"),
        _ => None,
    })
}

/// What values are checked against: the devices of the region a change will meet, with their
/// physical sizes (0 = unknown), the live file's or those `--create_new` will write.
struct Shape {
    devices: usize,
    physical: [u64; MAX_DEVICES],
}

impl Shape {
    fn of_region(r: &Region) -> Shape {
        Shape { devices: r.device_num(), physical: std::array::from_fn(|d| r.physical_total(d)) }
    }
    fn of_init(i: &RegionInit) -> Shape {
        Shape { devices: (i.device_num as usize).min(MAX_DEVICES), physical: i.physical }
    }
}

/// A device index the region has.
fn parse_dev(s: &str, shape: &Shape) -> Result<usize, String> {
    let n = shape.devices;
    match s.trim().parse::<usize>() {
        Ok(d) if d < n => Ok(d),
        Ok(d) if n == 0 => Err(format!("device {d}: the region records no devices")),
        Ok(d) => Err(format!("device {d}: the region has {n} device(s) (0..{})", n - 1)),
        Err(_) => Err(format!("invalid device index {s:?} (a non-negative integer)")),
    }
}

fn parse_sm(p: &str) -> Result<Option<u32>, String> {
    match p.trim().parse::<u32>() {
        Ok(v) if v <= 100 => Ok((v != 0 && v != 100).then_some(v)),
        _ => Err(format!("invalid SM limit {p:?} (an integer 0..=100)")),
    }
}

fn is_literal_zero(s: &str) -> bool {
    let digits: Vec<char> = s.trim().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    digits.iter().any(|c| c.is_ascii_digit()) && digits.iter().all(|c| *c == '0' || *c == '.')
}

/// A memory cap for device `dev`: `None` = no cap (a literal zero only).
fn parse_mem(s: &str, dev: usize, shape: &Shape) -> Result<Option<u64>, String> {
    match parse_size(s).map_err(|e| e.to_string())? {
        SizeSpec::Bytes(0) if is_literal_zero(s) => Ok(None),
        SizeSpec::Bytes(0) => Err(format!("memory limit {s:?} rounds down to 0 bytes (a literal 0 means no cap)")),
        SizeSpec::Bytes(b) => Ok(Some(b)),
        spec @ SizeSpec::Percent(_) => match shape.physical[dev] {
            0 => Err(format!("device {dev}: physical size unknown, cannot use {s:?}")),
            phys => match spec.resolve(phys) {
                0 => Err(format!("memory limit {s:?} of device {dev} rounds down to 0 bytes")),
                b => Ok(Some(b)),
            },
        },
    }
}

fn init_from_env() -> Result<RegionInit, String> {
    let cfg = Config::from_process_env();
    // The region path is `region_path`'s to name (and only where the environment picks it).
    for p in cfg.problems.iter().filter(|p| p.var != "CUDA_DEVICE_MEMORY_SHARED_CACHE") {
        errln!("shrreg-tool: warning: {p}");
    }
    // Devices: the UUID list when given, else up to the highest per-device variable (`_<i>`),
    // else one. A global cap alone must not invent 16 devices.
    let mut n = cfg.devices_uuid.len();
    if n == 0 {
        n = 1;
        // `vars_os`: `vars` panics on a name or value that is not UTF-8. Only names are read here
        // (the values went through `Config`, where a non-UTF-8 value is malformed).
        for (k, _) in std::env::vars_os() {
            let Some(k) = k.to_str() else { continue };
            let families = ["CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_MEM_LIMIT_", "CUDA_DEVICE_SM_LIMIT_", "CUDA_CORE_LIMIT_"];
            if let Some(i) = families.iter().find_map(|f| k.strip_prefix(f)).and_then(|i| i.parse::<usize>().ok()) {
                if i < MAX_DEVICES {
                    n = n.max(i + 1);
                }
            }
        }
    }
    // The tool does not know the devices' sizes: a percentage would resolve to 0 bytes.
    if let Some((d, p)) = cfg.mem.iter().take(n).enumerate().find_map(|(d, m)| match m {
        MemLimit::Spec(SizeSpec::Percent(p)) => Some((d, p)),
        _ => None,
    }) {
        return Err(format!(
            "device {d}: a memory cap of {p}% is a percentage of the device's size, which shrreg-tool does not know; give a size (like 4g), or let the library create the region"
        ));
    }
    let physical = vec![0u64; n.min(MAX_DEVICES)];
    Ok(RegionInit::from_config(&cfg, &physical, &cfg.devices_uuid))
}

/// A checked change.
enum Change {
    Suspend(bool),
    Sm(usize, Option<u32>),
    Mem(usize, Option<u64>),
}

fn apply(r: &Region, c: &Change) -> Result<String, String> {
    Ok(match *c {
        Change::Suspend(on) => {
            r.set_suspended(on);
            (if on { "suspended" } else { "resumed" }).to_string()
        }
        Change::Sm(dev, cap) => {
            r.set_sm_limit(dev, cap).map_err(|e| e.to_string())?;
            format!("device {dev}: sm limit {}", cap.map_or("none".into(), |c| format!("{c}%")))
        }
        Change::Mem(dev, limit) => {
            r.set_limit(dev, limit).map_err(|e| e.to_string())?;
            let used = r.device_used(dev);
            match limit {
                Some(l) if used > l => format!(
                    "device {dev}: memory limit {} (below current use {}: new allocations are refused)",
                    format_size(l),
                    format_size(used)
                ),
                Some(l) => format!("device {dev}: memory limit {}", format_size(l)),
                None => format!("device {dev}: memory limit none"),
            }
        }
    })
}

fn run(file: Option<&String>, actions: Vec<Action>) -> Result<(), String> {
    let path = region_path("shrreg-tool", file.map(String::as_str));
    let mutates = actions.iter().any(|a| matches!(a, Action::Suspend(_) | Action::SetSm(..) | Action::SetMem(..)));
    let creates = actions.iter().any(|a| matches!(a, Action::CreateNew));
    // What --create_new will write, read from the environment once, before anything changes.
    let init = if creates { Some(init_from_env()?) } else { None };
    // Check every value first, against the region each change will meet: the live file (read-write;
    // no change comes before --create_new, see `misordered`), or the one --create_new makes.
    let live = if mutates && !creates { Some(Region::open_existing(&path).map_err(|e| e.to_string())?) } else { None };
    let mut shape = live.as_ref().map(Shape::of_region);
    let mut checked = Vec::new();
    for a in &actions {
        let target = || shape.as_ref().ok_or_else(|| String::from("no region"));
        checked.push(match a {
            Action::CreateNew => {
                shape = init.as_ref().map(Shape::of_init);
                None
            }
            Action::Suspend(on) => Some(Change::Suspend(*on)),
            Action::SetSm(d, p) => Some(Change::Sm(parse_dev(d, target()?)?, parse_sm(p)?)),
            Action::SetMem(d, s) => {
                let dev = parse_dev(d, target()?)?;
                Some(Change::Mem(dev, parse_mem(s, dev, target()?)?))
            }
            Action::Print | Action::Version => None,
        });
    }
    let mut region = live;
    for (a, change) in actions.iter().zip(&checked) {
        match a {
            Action::CreateNew => {
                let Some(init) = &init else { unreachable!("computed when creating") };
                let r = Region::create_new(&path, init).map_err(|e| e.to_string())?;
                emit(&format!("created {}\n", path.display()));
                region = Some(r);
            }
            Action::Print => {
                if region.is_none() {
                    region = Some(open_for_read(&path).map_err(|e| e.to_string())?);
                }
                if let Some(r) = &region {
                    emit(&render_print(&view(r)));
                }
            }
            Action::Version => {
                emit(&format!(
                    "shrreg-tool {} (region layout {HAMI_MAJOR}.{HAMI_MINOR}, libvgpu extension {EXT_VERSION})\n",
                    env!("CARGO_PKG_VERSION")
                ));
                if let Ok(r) = open_for_read(&path) {
                    let v = view(&r);
                    emit(&format!("region {}: layout {}.{}\n", path.display(), v.major, v.minor));
                }
            }
            Action::Suspend(_) | Action::SetSm(..) | Action::SetMem(..) => {
                let (Some(r), Some(c)) = (&region, change) else { return Err("no region".into()) };
                emit(&format!("{}\n", apply(r, c)?));
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let m = parse_args(cli());
    let actions = actions(&m);
    if let Some(flag) = misordered(&actions) {
        errln!("shrreg-tool: error: {flag} before --create_new would be undone by it; give --create_new first (see --help)");
        return ExitCode::from(2);
    }
    match run(m.get_one::<String>("file"), actions) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("shrreg-tool: error: {e}");
            ExitCode::from(1)
        }
    }
}
