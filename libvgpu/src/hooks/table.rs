//! The hook layer's expansion of the one list (`sys::entries!`): every hooked entry becomes an
//! exported shim calling its policy; `HOOKS` and `index_of` serve `dlsym` and `cuGetProcAddress`.

#![allow(clippy::too_many_arguments)]

#[allow(unused_imports)]
use crate::ffi::*;
use crate::{context, linger, memory, meminfo, nvml, physmem, streams};
#[allow(unused_imports)]
use std::ffi::{c_char, c_int, c_uint, c_void};

use super::procaddr;

crate::sys::entries!(hooks);
