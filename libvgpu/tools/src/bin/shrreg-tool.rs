//! shrreg-tool: inspect and steer a libvgpu shared region (HAMi-compatible interface).
//!
//! Region path: `--file PATH`, else `CUDA_DEVICE_MEMORY_SHARED_CACHE`, else /tmp/cudevshr.cache.
//! Actions run in the order given; the first failure stops with a one-line error and exit 1
//! (usage errors exit 2).

use std::process::ExitCode;
use vgpu_core::config::Config;
use vgpu_core::region::{Region, RegionInit, HAMI_MAJOR, HAMI_MINOR, EXT_VERSION};
use vgpu_core::size::{format_size, parse_size, SizeSpec};
use vgpu_core::MAX_DEVICES;
use vgpu_tools::{open_for_read, region_path, render_print, view};

const USAGE: &str = "usage: shrreg-tool [--file PATH] ACTION...
actions:
  --create_new              create or reinitialize the region from the environment (refused while in use)
  --print                   show devices, limits, per-process usage and suspend state
  --version                 show tool and region layout versions
  --suspend | --resume      pause / resume kernel launches of the container
  --set-sm-limit DEV PCT    set the SM cap of device DEV (0 or 100 = no cap)
  --set-mem-limit DEV SIZE  set the memory cap of device DEV (e.g. 4g, 3000m, 50%; 0 = no cap);
                            lowering it below current use refuses new allocations, frees nothing";

enum Action {
    CreateNew,
    Print,
    Version,
    Suspend(bool),
    SetSm(String, String),
    SetMem(String, String),
}

fn parse_args(args: &[String]) -> Result<(Option<String>, Vec<Action>), String> {
    let mut file = None;
    let mut actions = Vec::new();
    let mut it = args.iter();
    let need = |it: &mut std::slice::Iter<'_, String>, flag: &str, what: &str| {
        it.next().cloned().ok_or_else(|| format!("{flag} needs {what}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--file" | "-f" => file = Some(need(&mut it, a, "a path")?),
            "--create_new" | "--create-new" => actions.push(Action::CreateNew),
            "--print" | "-p" => actions.push(Action::Print),
            "--version" | "-v" => actions.push(Action::Version),
            "--suspend" => actions.push(Action::Suspend(true)),
            "--resume" => actions.push(Action::Suspend(false)),
            "--set-sm-limit" => {
                let d = need(&mut it, a, "DEV PCT")?;
                actions.push(Action::SetSm(d, need(&mut it, a, "DEV PCT")?));
            }
            "--set-mem-limit" => {
                let d = need(&mut it, a, "DEV SIZE")?;
                actions.push(Action::SetMem(d, need(&mut it, a, "DEV SIZE")?));
            }
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if actions.is_empty() {
        return Err("no action given".into());
    }
    Ok((file, actions))
}

fn parse_dev(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(d) if d < MAX_DEVICES => Ok(d),
        _ => Err(format!("invalid device index {s:?} (expected 0..{})", MAX_DEVICES - 1)),
    }
}

fn init_from_env() -> RegionInit {
    let cfg = Config::from_process_env();
    for p in &cfg.problems {
        eprintln!("shrreg-tool: warning: {p}");
    }
    // Devices: the UUID list when given, else up to the highest device with a per-device limit.
    let mut n = cfg.devices_uuid.len();
    for d in 0..MAX_DEVICES {
        if cfg.mem_limit(d, 0).is_some() || cfg.sm_limit(d).is_some() {
            n = n.max(d + 1);
        }
    }
    let physical = vec![0u64; n.min(MAX_DEVICES)];
    RegionInit::from_config(&cfg, &physical, &cfg.devices_uuid)
}

fn run(file: Option<String>, actions: Vec<Action>) -> Result<(), String> {
    let path = region_path(file.as_deref());
    let mut region: Option<Region> = None;
    // Mutating actions need the live file (read-write).
    let writable = |region: &mut Option<Region>| -> Result<(), String> {
        if region.as_ref().is_none_or(|r| r.is_private()) {
            *region = Some(Region::open_existing(&path).map_err(|e| e.to_string())?);
        }
        Ok(())
    };
    for a in actions {
        match a {
            Action::CreateNew => {
                let r = Region::create_new(&path, &init_from_env()).map_err(|e| e.to_string())?;
                println!("created {}", path.display());
                region = Some(r);
            }
            Action::Print => {
                if region.is_none() {
                    region = Some(open_for_read(&path).map_err(|e| e.to_string())?);
                }
                if let Some(r) = &region {
                    print!("{}", render_print(&view(r)));
                }
            }
            Action::Version => {
                println!(
                    "shrreg-tool {} (region layout {HAMI_MAJOR}.{HAMI_MINOR}, libvgpu extension {EXT_VERSION})",
                    env!("CARGO_PKG_VERSION")
                );
                if let Ok(r) = open_for_read(&path) {
                    let v = view(&r);
                    println!("region {}: layout {}.{}", path.display(), v.major, v.minor);
                }
            }
            Action::Suspend(on) => {
                writable(&mut region)?;
                if let Some(r) = &region {
                    r.set_suspended(on);
                    println!("{}", if on { "suspended" } else { "resumed" });
                }
            }
            Action::SetSm(d, p) => {
                let dev = parse_dev(&d)?;
                let pct = match p.trim().parse::<u32>() {
                    Ok(v) if v <= 100 => v,
                    _ => return Err(format!("invalid SM limit {p:?} (expected an integer 0..=100)")),
                };
                writable(&mut region)?;
                if let Some(r) = &region {
                    let cap = (pct != 0 && pct != 100).then_some(pct);
                    r.set_sm_limit(dev, cap).map_err(|e| e.to_string())?;
                    println!("device {dev}: sm limit {}", cap.map_or("none".into(), |c| format!("{c}%")));
                }
            }
            Action::SetMem(d, s) => {
                let dev = parse_dev(&d)?;
                let spec = parse_size(&s).map_err(|e| e.to_string())?;
                writable(&mut region)?;
                if let Some(r) = &region {
                    let limit = match spec {
                        SizeSpec::Bytes(0) => None,
                        SizeSpec::Bytes(b) => Some(b),
                        SizeSpec::Percent(_) => {
                            let phys = r.physical_total(dev);
                            if phys == 0 {
                                return Err(format!("device {dev}: physical size unknown, cannot use {s:?}"));
                            }
                            Some(spec.resolve(phys))
                        }
                    };
                    r.set_limit(dev, limit).map_err(|e| e.to_string())?;
                    let used = r.device_used(dev);
                    match limit {
                        Some(l) if used > l => println!(
                            "device {dev}: memory limit {} (below current use {}: new allocations are refused)",
                            format_size(l),
                            format_size(used)
                        ),
                        Some(l) => println!("device {dev}: memory limit {}", format_size(l)),
                        None => println!("device {dev}: memory limit none"),
                    }
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (file, actions) = match parse_args(&args) {
        Ok(v) => v,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("shrreg-tool: error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(file, actions) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shrreg-tool: error: {e}");
            ExitCode::from(1)
        }
    }
}
