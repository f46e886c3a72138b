//! kubeconfig files: the current context's cluster and user, with the files they name
//! read and checked, so a wrong path or a bad certificate is one clear error at start.
//!
//! Reads the file format kubectl writes (clusters, users, contexts, current-context);
//! never the environment (`KUBECONFIG` is the config module's business). What the
//! credentials hold is checked in `credentials`; this file finds them.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls_pki_types::{CertificateDer, ServerName};
use serde::Deserialize;

use super::credentials::{self, ClientIdentity, Token};
pub use super::site::KubeconfigError;
use super::site::{RawUser, Site};
use crate::proxy::{ProxyUrl, Route};
use crate::yaml::{prescan, read_bounded, MAX_BYTES};

/// The current context of a kubeconfig, with everything it names loaded and checked.
#[derive(Debug, Clone)]
pub struct Kubeconfig {
    /// The kubeconfig file, for error messages.
    pub path: PathBuf,
    pub context: String,
    pub cluster: String,
    pub user: String,
    /// The server URL without a trailing slash (`https://10.0.0.1:6443`).
    pub server: String,
    /// The name the server certificate is verified against instead of the URL's host.
    pub tls_server_name: Option<ServerName<'static>>,
    /// The cluster CA: the only roots trusted. Empty only for an `http://` server.
    pub ca: Vec<CertificateDer<'static>>,
    /// The client certificate chain and key, if the user has one.
    pub identity: Option<ClientIdentity>,
    /// The bearer token, if the user has one.
    pub token: Option<Token>,
    /// The cluster's `proxy-url`: every connection to this server goes through it, the
    /// node's proxy rules and `NO_PROXY` aside, as with client-go.
    pub proxy_url: Option<ProxyUrl>,
}

#[derive(Debug, Deserialize)]
struct Raw {
    #[serde(rename = "current-context", default)]
    current_context: Option<String>,
    #[serde(default)]
    clusters: Option<Vec<NamedCluster>>,
    #[serde(default)]
    users: Option<Vec<NamedUser>>,
    #[serde(default)]
    contexts: Option<Vec<NamedContext>>,
}

#[derive(Debug, Deserialize)]
struct NamedCluster {
    name: String,
    cluster: RawCluster,
}

#[derive(Debug, Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: Option<RawUser>,
}

#[derive(Debug, Deserialize)]
struct NamedContext {
    name: String,
    context: RawContext,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawCluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    tls_server_name: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    proxy_url: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawContext {
    cluster: String,
    user: String,
}

impl Kubeconfig {
    /// Reads the kubeconfig at `path` and loads its current context.
    pub fn load(path: &Path) -> Result<Kubeconfig, KubeconfigError> {
        Kubeconfig::load_at(path, SystemTime::now())
    }

    /// As [`Kubeconfig::load`], judging certificate validity at `now`.
    pub fn load_at(path: &Path, now: SystemTime) -> Result<Kubeconfig, KubeconfigError> {
        let text = read_bounded(path, MAX_BYTES).map_err(|source| KubeconfigError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |message: String| KubeconfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        // Nesting and aliases that would cost serde_yaml seconds or gigabytes are
        // refused by a look that costs one pass.
        prescan(&text).map_err(&invalid)?;
        let raw: Raw =
            serde_yaml::from_str(&text).map_err(|e| invalid(format!("not a kubeconfig: {e}")))?;
        let contexts = raw.contexts.unwrap_or_default();
        let context = match raw.current_context.as_deref().filter(|c| !c.is_empty()) {
            Some(name) => contexts.iter().find(|c| c.name == name).ok_or_else(|| {
                invalid(format!(
                    "current-context {name:?} is not among contexts ({})",
                    names(contexts.iter().map(|c| &c.name))
                ))
            })?,
            None => match contexts.as_slice() {
                [only] => only,
                [] => return Err(invalid("no current-context and no contexts".to_string())),
                many => {
                    return Err(invalid(format!(
                        "no current-context to choose among contexts ({})",
                        names(many.iter().map(|c| &c.name))
                    )))
                }
            },
        };
        let clusters = raw.clusters.unwrap_or_default();
        let cluster = clusters
            .iter()
            .find(|c| c.name == context.context.cluster)
            .ok_or_else(|| {
                invalid(format!(
                    "context {:?} names cluster {:?}, which is not among clusters ({})",
                    context.name,
                    context.context.cluster,
                    names(clusters.iter().map(|c| &c.name))
                ))
            })?;
        let users = raw.users.unwrap_or_default();
        let user = users
            .iter()
            .find(|u| u.name == context.context.user)
            .ok_or_else(|| {
                invalid(format!(
                    "context {:?} names user {:?}, which is not among users ({})",
                    context.name,
                    context.context.user,
                    names(users.iter().map(|u| &u.name))
                ))
            })?;

        let dir = path.parent().unwrap_or(Path::new("."));
        let site = |prefix: String| Site { path, dir, prefix };
        let cluster_site = site(format!("clusters[{}]", cluster.name));
        let (server, tls_server_name, ca) = load_cluster(&cluster_site, &cluster.cluster)?;
        let proxy_url = proxy_url(&cluster_site, &cluster.cluster)?;
        let user_site = site(format!("users[{}]", user.name));
        let no_user = RawUser::default();
        let raw_user = user.user.as_ref().unwrap_or(&no_user);
        let (identity, token) = credentials::load_user(&user_site, raw_user, now)?;
        if server.starts_with("http://") && (identity.is_some() || token.is_some()) {
            log::warn!(
                "kubeconfig {}: server {server} is plain http: credentials and pod data cross \
                 the network unencrypted",
                path.display()
            );
        }
        Ok(Kubeconfig {
            path: path.to_path_buf(),
            context: context.name.clone(),
            cluster: cluster.name.clone(),
            user: user.name.clone(),
            server,
            tls_server_name,
            ca,
            identity,
            token,
            proxy_url,
        })
    }

    /// How connections to the server choose their proxy.
    pub fn proxy_route(&self) -> Route {
        match &self.proxy_url {
            Some(p) => Route::Fixed(std::sync::Arc::new(p.clone())),
            None => Route::Rules,
        }
    }
}

/// The cluster's `proxy-url`, checked.
fn proxy_url(site: &Site<'_>, raw: &RawCluster) -> Result<Option<ProxyUrl>, KubeconfigError> {
    match raw.proxy_url.as_deref().filter(|p| !p.is_empty()) {
        None => Ok(None),
        Some(p) => ProxyUrl::parse(p)
            .map(Some)
            .map_err(|e| site.error("proxy-url", e)),
    }
}

type Cluster = (
    String,
    Option<ServerName<'static>>,
    Vec<CertificateDer<'static>>,
);

fn load_cluster(site: &Site<'_>, raw: &RawCluster) -> Result<Cluster, KubeconfigError> {
    let server = raw
        .server
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| site.error("server", "missing"))?;
    let uri: ureq::http::Uri = server
        .parse()
        .map_err(|e| site.error("server", format!("{server:?} is not a URL: {e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(site.error(
                "server",
                format!("{server:?} is not an http:// or https:// URL"),
            ))
        }
    };
    if uri.host().is_none_or(str::is_empty) {
        return Err(site.error("server", format!("{server:?} has no host")));
    }
    if uri.query().is_some() {
        return Err(site.error("server", format!("{server:?} has a query")));
    }
    if raw.insecure_skip_tls_verify {
        // The agent would hand its node credentials to whoever answers, and gateways sit
        // on networks nobody vouches for; a node's identity reads every secret its pods use.
        return Err(site.error(
            "insecure-skip-tls-verify",
            "refused: the agent verifies the apiserver against the cluster CA; set \
             certificate-authority or certificate-authority-data instead",
        ));
    }
    let tls_server_name = match raw.tls_server_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => Some(ServerName::try_from(name.to_string()).map_err(|e| {
            site.error(
                "tls-server-name",
                format!("{name:?} is not a host name: {e}"),
            )
        })?),
        None => None,
    };
    let ca = match site.file_or_data(
        "certificate-authority",
        raw.certificate_authority.as_deref(),
        "certificate-authority-data",
        raw.certificate_authority_data.as_deref(),
    )? {
        Some((source, bytes)) => {
            let field = source.field("certificate-authority");
            credentials::ca_certificates(&bytes).map_err(|m| site.error(&field, m))?
        }
        None if https => {
            return Err(site.error(
                "certificate-authority",
                "missing: set certificate-authority or certificate-authority-data; the agent \
                 trusts the cluster CA only, never the system's roots",
            ))
        }
        None => Vec::new(),
    };
    Ok((
        server.trim_end_matches('/').to_string(),
        tls_server_name,
        ca,
    ))
}

fn names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let list: Vec<&str> = names.map(String::as_str).collect();
    if list.is_empty() {
        "none".to_string()
    } else {
        list.join(", ")
    }
}

#[cfg(test)]
#[path = "kubeconfig_tests.rs"]
mod tests;
