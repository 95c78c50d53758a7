//! Storage the device holds for a CUDA array (every format, block compression, layers, cubemap
//! faces, mip levels) and for a pitched allocation, so an allocation is charged before the
//! driver call makes it.

/// `CUarray_format` (an `int` in `cuda.h`).
pub type ArrayFormat = i32;
/// `CUDA_ARRAY3D_LAYERED` (`ci/check-abi.py` checks the cdylib's copy against `cuda.h`; the
/// cdylib asserts that it equals this one).
pub const ARRAY3D_LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`.
pub const ARRAY3D_CUBEMAP: u32 = 0x04;
/// Bits per texel charged for a format we do not know: the widest known format (16 bytes), rather
/// than nothing.
pub const UNKNOWN_TEXEL_BITS: u64 = 128;
/// The row pitch the driver picks is at most the width rounded up to this.
pub const PITCH_ALIGN: u64 = 512;

/// Storage of one texel of `format` with `channels` channels, in bits; for block-compressed
/// formats the per-texel share of a 4x4 block. `None` for formats we do not know.
pub fn texel_bits(format: ArrayFormat, channels: u32) -> Option<u64> {
    let ch = channels.max(1) as u64;
    Some(match format {
        0x01 | 0x08 => 8 * ch,             // (un)signed int8
        0x02 | 0x09 | 0x10 => 16 * ch,     // (un)signed int16, half
        0x03 | 0x0a | 0x20 => 32 * ch,     // (un)signed int32, float
        0xc0 | 0xc6 => 8,                  // unorm/snorm int8 x1
        0xc1 | 0xc7 | 0xc3 | 0xc9 => 16,   // int8 x2, int16 x1
        0xc2 | 0xc8 | 0xc4 | 0xca => 32,   // int8 x4, int16 x2
        0xc5 | 0xcb => 64,                 // int16 x4
        0x91 | 0x92 | 0x97 | 0x98 => 4,    // BC1, BC4: 8 bytes per 16 texels
        0x93..=0x96 | 0x99..=0x9e => 8,    // BC2, BC3, BC5, BC6H, BC7: 16 bytes per 16 texels
        0xb0 => 12,                        // NV12: 8-bit 4:2:0
        0x9f | 0xa1 => 24,                 // P010, P016: 16-bit 4:2:0
        0xa2 | 0xa5 => 16,                 // NV16, YUY2: 8-bit 4:2:2
        0xa3 | 0xa4 | 0xa6 | 0xa7 => 32,   // P210, P216, Y210, Y216: 16-bit 4:2:2
        0xa8 | 0xa9 | 0x50 => 32,          // AYUV, Y410, 10-10-10-2
        0xb1 => 64,                        // Y416
        0xb2 | 0xb4 => 24,                 // 8-bit 4:4:4 planar / semi-planar
        0xb3 | 0xb5 => 48,                 // 10/16-bit 4:4:4
        _ => return None,
    })
}

fn is_block_compressed(format: ArrayFormat) -> bool {
    matches!(format, 0x91..=0x9e)
}

/// Bytes of one array level of `w x h x d` texels (0 extents count as 1); saturates at `u64::MAX`.
pub fn level_bytes(format: ArrayFormat, channels: u32, w: u64, h: u64, d: u64) -> u64 {
    let (mut w, mut h) = (w.max(1), h.max(1));
    if is_block_compressed(format) {
        w = w.div_ceil(4) * 4;
        h = h.div_ceil(4) * 4;
    }
    let bits = texel_bits(format, channels).unwrap_or(UNKNOWN_TEXEL_BITS) as u128;
    let total = w as u128 * h as u128 * d.max(1) as u128 * bits;
    u64::try_from(total.div_ceil(8)).unwrap_or(u64::MAX)
}

/// Bytes of a CUDA array (layers and cubemap faces are in `depth`, as the API defines them).
pub fn array_bytes(format: ArrayFormat, channels: u32, w: u64, h: u64, d: u64) -> u64 {
    level_bytes(format, channels, w, h, d)
}

/// Bytes of a mipmapped array: the sum over `levels` levels (1..=64), each halving width/height
/// (and depth for true 3D arrays; layered and cubemap arrays keep their layer/face count).
pub fn mipmapped_bytes(format: ArrayFormat, channels: u32, w: u64, h: u64, d: u64, flags: u32, levels: u32) -> u64 {
    let keep_depth = flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
    let mut sum: u64 = 0;
    for l in 0..levels.clamp(1, 64) {
        let shrink = |x: u64| if x == 0 { 0 } else { (x >> l).max(1) };
        let dl = if keep_depth { d } else { shrink(d) };
        sum = sum.saturating_add(level_bytes(format, channels, shrink(w), shrink(h), dl));
        if (w >> l) <= 1 && (h >> l) <= 1 && (keep_depth || (d >> l) <= 1) {
            break;
        }
    }
    sum
}

/// Upper estimate of the pitch the driver picks for a row of `width` bytes.
pub fn pitch_estimate(width: u64) -> u64 {
    width.div_ceil(PITCH_ALIGN).saturating_mul(PITCH_ALIGN)
}

/// How a pitched allocation's reservation moves from the estimate to the driver's real size
/// (both already rounded by `ledger::accounted_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The estimate was exact.
    Keep,
    /// The real size is larger: reserve this much more (refused over the cap: free it, OOM).
    ReserveMore(u64),
    /// The real size is smaller: give this much back.
    GiveBack(u64),
}

pub fn settle_pitch(estimate: u64, actual: u64) -> Settle {
    use std::cmp::Ordering::*;
    match actual.cmp(&estimate) {
        Equal => Settle::Keep,
        Greater => Settle::ReserveMore(actual - estimate),
        Less => Settle::GiveBack(estimate - actual),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn basic_formats() {
        assert_eq!(array_bytes(0x01, 1, 1024, 1024, 1), MIB); // uint8
        assert_eq!(array_bytes(0x20, 4, 1024, 256, 1), 4 * MIB); // float4
        assert_eq!(array_bytes(0x10, 2, 1024, 1024, 2), 8 * MIB); // half2, depth 2
        assert_eq!(array_bytes(0x03, 1, 100, 0, 0), 400); // 1D: zero extents count as 1
    }

    #[test]
    fn packed_and_compressed() {
        assert_eq!(array_bytes(0xc2, 4, 256, 256, 1), 256 * 256 * 4); // unorm int8x4 ignores channels
        assert_eq!(array_bytes(0x91, 4, 256, 256, 1), 256 * 256 / 2); // BC1: half a byte per texel
        assert_eq!(array_bytes(0x91, 4, 5, 5, 1), 8 * 8 / 2); // BC rounds to 4x4 blocks
        assert_eq!(array_bytes(0x9d, 4, 256, 256, 1), 256 * 256); // BC7: a byte per texel
        assert_eq!(array_bytes(0xb0, 1, 1920, 1080, 1), 1920 * 1080 * 3 / 2); // NV12
    }

    #[test]
    fn unknown_format_is_charged_wide() {
        assert_eq!(array_bytes(0x7777, 1, 10, 10, 1), 100 * 16);
        assert_eq!(array_bytes(-1, 1, 10, 10, 1), 100 * 16);
    }

    #[test]
    fn huge_saturates() {
        assert_eq!(array_bytes(0x20, 4, u32::MAX as u64 * 4, u32::MAX as u64 * 4, u32::MAX as u64), u64::MAX);
    }

    #[test]
    fn mipmaps() {
        // 8x8 uint8, full chain: 64 + 16 + 4 + 1
        assert_eq!(mipmapped_bytes(0x01, 1, 8, 8, 0, 0, 10), 85);
        // 2 levels only
        assert_eq!(mipmapped_bytes(0x01, 1, 8, 8, 0, 0, 2), 80);
        // layered: depth (layers) never shrinks
        assert_eq!(mipmapped_bytes(0x01, 1, 4, 4, 3, ARRAY3D_LAYERED, 3), (16 + 4 + 1) * 3);
        // 3D: depth shrinks too
        assert_eq!(mipmapped_bytes(0x01, 1, 4, 4, 4, 0, 3), 64 + 8 + 1);
        // cubemap: 6 faces kept
        assert_eq!(mipmapped_bytes(0x20, 1, 2, 2, 6, ARRAY3D_CUBEMAP, 2), (4 + 1) * 4 * 6);
        // 0 levels is one level
        assert_eq!(mipmapped_bytes(0x01, 1, 8, 8, 0, 0, 0), 64);
    }

    #[test]
    fn pitch() {
        assert_eq!(pitch_estimate(1), 512);
        assert_eq!(pitch_estimate(512), 512);
        assert_eq!(pitch_estimate(513), 1024);
        assert_eq!(pitch_estimate(0), 0);
        assert_eq!(pitch_estimate(u64::MAX), u64::MAX);
    }

    #[test]
    fn pitch_settles_to_the_real_size() {
        assert_eq!(settle_pitch(1024, 1024), Settle::Keep);
        assert_eq!(settle_pitch(1024, 3072), Settle::ReserveMore(2048));
        assert_eq!(settle_pitch(4096, 1024), Settle::GiveBack(3072));
    }

    fn format() -> impl Strategy<Value = ArrayFormat> {
        prop_oneof![
            prop::sample::select(vec![0x01, 0x02, 0x03, 0x08, 0x09, 0x0a, 0x10, 0x20, 0x50, 0x91, 0x96, 0x9e, 0xa2, 0xb0, 0xb5, 0xc0, 0xcb]),
            any::<i32>(),
        ]
    }

    proptest! {
        #[test]
        fn level_bytes_grow_with_every_extent(f in format(), ch in 0u32..8, w in 0u64..5000, h in 0u64..5000, d in 0u64..64,
                                              dw in 0u64..100, dh in 0u64..100, dd in 0u64..4) {
            let b = level_bytes(f, ch, w, h, d);
            prop_assert!(b > 0);
            prop_assert!(level_bytes(f, ch, w + dw, h, d) >= b);
            prop_assert!(level_bytes(f, ch, w, h + dh, d) >= b);
            prop_assert!(level_bytes(f, ch, w, h, d + dd) >= b);
        }

        #[test]
        fn level_bytes_cover_the_texels(f in format(), ch in 1u32..5, w in 1u64..5000, h in 1u64..5000, d in 1u64..64) {
            // At least the texels times their bits, at most one 4x4 block's rounding more.
            let bits = texel_bits(f, ch).unwrap_or(UNKNOWN_TEXEL_BITS) as u128;
            let exact = (w as u128 * h as u128 * d as u128 * bits).div_ceil(8);
            let b = level_bytes(f, ch, w, h, d) as u128;
            prop_assert!(b >= exact);
            let padded = ((w + 3) as u128 * (h + 3) as u128 * d as u128 * bits).div_ceil(8);
            prop_assert!(b <= padded);
        }

        #[test]
        fn mip_chain_is_between_its_base_and_the_geometric_bound(f in format(), w in 1u64..4096, h in 1u64..4096,
                                                                  levels in 1u32..20) {
            // 2D: level 0 <= chain <= twice level 0 (each level at most half the one before, a
            // 1-texel-high chain halving only its width) plus a byte per level (rounding).
            prop_assume!(!is_block_compressed(f));
            let base = level_bytes(f, 1, w, h, 0);
            let chain = mipmapped_bytes(f, 1, w, h, 0, 0, levels);
            prop_assert!(chain >= base);
            prop_assert!(chain <= 2 * base + levels as u64 * level_bytes(f, 1, 1, 1, 1));
            prop_assert_eq!(mipmapped_bytes(f, 1, w, h, 0, 0, 1), base);
        }

        #[test]
        fn layered_chains_scale_with_layers(w in 1u64..2048, h in 1u64..2048, layers in 1u64..32, levels in 1u32..12) {
            let one = mipmapped_bytes(0x20, 4, w, h, 1, ARRAY3D_LAYERED, levels);
            prop_assert_eq!(mipmapped_bytes(0x20, 4, w, h, layers, ARRAY3D_LAYERED, levels), one * layers);
        }

        #[test]
        fn pitch_estimate_is_the_aligned_width(w in 0u64..(1 << 48)) {
            let p = pitch_estimate(w);
            prop_assert!(p >= w && p < w + PITCH_ALIGN);
            prop_assert_eq!(p % PITCH_ALIGN, 0);
        }

        #[test]
        fn settling_lands_on_the_real_size(est in any::<u32>(), actual in any::<u32>()) {
            let (est, actual) = (est as u64, actual as u64);
            let landed = match settle_pitch(est, actual) {
                Settle::Keep => est,
                Settle::ReserveMore(b) => est + b,
                Settle::GiveBack(b) => est - b,
            };
            prop_assert_eq!(landed, actual);
        }
    }
}
