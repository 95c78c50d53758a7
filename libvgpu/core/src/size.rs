//! Size strings of the HAMi env contract (`CUDA_DEVICE_MEMORY_LIMIT=3000m`, `VGPU_CONTEXT_RESERVE`).
//!
//! Grammar (surrounding ASCII whitespace is ignored, nothing else is):
//! ```text
//! size    := number [unit] | number '%'
//! number  := digits [ '.' digits ]          (no sign, no exponent, no hex, no '_')
//! unit    := ('k'|'m'|'g'|'t') ['b'|'ib']  |  'b'      (any case, powers of 1024)
//! ```
//! * `2GB` = `2gib` = `2g` = 2 GiB (HAMi's reference hook silently read `2GB` as 2 bytes).
//! * `1.5g` = 1.5 GiB exactly; a fraction of a unit is floored to whole bytes (`0.1k` = 102).
//! * A bare number is bytes and must be an integer (`1.5` and `1.5b` are rejected).
//! * `N%` (0 < N <= 100, decimal allowed) is a share of the physical device, see [`SizeSpec::resolve`].
//! * Rejected: empty/blank, signs (`-1`, `+1`, `--1`), `1e9`, `0x10`, `12x`, `1 g` (inner space),
//!   `.5g`/`5.g` (a digit on each side of the dot), anything above `u64::MAX` bytes.

use std::fmt;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// A parsed size: absolute bytes or a percentage of the physical device memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeSpec {
    Bytes(u64),
    /// In (0, 100].
    Percent(f64),
}

impl SizeSpec {
    /// Bytes this spec means on a device with `physical` bytes (percent is floored).
    pub fn resolve(&self, physical: u64) -> u64 {
        match *self {
            SizeSpec::Bytes(b) => b,
            SizeSpec::Percent(p) => {
                // u128 on a scaled integer percentage avoids f64 rounding on large devices.
                let milli = (p * 1000.0).floor().clamp(0.0, 100_000.0) as u128;
                (physical as u128 * milli / 100_000) as u64
            }
        }
    }
}

/// Why a size string was rejected; `Display` names the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError {
    pub value: String,
    pub reason: &'static str,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid size {:?}: {}", self.value, self.reason)
    }
}

impl std::error::Error for SizeError {}

/// Parse a size string (grammar in the module docs).
pub fn parse_size(input: &str) -> Result<SizeSpec, SizeError> {
    let err = |reason| SizeError { value: input.to_string(), reason };
    let s = input.trim_matches(|c: char| c.is_ascii_whitespace());
    if s.is_empty() {
        return Err(err("empty"));
    }
    let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_end);
    if num.is_empty() {
        return Err(err("expected a non-negative number (no sign, no hex)"));
    }
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => {
            if i.is_empty() || f.is_empty() || f.contains('.') {
                return Err(err("malformed decimal number"));
            }
            (i, f)
        }
        None => (num, ""),
    };
    if frac_part.len() > 18 {
        return Err(err("too many decimal digits"));
    }
    let lower = suffix.to_ascii_lowercase();
    if lower == "%" {
        let p: f64 = num.parse().map_err(|_| err("malformed percentage"))?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(err("percentage must be in (0, 100]"));
        }
        return Ok(SizeSpec::Percent(p));
    }
    let mult = match lower.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        _ => return Err(err("unknown unit (use k, m, g, t with optional b/ib, or %)")),
    };
    if mult == 1 && !frac_part.is_empty() {
        return Err(err("fractional bytes"));
    }
    // mantissa = all digits as one integer; value = mantissa * mult / 10^frac_len (floored).
    let digits: String = int_part.chars().chain(frac_part.chars()).collect();
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return Err(err("too large"));
    }
    let mantissa: u128 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| err("too large"))? };
    let scaled = mantissa.checked_mul(mult as u128).ok_or_else(|| err("too large"))?;
    let bytes = scaled / 10u128.pow(frac_part.len() as u32);
    u64::try_from(bytes).map(SizeSpec::Bytes).map_err(|_| err("too large (above 2^64-1 bytes)"))
}

/// Exact, human-readable rendering that [`parse_size`] reads back to the same value:
/// the largest unit (TiB, GiB, MiB, KiB) in which the value has at most two decimals, else bytes.
/// Examples: `4GiB`, `1.5GiB`, `512MiB`, `1000B`.
pub fn format_size(bytes: u64) -> String {
    for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes < unit {
            continue;
        }
        for decimals in 0..=2u32 {
            let scale = 10u128.pow(decimals);
            let v = bytes as u128 * scale;
            if v.is_multiple_of(unit as u128) {
                let q = v / unit as u128;
                if decimals == 0 {
                    return format!("{q}{name}");
                }
                let (i, f) = (q / scale, q % scale);
                let f = format!("{:0width$}", f, width = decimals as usize);
                return format!("{i}.{}{name}", f.trim_end_matches('0'));
            }
        }
    }
    format!("{bytes}B")
}

/// Approximate rendering for tables (`3.41GiB`, `12.0MiB`); not guaranteed to parse back exactly.
pub fn format_size_approx(bytes: u64) -> String {
    for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes >= unit {
            return format!("{:.2}{name}", bytes as f64 / unit as f64);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    #[rstest]
    #[case("0", 0)]
    #[case("1", 1)]
    #[case("4096", 4096)]
    #[case("  3000m\n", 3000 * MIB)]
    #[case("3000M", 3000 * MIB)]
    #[case("2GB", 2 * GIB)]
    #[case("2gib", 2 * GIB)]
    #[case("2GiB", 2 * GIB)]
    #[case("2g", 2 * GIB)]
    #[case("1.5g", GIB + GIB / 2)]
    #[case("0.5m", MIB / 2)]
    #[case("0.1k", 102)]
    #[case("7k", 7 * KIB)]
    #[case("7KB", 7 * KIB)]
    #[case("1t", TIB)]
    #[case("10b", 10)]
    #[case("10B", 10)]
    #[case("007m", 7 * MIB)]
    #[case("16777215t", 16777215 * TIB)]
    #[case("18446744073709551615", u64::MAX)]
    fn parses_bytes(#[case] s: &str, #[case] want: u64) {
        assert_eq!(parse_size(s), Ok(SizeSpec::Bytes(want)), "{s}");
    }

    #[rstest]
    #[case("50%", 50.0)]
    #[case("100%", 100.0)]
    #[case("12.5%", 12.5)]
    fn parses_percent(#[case] s: &str, #[case] want: f64) {
        assert_eq!(parse_size(s), Ok(SizeSpec::Percent(want)));
    }

    #[rstest]
    #[case("")]
    #[case(" ")]
    #[case("-1")]
    #[case("--1")]
    #[case("+1")]
    #[case("12x")]
    #[case("1e9")]
    #[case("0x10")]
    #[case("1 g")]
    #[case("1.5")]
    #[case("1.5b")]
    #[case(".5g")]
    #[case("5.g")]
    #[case("1.2.3g")]
    #[case("0%")]
    #[case("101%")]
    #[case("-5%")]
    #[case("%")]
    #[case("g")]
    #[case("1_000")]
    #[case("1gbb")]
    #[case("1ibg")]
    #[case("18446744073709551616")]
    #[case("16777216t")]
    #[case("99999999999999999999999999999999999999999999g")]
    #[case("1.0000000000000000001g")]
    fn rejects(#[case] s: &str) {
        let e = parse_size(s).unwrap_err();
        assert!(e.to_string().contains(&format!("{s:?}")), "{e}");
    }

    #[test]
    fn percent_resolution() {
        assert_eq!(SizeSpec::Percent(50.0).resolve(8 * GIB), 4 * GIB);
        assert_eq!(SizeSpec::Percent(100.0).resolve(u64::MAX), u64::MAX);
        assert_eq!(SizeSpec::Percent(12.5).resolve(80 * GIB), 10 * GIB);
        assert_eq!(SizeSpec::Bytes(5).resolve(0), 5);
    }

    #[rstest]
    #[case(0, "0B")]
    #[case(1000, "1000B")]
    #[case(4 * GIB, "4GiB")]
    #[case(GIB + GIB / 2, "1.5GiB")]
    #[case(512 * MIB, "512MiB")]
    #[case(3000 * MIB, "3000MiB")] // 2.9296875GiB: not exact with two decimals
    fn formats(#[case] b: u64, #[case] want: &str) {
        assert_eq!(format_size(b), want);
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn never_panics_on_near_grammar(s in "[0-9.%kmgtibKMGTIB +-]{0,24}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn format_roundtrips(b in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(b)), Ok(SizeSpec::Bytes(b)));
        }

        #[test]
        fn format_roundtrips_round_values(n in 0u64..100_000, unit in prop::sample::select(vec![1, KIB, MIB, GIB])) {
            let b = n * unit;
            prop_assert_eq!(parse_size(&format_size(b)), Ok(SizeSpec::Bytes(b)));
        }

        #[test]
        fn monotonic(a in 0u64..1_000_000, b in 0u64..1_000_000, fa in 0u32..100, fb in 0u32..100,
                     u in prop::sample::select(vec!["", "k", "m", "g", "t"])) {
            let fmt = |i: u64, f: u32| if u.is_empty() { format!("{i}") } else { format!("{i}.{f:02}{u}") };
            let (x, y) = ((a, fa), (b, fb));
            let (lo, hi) = if x <= y { (x, y) } else { (y, x) };
            let pl = parse_size(&fmt(lo.0, lo.1)).unwrap();
            let ph = parse_size(&fmt(hi.0, hi.1)).unwrap();
            match (pl, ph) {
                (SizeSpec::Bytes(l), SizeSpec::Bytes(h)) => prop_assert!(l <= h),
                _ => prop_assert!(false),
            }
        }
    }
}
