//! Who a kubelet API request is from and whether it may do what it asks, as the
//! kubelet decides it (`pkg/kubelet/server/auth.go`).
//!
//! Authentication: a client certificate from the client CA names the user (subject CN)
//! and groups (subject O); otherwise, with `authentication.webhook.enabled`, a bearer
//! token is reviewed by the apiserver (TokenReview, cached by the token's SHA-256 for
//! `cacheTTL`; the token is never logged or kept); otherwise the request is
//! `system:anonymous` if anonymous requests are enabled, else 401.
//!
//! Authorization (`authorization.mode: Webhook`): a SubjectAccessReview for
//! `nodes/<subresource>` of this node with the verb of the method ([`attributes`]);
//! answers cached by their full attributes, allowed ones for `cacheAuthorizedTTL`,
//! denied ones for `cacheUnauthorizedTTL`. While the apiserver cannot be asked, cached
//! answers hold until they expire; then only the identities of
//! `holdfast.offlineAuthorization` are let in, and every refusal says why the apiserver
//! could not be asked. Never allow-all.
//!
//! Touches nothing but its caches and the apiserver (through [`review`]).

mod cache;
mod review;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use hyper::header::{HeaderMap, AUTHORIZATION};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::http::{error, Identity, Resp, User};
use super::x509::Subject;
use crate::config::{AuthorizationMode, ServerConfig};
use crate::kube::connect::SharedClient;
use crate::metrics;
use review::Answer;

/// How many answers each cache keeps, and how many refusals are remembered as logged.
const CACHE_ENTRIES: usize = 4096;
const LOGGED_REFUSALS: usize = 1024;
/// The most groups, extra keys and values per key a TokenReview may give a user.
const MAX_GROUPS: usize = 256;
const MAX_EXTRA: usize = 64;

const AUTHENTICATED: &str = "system:authenticated";

impl User {
    /// The user a client certificate names; an empty CN is no user (as in the kubelet).
    pub fn from_subject(subject: Subject) -> Result<User, String> {
        let name = subject
            .common_name
            .filter(|n| !n.is_empty())
            .ok_or("the client certificate's subject has no common name (CN)")?;
        let mut u = User {
            name,
            groups: subject.organizations,
            ..User::default()
        };
        u.add_authenticated();
        Ok(u)
    }

    fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..User::default()
        }
    }

    /// Every authenticated user is in `system:authenticated` (the kubelet's group
    /// adder).
    fn add_authenticated(&mut self) {
        if !self.groups.iter().any(|g| g == AUTHENTICATED) {
            self.groups.push(AUTHENTICATED.into());
        }
    }

    /// The user of a TokenReview's `status.user`, checked.
    fn from_review(user: &Value) -> Result<User, String> {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let name = text(&user["username"]).filter(|n| !n.is_empty());
        let name = name.ok_or("the token review named no user")?;
        let list = |v: &Value, max: usize, what: &str| -> Result<Vec<String>, String> {
            match v {
                Value::Null => Ok(Vec::new()),
                Value::Array(a) if a.len() <= max => a
                    .iter()
                    .map(|s| text(s).ok_or(format!("{what}: not a string")))
                    .collect(),
                _ => Err(format!("{what}: not a list of at most {max} strings")),
            }
        };
        let groups = list(&user["groups"], MAX_GROUPS, "groups")?;
        let mut extra = BTreeMap::new();
        match &user["extra"] {
            Value::Null => {}
            Value::Object(m) if m.len() <= MAX_EXTRA => {
                for (k, v) in m {
                    extra.insert(k.clone(), list(v, MAX_EXTRA, "extra")?);
                }
            }
            _ => return Err(format!("extra: not a map of at most {MAX_EXTRA} keys")),
        }
        let mut u = User {
            name,
            uid: text(&user["uid"]).unwrap_or_default(),
            groups,
            extra,
        };
        u.add_authenticated();
        Ok(u)
    }
}

/// What a request asks, in the authorizer's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    /// Asked in order; the first allowed lets the request in.
    pub subresources: Vec<&'static str>,
}

/// `path` is `prefix` or below it (the kubelet's `isSubpath`).
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The kubelet's mapping of a request to `nodes/<subresource>` attributes, with
/// KubeletFineGrainedAuthz (on by default since v1.33): `/pods`, `/runningpods`,
/// `/healthz`, `/configz` and `/statusz` ask their own subresource first and fall back
/// to `proxy`. The verb comes from the method alone: a websocket upgrade of `/exec`,
/// `/attach` or `/portForward` is a GET and is asked as `get`, as the v1.36 kubelet
/// does (which is why `get` on `nodes/proxy` is not read-only).
pub fn attributes(method: &Method, path: &str) -> Attributes {
    let verb = match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    let mut subresources = Vec::with_capacity(2);
    for (prefix, sub) in [
        ("/pods", "pods"),
        ("/healthz", "healthz"),
        ("/configz", "configz"),
        ("/statusz", "statusz"),
        ("/runningpods/", "pods"),
    ] {
        if is_subpath(path, prefix) {
            subresources.push(sub);
            break;
        }
    }
    subresources.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else {
        "proxy"
    });
    Attributes { verb, subresources }
}

/// The bearer token of an `Authorization` header, as the apiserver's bearer token
/// authenticator reads it.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[derive(Debug, Clone)]
enum TokenAnswer {
    User(Arc<User>),
    Invalid,
}

/// One authorization check's outcome.
enum Decision {
    Allowed,
    Denied,
    /// Not allowed because the apiserver could not be asked: why.
    Offline(String),
}

/// Delegated authentication and authorization for one node's kubelet API.
pub struct Auth {
    settings: ServerConfig,
    node: String,
    apiserver: review::Apiserver,
    tokens: cache::TtlCache<[u8; 32], TokenAnswer>,
    decisions: cache::TtlCache<[u8; 32], bool>,
    logged: cache::Once,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Auth {
    /// `client` is how the apiserver is reached (the agent's own); without it,
    /// every review "could not be asked".
    pub fn new(settings: &ServerConfig, node: &str, client: Option<SharedClient>) -> Arc<Auth> {
        Arc::new(Auth {
            settings: settings.clone(),
            node: node.to_owned(),
            apiserver: review::Apiserver::new(client),
            tokens: cache::TtlCache::new(CACHE_ENTRIES),
            decisions: cache::TtlCache::new(CACHE_ENTRIES),
            logged: cache::Once::new(LOGGED_REFUSALS),
        })
    }

    /// Authenticates and authorizes one request of the secure port; the refusal (401
    /// or 403) is the response.
    pub async fn admit(
        &self,
        identity: &Identity,
        method: &Method,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<Arc<User>, Resp> {
        let t0 = Instant::now();
        let user = self.authenticate(identity, headers).await?;
        metrics::KUBELET_API_REQUESTS_BY_USER.inc(&user.name);
        if self.settings.authorization == AuthorizationMode::Webhook {
            self.authorize(&user, method, path).await?;
        }
        metrics::KUBELET_API_AUTH_DURATION.observe(t0.elapsed());
        Ok(user)
    }

    async fn authenticate(
        &self,
        identity: &Identity,
        headers: &HeaderMap,
    ) -> Result<Arc<User>, Resp> {
        let why = match identity {
            Identity::Client(u) => return Ok(u.clone()),
            Identity::Anonymous(why) => why,
        };
        if self.settings.token_webhook {
            if let Some(token) = bearer(headers) {
                return self.review_token(token).await;
            }
        }
        if self.settings.anonymous {
            return Ok(Arc::new(User::anonymous()));
        }
        // The kubelet says only "Unauthorized"; what was wrong with the certificate
        // saves its operator a packet capture.
        Err(match why {
            Some(why) => error(StatusCode::UNAUTHORIZED, &format!("Unauthorized: {why}")),
            None => error(StatusCode::UNAUTHORIZED, "Unauthorized"),
        })
    }

    async fn review_token(&self, token: &str) -> Result<Arc<User>, Resp> {
        let key = digest(token.as_bytes());
        let unauthorized = || error(StatusCode::UNAUTHORIZED, "Unauthorized");
        if let Some(answer) = self.tokens.get(&key, Instant::now()) {
            metrics::KUBELET_API_TOKEN_CACHE.inc("hit");
            return match answer {
                TokenAnswer::User(u) => Ok(u),
                TokenAnswer::Invalid => Err(unauthorized()),
            };
        }
        metrics::KUBELET_API_TOKEN_CACHE.inc("miss");
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let ttl = self.settings.token_cache_ttl;
        match self.apiserver.post(review::TOKEN_REVIEWS, body).await {
            Answer::Got(review) => {
                let status = &review["status"];
                let answer = if status["authenticated"] == Value::Bool(true) {
                    match User::from_review(&status["user"]) {
                        Ok(u) => TokenAnswer::User(Arc::new(u)),
                        Err(why) => {
                            self.log_once(
                                "token",
                                &format!("a token review was not usable: {why}"),
                            );
                            TokenAnswer::Invalid
                        }
                    }
                } else {
                    TokenAnswer::Invalid
                };
                self.tokens.insert(key, answer.clone(), ttl, Instant::now());
                match answer {
                    TokenAnswer::User(u) => Ok(u),
                    TokenAnswer::Invalid => Err(unauthorized()),
                }
            }
            Answer::Refused(why) => {
                self.log_once(
                    "token",
                    &format!("the apiserver refused a TokenReview: {why}"),
                );
                Err(unauthorized())
            }
            Answer::Unreachable(why) => Err(error(
                StatusCode::UNAUTHORIZED,
                &format!(
                    "Unauthorized: the bearer token could not be checked: the apiserver could \
                     not be asked ({why})"
                ),
            )),
        }
    }

    async fn authorize(&self, user: &User, method: &Method, path: &str) -> Result<(), Resp> {
        let attrs = attributes(method, path);
        let mut offline = None;
        for sub in &attrs.subresources {
            match self.decide(user, attrs.verb, sub).await {
                Decision::Allowed => return Ok(()),
                Decision::Denied => {}
                Decision::Offline(why) => offline = Some(why),
            }
        }
        let subresource = match attrs.subresources.as_slice() {
            [one] => format!("subresource={one}"),
            many => format!("subresource(s)=[{}]", many.join(" ")),
        };
        let forbidden = format!(
            "Forbidden (user={}, verb={}, resource=nodes, {subresource})",
            user.name, attrs.verb
        );
        let message = match &offline {
            None => forbidden,
            Some(why) => format!(
                "{forbidden}: the apiserver could not be asked ({why}); until it can, only the \
                 offline policy (holdfast.offlineAuthorization) is let in: users {:?}, groups {:?}",
                self.settings.offline.users, self.settings.offline.groups
            ),
        };
        let kind = if offline.is_some() {
            "offline"
        } else {
            "denied"
        };
        self.log_once(
            &format!("{}\0{kind}\0{}\0{subresource}", user.name, attrs.verb),
            &format!("kubelet API: refused: {message}"),
        );
        Err(error(StatusCode::FORBIDDEN, &message))
    }

    async fn decide(&self, user: &User, verb: &str, subresource: &str) -> Decision {
        let mut spec = json!({
            "user": user.name,
            "groups": user.groups,
            "resourceAttributes": {
                "verb": verb,
                "version": "v1",
                "resource": "nodes",
                "subresource": subresource,
                "name": self.node,
            },
        });
        if !user.uid.is_empty() {
            spec["uid"] = json!(user.uid);
        }
        if !user.extra.is_empty() {
            spec["extra"] = json!(user.extra);
        }
        let key = digest(spec.to_string().as_bytes());
        let count = |allowed: bool| {
            metrics::KUBELET_API_AUTHZ_DECISIONS.inc(if allowed { "allowed" } else { "denied" });
            if allowed {
                Decision::Allowed
            } else {
                Decision::Denied
            }
        };
        if let Some(allowed) = self.decisions.get(&key, Instant::now()) {
            metrics::KUBELET_API_AUTHZ_CACHE.inc("hit");
            return count(allowed);
        }
        metrics::KUBELET_API_AUTHZ_CACHE.inc("miss");
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        });
        match self.apiserver.post(review::ACCESS_REVIEWS, body).await {
            Answer::Got(review) => {
                let allowed = review["status"]["allowed"] == Value::Bool(true);
                let ttl = if allowed {
                    self.settings.authorized_ttl
                } else {
                    self.settings.unauthorized_ttl
                };
                self.decisions.insert(key, allowed, ttl, Instant::now());
                count(allowed)
            }
            Answer::Refused(why) => {
                self.log_once(
                    &format!("sar\0{why}"),
                    &format!("kubelet API: the apiserver refused a SubjectAccessReview: {why}"),
                );
                count(false)
            }
            Answer::Unreachable(why) => {
                let policy = &self.settings.offline;
                let listed = policy.users.contains(&user.name)
                    || user.groups.iter().any(|g| policy.groups.contains(g));
                if listed {
                    metrics::KUBELET_API_AUTHZ_DECISIONS.inc("offline_allowed");
                    Decision::Allowed
                } else {
                    metrics::KUBELET_API_AUTHZ_DECISIONS.inc("offline_denied");
                    Decision::Offline(why)
                }
            }
        }
    }

    fn log_once(&self, key: &str, line: &str) {
        if self.logged.first(key) {
            log::warn!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs(method: Method, path: &str) -> (&'static str, Vec<&'static str>) {
        let a = attributes(&method, path);
        (a.verb, a.subresources)
    }

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        assert_eq!(subs(Method::GET, "/pods"), ("get", vec!["pods", "proxy"]));
        assert_eq!(subs(Method::GET, "/pods/"), ("get", vec!["pods", "proxy"]));
        assert_eq!(subs(Method::GET, "/podsx"), ("get", vec!["proxy"]));
        assert_eq!(
            subs(Method::GET, "/runningpods/"),
            ("get", vec!["pods", "proxy"])
        );
        assert_eq!(
            subs(Method::GET, "/healthz"),
            ("get", vec!["healthz", "proxy"])
        );
        assert_eq!(
            subs(Method::GET, "/configz"),
            ("get", vec!["configz", "proxy"])
        );
        assert_eq!(subs(Method::GET, "/stats/summary"), ("get", vec!["stats"]));
        assert_eq!(
            subs(Method::POST, "/stats/summary"),
            ("create", vec!["stats"])
        );
        assert_eq!(subs(Method::GET, "/metrics"), ("get", vec!["metrics"]));
        assert_eq!(
            subs(Method::GET, "/metrics/resource"),
            ("get", vec!["metrics"])
        );
        assert_eq!(subs(Method::GET, "/metricsx"), ("get", vec!["proxy"]));
        assert_eq!(subs(Method::GET, "/logs/syslog"), ("get", vec!["log"]));
        assert_eq!(
            subs(Method::GET, "/containerLogs/ns/p/c"),
            ("get", vec!["proxy"])
        );
        // A websocket exec is a GET: `get`, as the v1.36 kubelet asks it.
        assert_eq!(subs(Method::GET, "/exec/ns/p/c"), ("get", vec!["proxy"]));
        assert_eq!(
            subs(Method::POST, "/exec/ns/p/c"),
            ("create", vec!["proxy"])
        );
        assert_eq!(subs(Method::POST, "/run/ns/p/c"), ("create", vec!["proxy"]));
        assert_eq!(
            subs(Method::POST, "/portForward/ns/p"),
            ("create", vec!["proxy"])
        );
        assert_eq!(subs(Method::PUT, "/x"), ("update", vec!["proxy"]));
        assert_eq!(subs(Method::PATCH, "/x"), ("patch", vec!["proxy"]));
        assert_eq!(subs(Method::DELETE, "/x"), ("delete", vec!["proxy"]));
        assert_eq!(subs(Method::HEAD, "/metrics"), ("get", vec!["metrics"]));
    }

    #[test]
    fn bearer_tokens_as_the_apiserver_reads_them() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(AUTHORIZATION, v.parse().expect("header"));
            m
        };
        assert_eq!(bearer(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&h("bearer abc extra")), Some("abc"));
        assert_eq!(bearer(&h("Basic abc")), None);
        assert_eq!(bearer(&h("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn users_from_certificates_and_reviews() {
        let u = User::from_subject(Subject {
            common_name: Some("system:node:other".into()),
            organizations: vec!["system:nodes".into()],
        })
        .expect("user");
        assert_eq!(u.groups, vec!["system:nodes", "system:authenticated"]);
        assert!(User::from_subject(Subject::default()).is_err());
        let r = User::from_review(&json!({
            "username": "system:serviceaccount:ns:sa", "uid": "u1",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        }))
        .expect("user");
        assert_eq!(r.groups.len(), 2);
        assert_eq!(r.uid, "u1");
        assert!(User::from_review(&json!({"username": ""})).is_err());
        let many: Vec<String> = (0..=MAX_GROUPS).map(|i| i.to_string()).collect();
        assert!(User::from_review(&json!({"username": "a", "groups": many})).is_err());
        assert!(User::from_review(&json!({"username": "a", "groups": [1]})).is_err());
    }

    fn request(
        auth: &Auth,
        identity: Identity,
        method: Method,
        path: &str,
    ) -> Result<u16, (u16, String)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(auth.admit(&identity, &method, &HeaderMap::new(), path))
            .map(|_| 200)
            .map_err(|r| {
                let status = r.status().as_u16();
                let body = match r.into_body() {
                    super::super::http::Body::Full(Some(b)) => {
                        String::from_utf8_lossy(&b).into_owned()
                    }
                    _ => String::new(),
                };
                (status, body)
            })
    }

    #[test]
    fn without_an_apiserver_only_the_offline_policy_is_let_in() {
        let settings = ServerConfig {
            authorization: AuthorizationMode::Webhook,
            ..ServerConfig::default()
        };
        let auth = Auth::new(&settings, "n1", None);
        let cert = |cn: &str, o: &str| {
            Identity::Client(Arc::new(
                User::from_subject(Subject {
                    common_name: Some(cn.into()),
                    organizations: vec![o.into()],
                })
                .expect("user"),
            ))
        };
        let admin = cert("alice", "system:masters");
        assert_eq!(request(&auth, admin, Method::POST, "/exec/ns/p/c"), Ok(200));
        let apiserver = cert("kube-apiserver-kubelet-client", "kubeadm:cluster-admins");
        assert_eq!(request(&auth, apiserver, Method::GET, "/pods"), Ok(200));
        let (code, body) = request(
            &auth,
            cert("system:node:other", "system:nodes"),
            Method::GET,
            "/pods",
        )
        .expect_err("refused");
        assert_eq!(code, 403);
        assert!(
            body.starts_with(
                "Forbidden (user=system:node:other, verb=get, resource=nodes, \
                 subresource(s)=[pods proxy]): the apiserver could not be asked (this node has no kubeconfig)"
            ),
            "{body}"
        );
        let (code, body) =
            request(&auth, Identity::Anonymous(None), Method::GET, "/pods").expect_err("refused");
        assert_eq!((code, body.as_str()), (401, "Unauthorized\n"));
    }
}
