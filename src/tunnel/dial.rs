//! tunnel::dial: a new stream to a proxy server: TCP (through the node's HTTP proxy when
//! its rules say so, [`crate::proxy`]), TLS (the proxy server's CA as the
//! only root, ALPN h2, the node's client certificate read from its files now, so a
//! rotated certificate is used without a restart), then the gRPC request (with the
//! ServiceAccount token, where that is the credential).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::stream::{self, Hello};
use super::{Agent, TunnelError};
use crate::config::TunnelCredential;

/// How long the TCP connect, the handshake and the response headers may take each.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) type Session = stream::Session<TlsStream<TcpStream>>;

/// Opens a stream to `addr` (`host:port`).
pub(super) async fn connect(agent: &Arc<Agent>, addr: &str) -> Result<Session, TunnelError> {
    let tls = client_config(agent)?;
    let token = match &agent.token {
        Some(_) => {
            let a = agent.clone();
            let got = tokio::task::spawn_blocking(move || a.token.as_ref().map(|t| t.token()))
                .await
                .map_err(|e| TunnelError::Credentials(e.to_string()))?;
            Some(
                got.transpose()
                    .map_err(TunnelError::Credentials)?
                    .unwrap_or_default(),
            )
        }
        None => None,
    };
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = agent.config.server_name.as_deref().unwrap_or(host);
    let server_name = ServerName::try_from(name.to_string()).map_err(|e| TunnelError::Tls {
        addr: addr.to_string(),
        reason: format!("{name:?} is not a server name: {e}"),
    })?;
    let timeout = |addr: &str| TunnelError::Timeout {
        addr: addr.to_string(),
        after: STEP_TIMEOUT,
    };
    let port = addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .unwrap_or(443);
    let route = crate::proxy::Route::Rules;
    let tcp = tokio::time::timeout(STEP_TIMEOUT, crate::proxy::dial(&route, host, port))
        .await
        .map_err(|_| timeout(addr))?
        .map_err(|e| match e {
            crate::proxy::DialError::Io { source, .. } => TunnelError::Io {
                addr: addr.to_string(),
                source,
            },
            proxy => TunnelError::HttpProxy {
                addr: addr.to_string(),
                reason: proxy.to_string(),
            },
        })?;
    let _ = tcp.set_nodelay(true);
    let connector = tokio_rustls::TlsConnector::from(tls);
    let io = tokio::time::timeout(STEP_TIMEOUT, connector.connect(server_name, tcp))
        .await
        .map_err(|_| timeout(addr))?
        .map_err(|e| {
            let reason = match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                Some(tls) => crate::tls::describe(tls, addr),
                None => format!("tls handshake: {e}"),
            };
            TunnelError::Tls {
                addr: addr.to_string(),
                reason,
            }
        })?;
    if io.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Err(TunnelError::Tls {
            addr: addr.to_string(),
            reason: "the server did not agree to http/2 (alpn h2)".into(),
        });
    }
    let hello = Hello {
        authority: addr,
        agent_id: &agent.node_name,
        identifiers: &agent.identifiers,
        token: token.as_deref(),
    };
    let opened = tokio::time::timeout(STEP_TIMEOUT, stream::open(io, addr, &hello))
        .await
        .map_err(|_| timeout(addr))?;
    if let (Err(TunnelError::Refused { .. }), Some(t)) = (&opened, &agent.token) {
        t.refused();
    }
    opened
}

/// The TLS client config of a new stream: built at each dial from the files as they
/// are now.
fn client_config(agent: &Agent) -> Result<Arc<ClientConfig>, TunnelError> {
    let bad = |what: String| TunnelError::Credentials(what);
    let ca_path = &agent.config.ca_file;
    let ca = std::fs::read(ca_path).map_err(|e| bad(format!("read {}: {e}", ca_path.display())))?;
    let ca =
        crate::tls::ca_certificates(&ca).map_err(|e| bad(format!("{}: {e}", ca_path.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in ca {
        roots
            .add(cert)
            .map_err(|e| bad(format!("{}: {e}", ca_path.display())))?;
    }
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match agent.config.credential {
        TunnelCredential::ServiceAccountToken(_) => builder.with_no_client_auth(),
        TunnelCredential::ClientCertificate => {
            let path = agent.kubeconfig.as_ref().ok_or_else(|| {
                bad("the client certificate comes from the kubeconfig, and none is set".into())
            })?;
            let kc =
                crate::kube::kubeconfig::Kubeconfig::load(path).map_err(|e| bad(e.to_string()))?;
            let id = kc
                .identity
                .ok_or_else(|| bad(format!("{} holds no client certificate", path.display())))?;
            builder
                .with_client_auth_cert(id.chain, id.key)
                .map_err(|e| bad(format!("client certificate of {}: {e}", path.display())))?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
