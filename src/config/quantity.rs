//! Kubernetes quantities (`10Mi`, `1G`, `5000`, `1e3`) as a whole number of bytes.

/// Parses a quantity the way `resource.Quantity.Value()` reads it: binary (`Ki`..`Ei`)
/// and decimal (`n`, `u`, `m`, `k`, `M`..`E`) suffixes and `e` exponents, a fractional
/// byte rounded up. Negative quantities are refused: a size cannot be below zero.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty quantity".into());
    }
    if s.starts_with('-') {
        return Err(format!("negative quantity {s:?}"));
    }
    let body = s.strip_prefix('+').unwrap_or(s);
    let int_len = body.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, after) = body.split_at(int_len);
    let (frac_part, suffix) = match after.strip_prefix('.') {
        Some(tail) => {
            let n = tail.bytes().take_while(u8::is_ascii_digit).count();
            tail.split_at(n)
        }
        None => ("", after),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(format!("invalid quantity {s:?}: expected a number"));
    }
    let invalid = || format!("invalid quantity {s:?}");
    let too_big = || format!("quantity {s:?} is too large");

    // value = mantissa * base^exp / 10^frac_len, kept exact until the final rounding.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return Err(too_big());
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| too_big())?
    };
    let (base, exp): (u128, i32) = match suffix {
        "" => (10, 0),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        "n" => (10, -9),
        "u" => (10, -6),
        "m" => (10, -3),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        other => match other.strip_prefix(['e', 'E']) {
            Some(e) if !e.is_empty() => {
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("invalid quantity {s:?}: bad exponent {other:?}"));
                }
                let exp: i32 = e.parse().map_err(|_| too_big())?;
                (10, exp)
            }
            _ => {
                return Err(format!(
                    "invalid quantity {s:?}: unknown suffix {other:?} (Ki, Mi, Gi, Ti, k, M, G, T, ...)"
                ))
            }
        },
    };
    if mantissa == 0 {
        return Ok(0);
    }
    let mut num = mantissa;
    let mut den: u128 = 10u128
        .checked_pow(frac_part.len() as u32)
        .ok_or_else(invalid)?;
    if exp >= 0 {
        let factor = base.checked_pow(exp as u32).ok_or_else(too_big)?;
        num = num.checked_mul(factor).ok_or_else(too_big)?;
    } else {
        let factor = base.checked_pow(exp.unsigned_abs()).ok_or_else(invalid)?;
        den = den.checked_mul(factor).ok_or_else(invalid)?;
    }
    let value = num.div_ceil(den);
    u64::try_from(value).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> u64 {
        parse_quantity(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn good_quantities() {
        assert_eq!(ok("10Mi"), 10 * 1024 * 1024);
        assert_eq!(ok("1G"), 1_000_000_000);
        assert_eq!(ok("5000"), 5000);
        assert_eq!(ok("1Ki"), 1024);
        assert_eq!(ok("1.5Gi"), 1_610_612_736);
        assert_eq!(ok("1e3"), 1000);
        assert_eq!(ok("1E3"), 1000);
        assert_eq!(ok("2k"), 2000);
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("0.5"), 1);
        assert_eq!(ok("1500m"), 2);
        assert_eq!(ok("1E"), 1_000_000_000_000_000_000);
        assert_eq!(ok("+3M"), 3_000_000);
        assert_eq!(ok("12e-1"), 2);
    }

    #[test]
    fn bad_quantities() {
        for bad in [
            "", "Mi", "-1Mi", "10MB", "1.2.3", "ten", "1e", "1e+", "1 Mi", "100Ei", "1e40",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} was accepted");
        }
        let msg = parse_quantity("10MB").expect_err("bad suffix");
        assert!(msg.contains("unknown suffix \"MB\""), "{msg}");
    }
}
