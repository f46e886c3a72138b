//! Sysctl names as the kubelet reads them: one spelling for `a/b` and `a.b`, and which
//! namespace (net, ipc) a sysctl belongs to, if any. Pure string facts; whether a pod
//! may set one is admission's to decide, and setting it the security context's.

/// `kernel/shm_rmid_forced` and `kernel.shm_rmid_forced` are one sysctl.
pub fn normalize_sysctl(name: &str) -> String {
    // As the kubelet's NormalizeName: only a name whose first separator is `/` uses
    // `/` as its separator (`net/ipv4/conf/eno2.100/rp_filter`).
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// Which namespace a sysctl belongs to (`utilsysctl.GetNamespace`), if it is
/// namespaced at all.
pub fn sysctl_namespace(name: &str) -> Option<&'static str> {
    if name.starts_with("net.") {
        Some("net")
    } else if name == "kernel.sem"
        || name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name.starts_with("fs.mqueue.")
    {
        Some("ipc")
    } else {
        None
    }
}
