//! vgpu-smi: nvidia-smi-style view of the container's virtual GPUs, read from the shared region
//! (live processes only). `--json`, `--metrics` (Prometheus text, HAMi's current names),
//! `--legacy-metrics`, `--watch`.

use clap::{value_parser, Arg, ArgAction, Command};
use std::process::ExitCode;
use std::time::Duration;
use vgpu_tools::{emit, errln, parse_args, open_for_read, region_path, render_legacy_metrics, render_metrics, render_table, to_json, view};
use vgpu_core::region::RegionError;

fn cli() -> Command {
    Command::new("vgpu-smi")
        .about("Show the container's virtual GPUs (caps, usage, utilization, live processes) from its libvgpu shared region")
        .disable_version_flag(true)
        .after_help(concat!(
            "Region file: --file PATH, else $CUDA_DEVICE_MEMORY_SHARED_CACHE, else /tmp/cudevshr.cache.\n",
            "Utilization is the container's share over the last seconds; it reads 0 when nothing launches.\n",
            "Exit status: 0 done (also when the reader of a pipe goes away), 1 region problem, 2 command-line error."
        ))
        .arg(Arg::new("file").long("file").short('f').value_name("PATH").value_parser(clap::builder::NonEmptyStringValueParser::new()).help("Region file (default: see below)"))
        .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("One JSON object per round"))
        .arg(
            Arg::new("metrics")
                .long("metrics")
                .action(ArgAction::SetTrue)
                .conflicts_with("json")
                .help("Prometheus text format with HAMi's metric names (hami_vgpu_memory_used_bytes, ...)"),
        )
        .arg(
            Arg::new("legacy_metrics")
                .long("legacy-metrics")
                .action(ArgAction::SetTrue)
                .conflicts_with_all(["json", "metrics"])
                .help("Prometheus text format with HAMi's names before #1644 (vGPU_device_memory_usage_in_bytes, ...)"),
        )
        .arg(Arg::new("watch").long("watch").short('w').action(ArgAction::SetTrue).help("Repeat every --interval seconds until interrupted (or --count rounds)"))
        .arg(
            Arg::new("count")
                .long("count")
                .short('c')
                .value_name("N")
                .value_parser(value_parser!(u64).range(1..))
                .help("Number of rounds (default: 1, or unlimited with --watch)"),
        )
        .arg(
            Arg::new("interval")
                .long("interval")
                .short('i')
                .value_name("SECS")
                .default_value("1")
                .value_parser(parse_interval)
                .help("Seconds between rounds, 0.1..=3600"),
        )
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("invalid interval {s:?} (seconds, 0.1..=3600)")),
    }
}

fn main() -> ExitCode {
    let m = parse_args(cli());
    let path = region_path("vgpu-smi", m.get_one::<String>("file").map(String::as_str));
    let watch = m.get_flag("watch");
    let count = m.get_one::<u64>("count").copied();
    let interval = m.get_one::<Duration>("interval").copied().unwrap_or(Duration::from_secs(1));
    let rounds = if watch { count.unwrap_or(u64::MAX) } else { count.unwrap_or(1) };
    let mut said_missing = false;
    for i in 0..rounds {
        if i > 0 {
            std::thread::sleep(interval);
        }
        // Reopen each round: the region may be recreated while we watch (deleted, it is gone
        // until the library's next look, about a second: watching waits, saying so once).
        let r = match open_for_read(&path) {
            Ok(r) => {
                said_missing = false;
                r
            }
            Err(e @ RegionError::NotFound(_)) if watch => {
                if !said_missing {
                    errln!("vgpu-smi: {e}; watching for it");
                    said_missing = true;
                }
                continue;
            }
            Err(e) => {
                errln!("vgpu-smi: error: {e}");
                return ExitCode::from(1);
            }
        };
        let v = view(&r);
        let out = if m.get_flag("json") {
            format!("{}\n", to_json(&v))
        } else if m.get_flag("metrics") {
            render_metrics(&v, vgpu_core::clock::unix_seconds())
        } else if m.get_flag("legacy_metrics") {
            render_legacy_metrics(&v)
        } else if watch {
            format!("\x1b[H\x1b[2J{}", render_table(&v))
        } else {
            render_table(&v)
        };
        emit(&out);
    }
    ExitCode::SUCCESS
}
