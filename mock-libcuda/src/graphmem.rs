//! Memory the driver holds beyond plain allocations: graph memory nodes (the per-device graph
//! memory pool), green contexts, and references taken on VMM handles.
//!
//! Graph memory, as CUDA documents it: a graph's alloc nodes (`cuGraphAddMemAllocNode`, or
//! `cuMemAllocAsync` captured into a graph) get physical memory when an executable graph is first
//! launched, from the device's graph memory pool; the executable keeps it while it lives; a
//! destroyed executable's memory stays reserved in the pool (reused by later launches) until
//! `cuDeviceGraphMemTrim`. `cuDeviceGetGraphMemAttribute` reports used / reserved.

use crate::driver::{charge_size, round_up, Proc, R, MIB2};
use crate::ffi::*;
use mock_gpu::GpuState;

/// Alloc nodes of one graph: (device, bytes) each.
#[derive(Default, Clone)]
pub struct GraphMem {
    pub nodes: Vec<(usize, u64)>,
}

/// An executable graph's memory: per device bytes, and whether its first launch backed them.
#[derive(Default, Clone)]
pub struct ExecMem {
    pub nodes: Vec<(usize, u64)>,
    pub backed: bool,
}

/// The device's graph memory pool: reserved (charged) and, of that, idle (no live executable).
#[derive(Default, Clone, Copy)]
pub struct GraphPool {
    pub reserved: u64,
    pub idle: u64,
    pub reserved_high: u64,
    pub used_high: u64,
}

pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: u32 = 0;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: u32 = 1;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: u32 = 2;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: u32 = 3;

impl Proc {
    /// A graph allocation of `size` bytes on device `d` in graph `g` (an alloc node): returns
    /// its address (valid for the graph's lifetime; no memory until a launch).
    pub fn graph_alloc(&mut self, g: u64, d: usize, size: u64) -> R<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = round_up(charge_size(size), MIB2);
        let ptr = self.reserve(bytes, MIB2)?;
        self.graph_ptrs.insert(ptr, size);
        self.graph_mem.entry(g).or_default().nodes.push((d, bytes));
        Ok(ptr)
    }

    /// Whether `ptr` was handed out by a graph allocation.
    pub fn is_graph_ptr(&self, ptr: u64) -> bool {
        self.graph_ptrs.contains_key(&ptr)
    }

    pub fn instantiate_mem(&mut self, g: u64, x: u64) {
        if let Some(m) = self.graph_mem.get(&g) {
            let nodes = m.nodes.clone();
            self.exec_mem.insert(x, ExecMem { nodes, backed: false });
        }
    }

    /// First launch of an executable with alloc nodes: take its memory from the device's graph
    /// pool (idle memory first, then new memory: `CUDA_ERROR_OUT_OF_MEMORY` if the device is full).
    pub fn back_exec(&mut self, st: &GpuState, x: u64) -> R<()> {
        let Some(m) = self.exec_mem.get(&x).filter(|m| !m.backed).cloned() else { return Ok(()) };
        let mut charged: Vec<(usize, u64)> = Vec::new();
        for &(d, bytes) in &m.nodes {
            let pool = self.graph_pool[d];
            let from_idle = pool.idle.min(bytes);
            let new = bytes - from_idle;
            if new > 0 && !st.try_charge(d, new) {
                for (d, b) in charged {
                    st.uncharge(d, b);
                    self.graph_pool[d].reserved -= b;
                }
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            charged.push((d, new));
            let p = &mut self.graph_pool[d];
            p.idle -= from_idle;
            p.reserved += new;
            p.reserved_high = p.reserved_high.max(p.reserved);
            p.used_high = p.used_high.max(p.reserved - p.idle);
        }
        if let Some(m) = self.exec_mem.get_mut(&x) {
            m.backed = true;
        }
        Ok(())
    }

    /// An executable graph goes: its memory stays reserved in the pool, idle.
    pub fn exec_mem_destroyed(&mut self, x: u64) {
        if let Some(m) = self.exec_mem.remove(&x).filter(|m| m.backed) {
            for (d, bytes) in m.nodes {
                self.graph_pool[d].idle += bytes;
            }
        }
    }

    /// `cuDeviceGraphMemTrim`: give the idle part of device `d`'s graph pool back.
    pub fn graph_mem_trim(&mut self, st: &GpuState, d: usize) {
        let p = &mut self.graph_pool[d];
        st.uncharge(d, p.idle);
        p.reserved -= p.idle;
        p.idle = 0;
    }

    pub fn graph_mem_attr(&self, d: usize, attr: u32) -> R<u64> {
        let p = &self.graph_pool[d];
        Ok(match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => p.reserved - p.idle,
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => p.used_high,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => p.reserved,
            CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => p.reserved_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, with one more reference.
    pub fn retain_handle(&mut self, addr: u64) -> R<u64> {
        let (&b, m) = self.maps.range(..=addr).next_back().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if addr >= b + m.size {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let hd = m.handle;
        self.phys.get_mut(&hd).ok_or(CUDA_ERROR_INVALID_VALUE)?.retains += 1;
        Ok(hd)
    }

    /// `cuMemRelease`: drop one reference (a retained one first); freed once released and unmapped.
    pub fn release_handle(&mut self, st: &GpuState, hd: u64) -> R<()> {
        let ph = self.phys.get_mut(&hd).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ph.retains > 0 {
            ph.retains -= 1;
        } else if ph.released {
            return Err(CUDA_ERROR_INVALID_VALUE);
        } else {
            ph.released = true;
        }
        self.drop_phys_if_done(st, hd);
        Ok(())
    }
}
