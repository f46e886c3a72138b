//! An address of a node's own on this machine, not loopback: a link (a bridge without
//! ports: the kernel here has no dummy links) holding one
//! address of TEST-NET-3 (203.0.113.0/24, RFC 5737). The apiserver's node proxy
//! (`/api/v1/nodes/<node>/proxy/...`, `kubectl top`) refuses loopback node addresses,
//! so a node reached through it listens there. Dropping it deletes the link.

use std::process::Command;

pub struct NodeAddress {
    pub link: String,
    pub ip: String,
}

impl NodeAddress {
    /// A new link and address; `index` tells apart those of one test binary.
    pub fn new(index: u32) -> NodeAddress {
        let pid = std::process::id();
        let link = format!("hfcp{}x{index}", pid % 100_000);
        let ip = format!(
            "203.0.113.{}",
            1 + (pid.wrapping_mul(13) + index * 37) % 254
        );
        let run = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("run ip");
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = Command::new("ip").args(["link", "del", &link]).output();
        run(&["link", "add", &link, "type", "bridge"]);
        let addr = NodeAddress { link, ip };
        run(&["addr", "add", &format!("{}/32", addr.ip), "dev", &addr.link]);
        run(&["link", "set", &addr.link, "up"]);
        addr
    }
}

impl Drop for NodeAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
    }
}
