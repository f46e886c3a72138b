//! DNS-1123 names, as the apiserver validates node, pod and container names.

/// A DNS-1123 label: at most 63 lowercase alphanumerics or `-`, starting and ending
/// with an alphanumeric. Container names and namespaces are labels.
pub fn check_dns1123_label(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "must be no more than 63 characters (has {})",
            name.len()
        ));
    }
    check_label_chars(name)
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels. Node
/// and pod names are subdomains.
pub fn check_dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "must be no more than 253 characters (has {})",
            name.len()
        ));
    }
    for part in name.split('.') {
        if part.is_empty() {
            return Err(format!(
                "{name:?} is not a DNS-1123 subdomain: empty part between dots"
            ));
        }
        check_label_chars(part).map_err(|_| {
            format!(
                "{name:?} is not a DNS-1123 subdomain: lowercase letters, digits, '-' and '.' only, \
                 each part starting and ending with a letter or digit"
            )
        })?;
    }
    Ok(())
}

fn check_label_chars(name: &str) -> Result<(), String> {
    let ok_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    let inner_ok = bytes.iter().all(|&b| ok_char(b) || b == b'-');
    let ends_ok =
        bytes.first().copied().is_some_and(ok_char) && bytes.last().copied().is_some_and(ok_char);
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a DNS-1123 label: lowercase letters, digits and '-' only, \
             starting and ending with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for good in ["a", "web", "web-1", "0abc", &"a".repeat(63)] {
            assert!(check_dns1123_label(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a-", "Web", "a.b", "a_b", &"a".repeat(64)] {
            assert!(check_dns1123_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for good in ["node-1", "gw.site-3.example", "a"] {
            assert!(check_dns1123_subdomain(good).is_ok(), "{good}");
        }
        for bad in ["", "a..b", ".a", "a.", "Gateway", "gw_1", &"a".repeat(254)] {
            assert!(check_dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }
}
