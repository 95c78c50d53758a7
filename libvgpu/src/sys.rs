//! `sys`: every driver and NVML entry point the hook hooks or calls, listed once, as typed
//! real-function slots. The list (`entries!`) is THE hook table: signatures checked against CUDA
//! 13.0 `cuda.h` / `cudaTypedefs.h` and `nvml.h` by ci/check-abi.py (driver 580 exports every
//! name; unversioned names are the legacy ABIs the driver still exports and `cuGetProcAddress`
//! may hand out for old `cudaVersion`s).
//!
//! * `hooked`: name, signature, and the mode / policy columns that only the `hooks` layer reads
//!   (`hooks::table` expands the same list into the exported shims, `HOOKS` and `index_of`);
//! * `called`: functions the policies call but do not hook (queries, events).
//!
//! For every entry this module generates `sig::NAME` (the C signature as a function-pointer type)
//! and `real::NAME` (a `Slot<sig::NAME>`: resolved lazily on our own library handle, handed out
//! typed). `driver` wraps the calls; nothing else turns an address into a function.

#[allow(unused_imports)]
use crate::ffi::*;
#[allow(unused_imports)]
use std::ffi::{c_char, c_int, c_uint, c_void};

/// The one list, handed to `$then!` (`slots` here, `hooks` in `hooks::table`). Policy paths are
/// tokens here: they resolve only where `hooks::table` expands them.
macro_rules! entries {
    ($then:ident) => { $then! {
hooked {
    // ---- entry points -------------------------------------------------------------------------
    Cuda policy fn cuInit(flags: c_uint) => context::init;
    Cuda policy fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int,
        flags: cuuint64_t) => procaddr::get_proc_address;
    Cuda policy fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int,
        flags: cuuint64_t, status: *mut CUdriverProcAddressQueryResult) => procaddr::get_proc_address_v2;

    // ---- device memory ------------------------------------------------------------------------
    Cuda policy fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => memory::mem_alloc;
    Cuda policy fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) => memory::mem_alloc_v1;
    Cuda policy fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize,
        elem: c_uint) => memory::mem_alloc_pitch;
    Cuda policy fn cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, width: c_uint, height: c_uint,
        elem: c_uint) => memory::mem_alloc_pitch;
    Cuda policy fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint)
        => memory::mem_alloc_managed;
    Cuda policy fn cuMemFree_v2(dptr: CUdeviceptr) => memory::mem_free;
    Cuda policy fn cuMemFree(dptr: CUdeviceptr_v1) => memory::mem_free_v1;
    Cuda policy fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
        => physmem::mem_alloc_async;
    Cuda policy fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
        => physmem::mem_alloc_async;
    Cuda policy fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool,
        stream: CUstream) => physmem::mem_alloc_from_pool_async;
    Cuda policy fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool,
        stream: CUstream) => physmem::mem_alloc_from_pool_async;
    Cuda policy fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => memory::mem_free_async;
    Cuda policy fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => memory::mem_free_async;
    Cuda policy fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize,
        prop: *const CUmemAllocationProp, flags: u64) => physmem::mem_create;
    Cuda policy fn cuMemRelease(handle: CUmemGenericAllocationHandle) => physmem::mem_release;
    // ---- memory the device holds beyond a call and its free (physmem.rs) -----------------------
    Cuda policy fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle,
        flags: u64) => physmem::mem_map;
    Cuda policy fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => physmem::mem_unmap;
    Cuda policy fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void)
        => physmem::retain_allocation_handle;
    Cuda policy fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void,
        typ: c_int) => physmem::import_shareable;
    Cuda policy fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolPropsHead) => physmem::pool_create;
    Cuda policy fn cuMemPoolDestroy(pool: CUmemoryPool) => physmem::pool_destroy;
    Cuda policy fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) => physmem::pool_trim;
    Cuda policy fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) => physmem::device_pool;
    Cuda policy fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) => physmem::device_pool;
    Cuda policy fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) => physmem::end_capture;
    Cuda policy fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) => physmem::end_capture;
    Cuda policy fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize,
        params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) => physmem::add_mem_alloc_node;
    Cuda policy fn cuGraphDestroy(graph: CUgraph) => physmem::graph_destroy;
    Cuda policy fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64)
        => physmem::graph_instantiate_with_flags;
    Cuda policy fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode,
        log: *mut c_char, log_size: usize) => physmem::graph_instantiate_v2;
    Cuda policy fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode,
        log: *mut c_char, log_size: usize) => physmem::graph_instantiate_v2;
    Cuda policy fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
        => physmem::graph_instantiate_with_params;
    Cuda policy fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
        => physmem::graph_instantiate_with_params;
    Cuda policy fn cuGraphExecDestroy(exec: CUgraphExec) => physmem::graph_exec_destroy;
    Cuda policy fn cuDeviceGraphMemTrim(dev: CUdevice) => physmem::graph_mem_trim;
    Cuda policy fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR)
        => memory::array_create;
    Cuda policy fn cuArrayCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1)
        => memory::array_create;
    Cuda policy fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR)
        => memory::array_create;
    Cuda policy fn cuArray3DCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1)
        => memory::array_create;
    Cuda policy fn cuArrayDestroy(handle: CUarray) => memory::array_destroy;
    Cuda policy fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR,
        levels: c_uint) => memory::mipmapped_array_create;
    Cuda policy fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) => memory::mipmapped_array_destroy;

    // ---- contexts (their device memory is charged as MemKind::Context) ---------------------------
    Cuda policy fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::ctx_create_v1;
    Cuda policy fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => context::ctx_create_v2;
    Cuda policy fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut CUexecAffinityParam, num_params: c_int,
        flags: c_uint, dev: CUdevice) => context::ctx_create_v3;
    Cuda policy fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint,
        dev: CUdevice) => context::ctx_create_v4;
    Cuda policy fn cuCtxDestroy(ctx: CUcontext) => context::ctx_destroy;
    Cuda policy fn cuCtxDestroy_v2(ctx: CUcontext) => context::ctx_destroy;
    Cuda policy fn cuGreenCtxCreate(pctx: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint)
        => context::green_create;
    Cuda policy fn cuGreenCtxDestroy(ctx: CUgreenCtx) => context::green_destroy;
    // ---- modules: what a load makes the device hold (code, globals, the context's growth) -----
    Cuda policy fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) => context::module_load;
    Cuda policy fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) => context::module_load_data;
    Cuda policy fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, num_options: c_uint,
        options: *mut c_int, values: *mut *mut c_void) => context::module_load_data_ex;
    Cuda policy fn cuModuleLoadFatBinary(module: *mut CUmodule, fat_cubin: *const c_void) => context::module_load_fat_binary;
    Cuda policy fn cuModuleUnload(module: CUmodule) => context::module_unload;
    Cuda policy fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) => context::primary_retain;
    Cuda policy fn cuDevicePrimaryCtxRelease(dev: CUdevice) => context::primary_release;
    Cuda policy fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => context::primary_release;
    Cuda policy fn cuDevicePrimaryCtxReset(dev: CUdevice) => context::primary_reset;
    Cuda policy fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => context::primary_reset;

    // ---- memory info --------------------------------------------------------------------------
    Cuda policy fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => meminfo::mem_get_info;
    Cuda policy fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) => meminfo::mem_get_info_v1;
    Cuda policy fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => meminfo::device_total_mem;
    Cuda policy fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) => meminfo::device_total_mem_v1;

    // ---- work submission: the lead's launch gate, nothing else on this path ---------------------
    Cuda launch(kind = vgpu_core::limiter::kinds::grid_kind(f as u64, gx, gy, gz); stream) fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
        by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void,
        extra: *mut *mut c_void);
    Cuda launch(kind = vgpu_core::limiter::kinds::grid_kind(f as u64, gx, gy, gz); stream) fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
        by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void,
        extra: *mut *mut c_void);
    Cuda launch(kind = config.as_ref().map_or(0, |c| vgpu_core::limiter::kinds::grid_kind(f as u64, c.grid_dim_x, c.grid_dim_y, c.grid_dim_z));
        if config.is_null() { std::ptr::null_mut() } else { (*config).h_stream })
        fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void);
    Cuda launch(kind = config.as_ref().map_or(0, |c| vgpu_core::limiter::kinds::grid_kind(f as u64, c.grid_dim_x, c.grid_dim_y, c.grid_dim_z));
        if config.is_null() { std::ptr::null_mut() } else { (*config).h_stream })
        fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void);
    Cuda launch(kind = vgpu_core::limiter::kinds::grid_kind(f as u64, gx, gy, gz); stream) fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint,
        bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void);
    Cuda launch(kind = vgpu_core::limiter::kinds::grid_kind(f as u64, gx, gy, gz); stream) fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint,
        bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void);
    Cuda launch(if list.is_null() || num_devices == 0 { std::ptr::null_mut() } else { (*list).h_stream })
        fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, num_devices: c_uint,
        flags: c_uint);
    Cuda launch(kind = vgpu_core::limiter::kinds::kernel_kind(exec as u64, 0); stream) fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
    Cuda launch(kind = vgpu_core::limiter::kinds::kernel_kind(exec as u64, 0); stream) fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream);
    Cuda launch(std::ptr::null_mut()) fn cuLaunch(f: CUfunction);
    Cuda launch(std::ptr::null_mut()) fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int);
    Cuda launch(stream) fn cuLaunchGridAsync(f: CUfunction, width: c_int, height: c_int, stream: CUstream);

    // ---- copies and memsets: device time NVML counts (an H100 reads 98-100% for a loop of them) --
    Cuda launch(stream) fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemsetD8Async_ptsz(dst: CUdeviceptr, v: u8, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemsetD16Async_ptsz(dst: CUdeviceptr, v: u16, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemsetD32Async_ptsz(dst: CUdeviceptr, v: c_uint, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize,
        stream: CUstream);
    Cuda launch(stream) fn cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize,
        stream: CUstream);
    Cuda launch(stream) fn cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, h: usize,
        stream: CUstream);
    Cuda launch(stream) fn cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize,
        h: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, n: usize,
        stream: CUstream);
    Cuda launch(stream) fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: CUdeviceptr, n: usize,
        stream: CUstream);
    Cuda launch(stream) fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream);
    Cuda launch(stream) fn cuMemcpyDtoDAsync_v2_ptsz(dst: CUdeviceptr, src: CUdeviceptr, n: usize,
        stream: CUstream);
    Cuda launch(stream) fn cuMemcpy2DAsync_v2(copy: *const c_void, stream: CUstream);
    Cuda launch(stream) fn cuMemcpy2DAsync_v2_ptsz(copy: *const c_void, stream: CUstream);
    Cuda launch(stream) fn cuMemcpy3DAsync_v2(copy: *const c_void, stream: CUstream);
    Cuda launch(stream) fn cuMemcpy3DAsync_v2_ptsz(copy: *const c_void, stream: CUstream);
    // Synchronous ones run on the default stream (`_ptds`: the per-thread one) and return when done.
    Cuda launch(std::ptr::null_mut()) fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, v: u8, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, v: c_uint, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    Cuda launch(std::ptr::null_mut()) fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize);

    // ---- streams: the ones a context synchronize waits for (`streams`) ---------------------------
    Cuda policy fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) => streams::create;
    Cuda policy fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int)
        => streams::create_with_priority;
    Cuda policy fn cuGreenCtxStreamCreate(stream: *mut CUstream, green: CUgreenCtx, flags: c_uint, priority: c_int)
        => streams::green_create;
    Cuda policy fn cuStreamDestroy(stream: CUstream) => streams::destroy;
    Cuda policy fn cuStreamDestroy_v2(stream: CUstream) => streams::destroy;
    Cuda policy fn cuStreamWaitValue32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) => streams::wait_value32;
    Cuda policy fn cuStreamWaitValue32_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint)
        => streams::wait_value32;
    Cuda policy fn cuStreamWaitValue32_v2(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint)
        => streams::wait_value32;
    Cuda policy fn cuStreamWaitValue64(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint)
        => streams::wait_value64;
    Cuda policy fn cuStreamWaitValue64_ptsz(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint)
        => streams::wait_value64;
    Cuda policy fn cuStreamWaitValue64_v2(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint)
        => streams::wait_value64;
    Cuda policy fn cuStreamBatchMemOp(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint) => streams::batch_mem_op;
    Cuda policy fn cuStreamBatchMemOp_ptsz(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint)
        => streams::batch_mem_op;
    Cuda policy fn cuStreamBatchMemOp_v2(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint)
        => streams::batch_mem_op;

    // ---- synchronization ----------------------------------------------------------------------
    Cuda sync(linger::Awaited::Stream(stream, false)) fn cuStreamSynchronize(stream: CUstream);
    Cuda sync(linger::Awaited::Stream(stream, true)) fn cuStreamSynchronize_ptsz(stream: CUstream);
    Cuda sync(linger::Awaited::Context(std::ptr::null_mut())) fn cuCtxSynchronize();
    Cuda sync(linger::Awaited::Context(ctx)) fn cuCtxSynchronize_v2(ctx: CUcontext);
    Cuda sync(linger::Awaited::Event(event)) fn cuEventSynchronize(event: CUevent);

    // ---- NVML (nvidia-smi and monitoring inside the container see the virtual GPU) --------------
    Nvml policy fn nvmlDeviceGetMemoryInfo(dev: nvmlDevice_t, mem: *mut nvmlMemory_t) => nvml::memory_info;
    Nvml policy fn nvmlDeviceGetMemoryInfo_v2(dev: nvmlDevice_t, mem: *mut nvmlMemory_v2_t)
        => nvml::memory_info;
    Nvml policy fn nvmlDeviceGetComputeRunningProcesses(dev: nvmlDevice_t, count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v1_t) => nvml::compute_processes_v1;
    Nvml policy fn nvmlDeviceGetComputeRunningProcesses_v2(dev: nvmlDevice_t, count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t) => nvml::compute_processes;
    Nvml policy fn nvmlDeviceGetComputeRunningProcesses_v3(dev: nvmlDevice_t, count: *mut c_uint,
        infos: *mut nvmlProcessInfo_t) => nvml::compute_processes;
}
called {
    Cuda call fn cuDeviceGetCount(count: *mut c_int);
    Cuda call fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    Cuda call fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice);
    Cuda call fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
    Cuda call fn cuDeviceGetAttribute(value: *mut c_int, attr: CUdevice_attribute, dev: CUdevice);
    Cuda call fn cuCtxGetDevice(dev: *mut CUdevice);
    Cuda call fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext);
    Cuda call fn cuCtxGetCurrent(pctx: *mut CUcontext);
    Cuda call fn cuCtxGetFlags(flags: *mut c_uint);
    Cuda call fn cuCtxPushCurrent_v2(ctx: CUcontext);
    Cuda call fn cuCtxPopCurrent_v2(pctx: *mut CUcontext);
    Cuda call fn cuCtxFromGreenCtx(pctx: *mut CUcontext, green: CUgreenCtx);
    Cuda call fn cuStreamGetDevice(stream: CUstream, dev: *mut CUdevice);
    Cuda call fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext);
    Cuda call fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int);
    Cuda call fn cuStreamQuery(stream: CUstream);
    Cuda call fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int);
    Cuda call fn cuEventCreate(event: *mut CUevent, flags: c_uint);
    Cuda call fn cuEventRecord(event: CUevent, stream: CUstream);
    Cuda call fn cuEventQuery(event: CUevent);
    Cuda call fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
    Cuda call fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint);
    Cuda call fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint);
    Cuda call fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char);
    Cuda call fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent);
    Cuda call fn cuMemAdvise_v2(ptr: CUdeviceptr, count: usize, advice: CUmem_advise, location: CUmemLocation);
    Cuda call fn cuMemAdvise(ptr: CUdeviceptr, count: usize, advice: CUmem_advise, dev: CUdevice);
    Cuda call fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, value: *mut c_void);
    Cuda call fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void);
    Nvml call fn nvmlInit_v2();
    Nvml call fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut nvmlDevice_t);
    Nvml call fn nvmlDeviceGetUUID(dev: nvmlDevice_t, uuid: *mut c_char, length: c_uint);
    Nvml call fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut c_uint);
    Nvml call fn nvmlDeviceGetUtilizationRates(dev: nvmlDevice_t, util: *mut nvmlUtilization_t);
    Nvml call fn nvmlDeviceGetSamples(dev: nvmlDevice_t, kind: c_int, since_us: u64, value_type: *mut c_int,
        count: *mut c_uint, samples: *mut nvmlSample_t);
    Nvml call fn nvmlDeviceGetProcessUtilization(dev: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t,
        count: *mut c_uint, since_us: u64);
}
    } };
}
pub(crate) use entries;

macro_rules! slots {
    ( hooked { $( $lib:ident $mode:ident $( ( $($extra:tt)* ) )?
                  fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) $( => $policy:path )? ; )* }
      called { $( $clib:ident call fn $cname:ident ( $( $carg:ident : $cty:ty ),* $(,)? ) ; )* } ) => {
        /// C signatures, as function-pointer types (every CUDA / NVML function returns an `int`).
        #[allow(non_camel_case_types, dead_code)]
        pub mod sig {
            #[allow(unused_imports)]
            use super::*;
            $( pub type $name = unsafe extern "C" fn( $($ty),* ) -> i32; )*
            $( pub type $cname = unsafe extern "C" fn( $($cty),* ) -> i32; )*
        }

        /// The real functions, resolved lazily on our own library handles.
        #[allow(non_upper_case_globals, dead_code)]
        pub mod real {
            use $crate::real::{Lib, Slot};
            $( slots!(@slot $lib $name); )*
            $( slots!(@slot $clib $cname); )*
        }
    };
    (@slot $lib:ident $name:ident) => {
        // SAFETY: `sig::$name` is this symbol's signature (the list above; ci/check-abi.py).
        pub static $name: Slot<super::sig::$name> = unsafe {
            Slot::new(
                Lib::$lib,
                match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("bad entry name"),
                },
            )
        };
    };
}

entries!(slots);
