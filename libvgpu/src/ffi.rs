//! C types and constants of the CUDA driver API (`cuda.h`, CUDA 13.0) and NVML (`nvml.h`) that the
//! hooks touch. Every item was checked against the 13.0 headers; only what is used is declared.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult` and `nvmlReturn_t` are both C enums (`int`).
pub type CUresult = c_int;
pub type nvmlReturn_t = c_int;

pub type CUdevice = c_int;
/// `CUdeviceptr_v2` (`unsigned long long`).
pub type CUdeviceptr = u64;
/// `CUdeviceptr_v1` (`unsigned int`): the pre-3.2 32-bit ABI still exported as `cuMemAlloc` etc.
pub type CUdeviceptr_v1 = c_uint;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgreenCtx = *mut c_void;
pub type CUdevResourceDesc = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type cuuint64_t = u64;
pub type CUarray_format = c_int;
pub type CUmem_advise = c_int;
pub type CUdevice_attribute = c_int;
pub type CUdriverProcAddressQueryResult = c_int;
pub type nvmlDevice_t = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// The special stream handles (cuda.h's CU_STREAM_LEGACY / CU_STREAM_PER_THREAD).
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
/// `nvmlSamplingType_t`: the device's GPU utilization samples.
pub const NVML_GPU_UTILIZATION_SAMPLES: c_int = 1;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`.
pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: CUdevice_attribute = 89;
/// `CU_MEM_ATTACH_GLOBAL`.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
/// `CU_MEM_ADVISE_SET_PREFERRED_LOCATION`.
pub const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: CUmem_advise = 3;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED` (device memory for `cuMemCreate`).
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1): `CUmemPoolProps` (88 bytes; it starts like
/// `CUmemAllocationProp`), access descriptors, size, and the address the driver returns.
#[repr(C)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub pool_props: CUmemPoolPropsHead,
    pub _pool_props_rest: [u8; 72],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// The leading fields of `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolPropsHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
}
/// `CUDA_ARRAY3D_CUBEMAP` flag.
pub const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;
/// `CUDA_ARRAY3D_LAYERED` flag.
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocation` (passed by value to `cuMemAdvise_v2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp` (`CUmemAllocationProp_v1`).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`: size_t extents).
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub format: CUarray_format,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: CUarray_format,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (unsigned int extents; the unversioned `cuArrayCreate`).
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub width: c_uint,
    pub height: c_uint,
    pub format: CUarray_format,
    pub num_channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (the unversioned `cuArray3DCreate`).
#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub width: c_uint,
    pub height: c_uint,
    pub depth: c_uint,
    pub format: CUarray_format,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUlaunchConfig` (only `hStream` is read).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `CUDA_LAUNCH_PARAMS` (`cuLaunchCooperativeKernelMultiDevice`).
#[repr(C)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub grid_dim_x: c_uint,
    pub grid_dim_y: c_uint,
    pub grid_dim_z: c_uint,
    pub block_dim_x: c_uint,
    pub block_dim_y: c_uint,
    pub block_dim_z: c_uint,
    pub shared_mem_bytes: c_uint,
    pub h_stream: CUstream,
    pub kernel_params: *mut *mut c_void,
}

/// Opaque `CUctxCreateParams` / `CUexecAffinityParam`: only passed through.
pub type CUctxCreateParams = c_void;
pub type CUexecAffinityParam = c_void;

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t` == `nvmlProcessInfo_t` (used by `_v2` and `_v3`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlSample_t`: a timestamp (CLOCK_REALTIME microseconds) and the raw 8 bytes of its
/// `nvmlValue_t` union (which member: the call's `nvmlValueType_t`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlSample_t {
    pub time_stamp: u64,
    pub sample_value: u64,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;

pub type c_str = *const c_char;

const _: () = assert!(std::mem::size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<CUDA_ARRAY3D_DESCRIPTOR>() == 40);
const _: () = assert!(std::mem::size_of::<CUDA_ARRAY_DESCRIPTOR>() == 24);
const _: () = assert!(std::mem::size_of::<CUlaunchConfig>() == 56);
const _: () = assert!(std::mem::size_of::<nvmlMemory_v2_t>() == 40);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_t>() == 24);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_v1_t>() == 16);
