//! Error replies as kube-apiserver writes them: a compact `Status` with keys in Go's
//! field order and a trailing newline (fixture README, semantics 1).

use serde_json::{json, Value};

use super::store::Res;

/// One `details.causes[]` entry.
#[derive(Debug, Clone)]
pub struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

/// `details` of a failure Status.
#[derive(Debug, Clone, Default)]
pub struct Details {
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: String,
    pub causes: Vec<Cause>,
}

/// A failed request.
#[derive(Debug, Clone)]
pub struct ApiErr {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<Details>>,
    /// `X-Content-Type-Options: nosniff` (authorization denials only).
    pub nosniff: bool,
    /// `metadata.continue` (410 on a too-old continue token).
    pub continue_token: Option<String>,
}

fn s(v: &str) -> String {
    Value::from(v).to_string()
}

impl ApiErr {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiErr {
        ApiErr {
            code,
            reason,
            message: message.into(),
            details: None,
            nosniff: false,
            continue_token: None,
        }
    }

    fn with_details(mut self, res: Res, name: &str, kind: &str) -> ApiErr {
        self.details = Some(Box::new(Details {
            name: (!name.is_empty()).then(|| name.to_string()),
            group: (!res.group().is_empty()).then(|| res.group().to_string()),
            kind: kind.to_string(),
            causes: Vec::new(),
        }));
        self
    }

    /// The compact JSON body, newline included.
    pub fn body(&self) -> Vec<u8> {
        let mut out = String::from("{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{");
        if let Some(c) = &self.continue_token {
            out.push_str(&format!("\"continue\":{}", s(c)));
        }
        out.push_str(&format!(
            "}},\"status\":\"Failure\",\"message\":{},\"reason\":{}",
            s(&self.message),
            s(self.reason)
        ));
        if let Some(d) = &self.details {
            let mut parts = Vec::new();
            if let Some(n) = &d.name {
                parts.push(format!("\"name\":{}", s(n)));
            }
            if let Some(g) = &d.group {
                parts.push(format!("\"group\":{}", s(g)));
            }
            if !d.kind.is_empty() {
                parts.push(format!("\"kind\":{}", s(&d.kind)));
            }
            if !d.causes.is_empty() {
                let causes: Vec<String> = d
                    .causes
                    .iter()
                    .map(|c| {
                        format!(
                            "{{\"reason\":{},\"message\":{},\"field\":{}}}",
                            s(c.reason),
                            s(&c.message),
                            s(&c.field)
                        )
                    })
                    .collect();
                parts.push(format!("\"causes\":[{}]", causes.join(",")));
            }
            out.push_str(&format!(",\"details\":{{{}}}", parts.join(",")));
        }
        out.push_str(&format!(",\"code\":{}}}\n", self.code));
        out.into_bytes()
    }

    /// The Status as a JSON value (for ERROR watch events), keys in the same order
    /// when serialised by hand with `event_json`.
    pub fn event_object(&self) -> String {
        let body = String::from_utf8_lossy(&self.body()).into_owned();
        body.trim_end().to_string()
    }
}

/// `pods`, `leases.coordination.k8s.io`.
pub fn qualified(res: Res) -> String {
    if res.group().is_empty() {
        res.plural().to_string()
    } else {
        format!("{}.{}", res.plural(), res.group())
    }
}

pub fn unauthorized() -> ApiErr {
    ApiErr::new(401, "Unauthorized", "Unauthorized")
}

pub fn not_found(res: Res, name: &str) -> ApiErr {
    ApiErr::new(
        404,
        "NotFound",
        format!("{} {name:?} not found", qualified(res)),
    )
    .with_details(res, name, res.plural())
}

pub fn already_exists(res: Res, name: &str) -> ApiErr {
    ApiErr::new(
        409,
        "AlreadyExists",
        format!("{} {name:?} already exists", qualified(res)),
    )
    .with_details(res, name, res.plural())
}

/// 409 for a stale resourceVersion.
pub fn conflict(res: Res, name: &str) -> ApiErr {
    ApiErr::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} {name:?}: the object has been modified; \
             please apply your changes to the latest version and try again",
            qualified(res)
        ),
    )
    .with_details(res, name, res.plural())
}

/// 409 for a delete precondition that does not hold (details.kind is the Kind).
pub fn precondition_failed(res: Res, name: &str, what: &str, want: &str, have: &str) -> ApiErr {
    let tail = if what == "UID" {
        "The object might have been deleted and then recreated"
    } else {
        "The object might have been modified"
    };
    ApiErr::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} {name:?}: the {what} in the precondition \
             ({want}) does not match the {what} in record ({have}). {tail}",
            res.kind()
        ),
    )
    .with_details(res, name, res.kind())
}

/// 403 from an authorizer: `nosniff`, message built like RBAC's.
pub fn forbidden_authz(
    res: Res,
    name: &str,
    user: &str,
    verb: &str,
    subresource: &str,
    namespace: &str,
    reason: &str,
) -> ApiErr {
    let resource = if subresource.is_empty() {
        res.plural().to_string()
    } else {
        format!("{}/{subresource}", res.plural())
    };
    let scope = if namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {namespace:?}")
    };
    let mut why = format!(
        "User {user:?} cannot {verb} resource {resource:?} in API group {:?} {scope}",
        res.group()
    );
    if !reason.is_empty() {
        why.push_str(": ");
        why.push_str(reason);
    }
    let mut e = forbidden(res, name, &why);
    e.nosniff = true;
    e
}

/// 403 from admission (NodeRestriction): no `nosniff`.
pub fn forbidden(res: Res, name: &str, why: &str) -> ApiErr {
    let subject = if name.is_empty() {
        qualified(res)
    } else {
        format!("{} {name:?}", qualified(res))
    };
    ApiErr::new(403, "Forbidden", format!("{subject} is forbidden: {why}")).with_details(
        res,
        name,
        res.plural(),
    )
}

/// 422 with field causes (details.kind is the Kind).
pub fn invalid(res: Res, name: &str, causes: Vec<Cause>) -> ApiErr {
    let mut seen: Vec<String> = Vec::new();
    for c in &causes {
        let line = format!("{}: {}", c.field, c.message);
        if !seen.contains(&line) {
            seen.push(line);
        }
    }
    let list = if seen.len() == 1 {
        seen[0].clone()
    } else {
        format!("[{}]", seen.join(", "))
    };
    let mut e = ApiErr::new(
        422,
        "Invalid",
        format!("{} {name:?} is invalid: {list}", res.kind()),
    )
    .with_details(res, name, res.kind());
    if let Some(d) = e.details.as_mut() {
        d.causes = causes;
    }
    e
}

pub fn bad_request(message: impl Into<String>) -> ApiErr {
    ApiErr::new(400, "BadRequest", message)
}

pub fn method_not_allowed() -> ApiErr {
    ApiErr::new(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

pub fn unsupported_media_type(ct: &str) -> ApiErr {
    ApiErr::new(
        415,
        "UnsupportedMediaType",
        format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ct:?})"),
    )
}

pub fn route_not_found() -> ApiErr {
    ApiErr::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    .with_details(Res::Pods, "", "")
}

/// A failure injected by the test (`Fault::Status`).
pub fn injected(code: u16) -> ApiErr {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    };
    ApiErr::new(code, reason, format!("injected failure ({code})"))
}

/// `{"type":..,"object":..}` with the object serialised as given.
pub fn event_json(ty: &str, object: &str) -> String {
    format!("{{\"type\":{},\"object\":{object}}}\n", s(ty))
}

pub fn to_compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| json!({}).to_string())
}
