//! Go duration strings (`20s`, `1m0s`, `1h2m3.5s`, `500ms`), as KubeletConfiguration
//! writes them, so an existing kubelet config file reads the same here.

use std::time::Duration;

/// Parses a Go `time.ParseDuration` string. Negative durations are refused: nothing
/// holdfast configures can run backwards.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s.starts_with('-') {
        return Err(format!("negative duration {s:?}"));
    }
    let body = s.strip_prefix('+').unwrap_or(s);
    // Go accepts a bare zero without a unit, and nothing else without one.
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    let mut nanos: u128 = 0;
    let mut rest = body;
    if rest.is_empty() {
        return Err(format!("invalid duration {s:?}"));
    }
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(tail) => {
                let n = tail.bytes().take_while(u8::is_ascii_digit).count();
                tail.split_at(n)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(format!("invalid duration {s:?}: expected a number"));
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map(|(i, _)| i)
            .unwrap_or(after.len());
        let (unit, tail) = after.split_at(unit_len);
        let scale = unit_nanos(unit).ok_or_else(|| {
            if unit.is_empty() {
                format!("invalid duration {s:?}: missing unit (ns, us, ms, s, m, h)")
            } else {
                format!("invalid duration {s:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)")
            }
        })?;
        let too_big = || format!("invalid duration {s:?}: too large");
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| too_big())?
        };
        let mut part = whole.checked_mul(scale).ok_or_else(too_big)?;
        // Digits past nanosecond precision cannot change the result, and keeping them
        // would overflow the divisor.
        let frac_digits = &frac_part[..frac_part.len().min(30)];
        if !frac_digits.is_empty() {
            let frac: u128 = frac_digits.parse().map_err(|_| too_big())?;
            let div = 10u128.pow(frac_digits.len() as u32);
            part = part
                .checked_add(frac.checked_mul(scale).ok_or_else(too_big)? / div)
                .ok_or_else(too_big)?;
        }
        nanos = nanos.checked_add(part).ok_or_else(too_big)?;
        // Go's Duration is an int64 of nanoseconds; matching its limit keeps a file
        // valid for both.
        if nanos > i64::MAX as u128 {
            return Err(too_big());
        }
        rest = tail;
    }
    let secs = (nanos / 1_000_000_000) as u64;
    let sub = (nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// `d` as Go's `Duration.String` writes it (`5s`, `2m0s`, `1h0m0s`, `1.5s`, `250ms`),
/// for messages that quote the kubelet's.
pub fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let (h, m) = (secs / 3600, secs % 3600 / 60);
    let mut s = format!("{}", secs % 60);
    let millis = d.subsec_millis();
    if millis > 0 {
        s = format!("{s}.{millis:03}").trim_end_matches('0').to_string();
    }
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn good_durations() {
        assert_eq!(ok("20s"), Duration::from_secs(20));
        assert_eq!(ok("1m0s"), Duration::from_secs(60));
        assert_eq!(ok("1h2m3.5s"), Duration::from_millis(3_723_500));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("+5m"), Duration::from_secs(300));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("3us"), Duration::from_micros(3));
        assert_eq!(ok("3µs"), Duration::from_micros(3));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("2h45m"), Duration::from_secs(9900));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
        assert_eq!(ok("1.0000000019s"), Duration::from_nanos(1_000_000_001));
    }

    #[test]
    fn bad_durations() {
        for bad in [
            "",
            "20",
            "s",
            ".s",
            "-1s",
            "1x",
            "1sm5",
            "1 s",
            "1.2.3s",
            "abc",
            "+",
            "1d",
            "99999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        let msg = parse_duration("20").expect_err("no unit");
        assert!(msg.contains("missing unit"), "{msg}");
        let msg = parse_duration("3d").expect_err("days");
        assert!(msg.contains("unknown unit \"d\""), "{msg}");
    }
}
