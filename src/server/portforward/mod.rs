//! `/portForward/{namespace}/{pod}[/{uid}]`: `kubectl port-forward`, TCP only, over
//! SPDY/3.1 (`portforward.k8s.io`, see [`spdy`]) or WebSocket (`v4.channel.k8s.io`,
//! see [`websocket`]).
//!
//! Each forwarded connection is one TCP connection to `localhost:<port>` inside the
//! pod's network namespace: for a `hostNetwork` pod, the host's; otherwise the one
//! that a running container's init is in, reached from a thread of its own that
//! enters it (see [`netns`]). Bytes go both ways through bounded channels, so a slow
//! client holds back only its own connection's reads from the pod.
//!
//! Errors reach the client on the connection's error stream in the kubelet's words
//! (`error forwarding port 80 to pod web_default, uid ...: ...`).

mod netns;
mod spdy;
mod tunnel;
mod websocket;

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use super::deps::ApiDeps;
use super::http::{error, segments, Query, Resp};
use super::lookup;
use tunnel::{parse_port, Target, MAX_CONNECTIONS};

pub async fn handle(req: Request<Incoming>, path: &str, q: &Query, deps: Arc<ApiDeps>) -> Resp {
    let seg = segments(path);
    let (ns, name, uid) = match seg.as_slice() {
        [ns, pod] => (ns, pod, None),
        [ns, pod, uid] => (ns, pod, Some(uid.as_str())),
        _ => return error(StatusCode::BAD_REQUEST, "missing namespace or pod"),
    };
    let is_ws = crate::server::websocket::is_upgrade(&req);
    // Over WebSocket the ports are in the query; over SPDY each stream names its own.
    let ports = if is_ws {
        match ports(q) {
            Ok(p) => p,
            Err(m) => return error(StatusCode::BAD_REQUEST, &m),
        }
    } else {
        Vec::new()
    };
    let state = match lookup::find(&deps, ns, name, uid).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let spec = state.pod().spec.as_ref();
    let target = Target {
        pod: format!("{name}_{ns}"),
        uid: state.uid().to_owned(),
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        containers: spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| lookup::container(&state, &c.name).ok()?.id(false))
            .collect(),
    };
    let Ok(permit) = deps.streams.clone().try_acquire_owned() else {
        return error(StatusCode::TOO_MANY_REQUESTS, "too many open streams");
    };
    if is_ws {
        crate::server::websocket::accept(
            req,
            &websocket::PROTOCOLS,
            true,
            move |io, _| async move {
                let _permit = permit;
                websocket::session(io, deps, target, ports).await
            },
        )
    } else if crate::server::spdy::is_upgrade(&req) {
        crate::server::spdy::accept(req, &[spdy::PROTOCOL], move |io, _| async move {
            let _permit = permit;
            spdy::session(io, deps, target).await
        })
    } else {
        error(
            StatusCode::BAD_REQUEST,
            "Upgrade request required (SPDY/3.1 or websocket)",
        )
    }
}

/// The `port` query values (`port=80&port=8080` or `port=80,8080`), checked as the
/// kubelet checks them.
fn ports(q: &Query) -> Result<Vec<u16>, String> {
    let values = q.all("port");
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut out = Vec::new();
    for v in values {
        if v.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in v.split(',') {
            out.push(parse_port(p)?);
        }
    }
    if out.len() > MAX_CONNECTIONS {
        return Err(format!(
            "{} ports asked for; at most {MAX_CONNECTIONS} at once",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_as_the_kubelet_reads_them() {
        assert_eq!(
            ports(&Query::parse("port=80&port=8080,9090")),
            Ok(vec![80, 8080, 9090])
        );
        assert!(ports(&Query::parse("")).is_err());
        assert!(ports(&Query::parse("port=")).is_err());
        assert!(ports(&Query::parse("port=0")).is_err());
        assert!(ports(&Query::parse("port=70000")).is_err());
        assert!(ports(&Query::parse("port=http")).is_err());
        let many = (1..=17)
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",");
        assert!(ports(&Query::parse(&format!("port={many}"))).is_err());
    }
}
