//! vgpu-smi: nvidia-smi-style view of the container's virtual GPUs, read from the shared region.
//! `--json`, `--metrics` (Prometheus text), `--watch` (every second; `--count N` stops after N).

use std::process::ExitCode;
use std::time::Duration;
use vgpu_tools::{open_for_read, region_path, render_metrics, render_table, to_json, view};

const USAGE: &str = "usage: vgpu-smi [--file PATH] [--json | --metrics] [--watch] [--count N]";

#[derive(Clone, Copy, PartialEq)]
enum Format {
    Table,
    Json,
    Metrics,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut file = None;
    let mut format = Format::Table;
    let mut watch = false;
    let mut count: Option<u64> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--file" | "-f" => match it.next() {
                Some(p) => file = Some(p.clone()),
                None => return usage_error("--file needs a path"),
            },
            "--json" => format = Format::Json,
            "--metrics" => format = Format::Metrics,
            "--watch" | "-w" => watch = true,
            "--count" | "-c" => match it.next().map(|s| s.trim().parse::<u64>()) {
                Some(Ok(n)) if n > 0 => count = Some(n),
                _ => return usage_error("--count needs a positive integer"),
            },
            "--help" | "-h" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage_error(&format!("unknown argument {other:?}")),
        }
    }
    let path = region_path(file.as_deref());
    let rounds = if watch { count.unwrap_or(u64::MAX) } else { count.unwrap_or(1) };
    for i in 0..rounds {
        if i > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        // Reopen each round: the region may be recreated while we watch.
        let r = match open_for_read(&path) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("vgpu-smi: error: {e}");
                return ExitCode::from(1);
            }
        };
        let v = view(&r);
        let out = match format {
            Format::Table => render_table(&v),
            Format::Json => format!("{}\n", to_json(&v)),
            Format::Metrics => render_metrics(&v),
        };
        if watch && format == Format::Table {
            print!("\x1b[H\x1b[2J");
        }
        print!("{out}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    ExitCode::SUCCESS
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("vgpu-smi: error: {msg}\n{USAGE}");
    ExitCode::from(2)
}
