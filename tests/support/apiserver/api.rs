//! Request dispatch: authenticate, log, answer. Non-resource URLs are answered here;
//! resource requests go to the handlers.

use std::io;
use std::time::Instant;

use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};

use super::auth::{Authn, User};
use super::http::{uuid, write_response, Request};
use super::server::Tls;
use super::{lock, Logged, Shared};

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

fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    let mut s = serde_json::to_vec(&json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    }))
    .unwrap_or_default();
    s.push(b'\n');
    s
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
}

/// Answers one request on `out`; an error drops the connection.
pub fn handle(
    shared: &Shared,
    _conn: u64,
    certs: Option<&[CertificateDer<'static>]>,
    req: &Request,
    out: &mut Tls,
) -> io::Result<()> {
    let audit = uuid();
    let user = match shared
        .authn
        .authenticate(&shared.pki, certs, req.header("authorization"))
    {
        Authn::User(u) => u,
        Authn::Unauthorized => {
            log(shared, req, "", 401);
            let body = status_body(401, "Unauthorized", "Unauthorized");
            return write_response(out, 401, &audit, &[], &body);
        }
    };
    respond(shared, &user, req, &audit, out)
}

fn respond(
    shared: &Shared,
    user: &User,
    req: &Request,
    audit: &str,
    out: &mut Tls,
) -> io::Result<()> {
    if req.method == "GET" && (req.path == "/version" || req.path == "/version/") {
        log(shared, req, &user.name, 200);
        return write_response(out, 200, audit, &PF, version_body().as_bytes());
    }
    log(shared, req, &user.name, 404);
    let body = status_body(
        404,
        "NotFound",
        "the server could not find the requested resource",
    );
    write_response(out, 404, audit, &PF, &body)
}

#[allow(unused)]
fn unused(_: Value) {}
