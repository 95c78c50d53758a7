#!/usr/bin/env python3
"""Check the hook table's C signatures and our CUDA constants against NVIDIA's own headers.

NVIDIA ships `cuda.h` in the `nvidia-cuda-runtime` wheel and `nvml.h` in `nvidia-nvml-dev` on
PyPI. This script fetches the versions matching the driver we target (cached under
target/nvidia-headers), then:
  * for every entry of the one list in libvgpu/src/sys.rs (hooked and called) that the headers
    declare, compares the number of parameters and each parameter's ABI class (pointer, integer
    or float of a size, struct by value of the same name) with the declaration (per-thread
    `_ptsz`/`_ptds` entries from the header's per-thread mode);
  * for every `pub const NAME` in libvgpu/src/ffi.rs and mock-libcuda/src/ffi.rs that the headers
    define, checks the value.
Exits 1 on any mismatch. When PyPI cannot be reached it prints SKIPPED loudly and exits 0.
usage: ci/check-abi.py [--cuda VERSION] [--nvml VERSION]
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "target", "nvidia-headers")
CUDA_VERSION = "13.0.96"
NVML_VERSION = "13.0.87"


def fetch(pkg, version):
    """Headers of one wheel, extracted under CACHE/<pkg>-<version>/ (downloaded once)."""
    dest = os.path.join(CACHE, f"{pkg}-{version}")
    if not glob.glob(os.path.join(dest, "**", "include"), recursive=True):
        os.makedirs(dest, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, f"{pkg}=={version}"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return None, r.stderr.strip().splitlines()[-1:] or ["pip failed"]
        for whl in glob.glob(os.path.join(dest, "*.whl")):
            with zipfile.ZipFile(whl) as z:
                z.extractall(dest, [n for n in z.namelist() if "/include/" in n])
    inc = glob.glob(os.path.join(dest, "**", "include"), recursive=True)
    return (inc[0] if inc else None), None


def preprocess(include, header, defines=()):
    src = f"#include <{header}>\n"
    r = subprocess.run(["cc", "-E", "-P", "-I", include, *[f"-D{d}" for d in defines], "-x", "c", "-"], input=src,
                       capture_output=True, text=True, check=True)
    return r.stdout


def declarations(text):
    """name -> list of parameter texts, for every function declared in preprocessed C."""
    out = {}
    flat = re.sub(r"\s+", " ", text)
    for m in re.finditer(r"\b(?:CUresult|nvmlReturn_t)\s+(\w+)\s*\(([^;{}]*?)\)\s*;", flat):
        params = [p.strip() for p in split_top(m.group(2))]
        out[m.group(1)] = [] if params in ([], ["void"]) else params
    return out


def split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def c_param_type(p):
    """The type of a C parameter declaration (drops the name); '*' marks pointers."""
    p = re.sub(r"\[\s*\w*\s*\]", "*", p)
    if "*" in p:
        return "ptr"
    toks = p.split()
    return " ".join(toks[:-1]) if len(toks) > 1 else toks[0]


def run_probe(include, headers, body, defines=()):
    src = "\n".join([f"#include <{h}>" for h in headers] + ["#include <stdio.h>", "int main(void) {"] + body
                    + ["  return 0; }"])
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "probe.c"), os.path.join(d, "probe")
        open(c, "w").write(src)
        subprocess.run(["cc", "-w", "-I", include, *[f"-D{d}" for d in defines], c, "-o", exe], check=True)
        return subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines()


def classify_c_types(include, headers, types, defines=()):
    """type -> (class, size, signed) via compiled probes: class 'ptr', 'int' or 'other'."""
    types = sorted(t for t in types if t != "ptr")
    res = {}
    for line in run_probe(include, headers, [f'  printf("%s|%d|%zu\\n", "{t}", __builtin_classify_type(*({t} *)0), '
                                              f'sizeof({t}));' for t in types], defines):
        t, cls, size = line.split("|")
        kind = {"5": "ptr", "1": "int", "2": "int", "3": "int", "4": "int", "8": "float", "12": "struct"}.get(cls, "other")
        res[t] = (kind, int(size), False)
    ints = [t for t, v in res.items() if v[0] == "int"]
    for line in run_probe(include, headers, [f'  printf("%s|%d\\n", "{t}", (int)(({t})-1 < ({t})0));' for t in ints],
                          defines):
        t, signed = line.split("|")
        res[t] = ("int", res[t][1], signed == "1")
    return res


RUST_INT = {"usize": (8, False), "u64": (8, False), "cuuint64_t": (8, False), "CUdeviceptr": (8, False),
            "CUmemGenericAllocationHandle": (8, False), "c_uint": (4, False), "u32": (4, False),
            "CUdeviceptr_v1": (4, False), "c_int": (4, True), "i32": (4, True), "CUdevice": (4, True),
            "u8": (1, False), "u16": (2, False), "CUdevice_attribute": (4, True),
            "CUmem_advise": (4, True)}
RUST_HANDLES = {"CUstream", "CUcontext", "CUfunction", "CUgraph", "CUgraphExec", "CUevent", "CUarray", "CUmemoryPool",
                "CUmipmappedArray", "CUgreenCtx", "CUdevResourceDesc", "nvmlDevice_t", "CUgraphNode", "CUmodule"}


RUST_FLOAT = {"f32": 4, "f64": 8}
RUST_BY_VALUE = {"CUmemLocation": 8}  # structs passed by value: (name, size); layouts checked below


def rust_class(t):
    t = t.strip()
    if t.startswith("*") or t in RUST_HANDLES:
        return ("ptr", 8, False)
    if t in RUST_FLOAT:
        return ("float", RUST_FLOAT[t], False)
    if t in RUST_BY_VALUE:
        return ("struct", RUST_BY_VALUE[t], False)
    if t in RUST_INT:
        size, signed = RUST_INT[t]
        return ("int", size, signed)
    return ("unknown", 0, False)


def hook_table():
    """(lib, name, [rust param types]) for every entry of the one list (hooked and called)."""
    text = open(os.path.join(ROOT, "libvgpu", "src", "sys.rs")).read()
    entries = []
    for m in re.finditer(r"\b(Cuda|Nvml)\s+(?:policy|init|sync|launch|call)\b[^;]*?\bfn\s+(\w+)\s*\(([^;]*?)\)\s*(?:=>[^;]*)?;",
                         text, re.S):
        params = [p.split(":", 1)[1].strip() for p in split_top(m.group(3)) if ":" in p]
        entries.append((m.group(1), m.group(2), params))
    return entries


def rust_consts(path):
    out = {}
    for m in re.finditer(r"pub const (\w+): [\w:]+ = (-?(?:0x[0-9a-fA-F_]+|[0-9_]+))\s*;", open(path).read()):
        out[m.group(1)] = int(m.group(2).replace("_", ""), 0)
    return out


def main():
    cuda_inc, err = fetch("nvidia-cuda-runtime", CUDA_VERSION)
    nvml_inc, err2 = fetch("nvidia-nvml-dev", NVML_VERSION)
    if not cuda_inc:
        print(f"check-abi: SKIPPED: cannot fetch NVIDIA's cuda.h from PyPI ({err or err2}); nothing was checked",
              file=sys.stderr)
        return 0
    decls = {}
    decls.update(declarations(preprocess(cuda_inc, "cuda.h")))
    ptsz = declarations(preprocess(cuda_inc, "cuda.h", ["CUDA_API_PER_THREAD_DEFAULT_STREAM"]))
    decls.update({k: v for k, v in ptsz.items() if k.endswith(("_ptsz", "_ptds"))})
    headers = ["cuda.h"]
    if nvml_inc:
        decls.update(declarations(preprocess(nvml_inc, "nvml.h")))
        headers.append("nvml.h")
    else:
        print(f"check-abi: NVML part SKIPPED: cannot fetch nvml.h ({err2})", file=sys.stderr)
    hooked = {name for _, name, _ in hook_table()}
    ctypes = {c_param_type(p) for n, ps in decls.items() if n in hooked for p in ps}
    probe = classify_c_types(cuda_inc, ["cuda.h"], {t for t in ctypes if not t.startswith("nvml")})
    if nvml_inc:
        probe.update(classify_c_types(nvml_inc, ["nvml.h"], {t for t in ctypes if t.startswith("nvml")}))
    bad, checked, undeclared = [], 0, []
    # Legacy unversioned entries cuda.h no longer declares: the oldest PFN typedef of that name.
    pfn = {}
    flat = re.sub(r"\s+", " ", preprocess(cuda_inc, "cudaTypedefs.h", ["__CUDA_API_VERSION_INTERNAL"]))
    for m in re.finditer(r"typedef CUresult \( ?\*PFN_(\w+?)_v(\d+)\)\s*\(([^;]*?)\)\s*;", flat):
        name, ver = m.group(1), int(m.group(2))
        params = [q.strip() for q in split_top(m.group(3))]
        if name not in pfn or ver < pfn[name][0]:
            pfn[name] = (ver, [] if params in ([], ["void"]) else params)
    for _, name, _ in hook_table():
        if name not in decls and name in pfn:
            decls[name] = pfn[name][1]
            ctypes.update(c_param_type(q) for q in pfn[name][1])
    legacy = {t for t in ctypes if t not in probe and not t.startswith("nvml")}
    probe.update(classify_c_types(cuda_inc, ["cudaTypedefs.h"], legacy, ["__CUDA_API_VERSION_INTERNAL"]))
    for lib, name, params in hook_table():
        if name not in decls:
            undeclared.append(name)
            continue
        cparams = decls[name]
        if len(cparams) != len(params):
            bad.append(f"{name}: {len(params)} parameters in sys.rs, {len(cparams)} in the header")
            continue
        for i, (rt, cp) in enumerate(zip(params, cparams)):
            ct = c_param_type(cp)
            c = ("ptr", 8, False) if ct == "ptr" else probe.get(ct, ("unknown", 0, False))
            r = rust_class(rt)
            if r[0] == "unknown" or c[0] == "other":
                bad.append(f"{name} parameter {i}: cannot compare `{rt}` with `{cp}`")
            elif r[:2] != c[:2]:  # class and size make the ABI; enums may differ in signedness only
                bad.append(f"{name} parameter {i}: `{rt}` is {r}, the header's `{cp}` is {c}")
        checked += 1
    # Constants: every one the headers define must have NVIDIA's value.
    consts = {}
    for f in ("libvgpu/src/ffi.rs", "mock-libcuda/src/ffi.rs"):
        for k, v in rust_consts(os.path.join(ROOT, f)).items():
            consts.setdefault(k, []).append((f, v))
    src = "#include <cuda.h>\n" + ("#include <nvml.h>\n" if nvml_inc else "") + "#include <stdio.h>\nint main(void) {\n"
    allc = preprocess(cuda_inc, "cuda.h") + (preprocess(nvml_inc, "nvml.h") if nvml_inc else "")
    macros = subprocess.run(["cc", "-E", "-dM", "-I", cuda_inc] + (["-I", nvml_inc] if nvml_inc else []) + ["-x", "c", "-"],
                            input=src.split("#include <stdio.h>")[0], capture_output=True, text=True).stdout
    known = [k for k in consts if re.search(rf"\b{k}\b", allc) or re.search(rf"#define {k}\b", macros)]
    for k in known:
        src += f'  printf("{k} %lld\\n", (long long){k});\n'
    src += "  return 0; }\n"
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "consts.c"), os.path.join(d, "consts")
        open(c, "w").write(src)
        subprocess.run(["cc", "-w", "-I", cuda_inc] + (["-I", nvml_inc] if nvml_inc else []) + [c, "-o", exe], check=True)
        for line in subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines():
            k, v = line.split()
            for f, ours in consts[k]:
                if ours != int(v) and ours != int(v) & 0xFFFFFFFF:
                    bad.append(f"{f}: {k} = {ours}, the header says {v}")
    print(f"check-abi: cuda.h {CUDA_VERSION}, nvml.h {NVML_VERSION if nvml_inc else 'skipped'}: {checked} "
          f"signatures of sys.rs and {len(known)} constants checked; declared nowhere in the headers: {len(undeclared)} "
          f"{' '.join(undeclared)}")
    for b in bad:
        print(f"check-abi: MISMATCH {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
