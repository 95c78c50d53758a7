/*
 * kernels_ptx.h: the samples' device code as hand-written PTX, JIT-compiled by the driver
 * (ISA 7.0 for sm_52 and later, so H100/H200 drivers compile it for sm_90).
 *
 *   vgpu_empty()                                  does nothing (launch-overhead benchmarks)
 *   vgpu_spin(u64 cycles)                         each thread spins until %clock64 advanced by
 *                                                 `cycles` (the mock reads the parameter as cycles
 *                                                 at the device clock rate)
 *   vgpu_fill_u32(u64 ptr, u64 n, u32 value)      grid-stride loop: ptr[i] = value, i < n
 *   vgpu_spin_traced(u64 cycles, u64 out)         vgpu_spin, and each block's thread 0 folds
 *                                                 %globaltimer into out[0] = max(~start) (the
 *                                                 first block's start) and out[1] = max(end)
 *                                                 (the last block's end); out starts zeroed
 */
#ifndef VGPU_KERNELS_PTX_H
#define VGPU_KERNELS_PTX_H

#define VGPU_KERNEL_EMPTY "vgpu_empty"
#define VGPU_KERNEL_SPIN "vgpu_spin"
#define VGPU_KERNEL_FILL_U32 "vgpu_fill_u32"
#define VGPU_KERNEL_SPIN_TRACED "vgpu_spin_traced"

static const char vgpu_kernels_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vgpu_empty()\n"
    "{\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry vgpu_spin(\n"
    "    .param .u64 vgpu_spin_cycles\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<5>;\n"
    "\n"
    "    ld.param.u64 %rd1, [vgpu_spin_cycles];\n"
    "    mov.u64 %rd2, %clock64;\n"
    "$Lspin_loop:\n"
    "    mov.u64 %rd3, %clock64;\n"
    "    sub.s64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p1, %rd4, %rd1;\n"
    "    @%p1 bra $Lspin_loop;\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry vgpu_fill_u32(\n"
    "    .param .u64 vgpu_fill_ptr,\n"
    "    .param .u64 vgpu_fill_n,\n"
    "    .param .u32 vgpu_fill_value\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<6>;\n"
    "    .reg .b64 %rd<10>;\n"
    "\n"
    "    ld.param.u64 %rd1, [vgpu_fill_ptr];\n"
    "    ld.param.u64 %rd2, [vgpu_fill_n];\n"
    "    ld.param.u32 %r1, [vgpu_fill_value];\n"
    "    cvta.to.global.u64 %rd3, %rd1;\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mov.u32 %r5, %nctaid.x;\n"
    "    mul.wide.u32 %rd4, %r2, %r3;\n"
    "    cvt.u64.u32 %rd5, %r4;\n"
    "    add.s64 %rd4, %rd4, %rd5;\n"  /* i = ctaid.x * ntid.x + tid.x */
    "    mul.wide.u32 %rd6, %r5, %r3;\n" /* stride = nctaid.x * ntid.x */
    "    setp.ge.u64 %p1, %rd4, %rd2;\n"
    "    @%p1 bra $Lfill_done;\n"
    "$Lfill_loop:\n"
    "    shl.b64 %rd7, %rd4, 2;\n"
    "    add.s64 %rd8, %rd3, %rd7;\n"
    "    st.global.u32 [%rd8], %r1;\n"
    "    add.s64 %rd4, %rd4, %rd6;\n"
    "    setp.lt.u64 %p2, %rd4, %rd2;\n"
    "    @%p2 bra $Lfill_loop;\n"
    "$Lfill_done:\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry vgpu_spin_traced(\n"
    "    .param .u64 vgpu_spin_traced_cycles,\n"
    "    .param .u64 vgpu_spin_traced_out\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<2>;\n"
    "    .reg .b64 %rd<10>;\n"
    "\n"
    "    ld.param.u64 %rd1, [vgpu_spin_traced_cycles];\n"
    "    ld.param.u64 %rd5, [vgpu_spin_traced_out];\n"
    "    cvta.to.global.u64 %rd6, %rd5;\n"
    "    mov.u32 %r1, %tid.x;\n"
    "    setp.eq.u32 %p2, %r1, 0;\n"
    "    mov.u64 %rd7, %globaltimer;\n"
    "    not.b64 %rd8, %rd7;\n"
    "    @%p2 atom.global.max.u64 %rd9, [%rd6], %rd8;\n"
    "    mov.u64 %rd2, %clock64;\n"
    "$Ltspin_loop:\n"
    "    mov.u64 %rd3, %clock64;\n"
    "    sub.s64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p1, %rd4, %rd1;\n"
    "    @%p1 bra $Ltspin_loop;\n"
    "    mov.u64 %rd7, %globaltimer;\n"
    "    @%p2 atom.global.max.u64 %rd9, [%rd6+8], %rd7;\n"
    "    ret;\n"
    "}\n";

#endif /* VGPU_KERNELS_PTX_H */
