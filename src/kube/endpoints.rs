//! Which apiserver the client talks to, when a site has several and no load balancer in
//! front of them: the kubeconfig's `server` first, then the ones `holdfast.apiservers`
//! names (validated by the config module), one in use at a time, as k3s's agent and
//! OpenYurt's YurtHub keep a list and move on.
//!
//! The endpoint in use keeps every request (connections reused) until it fails: no
//! connection, a failed TLS handshake, a timeout, or an answer that is not the
//! apiserver's (a 502 or 504 from something in between, a 503 from that or from an
//! apiserver that is not ready). Then the next one is in use at once, for the request
//! that failed when sending it again is safe (it never reached an apiserver, or it is a
//! GET) and for every request after. The client closes the connections it had, so the
//! watches on them end and are opened again on the next endpoint, from their last
//! resourceVersion. Only when every endpoint has failed the same request does the error
//! go up, and the link's back-off with jitter applies as with one server.
//!
//! Every endpoint gets the kubeconfig's credentials and is verified against its CA,
//! under the endpoint's own host name (or the kubeconfig's `tls-server-name`); nothing
//! else is ever sent them: no redirect is followed, and no address is learned from the
//! cluster (a list the cluster hands out would decide where the node's credentials go).
//!
//! Knows nothing of HTTP connections: the client asks which endpoint to use, and tells
//! what happened there.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// What went wrong at an endpoint, as far as the choice of endpoint is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// The request never reached an apiserver (no connection, TLS refused, a 503): the
    /// next endpoint may be asked the same at once.
    Unreached,
    /// The request may have been handled before the answer was lost (a timeout waiting
    /// for it, a reset, a 502 or 504 from something in between): a GET is asked again
    /// at once; a write goes back to its caller, which knows whether repeating it is
    /// right.
    Lost,
}

impl Trouble {
    /// Whether a `method` request that met this at one endpoint is sent to the next.
    pub fn resend(self, method: &str) -> bool {
        self == Trouble::Unreached || method == "GET"
    }
}

/// The endpoints, and which one is in use. Shared by the clones of one client.
#[derive(Debug)]
pub struct Endpoints {
    urls: Vec<String>,
    current: AtomicUsize,
    /// Whether the endpoint in use has answered since it was chosen: its failure is
    /// news worth a warning, where one more dead endpoint during an outage is not.
    answered: AtomicBool,
}

impl Endpoints {
    /// The kubeconfig's `server` first, then `more` in their order, each once (a
    /// trailing `/` does not make another).
    pub fn new(server: &str, more: &[String]) -> Endpoints {
        let mut urls = vec![server.trim_end_matches('/').to_string()];
        for url in more {
            let url = url.trim_end_matches('/');
            if !urls.iter().any(|u| u == url) {
                urls.push(url.to_string());
            }
        }
        Endpoints {
            urls,
            current: AtomicUsize::new(0),
            answered: AtomicBool::new(false),
        }
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Never: the kubeconfig's server is always one.
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// The endpoint in use: its place in the list and its URL.
    pub fn current(&self) -> (usize, &str) {
        let at = self.current.load(Ordering::Acquire) % self.urls.len();
        (at, &self.urls[at])
    }

    /// The endpoint at `at` answered as an apiserver.
    pub fn answered(&self, at: usize) {
        if self.current.load(Ordering::Acquire) == at {
            self.answered.store(true, Ordering::Relaxed);
        }
    }

    /// The endpoint at `at` failed: the next one is in use from now on. `None` when
    /// another request had already moved on from it (nothing more to do); else the
    /// place of the endpoint now in use, and whether the one left had been answering.
    pub fn failed(&self, at: usize) -> Option<(usize, bool)> {
        let next = (at + 1) % self.urls.len();
        self.current
            .compare_exchange(at, next, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let was_answering = self.answered.swap(false, Ordering::Relaxed);
        crate::metrics::APISERVER_SWITCHES.inc();
        crate::metrics::APISERVER_IN_USE.store(next as i64, Ordering::Relaxed);
        Some((next, was_answering))
    }

    /// The URL at `at`.
    pub fn url(&self, at: usize) -> &str {
        &self.urls[at % self.urls.len()]
    }
}

/// What a failed exchange says about the endpoint; `None` when the fault is the
/// request's own (it would fail anywhere).
pub fn transport_trouble(e: &ureq::Error) -> Option<Trouble> {
    use std::io::ErrorKind as K;
    use ureq::Timeout as T;
    match e {
        ureq::Error::Http(_)
        | ureq::Error::BadUri(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::BodyExceedsLimit(_) => None,
        ureq::Error::HostNotFound
        | ureq::Error::ConnectionFailed
        | ureq::Error::ConnectProxyFailed(_)
        | ureq::Error::Tls(_)
        | ureq::Error::Rustls(_)
        | ureq::Error::Timeout(T::Resolve | T::Connect) => Some(Trouble::Unreached),
        ureq::Error::Io(io) => {
            let tls = io
                .get_ref()
                .is_some_and(|i| i.downcast_ref::<crate::tls::TlsFailure>().is_some());
            let unreached = tls
                || matches!(
                    io.kind(),
                    K::ConnectionRefused
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                        | K::NetworkDown
                        | K::AddrNotAvailable
                );
            Some(if unreached {
                Trouble::Unreached
            } else {
                Trouble::Lost
            })
        }
        _ => Some(Trouble::Lost),
    }
}

/// What an answer's status code says about the endpoint: a 503 comes from an
/// apiserver that is not ready or from something in front of one that is gone, neither
/// of which handled the request; a 502 or 504 from something in between that may have
/// passed it on. Every other code is the apiserver's answer.
pub fn status_trouble(code: u16) -> Option<Trouble> {
    match code {
        503 => Some(Trouble::Unreached),
        502 | 504 => Some(Trouble::Lost),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(more: &[&str]) -> Endpoints {
        let more: Vec<String> = more.iter().map(|s| s.to_string()).collect();
        Endpoints::new("https://10.0.0.1:6443/", &more)
    }

    #[test]
    fn the_kubeconfig_server_comes_first_and_each_endpoint_once() {
        let e = list(&[
            "https://10.0.0.2:6443",
            "https://10.0.0.1:6443",
            "https://10.0.0.3:6443/",
            "https://10.0.0.2:6443/",
        ]);
        assert_eq!(e.len(), 3);
        assert_eq!(e.current(), (0, "https://10.0.0.1:6443"));
        assert_eq!(e.url(1), "https://10.0.0.2:6443");
        assert_eq!(e.url(2), "https://10.0.0.3:6443");
    }

    #[test]
    fn a_failure_moves_on_once_however_many_requests_saw_it() {
        let e = list(&["https://10.0.0.2:6443", "https://10.0.0.3:6443"]);
        e.answered(0);
        assert_eq!(e.failed(0), Some((1, true)));
        // A second request that failed on the same endpoint does not skip the next.
        assert_eq!(e.failed(0), None);
        assert_eq!(e.current(), (1, "https://10.0.0.2:6443"));
        // One that never answered is no news.
        assert_eq!(e.failed(1), Some((2, false)));
        // Past the last, the first again.
        e.answered(2);
        assert_eq!(e.failed(2), Some((0, true)));
        assert_eq!(e.current(), (0, "https://10.0.0.1:6443"));
    }

    #[test]
    fn an_answer_from_an_endpoint_left_behind_does_not_count_for_the_new_one() {
        let e = list(&["https://10.0.0.2:6443"]);
        assert_eq!(e.failed(0), Some((1, false)));
        e.answered(0);
        assert_eq!(e.failed(1), Some((0, false)));
    }

    #[test]
    fn one_endpoint_stays_in_use() {
        let e = list(&[]);
        assert_eq!(e.failed(0), Some((0, false)));
        assert_eq!(e.current(), (0, "https://10.0.0.1:6443"));
    }

    #[test]
    fn only_requests_that_never_reached_an_apiserver_or_gets_are_sent_again() {
        use std::io::{Error, ErrorKind};
        let io = |kind| ureq::Error::Io(Error::new(kind, "x"));
        let tls = ureq::Error::Io(Error::new(
            ErrorKind::InvalidData,
            crate::tls::TlsFailure("not trusted".into()),
        ));
        for (e, want) in [
            (io(ErrorKind::ConnectionRefused), Some(Trouble::Unreached)),
            (tls, Some(Trouble::Unreached)),
            (
                ureq::Error::Timeout(ureq::Timeout::Connect),
                Some(Trouble::Unreached),
            ),
            (ureq::Error::HostNotFound, Some(Trouble::Unreached)),
            (io(ErrorKind::ConnectionReset), Some(Trouble::Lost)),
            (io(ErrorKind::UnexpectedEof), Some(Trouble::Lost)),
            (
                ureq::Error::Timeout(ureq::Timeout::RecvResponse),
                Some(Trouble::Lost),
            ),
            (ureq::Error::BadUri("x".into()), None),
        ] {
            let shown = e.to_string();
            assert_eq!(transport_trouble(&e), want, "{shown}");
        }
        assert_eq!(status_trouble(503), Some(Trouble::Unreached));
        assert_eq!(status_trouble(502), Some(Trouble::Lost));
        assert_eq!(status_trouble(504), Some(Trouble::Lost));
        for code in [200, 401, 403, 404, 409, 410, 429, 500] {
            assert_eq!(status_trouble(code), None, "{code}");
        }
        assert!(Trouble::Unreached.resend("PATCH"));
        assert!(Trouble::Lost.resend("GET"));
        assert!(!Trouble::Lost.resend("PUT"));
        assert!(!Trouble::Lost.resend("POST"));
    }
}
