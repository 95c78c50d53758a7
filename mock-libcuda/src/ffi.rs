//! Driver API types and constants, checked against CUDA 12.6 `cuda.h` / `cudaTypedefs.h`.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::c_void;

pub type CUresult = u32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;
pub type Handle = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_OPERATING_SYSTEM: CUresult = 304;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// (code, name, description) for cuGetErrorName / cuGetErrorString. NUL-terminated for C.
pub const ERRORS: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
    (100, "CUDA_ERROR_NO_DEVICE\0", "no CUDA-capable device is detected\0"),
    (101, "CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
    (200, "CUDA_ERROR_INVALID_IMAGE\0", "device kernel image is invalid\0"),
    (201, "CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
    (218, "CUDA_ERROR_INVALID_PTX\0", "a PTX JIT compilation failed\0"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND\0", "file not found\0"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM\0", "OS call failed or operation not supported on this OS\0"),
    (400, "CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
    (401, "CUDA_ERROR_ILLEGAL_STATE\0", "the operation cannot be performed in the present state\0"),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS\0", "an illegal memory access was encountered\0"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0", "too many resources requested for launch\0"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT\0", "the launch timed out and was terminated\0"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE\0", "primary context active\0"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED\0", "context is destroyed\0"),
    (719, "CUDA_ERROR_LAUNCH_FAILED\0", "unspecified launch failure\0"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE\0", "too many blocks in cooperative launch\0"),
    (800, "CUDA_ERROR_NOT_PERMITTED\0", "operation not permitted\0"),
    (801, "CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0", "operation not permitted when stream is capturing\0"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0", "operation failed due to a previous error during capture\0"),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

// cuGetProcAddress flags and status (CUdriverProcAddress_flags, CUdriverProcAddressQueryResult).
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// Special stream handles: 0 and CU_STREAM_LEGACY are the legacy default stream,
/// CU_STREAM_PER_THREAD the per-thread one.
pub const CU_STREAM_LEGACY: u64 = 1;
pub const CU_STREAM_PER_THREAD: u64 = 2;

pub const CU_EVENT_DISABLE_TIMING: u32 = 2;
pub const CU_MEM_ATTACH_GLOBAL: u32 = 1;
pub const CU_MEM_ATTACH_HOST: u32 = 2;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: u32 = 1;
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

// CUmemPool_attribute
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: u32 = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: u32 = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: u32 = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: u32 = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: u32 = 8;

// cuLaunchKernel `extra` markers (CU_LAUNCH_PARAM_*).
pub const CU_LAUNCH_PARAM_END: usize = 0;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

#[repr(C)]
pub struct CUlaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub h_stream: Handle,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}

/// CUDA_KERNEL_NODE_PARAMS_v1; v2 appends `kern` and `ctx`.
#[repr(C)]
pub struct CudaKernelNodeParams {
    pub func: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

#[repr(C)]
pub struct CudaKernelNodeParamsV2 {
    pub v1: CudaKernelNodeParams,
    pub kern: Handle,
    pub ctx: Handle,
}

#[repr(C)]
pub struct CUmemLocation {
    pub type_: u32,
    pub id: i32,
}

/// Leading fields of CUmemAllocationProp and CUmemPoolProps (allocation type, handle types,
/// location); the rest is not read.
#[repr(C)]
pub struct AllocPropHead {
    pub type_: u32,
    pub handle_types: u32,
    pub location: CUmemLocation,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1): pool properties (88 bytes), access descriptors, size, out pointer.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: AllocPropHead,
    pub _props_rest: [u8; 72],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUdevResource` (12.4 layout, 144 bytes) holding an SM resource.
#[repr(C)]
pub struct DevResource {
    pub type_: u32,
    pub pad: [u8; 92],
    pub sm_count: u32,
    pub rest: [u8; 44],
}
pub const CU_DEV_RESOURCE_TYPE_SM: u32 = 1;
pub const CU_GREEN_CTX_DEFAULT_STREAM: u32 = 1;

#[repr(C)]
pub struct CudaArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: u32,
}

#[repr(C)]
pub struct CudaArray3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

/// Bytes per channel of a CUarray_format (unknown formats count 4).
pub fn format_bytes(f: u32) -> u64 {
    match f {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

/// cuDeviceGetAttribute values of the simulated device (H100-like); `None` = not a known attribute.
pub fn device_attribute(attr: i32, sms: u32, clock_khz: u32, cc: (u32, u32), pci_bus: u32) -> Option<i32> {
    Some(match attr {
        1..=3 => 1024,
        4 => 64,
        5 => i32::MAX,
        6 | 7 => 65535,
        8 => 49152,
        9 => 65536,
        10 => 32,
        11 => i32::MAX,
        12 => 65536,
        13 => clock_khz as i32,
        14 | 30 => 512,
        15 | 19 | 31 | 32 | 41 => 1,
        16 => sms as i32,
        33 => pci_bus as i32,
        36 => 2_619_000,
        37 => 5120,
        38 => 50 << 20,
        39 => 2048,
        40 => 2,
        51 => 32,
        75 => cc.0 as i32,
        76 => cc.1 as i32,
        78 | 79 | 80 | 83 | 89 | 90 | 95 | 99 | 102 | 103 | 112 | 115 | 120 | 124 | 125 | 127 | 129 => 1,
        81 => 233_472,
        82 => 65536,
        87 => 2,
        97 => 232_448,
        106 => 32,
        119 => 1,
        126 => 4,
        131 | 134 => -1,
        // Known attributes not modeled above read as 0 (unsupported feature); CUDA 13 adds a few.
        a if (1..200).contains(&a) => 0,
        _ => return None,
    })
}
