//! Request dispatch: authenticate, apply an injected fault, route, authorize, answer,
//! log. Non-resource URLs (`/version`) are answered here; resource requests go to
//! `resources` (and `watch` for streams).

use std::io;
use std::time::Instant;

use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};

use super::auth::{Authn, User};
use super::authz::{authorize, Attrs};
use super::http::{uuid, write_response, Request};
use super::server::Tls;
use super::status::{self, route_not_found, ApiErr};
use super::store::{parse_selector, Op, Res};
use super::{lock, resources, watch, Fault, Logged, Shared};

/// Priority-and-fairness headers the recorded server puts on every authenticated reply.
pub const PF: [(&str, &str); 2] = [
    (
        "X-Kubernetes-Pf-Flowschema-Uid",
        "e4263158-85f2-4cf6-9566-895bbcebfbcb",
    ),
    (
        "X-Kubernetes-Pf-Prioritylevel-Uid",
        "83f9ad1a-6cc1-4b6b-b094-a2ddbfdd8912",
    ),
];

/// What a handler answers.
pub enum Reply {
    Json(u16, Value),
    Err(ApiErr),
    Watch(watch::Spec),
}

/// `/version` as recorded (`00`): always indented, keys in Go's field order.
pub fn version_body() -> String {
    let fields = [
        ("major", "1"),
        ("minor", "36"),
        ("emulationMajor", "1"),
        ("emulationMinor", "36"),
        ("minCompatibilityMajor", "1"),
        ("minCompatibilityMinor", "35"),
        ("gitVersion", "v1.36.2"),
        ("gitCommit", "98b35193b2ac7a23a673325f5e9b830ecd5ba406"),
        ("gitTreeState", "clean"),
        ("buildDate", "2026-01-01T00:00:00Z"),
        ("goVersion", "go1.27.3-X:nojsonv2"),
        ("compiler", "gc"),
        ("platform", "linux/amd64"),
    ];
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("  {}: {}", json!(k), json!(v)))
        .collect();
    format!("{{\n{}\n}}", body.join(",\n"))
}

/// A resource path: `/api/v1/[namespaces/<ns>/]<plural>[/<name>[/<sub>]]` and the
/// `coordination.k8s.io/v1` and `events.k8s.io/v1` equivalents.
#[derive(Debug, Clone)]
pub struct Route {
    pub res: Res,
    pub namespace: String,
    pub name: String,
    pub subresource: String,
}

pub fn parse_route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", g, "v1", rest @ ..] => (*g, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, "", ""),
        [p, n] => (*p, *n, ""),
        [p, n, s] => (*p, *n, *s),
        _ => return None,
    };
    let res = match (group, plural) {
        ("", "pods") => Res::Pods,
        ("", "nodes") => Res::Nodes,
        ("", "configmaps") => Res::ConfigMaps,
        ("", "secrets") => Res::Secrets,
        ("", "services") => Res::Services,
        ("", "events") => Res::Events,
        ("coordination.k8s.io", "leases") => Res::Leases,
        ("events.k8s.io", "events") => Res::EventsV1,
        _ => return None,
    };
    if res.namespaced() == namespace.is_empty() && !name.is_empty() {
        return None;
    }
    if !res.namespaced() && !namespace.is_empty() {
        return None;
    }
    Some(Route {
        res,
        namespace,
        name: name.to_string(),
        subresource: sub.to_string(),
    })
}

/// The authorizer's verb.
pub fn verb(req: &Request, route: &Route) -> &'static str {
    let watch = matches!(req.param("watch").as_deref(), Some("true" | "1"));
    match (req.method.as_str(), route.name.is_empty()) {
        ("GET", false) => "get",
        ("GET", true) if watch => "watch",
        ("GET", true) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "delete",
        ("DELETE", true) => "deletecollection",
        _ => "unknown",
    }
}

/// Runs a request as `user` (no logging, no faults): the HTTP path and the test-side
/// control API share this.
pub fn execute(shared: &Shared, user: &User, req: &Request) -> Reply {
    let Some(route) = parse_route(&req.path) else {
        return Reply::Err(route_not_found());
    };
    let verb = verb(req, &route);
    let fields = parse_selector(&req.param("fieldSelector").unwrap_or_default());
    let mut name = route.name.clone();
    if name.is_empty() && matches!(verb, "list" | "watch") {
        if let Some(r) = fields
            .iter()
            .find(|r| r.key == "metadata.name" && matches!(r.op, Op::Equals | Op::DoubleEquals))
        {
            name = r.value.clone();
        }
    }
    {
        let state = lock(&shared.state);
        let attrs = Attrs {
            res: route.res,
            namespace: &route.namespace,
            name: &name,
            subresource: &route.subresource,
            verb,
            fields: &fields,
        };
        if let Err(e) = authorize(&state, user, &attrs) {
            return Reply::Err(e);
        }
    }
    let r = match verb {
        "get" => resources::get(shared, &route),
        "list" => resources::list(shared, &route, req),
        "watch" => watch::spec(shared, &route, req).map(Reply::Watch),
        "create" => resources::create(shared, user, &route, req),
        "update" => resources::update(shared, user, &route, req),
        "patch" => resources::patch(shared, user, &route, req),
        "delete" => resources::delete(shared, user, &route, req),
        _ => Err(status::method_not_allowed()),
    };
    r.unwrap_or_else(Reply::Err)
}

fn log(shared: &Shared, req: &Request, user: &str, code: u16) {
    lock(&shared.log).push(Logged {
        method: req.method.clone(),
        path: req.path.clone(),
        query: req.query.clone(),
        user: user.to_string(),
        code,
        at: Instant::now(),
    });
    shared.changed.notify_all();
}

fn write_err(out: &mut Tls, audit: &str, e: &ApiErr) -> io::Result<()> {
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if e.nosniff {
        headers.push(("X-Content-Type-Options", "nosniff"));
    }
    if e.code != 401 {
        headers.extend(PF);
    }
    if e.code == 429 {
        headers.push(("Retry-After", "1"));
    }
    write_response(out, e.code, audit, &headers, &e.body())
}

fn json_body(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// Answers one request on `out`; an error drops the connection.
pub fn handle(
    shared: &Shared,
    conn: u64,
    certs: Option<&[CertificateDer<'static>]>,
    req: &Request,
    out: &mut Tls,
) -> io::Result<()> {
    let audit = uuid();
    let authn = shared
        .authn
        .authenticate(&shared.pki, certs, req.header("authorization"));
    let user_name = match &authn {
        Authn::User(u) => u.name.clone(),
        Authn::Unauthorized => String::new(),
    };
    let is_list = req.method == "GET"
        && !matches!(req.param("watch").as_deref(), Some("true" | "1"))
        && parse_route(&req.path).is_some_and(|r| r.name.is_empty());
    match super::take_fault(shared, req, is_list) {
        Some(Fault::Drop) => {
            log(shared, req, &user_name, 0);
            return Err(io::Error::other("fault: drop"));
        }
        Some(Fault::Status(code)) => {
            log(shared, req, &user_name, code);
            return write_err(out, &audit, &status::injected(code));
        }
        Some(fault @ (Fault::StaleList | Fault::EmptyList)) => {
            let route = parse_route(&req.path);
            let kind = route.map_or("List", |r| r.res.kind());
            let current = lock(&shared.state).rv;
            let rv = if fault == Fault::StaleList {
                current.saturating_sub(1).max(1)
            } else {
                current
            };
            log(shared, req, &user_name, 200);
            let body = json!({"kind": format!("{kind}List"), "apiVersion": "v1",
                "metadata": {"resourceVersion": rv.to_string()}, "items": []});
            return write_response(out, 200, &audit, &PF, &json_body(&body));
        }
        Some(Fault::Delay(d)) => std::thread::sleep(d),
        None => {}
    }
    let user = match authn {
        Authn::User(u) => u,
        Authn::Unauthorized => {
            log(shared, req, "", 401);
            return write_err(out, &audit, &status::unauthorized());
        }
    };
    if req.path == "/version" || req.path == "/version/" {
        let code = if req.method == "GET" { 200 } else { 405 };
        log(shared, req, &user.name, code);
        if code == 405 {
            return write_err(out, &audit, &status::method_not_allowed());
        }
        return write_response(out, 200, &audit, &PF, version_body().as_bytes());
    }
    if parse_route(&req.path).is_none() && !user.is_admin() {
        // Unknown non-resource paths are denied like any other request.
        log(shared, req, &user.name, 403);
        let e = ApiErr {
            nosniff: true,
            ..ApiErr::new(
                403,
                "Forbidden",
                format!(
                    "forbidden: User {:?} cannot {} path {:?}",
                    user.name,
                    req.method.to_lowercase(),
                    req.path
                ),
            )
        };
        return write_err(out, &audit, &e);
    }
    match execute(shared, &user, req) {
        Reply::Json(code, v) => {
            log(shared, req, &user.name, code);
            write_response(out, code, &audit, &PF, &json_body(&v))
        }
        Reply::Err(e) => {
            log(shared, req, &user.name, e.code);
            write_err(out, &audit, &e)
        }
        Reply::Watch(spec) => {
            log(shared, req, &user.name, 200);
            watch::stream(shared, conn, spec, &audit, out)
        }
    }
}
