//! HTTP to registries: one ureq agent per endpoint, over the shared rustls connector with
//! the system's CA bundle plus the endpoint's own CA and client certificate. Redirects
//! (blob storage, a CDN) are followed here, not by ureq, so that the `Authorization`
//! header never goes to another origin, nor to any hop after one that left it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rustls::ClientConfig;
use ureq::http::{Request, Response};
use ureq::{Agent, Body};

use super::hosts::Endpoint;
use super::redirect::{host_of, origin, redirect_target};
use super::RegistryError;
use crate::proxy::Route;
use crate::tls::{TlsConnector, TlsFailure};

/// How long a connection (TCP and TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the response head may take.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;

/// The HTTP side of the registry client. Cheap to share; agents keep their connections.
pub(crate) struct Http {
    agents: Mutex<HashMap<Endpoint, Agent>>,
    /// For hosts a redirect leads to: the system's roots only.
    plain_agent: OnceLock<Result<Agent, String>>,
}

/// One request's settings.
pub(crate) struct Call<'a> {
    pub method: &'static str,
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    /// `Authorization` value, sent to the endpoint's own host only.
    pub auth: Option<&'a str>,
    /// How long the body may take to arrive, when it is read.
    pub body_timeout: Option<Duration>,
}

impl Http {
    pub(crate) fn new() -> Http {
        Http {
            agents: Mutex::new(HashMap::new()),
            plain_agent: OnceLock::new(),
        }
    }

    fn agent(&self, ep: &Endpoint) -> Result<Agent, RegistryError> {
        let mut agents = self.agents.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = agents.get(ep) {
            return Ok(a.clone());
        }
        let config = tls_config(ep).map_err(|reason| RegistryError::Config { reason })?;
        let agent = build_agent(config);
        agents.insert(ep.clone(), agent.clone());
        Ok(agent)
    }

    fn redirect_agent(&self) -> Result<Agent, RegistryError> {
        self.plain_agent
            .get_or_init(|| {
                let roots = crate::tls::system_roots();
                ClientConfig::builder_with_provider(crate::tls::provider())
                    .with_protocol_versions(rustls::ALL_VERSIONS)
                    .map(|b| {
                        build_agent(Arc::new(
                            b.with_root_certificates(roots).with_no_client_auth(),
                        ))
                    })
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|reason| RegistryError::Config { reason })
    }

    /// Sends `call` to `ep`, following redirects hop by hop. The `Authorization` goes
    /// only to the origin (scheme, host and port) of `call.url`, and to no hop after
    /// the first one that left it: a token service or a registry that redirects
    /// elsewhere must not hand the credentials on. The answer may be any status.
    pub(crate) fn send(
        &self,
        ep: &Endpoint,
        call: &Call<'_>,
    ) -> Result<Response<Body>, RegistryError> {
        let home = origin(&call.url);
        let mut url = call.url.clone();
        let mut at_home = true;
        for _ in 0..=MAX_REDIRECTS {
            at_home = at_home && origin(&url) == home;
            let agent = if at_home {
                self.agent(ep)?
            } else {
                self.redirect_agent()?
            };
            let request = build_request(call, &url, at_home)?;
            let request = agent
                .configure_request(request)
                .timeout_recv_body(call.body_timeout)
                .build();
            let response = agent.run(request).map_err(|e| transport(&url, e))?;
            let status = response.status().as_u16();
            if !matches!(status, 301 | 302 | 303 | 307 | 308) {
                return Ok(response);
            }
            let next = redirect_target(&url, status, &response)?;
            log::debug!(
                "{} {url}: redirected to host {}",
                call.method,
                host_of(&next)
            );
            url = next;
        }
        Err(RegistryError::Invalid {
            what: call.url.clone(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }
}

/// One hop's request: the call's headers, and its `Authorization` only `at_home`.
fn build_request(call: &Call<'_>, url: &str, at_home: bool) -> Result<Request<()>, RegistryError> {
    let mut builder = Request::builder().method(call.method).uri(url);
    // Credentials travel only in `auth`, whose every hop is decided below.
    for (k, v) in call
        .headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
    {
        builder = builder.header(*k, v);
    }
    if let (Some(auth), true) = (call.auth, at_home) {
        builder = builder.header("Authorization", auth);
    }
    builder.body(()).map_err(|e| RegistryError::Invalid {
        what: url.to_string(),
        reason: format!("invalid request: {e}"),
    })
}

/// Bytes ureq reads a connection's responses into (its default is 128 KiB): the headers
/// must fit; layers stream through it.
const INPUT_BUFFER: usize = 32 * 1024;

/// Bytes ureq writes requests out of (its default is 128 KiB, every page touched, in
/// each pooled connection): the headers with a token fit many times.
const OUTPUT_BUFFER: usize = 16 * 1024;

fn build_agent(tls: Arc<ClientConfig>) -> Agent {
    let config = crate::proxy::agent_config()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_response(Some(RESPONSE_TIMEOUT))
        .input_buffer_size(INPUT_BUFFER)
        .output_buffer_size(OUTPUT_BUFFER)
        .build();
    // Every host the registry sends us to (token service, blob storage) is a connection
    // of this agent, and each gets the proxy the node's rules give its host.
    crate::proxy::agent(config, Route::Rules, TlsConnector::new(tls, None))
}

fn tls_config(ep: &Endpoint) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| e.to_string())?;
    let builder = if ep.skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::tls::AnyServerCertificate(
                crate::tls::provider(),
            )))
    } else {
        let mut roots = crate::tls::system_roots();
        if let Some(path) = &ep.ca_file {
            let bytes = std::fs::read(path)
                .map_err(|e| format!("{}: caFile {}: {e}", ep.host, path.display()))?;
            for cert in crate::tls::ca_certificates(&bytes)
                .map_err(|e| format!("{}: caFile {}: {e}", ep.host, path.display()))?
            {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: caFile {}: {e}", ep.host, path.display()))?;
            }
        }
        builder.with_root_certificates(roots)
    };
    let config = match (&ep.client_cert, &ep.client_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &std::path::Path, what: &str| {
                std::fs::read(p).map_err(|e| format!("{}: {what} {}: {e}", ep.host, p.display()))
            };
            let chain = crate::tls::certificates(&read(cert, "clientCert")?)
                .map_err(|e| format!("{}: clientCert {}: {e}", ep.host, cert.display()))?;
            let key_der = crate::tls::private_key(&read(key, "clientKey")?)
                .map_err(|e| format!("{}: clientKey {}: {e}", ep.host, key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("{}: clientCert and clientKey: {e}", ep.host))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A ureq error in words, TLS failures as the shared connector put them; whether a
/// connection was made at all.
pub(crate) fn transport(url: &str, e: ureq::Error) -> RegistryError {
    let connect = no_connection(&e);
    let message = crate::tls::describe_ureq(e, host_of(url));
    RegistryError::Transport {
        url: url.to_string(),
        message,
        connect,
    }
}

/// The failures that leave no connection to the host: no name, refused, no route, the
/// connection or its TLS handshake timed out or failed. A request that timed out or
/// was cut on a connection that was made is not one of them: the host is there.
fn no_connection(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    use ureq::Timeout;
    match e {
        ureq::Error::HostNotFound
        | ureq::Error::ConnectionFailed
        | ureq::Error::ConnectProxyFailed(_)
        | ureq::Error::Rustls(_)
        | ureq::Error::Tls(_)
        | ureq::Error::Timeout(Timeout::Resolve | Timeout::Connect) => true,
        ureq::Error::Io(io) => {
            io.get_ref()
                .is_some_and(|i| i.downcast_ref::<TlsFailure>().is_some())
                || matches!(
                    io.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::HostUnreachable
                        | ErrorKind::NetworkUnreachable
                        | ErrorKind::NetworkDown
                        | ErrorKind::AddrNotAvailable
                )
        }
        _ => false,
    }
}

/// The distribution API's error codes in a body (`{"errors":[{"code","message"}]}`).
pub(crate) fn error_codes(body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Errors {
        #[serde(default)]
        errors: Vec<ApiError>,
    }
    #[derive(serde::Deserialize)]
    struct ApiError {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Errors>(body) {
        Ok(e) => e
            .errors
            .into_iter()
            .map(|e| {
                let mut s = format!("{}: {}", e.code, e.message);
                s.truncate(300);
                s
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The status error for a response, with the registry's codes from its (small) body.
pub(crate) fn status_error(
    method: &'static str,
    url: &str,
    response: Response<Body>,
) -> RegistryError {
    let status = response.status().as_u16();
    let (_, mut body) = response.into_parts();
    let bytes = body
        .with_config()
        .limit(64 * 1024)
        .read_to_vec()
        .unwrap_or_default();
    RegistryError::Status {
        method,
        url: url.to_string(),
        status,
        codes: error_codes(&bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves one request on 127.0.0.1 with `answer`; the request head comes back.
    fn one_shot(answer: String) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let handle = std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return String::new();
            };
            let mut head = String::new();
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let _ = conn.write_all(answer.as_bytes());
            head
        });
        (addr, handle)
    }

    #[test]
    fn a_redirect_to_another_host_does_not_carry_the_authorization() {
        let (storage, storage_seen) = one_shot(
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nblob".into(),
        );
        let (registry, registry_seen) = one_shot(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{storage}/bucket/blob?sig=1\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let ep = Endpoint {
            base: format!("http://{registry}"),
            host: registry.clone(),
            mirror: true,
            pull: true,
            resolve: false,
            ca_file: None,
            client_cert: None,
            client_key: None,
            skip_verify: false,
        };
        let http = Http::new();
        let call = Call {
            method: "GET",
            url: format!("http://{registry}/v2/x/blobs/sha256:ab"),
            headers: Vec::new(),
            auth: Some("Bearer not-for-storage"),
            body_timeout: Some(Duration::from_secs(5)),
        };
        let response = http.send(&ep, &call).expect("followed");
        assert_eq!(response.status().as_u16(), 200);
        let (_, mut body) = response.into_parts();
        assert_eq!(body.read_to_vec().expect("body"), b"blob");
        let to_registry = registry_seen.join().expect("registry").to_ascii_lowercase();
        let to_storage = storage_seen.join().expect("storage").to_ascii_lowercase();
        assert!(
            to_registry.contains("authorization: bearer not-for-storage"),
            "{to_registry}"
        );
        assert!(
            to_storage.starts_with("get /bucket/blob?sig=1 "),
            "{to_storage}"
        );
        assert!(!to_storage.contains("authorization"), "{to_storage}");
    }

    #[test]
    fn credentials_go_only_in_auth_and_stay_off_once_a_redirect_left_the_host() {
        let (third, third_seen) =
            one_shot("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".into());
        let (elsewhere, elsewhere_seen) = one_shot(format!(
            "HTTP/1.1 302 Found\r\nLocation: http://{third}/again\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let (home, home_seen) = one_shot(format!(
            "HTTP/1.1 302 Found\r\nLocation: http://{elsewhere}/token?scope=x\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let ep = Endpoint {
            base: format!("http://{home}"),
            host: home.clone(),
            mirror: true,
            pull: true,
            resolve: false,
            ca_file: None,
            client_cert: None,
            client_key: None,
            skip_verify: false,
        };
        // A call's own headers never carry credentials; its `auth` goes to its own host
        // alone, and to no hop after the first redirect elsewhere.
        let call = Call {
            method: "GET",
            url: format!("http://{home}/token?scope=x"),
            headers: vec![("Authorization", "Basic smuggled".to_string())],
            auth: Some("Basic for-home-only"),
            body_timeout: Some(Duration::from_secs(5)),
        };
        let response = Http::new().send(&ep, &call).expect("followed");
        assert_eq!(response.status().as_u16(), 200);
        let to_home = home_seen.join().expect("home").to_ascii_lowercase();
        assert!(
            to_home.contains("authorization: basic for-home-only"),
            "{to_home}"
        );
        assert!(!to_home.contains("smuggled"), "{to_home}");
        for seen in [elsewhere_seen, third_seen] {
            let head = seen.join().expect("listener").to_ascii_lowercase();
            assert!(!head.is_empty());
            assert!(!head.contains("authorization"), "{head}");
        }
    }

    #[test]
    fn registry_error_codes_are_read() {
        let body =
            br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}}]}"#;
        assert_eq!(error_codes(body), ["MANIFEST_UNKNOWN: manifest unknown"]);
        assert!(error_codes(b"<html>").is_empty());
    }
}
