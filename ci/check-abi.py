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
  * the mocks' exports (mock-libcuda/src/exports.rs, mock-nvml/src/lib.rs) the same way;
  * every `#[repr(C)]` struct of libvgpu/src/ffi.rs, mock-libcuda/src/ffi.rs and mock-nvml: its
    size and each field's offset (computed by the C layout rules) against sizeof / offsetof of the
    C type it stands for (`STRUCTS`), from a compiled probe;
  * cuda-samples/c/vgpu_cuda.h, a restated subset of the headers: its declarations and PFN
    typedefs against the headers', its structs' sizes and member offsets against the same types.
Exits 1 on any mismatch. When PyPI cannot be reached it prints SKIPPED loudly and exits 0.
usage: ci/check-abi.py [--cuda VERSION] [--nvml VERSION]
"""
import os
import re
import subprocess
import sys
import tempfile

import nvidia_wheel  # ci/, next to this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_VERSION = "13.0.96"
NVML_VERSION = "13.0.87"


def fetch(pkg, version):
    """Headers of one wheel, extracted under target/nvidia-headers/<pkg>-<version>/ (downloaded once)."""
    return nvidia_wheel.fetch("nvidia-headers", pkg, version, lambda n: "/include/" in n, os.path.join("**", "include"))


def preprocess(include, header, defines=()):
    src = f"#include <{header}>\n"
    r = subprocess.run(["cc", "-E", "-P", "-I", include, *[f"-D{d}" for d in defines], "-x", "c", "-"], input=src,
                       capture_output=True, text=True, check=True)
    return r.stdout


def declarations(text):
    """name -> list of parameter texts, for every function declared in preprocessed C."""
    out = {}
    flat = re.sub(r"\s+", " ", text)
    for m in re.finditer(r"\b(?:CUresult|nvmlReturn_t|const\s+char\s*\*)\s*(\w+)\s*\(([^;{}]*?)\)\s*;", flat):
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


def c_pointee(p):
    """(levels, pointee type) of a C pointer parameter (`const unsigned int *pitch` -> (1, 'unsigned
    int')); None when it is not a pointer. The name, `const` and `restrict` are dropped."""
    p = re.sub(r"\[\s*\w*\s*\]", "*", p)
    if "*" not in p:
        return None
    levels = p.count("*")
    base = p[: p.index("*")]
    toks = [t for t in base.split() if t not in ("const", "volatile", "restrict", "__restrict", "struct", "enum")]
    return levels, " ".join(toks)


def rust_pointee(t):
    """(levels, pointee type) of a Rust raw pointer type (`*mut *const c_uint` -> (2, 'c_uint'))."""
    t, levels = t.strip(), 0
    while t.startswith("*"):
        t = re.sub(r"^\*\s*(mut|const)\s+", "", t)
        levels += 1
    return levels, t.strip()


# Pointee names the hook spells differently on purpose: (Rust, C) -> why that is the same memory.
POINTEE_ALIASES = {
    ("CUmemPoolPropsHead", "CUmemPoolProps"): "the head of CUmemPoolProps_v1, checked as its prefix with the struct layouts",
    ("nvmlProcessInfo_t", "nvmlProcessInfo_v2_t"): "nvml.h names one struct both ways",
}


def pointees_differ(ours, theirs, ours_text, cp, names):
    """Why two pointees differ, or None. Each is (pointer levels, type name, (class, size, signed)
    or None when unresolved). Scalars (integer or float) compare levels, class and size; with
    `names`, any other pointee must carry the header's name (or a `POINTEE_ALIASES` entry) at the
    same levels. `void` matches anything."""
    (ol, on, ok), (hl, hn, hk) = ours, theirs
    if "void" in (on, hn):
        return None
    scalar = lambda k: k is not None and k[0] in ("int", "float")  # noqa: E731
    if scalar(ok) and scalar(hk):
        if ol != hl:
            return f"`{ours_text}` is {ol} pointer level(s), the header's `{cp}` {hl}"
        return None if ok[:2] == hk[:2] else f"`{ours_text}` points at {on} {ok}, the header's `{cp}` at {hn} {hk}"
    if names and on != hn and (on, hn) not in POINTEE_ALIASES:
        return f"`{ours_text}` points at {on} {ok}, the header's `{cp}` at {hn} {hk}"
    if names and ol != hl:
        return f"`{ours_text}` is {ol} pointer level(s), the header's `{cp}` {hl}"
    return None


def pointee_mismatch(rt, cp, probe, names=False):
    """`pointees_differ` for Rust's `rt` against C's `cp`: with `names` for the hook, which uses
    NVIDIA's type names; the mocks name their own types (their layouts are checked on their own
    below), so only their scalar pointees compare."""
    c = c_pointee(cp)
    if c is None or not rt.strip().startswith("*"):
        return None
    (rl, rp), (cl, ctype) = rust_pointee(rt), c
    if rp in ("c_void", "core::ffi::c_void", "std::ffi::c_void"):
        rp = "void"
    r = rust_class(rp)
    if r[0] == "unknown":
        r = ("int", PRIM[rp], False) if rp in PRIM else None
    return pointees_differ((rl, rp, r), (cl, ctype, probe.get(ctype)), rt, cp, names and re.fullmatch(r"\w+", ctype))


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


# ---- struct layouts ------------------------------------------------------------------------------
# Every `#[repr(C)]` struct of these files is checked against the C type it stands for: its size
# (a `prefix` struct restates only the leading fields: size <= C's) and the offset of each field.
# Field names map snake_case -> camelCase unless listed; fields starting with `_` or named in
# `skip` are padding with no C counterpart. An unlisted `#[repr(C)]` struct is an error.
CAP = {f: f[0].upper() + f[1:] for f in ("width", "height", "depth", "format", "flags")}
CAP["num_channels"] = "NumChannels"
STRUCTS = {
    "libvgpu/src/ffi.rs": {
        "CUDA_MEM_ALLOC_NODE_PARAMS": ("CUDA_MEM_ALLOC_NODE_PARAMS_v1", {}),
        "CUmemPoolPropsHead": ("CUmemPoolProps_v1", {"prefix": True}),
        "CUuuid": ("CUuuid", {}),
        "CUmemLocation": ("CUmemLocation", {}),
        "CUmemAllocationProp": ("CUmemAllocationProp_v1", {"compression_type": "allocFlags.compressionType",
                                "gpu_direct_rdma_capable": "allocFlags.gpuDirectRDMACapable",
                                "usage": "allocFlags.usage", "reserved": "allocFlags.reserved"}),
        "CUDA_ARRAY_DESCRIPTOR": ("CUDA_ARRAY_DESCRIPTOR_v2", CAP),
        "CUDA_ARRAY3D_DESCRIPTOR": ("CUDA_ARRAY3D_DESCRIPTOR_v2", CAP),
        "CUDA_ARRAY_DESCRIPTOR_v1": ("CUDA_ARRAY_DESCRIPTOR_v1", CAP),
        "CUDA_ARRAY3D_DESCRIPTOR_v1": ("CUDA_ARRAY3D_DESCRIPTOR_v1", CAP),
        "CUlaunchConfig": ("CUlaunchConfig", {}),
        "CUDA_LAUNCH_PARAMS": ("CUDA_LAUNCH_PARAMS_v1", {}),
        "nvmlMemory_t": ("nvmlMemory_t", {}),
        "nvmlMemory_v2_t": ("nvmlMemory_v2_t", {}),
        "nvmlProcessInfo_v1_t": ("nvmlProcessInfo_v1_t", {}),
        "nvmlProcessInfo_t": ("nvmlProcessInfo_t", {}),
        "nvmlUtilization_t": ("nvmlUtilization_t", {}),
        "nvmlProcessUtilizationSample_t": ("nvmlProcessUtilizationSample_t", {}),
        "nvmlSample_t": ("nvmlSample_t", {}),
    },
    "mock-libcuda/src/ffi.rs": {
        "CUlaunchConfig": ("CUlaunchConfig", {"grid": "gridDimX", "block": "blockDimX"}),
        "CudaKernelNodeParams": ("CUDA_KERNEL_NODE_PARAMS_v1", {"grid": "gridDimX", "block": "blockDimX"}),
        "CudaKernelNodeParamsV2": ("CUDA_KERNEL_NODE_PARAMS_v2", {"v1": "func"}),
        "CUmemLocation": ("CUmemLocation", {}),
        "AllocPropHead": ("CUmemAllocationProp_v1", {"prefix": True, "handle_types": "requestedHandleTypes"}),
        "MemAllocNodeParams": ("CUDA_MEM_ALLOC_NODE_PARAMS_v1", {}),
        "DevResource": ("CUdevResource", {"sm_count": "sm.smCount", "skip": ("pad", "rest")}),
        "CudaArrayDescriptor": ("CUDA_ARRAY_DESCRIPTOR_v2", CAP),
        "CudaArray3DDescriptor": ("CUDA_ARRAY3D_DESCRIPTOR_v2", CAP),
    },
    "mock-nvml/src/lib.rs": {
        "Memory": ("nvmlMemory_t", {}),
        "MemoryV2": ("nvmlMemory_v2_t", {}),
        "Utilization": ("nvmlUtilization_t", {}),
        "PciInfo": ("nvmlPciInfo_t", {"pci_sub_system_id": "pciSubSystemId"}),
        "ProcessInfoV1": ("nvmlProcessInfo_v1_t", {}),
        "ProcessInfoV2": ("nvmlProcessInfo_v2_t", {}),
        "ProcessUtilizationSample": ("nvmlProcessUtilizationSample_t", {}),
        "Sample": ("nvmlSample_t", {}),
    },
}
PRIM = {"u8": 1, "i8": 1, "c_char": 1, "u16": 2, "i16": 2, "u32": 4, "i32": 4, "c_int": 4, "c_uint": 4, "f32": 4,
        "u64": 8, "i64": 8, "usize": 8, "isize": 8, "f64": 8}


def rust_structs(path):
    """name -> [(field, type)] for every #[repr(C)] struct; and the file's type aliases."""
    text = re.sub(r"//[^\n]*", "", open(os.path.join(ROOT, path)).read())
    aliases = dict(re.findall(r"\btype (\w+)\s*=\s*([^;]+);", text))
    structs = {}
    for m in re.finditer(r"#\[repr\(C\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([\w]+\))?\s+)?struct (\w+)\s*\{([^}]*)\}", text):
        fields = []
        for f in m.group(2).split(","):
            f = f.strip()
            if ":" in f:
                name, ty = f.split(":", 1)
                fields.append((name.replace("pub ", "").strip(), ty.strip()))
        structs[m.group(1)] = fields
    return structs, aliases


def rust_layout(name, structs, aliases, memo=None):
    """(size, align, {field: offset}) of a repr(C) struct, by the C layout rules."""
    def size_align(t):
        t = t.strip()
        while t in aliases:
            t = aliases[t].strip()
        if t.startswith("*") or t.startswith("&"):
            return 8, 8
        if t in PRIM:
            return PRIM[t], PRIM[t]
        m = re.match(r"\[(.+);\s*(\d+)\]$", t)
        if m:
            s, a = size_align(m.group(1))
            return s * int(m.group(2)), a
        if t in structs:
            s, a, _ = rust_layout(t, structs, aliases)
            return s, a
        raise ValueError(f"unknown Rust type `{t}`")
    off, align, offsets = 0, 1, {}
    for f, t in structs[name]:
        s, a = size_align(t)
        off = (off + a - 1) // a * a
        offsets[f] = off
        off += s
        align = max(align, a)
    return (off + align - 1) // align * align, align, offsets


def camel(f):
    f = f.rstrip("_")
    parts = f.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def c_layouts(incs, headers, queries, defines=()):
    """{(ctype, member or None): value} of sizeof / offsetof, from one compiled probe."""
    body = []
    for ctype, member in queries:
        expr = f"sizeof({ctype})" if member is None else f"offsetof({ctype}, {member})"
        body.append(f'  printf("%s|%s|%zu\\n", "{ctype}", "{member or ""}", (size_t){expr});')
    src = "\n".join([f"#include <{h}>" for h in headers] + ["#include <stdio.h>", "#include <stddef.h>",
                                                            "int main(void) {"] + body + ["  return 0; }"])
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        open(c, "w").write(src)
        inc = [x for i in incs for x in ("-I", i)]
        r = subprocess.run(["cc", "-w", *inc, *[f"-D{x}" for x in defines], c, "-o", exe], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip().splitlines()[:5])
        out = {}
        for line in subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines():
            t, m, v = line.split("|")
            out[(t, m or None)] = int(v)
        return out


def check_structs(cuda_inc, nvml_inc, bad):
    """Rust #[repr(C)] structs of the hook and the mocks against NVIDIA's headers; returns count."""
    plan = []  # (file, rust name, ctype, size, prefix, [(field, c member, offset)])
    for path, table in STRUCTS.items():
        structs, aliases = rust_structs(path)
        for name in structs:
            if name not in table:
                bad.append(f"{path}: #[repr(C)] struct {name} is not mapped to a C type in check-abi.py STRUCTS")
        for name, (ctype, opts) in table.items():
            if name not in structs:
                bad.append(f"{path}: struct {name} (STRUCTS) not found")
                continue
            if ctype.startswith("nvml") and not nvml_inc:
                continue
            size, _, offsets = rust_layout(name, structs, aliases)
            fields = [(f, opts.get(f, camel(f)), o) for f, o in offsets.items()
                      if not f.startswith("_") and f not in opts.get("skip", ())]
            plan.append((path, name, ctype, size, opts.get("prefix", False), fields))
    queries = [(ct, None) for _, _, ct, _, _, _ in plan] + [(ct, m) for _, _, ct, _, _, fs in plan for _, m, _ in fs]
    incs = [cuda_inc] + ([nvml_inc] if nvml_inc else [])
    c = c_layouts(incs, ["cuda.h"] + (["nvml.h"] if nvml_inc else []), sorted(set(queries), key=lambda q: (q[0], q[1] or "")),
                  ["__CUDA_API_VERSION_INTERNAL"])
    for path, name, ctype, size, prefix, fields in plan:
        csize = c[(ctype, None)]
        if (size > csize) if prefix else (size != csize):
            bad.append(f"{path}: {name} is {size} bytes, {ctype} is {csize}{' (prefix)' if prefix else ''}")
        for f, m, off in fields:
            if c[(ctype, m)] != off:
                bad.append(f"{path}: {name}.{f} at offset {off}, {ctype}.{m} at {c[(ctype, m)]}")
    return len(plan)


# ---- restated signatures: the mocks' exports and the samples' header ------------------------------
MOCK_TYPES = {"Handle": ("ptr", 8, False), "Device": ("ptr", 8, False), "Ret": ("int", 4, False),
              "CUresult": ("int", 4, False)}


def mock_exports():
    """(file, name, [rust param types]) of every function the mocks export."""
    out = []
    text = open(os.path.join(ROOT, "mock-libcuda", "src", "exports.rs")).read()
    for m in re.finditer(r"=>\s*fn\s+(\w+)\s*\(([^)]*)\)", text):
        params = [p.split(":", 1)[1].strip() for p in split_top(m.group(2)) if ":" in p]
        out.append(("mock-libcuda/src/exports.rs", m.group(1), params))
        pre = text[:m.start()].rsplit("\n", 1)[-1]
        twin = re.search(r"/\s*\d+\s+(\w+)\s*$", pre.strip())
        if twin:
            out.append(("mock-libcuda/src/exports.rs", twin.group(1), params))
    text = open(os.path.join(ROOT, "mock-nvml", "src", "lib.rs")).read()
    for m in re.finditer(r"^\s*(?:pub (?:unsafe )?extern \"C\" )?fn\s+(nvml\w+)\s*\(([^)]*)\)", text, re.M):
        params = [p.split(":", 1)[1].strip() for p in split_top(m.group(2)) if ":" in p]
        out.append(("mock-nvml/src/lib.rs", m.group(1), params))
    return out


def sample_pointee_mismatch(op, cp, hdir, cuda_inc, probe):
    """`pointees_differ` for the samples' `op` against the header's `cp` (both C, both NVIDIA's
    names): differently named pointees must be scalars of one class and size."""
    po, pc = c_pointee(op), c_pointee(cp)
    if not po or not pc:
        return None
    ko = kc = None
    if po[1] != pc[1] and "void" not in (po[1], pc[1]):
        try:
            ko = classify_c_types(hdir, ["vgpu_cuda.h"], {po[1]}).get(po[1])
            kc = probe.get(pc[1]) or classify_c_types(cuda_inc, ["cuda.h"], {pc[1]}, ["__CUDA_API_VERSION_INTERNAL"]).get(pc[1])
        except subprocess.CalledProcessError:
            pass
    return pointees_differ((po[0], po[1], ko), (pc[0], pc[1], kc), op, cp, True)


def sample_header(cuda_inc, nvml_inc, decls, probe, bad, undeclared):
    """cuda-samples/c/vgpu_cuda.h (a restated subset of cuda.h/nvml.h): its function declarations
    and PFN typedefs against the headers' declarations, its structs' sizes and member offsets
    against the same types of the headers. Returns (functions, structs) checked."""
    hdir = os.path.join(ROOT, "cuda-samples", "c")
    text = open(os.path.join(hdir, "vgpu_cuda.h")).read()
    pre = preprocess(hdir, "vgpu_cuda.h")
    ours = declarations(pre)
    flat = re.sub(r"\s+", " ", pre)
    for m in re.finditer(r"typedef CUresult \( ?\*PFN_(\w+)\)\s*\(([^;]*?)\)\s*;", flat):
        ours[m.group(1)] = [q.strip() for q in split_top(m.group(2))]
    otypes = {c_param_type(p) for ps in ours.values() for p in ps}
    oprobe = classify_c_types(hdir, ["vgpu_cuda.h"], otypes)
    nfun = 0
    for name, params in ours.items():
        if name not in decls:
            undeclared.append(name)
            continue
        nfun += 1
        if len(params) != len(decls[name]):
            bad.append(f"vgpu_cuda.h: {name} has {len(params)} parameters, the header {len(decls[name])}")
            continue
        for i, (op, cp) in enumerate(zip(params, decls[name])):
            ot, ct = c_param_type(op), c_param_type(cp)
            o = ("ptr", 8, False) if ot == "ptr" else oprobe.get(ot)
            c = ("ptr", 8, False) if ct == "ptr" else probe.get(ct)
            if c is None:
                c = classify_c_types(cuda_inc, ["cuda.h"], {ct}).get(ct)
            if o is None or c is None or o[:2] != c[:2]:
                bad.append(f"vgpu_cuda.h: {name} parameter {i}: `{op}` is {o}, the header's `{cp}` is {c}")
            elif (why := sample_pointee_mismatch(op, cp, hdir, cuda_inc, probe)):
                bad.append(f"vgpu_cuda.h: {name} parameter {i}: {why}")
    queries = []
    nocomment = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    for m in re.finditer(r"typedef struct \w+\s*\{", nocomment):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(nocomment[i], 0)
            i += 1
        body = nocomment[m.end():i - 1]
        ctype = re.match(r"\s*(\w+)\s*;", nocomment[i:]).group(1)
        if ctype.startswith("nvml") and not nvml_inc:
            continue
        body = re.sub(r"\{[^{}]*\}", "", body)  # nested struct bodies: the member's name stays
        queries.append((ctype, None))
        for decl in body.split(";"):
            names = re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*$", decl.strip())
            if names:
                queries.append((ctype, names[0]))
    mine = c_layouts([hdir], ["vgpu_cuda.h"], queries)
    theirs = c_layouts([cuda_inc] + ([nvml_inc] if nvml_inc else []), ["cuda.h"] + (["nvml.h"] if nvml_inc else []),
                       queries)
    for q in queries:
        if mine[q] != theirs[q]:
            what = f"sizeof({q[0]})" if q[1] is None else f"offsetof({q[0]}, {q[1]})"
            bad.append(f"vgpu_cuda.h: {what} is {mine[q]}, the header says {theirs[q]}")
    return nfun, sum(1 for q in queries if q[1] is None)


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
    # Versions cuda.h keeps for old binaries only (cuCtxCreate_v2/_v3, cuGraphInstantiate_v2).
    internal = declarations(preprocess(cuda_inc, "cuda.h", ["__CUDA_API_VERSION_INTERNAL"]))
    wanted = {name for _, name, _ in hook_table()} | {name for _, name, _ in mock_exports()}
    decls.update({k: v for k, v in internal.items() if k not in decls and k in wanted})
    headers = ["cuda.h"]
    if nvml_inc:
        decls.update(declarations(preprocess(nvml_inc, "nvml.h")))
        # The unversioned and _v2 names nvml.h declares only when asked not to upgrade them.
        old_nvml = declarations(preprocess(nvml_inc, "nvml.h", ["NVML_NO_UNVERSIONED_FUNC_DEFS"]))
        decls.update({k: v for k, v in old_nvml.items() if k not in decls})
        headers.append("nvml.h")
    else:
        print(f"check-abi: NVML part SKIPPED: cannot fetch nvml.h ({err2})", file=sys.stderr)
    hooked = {name for _, name, _ in hook_table()}
    ctypes = {c_param_type(p) for n, ps in decls.items() if n in hooked for p in ps}
    ctypes |= {c_pointee(p)[1] for n, ps in decls.items() if n in hooked for p in ps
               if c_pointee(p) and c_pointee(p)[1] not in ("void", "")}
    probe = classify_c_types(cuda_inc, ["cuda.h"], {t for t in ctypes if not t.startswith("nvml")},
                             ["__CUDA_API_VERSION_INTERNAL"])
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
            elif (why := pointee_mismatch(rt, cp, probe, names=True)):
                bad.append(f"{name} parameter {i}: {why}")
        checked += 1
    # The mocks' exports restate signatures too (a mock's CUresult is `u32`, cuda.h's an `int` enum:
    # the same ABI class and size, which is what a caller sees).
    nmock = 0
    for f, name, params in mock_exports():
        if name not in decls:
            bad.append(f"{f}: exports {name}, which no NVIDIA header declares")
            continue
        cparams = decls[name]
        nmock += 1
        if len(cparams) != len(params):
            bad.append(f"{f}: {name} has {len(params)} parameters, the header {len(cparams)}")
            continue
        for i, (rt, cp) in enumerate(zip(params, cparams)):
            ct = c_param_type(cp)
            if ct not in probe and ct != "ptr":
                probe.update(classify_c_types(cuda_inc, ["cuda.h"], {ct}) if not ct.startswith("nvml")
                             else classify_c_types(nvml_inc, ["nvml.h"], {ct}))
            c = ("ptr", 8, False) if ct == "ptr" else probe.get(ct, ("unknown", 0, False))
            r = MOCK_TYPES.get(rt.strip()) or rust_class(rt)
            if r[0] == "unknown" and rt.strip() in PRIM:
                r = ("int", PRIM[rt.strip()], False)
            if r[0] == "unknown" or c[0] == "other" or r[:2] != c[:2]:
                bad.append(f"{f}: {name} parameter {i}: `{rt}` is {r}, the header's `{cp}` is {c}")
            elif (why := pointee_mismatch(rt, cp, probe)):
                bad.append(f"{f}: {name} parameter {i}: {why}")
    nstruct = check_structs(cuda_inc, nvml_inc, bad)
    sample_undeclared = []
    nsfun, nsstruct = sample_header(cuda_inc, nvml_inc, decls, probe, bad, sample_undeclared)
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
    for name in undeclared:
        bad.append(f"{name}: hooked or called, but declared nowhere in cuda.h, cudaTypedefs.h or nvml.h")
    print(f"check-abi: cuda.h {CUDA_VERSION}, nvml.h {NVML_VERSION if nvml_inc else 'skipped'}: {checked} "
          f"signatures of sys.rs and {len(known)} constants checked; declared nowhere in the headers: {len(undeclared)} "
          f"{' '.join(undeclared)}")
    print(f"check-abi: also {nmock} mock exports' signatures, {nstruct} Rust #[repr(C)] struct layouts (hook and "
          f"mocks), vgpu_cuda.h's {nsfun} declarations "
          f"(declared nowhere in the headers: {' '.join(sample_undeclared) or 'none'}) and {nsstruct} struct layouts")
    for b in bad:
        print(f"check-abi: MISMATCH {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
