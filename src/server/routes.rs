//! Routing: which path goes where, which methods each takes (405 otherwise), which
//! routes each port serves, and on the secure port every route but `/healthz` passes
//! [`super::auth`] first (401 or 403).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use super::deps::ApiDeps;
use super::http::{error, respond, Identity, Query, Resp};
use super::{exec, logs, metrics, pods, stats};

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
            exec::handle(req, route_kind(route), &path, &query, deps).await
        }
    }
}

fn route_kind(route: Route) -> exec::Kind {
    match route {
        Route::Exec => exec::Kind::Exec,
        Route::Attach => exec::Kind::Attach,
        _ => exec::Kind::PortForward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
