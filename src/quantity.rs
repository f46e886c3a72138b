//! Kubernetes quantities (`64Mi`, `1G`, `129e6`, `500m`, `1.5`): sizes in bytes, CPU in
//! millicores. Values round up, as the API's `Value()` and `MilliValue()` do, so a limit
//! is never tighter than asked. Errors are sentences for the caller to put in context.
//! Written back in the apiserver's canonical forms ([`decimal_si`], [`binary_si`]), so
//! what the agent reports compares equal to what the server returns.

/// Bytes in a memory quantity such as `64Mi`, `1G`, `128974848`, `129e6` or `123M`.
pub fn parse_bytes(quantity: &str) -> Result<u64, String> {
    parse_scaled(quantity, 0)
}

/// Millicores in a CPU quantity such as `500m`, `1` or `1.5`.
pub fn parse_millicpu(quantity: &str) -> Result<u64, String> {
    parse_scaled(quantity, 3)
}

fn invalid(quantity: &str, reason: &str) -> String {
    format!("invalid quantity {quantity:?}: {reason}")
}

/// `ceil(quantity * 10^target_exp10)`.
fn parse_scaled(quantity: &str, target_exp10: i32) -> Result<u64, String> {
    let s = quantity.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(invalid(quantity, "negative"));
    }
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(invalid(quantity, "no number"));
    }
    if frac_part.contains('.') {
        return Err(invalid(quantity, "more than one decimal point"));
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    // u128 holds 38 decimal digits; a quantity with more is not a real limit.
    if digits.len() > 30 {
        return Err(invalid(quantity, "too many digits"));
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits
            .parse()
            .map_err(|_| invalid(quantity, "bad number"))?
    };
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| invalid(quantity, "too long"))?;
    let (exp10, bin_shift) = suffix_scale(suffix)
        .ok_or_else(|| invalid(quantity, &format!("unknown suffix {suffix:?}")))?;
    // A fraction of a billion digits would take the exponent past i32.
    let exp10 = exp10
        .checked_sub(frac_len)
        .and_then(|e| e.checked_add(target_exp10))
        .ok_or_else(|| invalid(quantity, "too long"))?;

    let overflow = || invalid(quantity, "too large");
    let mut numerator = mantissa
        .checked_mul(1u128 << bin_shift)
        .ok_or_else(overflow)?;
    let mut denominator: u128 = 1;
    if exp10 >= 0 {
        let factor = 10u128
            .checked_pow(exp10.unsigned_abs())
            .ok_or_else(overflow)?;
        numerator = numerator.checked_mul(factor).ok_or_else(overflow)?;
    } else {
        match 10u128.checked_pow(exp10.unsigned_abs()) {
            Some(d) => denominator = d,
            // Past 10^38, which is more than any numerator u128 holds: what is left is
            // a fraction of one, and fractions round up.
            None => return Ok(u64::from(numerator > 0)),
        }
    }
    let value = numerator.div_ceil(denominator);
    u64::try_from(value).map_err(|_| overflow())
}

/// (decimal exponent, binary shift) of a suffix.
fn suffix_scale(suffix: &str) -> Option<(i32, u32)> {
    let scale = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let exponent: i32 = exponent.parse().ok()?;
            // unsigned_abs: `1e-2147483648` has no i32 absolute value.
            if exponent.unsigned_abs() > 30 {
                return None;
            }
            (exponent, 0)
        }
    };
    Some(scale)
}

const DECIMAL_SUFFIXES: &[(i32, &str)] = &[
    (-9, "n"),
    (-6, "u"),
    (-3, "m"),
    (0, ""),
    (3, "k"),
    (6, "M"),
    (9, "G"),
    (12, "T"),
    (15, "P"),
    (18, "E"),
];

/// `value * 10^exp` in canonical DecimalSI form: trailing zeros folded into the largest
/// exponent that is a multiple of three (`3800m`, `4`, `110`, `1k`).
pub fn decimal_si(value: u64, exp: i32) -> String {
    if value == 0 {
        return "0".into();
    }
    let (mut mantissa, mut exp) = (u128::from(value), exp);
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exp += 1;
    }
    match exp.rem_euclid(3) {
        1 => {
            mantissa *= 10;
            exp -= 1;
        }
        2 => {
            mantissa *= 100;
            exp -= 2;
        }
        _ => {}
    }
    match DECIMAL_SUFFIXES.iter().find(|(e, _)| *e == exp) {
        Some((_, suffix)) => format!("{mantissa}{suffix}"),
        None => format!("{mantissa}e{exp}"),
    }
}

/// Bytes in canonical BinarySI form: the largest power-of-1024 suffix that divides the
/// value (`8048572Ki`, `1Gi`); values below 1 Ki, and values no suffix divides, come
/// out as plain or decimal numbers, as the apiserver writes them.
pub fn binary_si(bytes: u64) -> String {
    if bytes < 1024 {
        return decimal_si(bytes, 0);
    }
    let (mut n, mut i) = (bytes, 0);
    while n % 1024 == 0 && i < 6 {
        n /= 1024;
        i += 1;
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][i];
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_quantities() {
        assert_eq!(parse_bytes("64Mi").ok(), Some(64 * 1024 * 1024));
        assert_eq!(parse_bytes("1G").ok(), Some(1_000_000_000));
        assert_eq!(parse_bytes("128974848").ok(), Some(128_974_848));
        assert_eq!(parse_bytes("129e6").ok(), Some(129_000_000));
        assert_eq!(parse_bytes("123M").ok(), Some(123_000_000));
        assert_eq!(parse_bytes("1.5Gi").ok(), Some(1_610_612_736));
        assert_eq!(parse_bytes("1E").ok(), Some(1_000_000_000_000_000_000));
        assert_eq!(parse_bytes("1E3").ok(), Some(1000));
        assert_eq!(parse_bytes("16Ki").ok(), Some(16384));
        // Fractions of a byte round up.
        assert_eq!(parse_bytes("1500m").ok(), Some(2));
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(parse_millicpu("500m").ok(), Some(500));
        assert_eq!(parse_millicpu("1").ok(), Some(1000));
        assert_eq!(parse_millicpu("1.5").ok(), Some(1500));
        assert_eq!(parse_millicpu("0.1").ok(), Some(100));
        assert_eq!(parse_millicpu(".25").ok(), Some(250));
        assert_eq!(parse_millicpu("100u").ok(), Some(1));
    }

    #[test]
    fn bad_quantities() {
        for q in [
            "",
            "-1",
            "1Xi",
            "abc",
            "1..2",
            "1.2.3",
            "1e",
            "99999999999999999999999999999999Ei",
            "1Ei0",
        ] {
            assert!(parse_bytes(q).is_err(), "{q:?} should not parse");
        }
        assert!(parse_bytes("20Ei").is_err(), "does not fit u64");
        // Exponents and fractions at the edges of i32 are errors, not overflows.
        for q in ["1e-2147483648", "1e2147483647", "1e-2147483649"] {
            assert!(parse_bytes(q).is_err(), "{q:?} should not parse");
        }
        let tiny = format!("0.{}1", "0".repeat(40));
        assert_eq!(
            parse_bytes(&tiny).ok(),
            Some(1),
            "a fraction of a byte rounds up"
        );
        let zero = format!("0.{}", "0".repeat(40));
        assert_eq!(parse_bytes(&zero).ok(), Some(0));
        let msg = parse_bytes("10MB").err().unwrap_or_default();
        assert!(msg.contains("unknown suffix \"MB\""), "{msg}");
    }

    #[test]
    fn sizes_as_config_files_write_them() {
        for (q, want) in [
            ("10Mi", 10 * 1024 * 1024),
            ("5000", 5000),
            ("2k", 2000),
            ("0", 0),
            ("0.5", 1),
            ("+3M", 3_000_000),
            ("12e-1", 2),
        ] {
            assert_eq!(parse_bytes(q).ok(), Some(want), "{q}");
        }
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(decimal_si(4000, -3), "4");
        assert_eq!(decimal_si(3800, -3), "3800m");
        assert_eq!(decimal_si(1500, -3), "1500m");
        assert_eq!(decimal_si(10_000, -3), "10");
        assert_eq!(decimal_si(250, -3), "250m");
        assert_eq!(decimal_si(110, 0), "110");
        assert_eq!(decimal_si(1000, 0), "1k");
        assert_eq!(decimal_si(0, -3), "0");
        assert_eq!(binary_si(8_048_572 * 1024), "8048572Ki");
        assert_eq!(binary_si(7_741_372 * 1024), "7741372Ki");
        assert_eq!(binary_si(56_453_061_334), "56453061334");
        assert_eq!(binary_si(1 << 30), "1Gi");
        assert_eq!(binary_si(1000), "1k");
        assert_eq!(binary_si(512), "512");
        assert_eq!(binary_si(0), "0");
        // Each form reads back to the same number.
        for n in [1u64 << 30, 56_453_061_334, 8_048_572 * 1024, 1000, 7] {
            assert_eq!(parse_bytes(&binary_si(n)), Ok(n));
        }
        for m in [3800u64, 4000, 1, 999_000] {
            assert_eq!(parse_millicpu(&decimal_si(m, -3)), Ok(m));
        }
    }
}
