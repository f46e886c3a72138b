//! Routing: which path goes where, which methods each takes (405 otherwise), which
//! routes each port serves, and on the secure port every route but `/healthz` passes
//! [`super::auth`] first (401 or 403).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::deps::ApiDeps;
use super::http::{error, respond, Identity, Resp};
use super::{logs, metrics, pods, stats, streams, Port};

/// The routes the kubelet serves, by their first path segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Healthz,
    Pods,
    RunningPods,
    StatsSummary,
    Metrics,
    MetricsResource,
    Configz,
    ContainerLogs,
    Exec,
    Attach,
    PortForward,
    Run,
}

impl Route {
    fn of(path: &str) -> Option<Route> {
        let trimmed = path.trim_end_matches('/');
        Some(match trimmed {
            "/healthz" => Route::Healthz,
            "/pods" => Route::Pods,
            "/runningpods" => Route::RunningPods,
            "/stats/summary" => Route::StatsSummary,
            "/metrics" => Route::Metrics,
            "/metrics/resource" => Route::MetricsResource,
            "/configz" => Route::Configz,
            _ if path.starts_with("/containerLogs/") => Route::ContainerLogs,
            _ if path.starts_with("/exec/") => Route::Exec,
            _ if path.starts_with("/attach/") => Route::Attach,
            _ if path.starts_with("/portForward/") => Route::PortForward,
            _ if path.starts_with("/run/") => Route::Run,
            _ => return None,
        })
    }

    fn methods(self) -> &'static [Method] {
        match self {
            Route::Exec | Route::Attach | Route::PortForward => &[Method::GET, Method::POST],
            Route::StatsSummary => &[Method::GET, Method::POST],
            Route::Run => &[Method::POST],
            _ => &[Method::GET],
        }
    }

    /// What the read-only port serves (the kubelet's default handlers, no debugging
    /// handlers).
    fn read_only(self) -> bool {
        matches!(
            self,
            Route::Healthz
                | Route::Pods
                | Route::StatsSummary
                | Route::Metrics
                | Route::MetricsResource
        )
    }
}

pub async fn handle(
    req: Request<Incoming>,
    port: Port,
    identity: Identity,
    deps: Arc<ApiDeps>,
) -> Resp {
    let path = req.uri().path().to_owned();
    let Some(route) = Route::of(&path) else {
        return error(StatusCode::NOT_FOUND, "404 page not found");
    };
    let allowed = match port {
        Port::Secure => true,
        Port::ReadOnly => route.read_only(),
        Port::Healthz => route == Route::Healthz,
    };
    if !allowed {
        return error(StatusCode::NOT_FOUND, "404 page not found");
    }
    if route != Route::Healthz && port == Port::Secure {
        let admitted = deps
            .auth
            .admit(&identity, req.method(), req.headers(), &path)
            .await;
        if let Err(refusal) = admitted {
            return refusal;
        }
    }
    if !route.methods().contains(req.method()) {
        let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed");
        let allow = route
            .methods()
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        if let Ok(v) = hyper::header::HeaderValue::from_str(&allow) {
            r.headers_mut().insert(hyper::header::ALLOW, v);
        }
        return r;
    }
    let query = Query::parse(req.uri().query().unwrap_or(""));
    match route {
        Route::Healthz => respond(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
        Route::Pods => pods::pods(&deps).await,
        Route::RunningPods => pods::running_pods(&deps).await,
        Route::Configz => super::http::json(&serde_json::json!({
            "kubeletconfig": deps.configz.as_ref()
        })),
        Route::StatsSummary => stats::summary(&deps, &query).await,
        Route::Metrics => metrics::own(&deps).await,
        Route::MetricsResource => metrics::resource(&deps).await,
        Route::ContainerLogs => logs::container_logs(&deps, &path, &query).await,
        Route::Run => super::run::run(&deps, &path, &query).await,
        Route::Exec | Route::Attach | Route::PortForward => {
            streams::handle(req, route_kind(route), &path, &query, deps).await
        }
    }
}

fn route_kind(route: Route) -> streams::Kind {
    match route {
        Route::Exec => streams::Kind::Exec,
        Route::Attach => streams::Kind::Attach,
        _ => streams::Kind::PortForward,
    }
}

/// A request's query: every `key=value`, percent-decoded, in order.
#[derive(Debug, Default, Clone)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(q: &str) -> Query {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order (`command=sh&command=-c`).
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// A boolean as Go's strconv.ParseBool reads it; absent is false, present with no
    /// value is true (`?follow`).
    pub fn flag(&self, key: &str) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(false),
            Some("") | Some("1") | Some("t") | Some("T") | Some("true") | Some("TRUE")
            | Some("True") => Ok(true),
            Some("0") | Some("f") | Some("F") | Some("false") | Some("FALSE") | Some("False") => {
                Ok(false)
            }
            Some(other) => Err(format!("{key}: invalid boolean {other:?}")),
        }
    }

    /// An integer; absent is None.
    pub fn int(&self, key: &str) -> Result<Option<i64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{key}: invalid integer {v:?}")),
        }
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a container's route points (`/exec/{ns}/{pod}[/{uid}]/{container}`).
pub struct ContainerPath {
    pub ns: String,
    pub pod: String,
    pub uid: Option<String>,
    pub container: String,
}

/// A container route's segments; else the kubelet's 400.
pub fn container_path(path: &str) -> Result<ContainerPath, Box<Resp>> {
    let mut seg = segments(path);
    let uid = match seg.len() {
        3 => None,
        4 => Some(seg.remove(2)),
        _ => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                "missing namespace, pod or container",
            )))
        }
    };
    let container = seg.pop().unwrap_or_default();
    let pod = seg.pop().unwrap_or_default();
    let ns = seg.pop().unwrap_or_default();
    Ok(ContainerPath {
        ns,
        pod,
        uid,
        container,
    })
}

/// The path segments after the route's own (`/exec/ns/pod/c` → `[ns, pod, c]`),
/// percent-decoded.
pub fn segments(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .skip(1)
        .map(decode)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_repeat() {
        let q = Query::parse("command=sh&command=-c&command=echo%20hi+there&stdout=1&tty");
        assert_eq!(q.all("command"), vec!["sh", "-c", "echo hi there"]);
        assert_eq!(q.flag("stdout"), Ok(true));
        assert_eq!(q.flag("tty"), Ok(true));
        assert_eq!(q.flag("stdin"), Ok(false));
        assert!(Query::parse("follow=maybe").flag("follow").is_err());
        assert_eq!(Query::parse("tailLines=5").int("tailLines"), Ok(Some(5)));
        assert!(Query::parse("tailLines=x").int("tailLines").is_err());
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%41%zz"), "A%zz");
    }

    #[test]
    fn routes() {
        assert_eq!(Route::of("/pods/"), Some(Route::Pods));
        assert_eq!(Route::of("/runningpods/"), Some(Route::RunningPods));
        assert_eq!(
            Route::of("/containerLogs/ns/p/c"),
            Some(Route::ContainerLogs)
        );
        assert_eq!(Route::of("/exec/ns/p/c"), Some(Route::Exec));
        assert_eq!(Route::of("/run/ns/p/c"), Some(Route::Run));
        assert!(!Route::Run.read_only());
        assert_eq!(Route::of("/nope"), None);
        assert!(!Route::ContainerLogs.read_only());
        assert!(Route::MetricsResource.read_only());
        assert_eq!(segments("/exec/ns/my%2Dpod/c"), vec!["ns", "my-pod", "c"]);
    }
}
