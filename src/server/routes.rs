//! Routing: one table ([`ROUTES`]) says which path goes to which handler, which
//! methods each takes (405 otherwise) and which ports serve it; on the secure port every
//! route but `/healthz` passes [`super::auth`] first (401 or 403). Handlers share the
//! [`super::http`] vocabulary and never call one another or come back here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::deps::ApiDeps;
use super::exec::{self, Kind};
use super::http::{error, json, respond, Identity, Query, Resp};
use super::{logs, metrics, pods, portforward, run, stats};

/// Which routes a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The authenticated HTTPS port: everything.
    Secure,
    /// `readOnlyPort`: no authentication, read-only routes.
    ReadOnly,
    /// `healthzPort`: `/healthz` only.
    Healthz,
}

/// What a handler is given: the request (a stream route upgrades it), its path and
/// query, and what the API reads.
struct Call {
    req: Request<Incoming>,
    path: String,
    query: Query,
    deps: Arc<ApiDeps>,
}

type Reply = Pin<Box<dyn Future<Output = Resp> + Send>>;

/// Who may reach a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Every port, without authentication (`/healthz`).
    Open,
    /// The secure port, and the read-only port (the kubelet's default handlers).
    ReadOnly,
    /// The secure port only (the debugging handlers).
    Secure,
}

/// One route: the path (whole, or the prefix of a path that names a pod or container),
/// the methods it takes, who may reach it, and its handler.
struct Route {
    path: &'static str,
    prefix: bool,
    methods: &'static [Method],
    access: Access,
    handler: fn(Call) -> Reply,
}

impl Route {
    fn matches(&self, path: &str) -> bool {
        if self.prefix {
            path.starts_with(self.path)
        } else {
            path.trim_end_matches('/') == self.path
        }
    }

    fn served_on(&self, port: Port) -> bool {
        match port {
            Port::Secure => true,
            Port::ReadOnly => self.access != Access::Secure,
            Port::Healthz => self.access == Access::Open,
        }
    }
}

const GET: &[Method] = &[Method::GET];
const GET_POST: &[Method] = &[Method::GET, Method::POST];
const POST: &[Method] = &[Method::POST];

impl Route {
    /// A route for one path (a trailing `/` is taken too).
    const fn exact(
        path: &'static str,
        methods: &'static [Method],
        access: Access,
        handler: fn(Call) -> Reply,
    ) -> Route {
        Route {
            path,
            prefix: false,
            methods,
            access,
            handler,
        }
    }

    /// A route for every path under `prefix` (the pod or container it names follows).
    const fn under(
        prefix: &'static str,
        methods: &'static [Method],
        access: Access,
        handler: fn(Call) -> Reply,
    ) -> Route {
        Route {
            path: prefix,
            prefix: true,
            methods,
            access,
            handler,
        }
    }
}

/// A handler in the table: `call => its response`, in an async block.
macro_rules! handler {
    ($c:ident => $reply:expr) => {
        |$c: Call| -> Reply { Box::pin(async move { $reply }) }
    };
}

/// The routes the kubelet serves.
#[rustfmt::skip]
static ROUTES: &[Route] = &[
    Route::exact("/healthz", GET, Access::Open, handler!(_c => healthz())),
    Route::exact("/pods", GET, Access::ReadOnly, handler!(c => pods::pods(&c.deps).await)),
    Route::exact("/runningpods", GET, Access::Secure, handler!(c => pods::running_pods(&c.deps).await)),
    Route::exact("/stats/summary", GET_POST, Access::ReadOnly, handler!(c => stats::summary(&c.deps, &c.query).await)),
    Route::exact("/metrics", GET, Access::ReadOnly, handler!(c => metrics::own(&c.deps).await)),
    Route::exact("/metrics/resource", GET, Access::ReadOnly, handler!(c => metrics::resource(&c.deps).await)),
    Route::exact("/configz", GET, Access::Secure, handler!(c => configz(&c.deps))),
    Route::under("/containerLogs/", GET, Access::Secure, handler!(c => logs::container_logs(&c.deps, &c.path, &c.query).await)),
    Route::under("/exec/", GET_POST, Access::Secure, handler!(c => exec::handle(c.req, Kind::Exec, &c.path, &c.query, c.deps).await)),
    Route::under("/attach/", GET_POST, Access::Secure, handler!(c => exec::handle(c.req, Kind::Attach, &c.path, &c.query, c.deps).await)),
    Route::under("/portForward/", GET_POST, Access::Secure, handler!(c => portforward::handle(c.req, &c.path, &c.query, c.deps).await)),
    Route::under("/run/", POST, Access::Secure, handler!(c => run::run(&c.deps, &c.path, &c.query).await)),
];

fn healthz() -> Resp {
    respond(StatusCode::OK, "text/plain; charset=utf-8", "ok")
}

/// `/configz`: the running configuration.
fn configz(deps: &ApiDeps) -> Resp {
    json(&serde_json::json!({"kubeletconfig": deps.configz.as_ref()}))
}

fn route(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.matches(path))
}

pub async fn handle(
    req: Request<Incoming>,
    port: Port,
    identity: Identity,
    deps: Arc<ApiDeps>,
) -> Resp {
    let path = req.uri().path().to_owned();
    let Some(route) = route(&path).filter(|r| r.served_on(port)) else {
        return error(StatusCode::NOT_FOUND, "404 page not found");
    };
    if route.access != Access::Open && port == Port::Secure {
        let admitted = deps
            .auth
            .admit(&identity, req.method(), req.headers(), &path)
            .await;
        if let Err(refusal) = admitted {
            return refusal;
        }
    }
    if !route.methods.contains(req.method()) {
        return not_allowed(route.methods);
    }
    let query = Query::parse(req.uri().query().unwrap_or(""));
    (route.handler)(Call {
        req,
        path,
        query,
        deps,
    })
    .await
}

/// 405, with the methods the route takes.
fn not_allowed(methods: &[Method]) -> Resp {
    let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed");
    let allow = methods
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(v) = hyper::header::HeaderValue::from_str(&allow) {
        r.headers_mut().insert(hyper::header::ALLOW, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let path = |p| route(p).map(|r| r.path);
        assert_eq!(path("/pods/"), Some("/pods"));
        assert_eq!(path("/runningpods/"), Some("/runningpods"));
        assert_eq!(path("/containerLogs/ns/p/c"), Some("/containerLogs/"));
        assert_eq!(path("/exec/ns/p/c"), Some("/exec/"));
        assert_eq!(path("/run/ns/p/c"), Some("/run/"));
        assert_eq!(path("/nope"), None);
        assert_eq!(path("/metrics/resource/"), Some("/metrics/resource"));
        let served = |p, port| route(p).is_some_and(|r| r.served_on(port));
        assert!(!served("/run/ns/p/c", Port::ReadOnly));
        assert!(!served("/containerLogs/ns/p/c", Port::ReadOnly));
        assert!(served("/metrics/resource", Port::ReadOnly));
        assert!(served("/healthz", Port::Healthz));
        assert!(!served("/pods", Port::Healthz));
    }
}
