//! The module layers of `libvgpu/src` (docs/design.md, "Layers"): every `crate::` path of a module
//! (`use crate::…`, `crate::a::b` in code, `$crate::…` in macros) must name a module of a lower
//! layer or the module itself. A reference to the same layer or upwards fails, so no module cycle
//! can come back; a module missing from `LAYERS` fails too, so each new one gets its place.

use std::collections::BTreeMap;
use std::path::Path;

/// Bottom to top. Modules of one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["ffi"],                                   // C types and constants (checked against NVIDIA's headers)
    &["guard", "real"],                         // panic guard; symbol resolution, typed slots
    &["sys"],                                   // the one list: typed real-function slots
    &["driver", "tsg"],                         // safe wrappers over the slots; channel groups
    &["runtime"],                               // per-process state: config, region, slot, devices, ledgers
    &["node", "streams"],                       // node-level file: priorities of the containers on a GPU; the program's streams
    &["caps", "physmem", "linger"],             // gate flags and caps; reservations, VMM, pools, graphs; linger
    &["launch", "memory"],                      // the launch gate; allocations and frees
    &["monitor", "context", "meminfo", "nvml"], // the monitor thread; contexts; virtual meminfo / NVML
    &["lifecycle"],                             // init, fork step, monitor start
    &["hooks"],                                 // shims (the list's hook column), dlsym, cuGetProcAddress
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// `(line, referenced top-level module)` for every `crate::` path in `src`, comments excluded.
fn references(src: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = Vec::new();
    for (n, line) in src.lines().enumerate() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                // `use crate::{a, b::c, d::{e, f}}`: the first segment of each top-level item.
                let (mut depth, mut start) = (0usize, true);
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => start = true,
                        c if start && !c.is_whitespace() => {
                            start = false;
                            out.push((n + 1, ident(&group[j..])));
                        }
                        _ => {}
                    }
                }
            } else {
                out.push((n + 1, ident(after)));
            }
            rest = after;
        }
    }
    out.retain(|(_, m)| !m.is_empty() && m != "self");
    out
}

/// Top-level module of each source file: `src/x.rs` and `src/x/**` are module `x`.
fn sources(dir: &Path, top: Option<&str>, out: &mut BTreeMap<String, Vec<(String, String)>>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            sources(&p, Some(top.unwrap_or(&name)), out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let module = top.map(str::to_owned).unwrap_or(name);
            let text = std::fs::read_to_string(&p).unwrap();
            out.entry(module).or_default().push((p.display().to_string(), text));
        }
    }
}

#[test]
fn every_crate_reference_points_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    sources(&src, None, &mut modules);
    modules.remove("lib");
    let mut bad = Vec::new();
    for (module, files) in &modules {
        let Some(from) = layer_of(module) else {
            bad.push(format!("module `{module}` is in no layer of LAYERS (tests/layers.rs, docs/design.md)"));
            continue;
        };
        for (path, text) in files {
            for (line, target) in references(text) {
                if &target == module {
                    continue;
                }
                match layer_of(&target) {
                    Some(to) if to < from => {}
                    Some(_) => bad.push(format!("{path}:{line}: `{module}` uses `{target}`, which is not below it")),
                    None => bad.push(format!("{path}:{line}: `{module}` uses `{target}`, a module in no layer")),
                }
            }
        }
    }
    for layer in LAYERS {
        for m in *layer {
            if !modules.contains_key(*m) {
                bad.push(format!("LAYERS names `{m}`, which is not a module of libvgpu/src"));
            }
        }
    }
    assert!(bad.is_empty(), "module layering violated:\n{}", bad.join("\n"));
}

#[test]
fn references_are_found_in_every_spelling() {
    let src = "use crate::ffi::*;\nuse crate::{runtime::{A, B}, driver};\n// crate::hooks in a comment\n\
               let x = $crate::launch::before(); crate::monitor::start(rt); // crate::caps";
    let found: Vec<(usize, String)> = references(src);
    let names: Vec<&str> = found.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(names, ["ffi", "runtime", "driver", "launch", "monitor"]);
    assert_eq!(found[3].0, 4);
}
