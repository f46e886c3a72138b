//! The apiserver client: one `ureq` agent over rustls, trusting the cluster CA only,
//! authenticating with a client certificate or a bearer token from the kubeconfig.
//! Blocking: callers run it on threads of their own, never on the sync loop.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;
use serde::de::DeserializeOwned;
use serde::Serialize;
use ureq::http::{Request, Response};
use ureq::{Agent, Body};

use super::credentials::{BearerToken, TOKEN_FILE_PERIOD};
use super::endpoints::{self, Endpoints};
use super::error::ApiError;
use super::kubeconfig::{Kubeconfig, KubeconfigError};
use super::tls::{self, TlsConnector};
pub use super::watch::{Watch, MAX_BODY};
pub use crate::wire::user_agent;

/// How long a connection (TCP and TLS handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an ordinary request may take, body included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How a PATCH body is to be read by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patch {
    /// `application/strategic-merge-patch+json`: lists with a merge key (conditions by
    /// `type`, container statuses by `name`) merge element by element.
    Strategic,
    /// `application/merge-patch+json` (RFC 7386): lists are replaced whole.
    Merge,
}

impl Patch {
    pub fn content_type(self) -> &'static str {
        match self {
            Patch::Strategic => "application/strategic-merge-patch+json",
            Patch::Merge => "application/merge-patch+json",
        }
    }
}

/// A handle on the apiserver. Cheap to clone; clones share connections and counters.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Replaced by a fresh one when the link is back after an outage.
    agent: RwLock<Agent>,
    /// Replaced (with a fresh session cache) when the client certificate is swapped, so
    /// no handshake resumes a session made with the old certificate.
    tls: RwLock<Arc<rustls::ClientConfig>>,
    /// The client certificate the handshakes present, if the kubeconfig has one.
    cert: Option<Arc<tls::SwappableCert>>,
    tls_server_name: Option<rustls_pki_types::ServerName<'static>>,
    /// The kubeconfig's server and the others the config names: which one is in use.
    endpoints: Endpoints,
    /// How connections choose their proxy: the kubeconfig's `proxy-url`, or the node's
    /// rules.
    route: crate::proxy::Route,
    token: Option<BearerToken>,
    requests: AtomicU64,
}

impl Client {
    /// Reads the kubeconfig at `path` and builds a client for its current context.
    pub fn from_kubeconfig(path: &Path) -> Result<Client, KubeconfigError> {
        Client::new(&Kubeconfig::load(path)?)
    }

    /// [`Client::from_kubeconfig`], with more apiserver endpoints after the
    /// kubeconfig's server (see [`super::endpoints`]).
    pub fn from_kubeconfig_with(path: &Path, more: &[String]) -> Result<Client, KubeconfigError> {
        Client::with_endpoints(&Kubeconfig::load(path)?, more)
    }

    /// Builds a client for a loaded kubeconfig.
    pub fn new(kc: &Kubeconfig) -> Result<Client, KubeconfigError> {
        Client::with_endpoints(kc, &[])
    }

    /// [`Client::new`], with more apiserver endpoints after the kubeconfig's server,
    /// reached with its credentials and verified against its CA.
    pub fn with_endpoints(kc: &Kubeconfig, more: &[String]) -> Result<Client, KubeconfigError> {
        let (tls, cert) = tls::client_config_with(kc)?;
        let route = kc.proxy_route();
        let agent = make_agent(&tls, &kc.tls_server_name, &route);
        Ok(Client {
            inner: Arc::new(Inner {
                agent: RwLock::new(agent),
                tls: RwLock::new(tls),
                cert,
                tls_server_name: kc.tls_server_name.clone(),
                endpoints: Endpoints::new(&kc.server, more),
                route,
                token: kc
                    .token
                    .as_ref()
                    .map(|t| BearerToken::new(t, TOKEN_FILE_PERIOD)),
                requests: AtomicU64::new(0),
            }),
        })
    }

    /// Closes every connection, idle or in use (a watch blocked in a read returns with
    /// an error), and goes on with fresh ones. Called when the link is back after an
    /// outage: a connection from before may be dead without a word (its peer reset it
    /// while no packet could pass, or a NAT forgot it), and a watch reading on it would
    /// wait out its whole timeout. Each watch is opened again from where it was.
    pub fn reset_connections(&self) {
        let tls = self
            .inner
            .tls
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let fresh = make_agent(&tls, &self.inner.tls_server_name, &self.inner.route);
        let old = {
            let mut agent = self
                .inner
                .agent
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::replace(&mut *agent, fresh)
        };
        old.shutdown();
    }

    /// Presents a new client certificate from now on: every connection is closed and the
    /// session cache emptied, so the next request makes a full handshake with it. A
    /// client without a certificate (a token) cannot take one.
    pub fn set_client_certificate(&self, chain_pem: &str, key_pem: &str) -> Result<(), String> {
        let Some(cert) = &self.inner.cert else {
            return Err("this client authenticates without a certificate".to_string());
        };
        let chain = crate::tls::certificates(chain_pem.as_bytes())?;
        let key = crate::tls::private_key(key_pem.as_bytes())?;
        cert.swap(chain, key)
            .map_err(|e| format!("unusable certificate or key: {e}"))?;
        {
            let mut tls = self
                .inner
                .tls
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut fresh = (**tls).clone();
            fresh.resumption = rustls::client::Resumption::default();
            *tls = Arc::new(fresh);
        }
        self.reset_connections();
        Ok(())
    }

    /// The validity of the client certificate now presented, if there is one.
    pub fn client_certificate_validity(&self) -> Option<crate::tls::der::Validity> {
        let leaf = self.inner.cert.as_ref()?.leaf()?;
        crate::tls::der::validity(&leaf).ok()
    }

    fn agent(&self) -> Agent {
        self.inner
            .agent
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Bytes ureq reads a connection's response into (ureq's default is 128 KiB): the
/// headers must fit; bodies, a watch's long lines too, stream through it.
const INPUT_BUFFER: usize = 32 * 1024;

/// Bytes ureq writes a request's headers and body out of (ureq's default is 128 KiB,
/// every page touched per connection): headers with a bearer token fit many times.
const OUTPUT_BUFFER: usize = 16 * 1024;

/// How long an idle connection is kept for the next request (ureq's default is 15 s):
/// over the renewal interval a user may set (the kubelet's 10 s, 20 s, 40 s), so that
/// each renewal does not pay a TLS handshake (benches/uplink_bytes.rs), and under the
/// minutes a cellular NAT keeps an idle flow.
const IDLE_AGE: Duration = Duration::from_secs(60);

/// The ureq agent for the apiserver: its TLS, no redirects, its proxy, the timeouts.
fn make_agent(
    tls: &Arc<rustls::ClientConfig>,
    tls_server_name: &Option<rustls_pki_types::ServerName<'static>>,
    route: &crate::proxy::Route,
) -> Agent {
    let config = crate::proxy::agent_config()
        .accept("application/json")
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(Some(REQUEST_TIMEOUT))
        .input_buffer_size(INPUT_BUFFER)
        .output_buffer_size(OUTPUT_BUFFER)
        .max_idle_age(IDLE_AGE)
        .build();
    let tls = TlsConnector::new(tls.clone(), tls_server_name.clone()).describing(tls::describe);
    crate::proxy::agent(config, route.clone(), tls)
}

impl Client {
    /// The URL of the apiserver endpoint in use, for log lines and `holdfast status`.
    pub fn server(&self) -> String {
        self.inner.endpoints.current().1.to_string()
    }

    /// The endpoint in use: its place in the list (0: the kubeconfig's server) and how
    /// many there are.
    pub fn server_place(&self) -> (usize, usize) {
        (self.inner.endpoints.current().0, self.inner.endpoints.len())
    }

    /// Every endpoint, the kubeconfig's server first.
    pub fn servers(&self) -> Vec<String> {
        let e = &self.inner.endpoints;
        (0..e.len()).map(|at| e.url(at).to_string()).collect()
    }

    /// How many requests this client (and its clones) has sent, watches included.
    pub fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// GET `path` (path and query, e.g. `/api/v1/nodes/n1`).
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let (response, _) = self.send("GET", path, None, None)?;
        self.read("GET", path, response)
    }

    /// POST `body` as JSON.
    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        let body = encode("POST", path, body)?;
        let (response, _) = self.send("POST", path, Some(("application/json", body)), None)?;
        self.read("POST", path, response)
    }

    /// PUT `body` as JSON.
    pub fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        let body = encode("PUT", path, body)?;
        let (response, _) = self.send("PUT", path, Some(("application/json", body)), None)?;
        self.read("PUT", path, response)
    }

    /// PATCH with `body` read as `kind`.
    pub fn patch<T: DeserializeOwned>(
        &self,
        path: &str,
        kind: Patch,
        body: &serde_json::Value,
    ) -> Result<T, ApiError> {
        let body = encode("PATCH", path, body)?;
        let (response, _) = self.send("PATCH", path, Some((kind.content_type(), body)), None)?;
        self.read("PATCH", path, response)
    }

    /// DELETE with `options` as the body.
    pub fn delete<T: DeserializeOwned>(
        &self,
        path: &str,
        options: &DeleteOptions,
    ) -> Result<T, ApiError> {
        let body = encode("DELETE", path, options)?;
        let (response, _) = self.send("DELETE", path, Some(("application/json", body)), None)?;
        self.read("DELETE", path, response)
    }

    /// Opens a watch (`path` carries `watch=true`, `resourceVersion`, `timeoutSeconds`);
    /// `timeout` bounds how long the body may take, a little beyond `timeoutSeconds`.
    pub fn watch<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<Watch<T>, ApiError> {
        let (response, server) = self.send("GET", path, None, Some(timeout))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let (_, mut body) = response.into_parts();
            return Err(error_status("GET", path, status, &mut body));
        }
        let (_, body) = response.into_parts();
        Ok(Watch::new(Box::new(body.into_reader()), path, &server))
    }

    /// Sends the request to the endpoint in use; where it meets trouble there, the next
    /// endpoint is in use from then on, and is sent the same request at once when that
    /// is safe (see [`super::endpoints`]), each endpoint once at most. Returns the answer
    /// and the endpoint that gave it.
    fn send(
        &self,
        method: &'static str,
        path: &str,
        mut body: Option<(&'static str, Vec<u8>)>,
        watch: Option<Duration>,
    ) -> Result<(Response<Body>, String), ApiError> {
        let transport = |message: String| ApiError::Transport {
            method,
            path: path.to_string(),
            message,
        };
        if !path.starts_with('/') {
            return Err(transport(format!("path {path:?} does not start with /")));
        }
        let endpoints = &self.inner.endpoints;
        let mut left = endpoints.len();
        loop {
            left -= 1;
            let (at, server) = endpoints.current();
            let server = server.to_string();
            // Only a request that may go to another endpoint keeps a copy of its body.
            let once = if left == 0 { body.take() } else { body.clone() };
            let result = self.send_once(&server, method, path, once, watch)?;
            let trouble = match &result {
                Ok(response) => {
                    // Answered, whatever the code: the apiserver saw it and its audit
                    // log has it (or what stands in front of it answered for it).
                    crate::metrics::API_REQUESTS.inc();
                    endpoints::status_trouble(response.status().as_u16())
                }
                Err(e) => endpoints::transport_trouble(e),
            };
            let result = result.map_err(|e| tls::describe_transport(&server, e));
            let Some(trouble) = trouble else {
                if result.is_ok() {
                    endpoints.answered(at);
                }
                return result.map(|r| (r, server)).map_err(transport);
            };
            if endpoints.len() == 1 {
                return result.map(|r| (r, server)).map_err(transport);
            }
            let resend = left > 0 && trouble.resend(method);
            let result = match result {
                Ok(response) if resend => Err(answer_in_words(&server, response)),
                other => other,
            };
            let what = match &result {
                Ok(response) => format!("{server}: answered {}", response.status()),
                Err(message) => message.clone(),
            };
            self.move_on(at, method, path, &what);
            if !resend {
                return result.map(|r| (r, server)).map_err(transport);
            }
        }
    }

    /// The endpoint at `at` met trouble (`what`): the next one is in use from now on,
    /// on fresh connections, so the watches on the old ones end and are opened there.
    fn move_on(&self, at: usize, method: &str, path: &str, what: &str) {
        let endpoints = &self.inner.endpoints;
        let Some((next, was_answering)) = endpoints.failed(at) else {
            return;
        };
        let line = format!(
            "{method} {path}: {what}; apiserver {} in use from now on",
            endpoints.url(next)
        );
        if was_answering {
            log::warn!("{line}");
        } else {
            log::info!("{line}");
        }
        self.reset_connections();
    }

    /// One exchange with `server`; the outer error is the request's own fault.
    fn send_once(
        &self,
        server: &str,
        method: &'static str,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
        watch: Option<Duration>,
    ) -> Result<Result<Response<Body>, ureq::Error>, ApiError> {
        let transport = |message: String| ApiError::Transport {
            method,
            path: path.to_string(),
            message,
        };
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{server}{path}"));
        if let Some(token) = &self.inner.token {
            builder = builder.header("Authorization", token.header());
        }
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        let agent = &self.agent();
        let result = match body {
            Some((content_type, bytes)) => {
                let request = builder
                    .header("Content-Type", content_type)
                    .body(bytes)
                    .map_err(|e| transport(format!("invalid request: {e}")))?;
                agent.run(request)
            }
            None => {
                let request = builder
                    .body(())
                    .map_err(|e| transport(format!("invalid request: {e}")))?;
                match watch {
                    // A watch lasts as long as the server keeps it open, up to `timeout`.
                    Some(timeout) => agent.run(
                        agent
                            .configure_request(request)
                            .timeout_global(None)
                            .timeout_recv_response(Some(REQUEST_TIMEOUT))
                            .timeout_recv_body(Some(timeout))
                            .build(),
                    ),
                    None => agent.run(request),
                }
            }
        };
        Ok(result)
    }

    fn read<T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        response: Response<Body>,
    ) -> Result<T, ApiError> {
        let status = response.status().as_u16();
        let (_, mut body) = response.into_parts();
        if !(200..300).contains(&status) {
            return Err(error_status(method, path, status, &mut body));
        }
        let bytes = body
            .with_config()
            .limit(MAX_BODY as u64)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(n) => ApiError::Decode {
                    method,
                    path: path.to_string(),
                    message: format!("body larger than {n} bytes"),
                },
                e => ApiError::Transport {
                    method,
                    path: path.to_string(),
                    message: self.describe(e),
                },
            })?;
        serde_json::from_slice(&bytes).map_err(|e| ApiError::Decode {
            method,
            path: path.to_string(),
            message: e.to_string(),
        })
    }

    /// A ureq error in words: TLS failures as `tls` put them, the rest with the server.
    fn describe(&self, e: ureq::Error) -> String {
        tls::describe_transport(&self.server(), e)
    }
}

fn encode<B: Serialize + ?Sized>(
    method: &'static str,
    path: &str,
    body: &B,
) -> Result<Vec<u8>, ApiError> {
    // Serialising our own typed objects fails only on a non-string map key; say so
    // instead of sending half a body.
    let failed = |e: serde_json::Error| ApiError::Decode {
        method,
        path: path.to_string(),
        message: format!("request body: {e}"),
    };
    let mut value = serde_json::to_value(body).map_err(failed)?;
    // Times taken before the wall clock was set are corrected here, or left out: no
    // 1970 time reaches the cluster as if it were real.
    let fixed = crate::time::wire_times(&mut value);
    if fixed.omitted > 0 {
        log::debug!(
            "{method} {path}: {} time(s) left out, taken before the clock was set",
            fixed.omitted
        );
    }
    serde_json::to_vec(&value).map_err(failed)
}

/// An answer that is not the apiserver's, in words for the log before the request goes
/// to the next endpoint: its code and the start of its body.
fn answer_in_words(server: &str, response: Response<Body>) -> String {
    use std::io::Read;
    let status = response.status();
    let mut start = Vec::new();
    let _ = response
        .into_body()
        .into_reader()
        .take(200)
        .read_to_end(&mut start);
    let text = String::from_utf8_lossy(&start);
    format!("{server}: answered {status}: {:?}", text.trim())
}

/// The error a non-2xx answer carries. A body that cannot be read still leaves the code.
fn error_status(method: &'static str, path: &str, status: u16, body: &mut Body) -> ApiError {
    let bytes = body
        .with_config()
        .limit(MAX_BODY as u64)
        .read_to_vec()
        .unwrap_or_default();
    ApiError::from_status(method, path, status, &bytes)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    #[test]
    fn client_and_watch_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Client>();
        send::<Watch<Pod>>();
    }

    #[test]
    fn user_agent_names_the_go_architecture() {
        let ua = user_agent();
        assert!(ua.starts_with(&format!("holdfast/{} (linux/", env!("CARGO_PKG_VERSION"))));
        let arch = ua
            .trim_end_matches(')')
            .rsplit('/')
            .next()
            .unwrap_or_default();
        assert!(
            ["amd64", "arm64", "arm", "386"].contains(&arch) || !arch.contains('_'),
            "{ua}"
        );
        #[cfg(target_arch = "x86_64")]
        assert!(ua.ends_with("(linux/amd64)"), "{ua}");
        #[cfg(target_arch = "aarch64")]
        assert!(ua.ends_with("(linux/arm64)"), "{ua}");
    }
}
