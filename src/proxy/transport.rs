//! The proxy under ureq: a resolver that, for a destination reached through a proxy,
//! gives the proxy's addresses instead of the destination's (the destination's name is
//! the proxy's to resolve, as Go leaves it), and a connector that, on the TCP
//! connection to the proxy, asks for the tunnel with CONNECT before TLS starts. A client
//! chains `TcpConnector`, then [`TunnelConnector`], then its TLS connector, and hands
//! ureq a [`ProxyResolver`] with the same [`Route`]: both make the same choice per
//! destination, and ureq's pool keys connections by destination.

use std::fmt;

use ureq::config::{Config, ConfigBuilder};
use ureq::http::Uri;
use ureq::typestate::AgentScope;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    ConnectionDetails, Connector, NextTimeout, TcpConnector, Transport,
};
use ureq::Agent;

use super::handshake;
use super::{ProxyUrl, Route};
use crate::tls::TlsConnector;

/// The settings every HTTP client of the node starts from: an answer of any status is
/// handed back rather than made an error; ureq follows no redirect (each client follows
/// its own, keeping credentials to their own host); holdfast's User-Agent; no
/// compression asked for; and no proxy of ureq's, which would read the environment
/// (the rules [`super::install`]ed choose instead).
pub fn agent_config() -> ConfigBuilder<AgentScope> {
    Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_redirects_will_error(false)
        .user_agent(crate::wire::user_agent())
        .accept_encoding("")
        .proxy(None)
}

/// An agent of `config` whose connections go out as `route` says, straight or through
/// a CONNECT tunnel, and then through `tls`.
pub fn agent(config: Config, route: Route, tls: TlsConnector) -> Agent {
    let connector =
        ().chain(TcpConnector::default())
            .chain(TunnelConnector::new(route.clone()))
            .chain(tls);
    Agent::with_parts(config, connector, ProxyResolver::new(route))
}

/// The destination of `uri` and its proxy, if it goes through one.
fn choose(route: &Route, uri: &Uri) -> Option<(ProxyUrl, String)> {
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let proxy = route.proxy_for(https, host, port)?;
    Some((proxy, super::authority(host, port)))
}

/// Resolves a proxied destination to its proxy's addresses.
#[derive(Debug, Default)]
pub struct ProxyResolver {
    route: Route,
    inner: DefaultResolver,
}

impl ProxyResolver {
    pub fn new(route: Route) -> Self {
        ProxyResolver {
            route,
            inner: DefaultResolver::default(),
        }
    }
}

impl Resolver for ProxyResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let Some((proxy, _)) = choose(&self.route, uri) else {
            return self.inner.resolve(uri, config, timeout);
        };
        let proxy_uri: Uri = format!("http://{}/", proxy.authority())
            .parse()
            .map_err(|_| ureq::Error::InvalidProxyUrl)?;
        self.inner.resolve(&proxy_uri, config, timeout)
    }
}

/// Opens the CONNECT tunnel on a connection to a proxy; passes a direct one through.
#[derive(Default)]
pub struct TunnelConnector {
    route: Route,
}

impl TunnelConnector {
    pub fn new(route: Route) -> Self {
        TunnelConnector { route }
    }
}

impl fmt::Debug for TunnelConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TunnelConnector")
            .field("route", &self.route)
            .finish()
    }
}

impl<In: Transport> Connector<In> for TunnelConnector {
    type Out = In;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<In>, ureq::Error> {
        let Some(mut transport) = chained else {
            return Ok(None);
        };
        let Some((proxy, target)) = choose(&self.route, details.uri) else {
            return Ok(Some(transport));
        };
        let failed = |e: handshake::ProxyError| ureq::Error::ConnectProxyFailed(e.to_string());
        let request = handshake::request(&proxy, &target);
        let out = transport.buffers().output();
        if request.len() > out.len() {
            return Err(failed(handshake::broken(
                &proxy,
                &target,
                "CONNECT request larger than the output buffer",
            )));
        }
        out[..request.len()].copy_from_slice(&request);
        transport.transmit_output(request.len(), details.timeout)?;
        loop {
            let buffers = transport.buffers();
            match handshake::answer(&proxy, &target, buffers.input()).map_err(failed)? {
                Some(used) => {
                    buffers.input_consume(used);
                    log::debug!("tunnel to {target} through proxy {proxy}");
                    return Ok(Some(transport));
                }
                None => buffers.input_consume(0),
            }
            if !transport.await_input(details.timeout)? {
                return Err(failed(handshake::closed(&proxy, &target)));
            }
        }
    }
}
