//! The proxy keys, `holdfast.proxy.*`: `https` (the proxy for `https://` destinations),
//! `http` (for `http://` ones) and `noProxy` (a list of NO_PROXY entries). When the file
//! has a `holdfast.proxy` section it is the whole of the node's proxy rules and the
//! environment's `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` are not read: a unit that
//! inherits a site-wide proxy for other programs cannot mix it into what the file says,
//! and `proxy: {}` means direct whatever the environment holds. Without the section the
//! environment is read, as Go programs read it (see [`crate::proxy`]).

use serde_yaml::Value;

use super::reader::{short, type_name, Reader};
use super::ConfigError;
use crate::proxy::{NoProxy, Proxies, ProxyUrl};

/// The node's proxy rules: the file's section if it has one, else the environment.
pub fn settings(file: Option<&Proxies>) -> Result<Proxies, ConfigError> {
    match file {
        Some(p) => Ok(p.clone()),
        None => Proxies::from_env(|name| std::env::var(name).ok())
            .map_err(|reason| ConfigError::Environment { reason }),
    }
}

impl Reader<'_> {
    /// The `holdfast.proxy` mapping.
    pub(super) fn proxy_section(
        &self,
        key: &str,
        value: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<Proxies, ConfigError> {
        let mut out = Proxies::default();
        if value.is_null() {
            return Ok(out);
        }
        for (k, v) in self.mapping(key, value)? {
            let name = format!("{key}.{}", self.string(key, k)?);
            if !super::keys::known(&name) {
                warnings.push(self.unknown(&name));
                continue;
            }
            match name.as_str() {
                "holdfast.proxy.https" => out.https = self.proxy_url(&name, v)?,
                "holdfast.proxy.http" => out.http = self.proxy_url(&name, v)?,
                "holdfast.proxy.noProxy" => {
                    let Value::Sequence(items) = v else {
                        return Err(self.err(
                            &name,
                            format!(
                                "expected a list of hosts, domains, IPs or CIDRs, got {} {}",
                                type_name(v),
                                short(v)
                            ),
                        ));
                    };
                    let entries = items
                        .iter()
                        .map(|item| self.string(&name, item))
                        .collect::<Result<Vec<_>, _>>()?;
                    out.no_proxy = NoProxy::from_entries(entries.iter().map(String::as_str));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// A proxy URL, or `None` for an empty string (no proxy for that scheme).
    fn proxy_url(&self, key: &str, value: &Value) -> Result<Option<ProxyUrl>, ConfigError> {
        let s = match value {
            Value::String(s) => s,
            Value::Null => return Ok(None),
            // Not quoted back: it may hold a password.
            other => {
                return Err(self.err(
                    key,
                    format!("expected a proxy URL string, got {}", type_name(other)),
                ))
            }
        };
        if s.trim().is_empty() {
            return Ok(None);
        }
        ProxyUrl::parse(s).map(Some).map_err(|e| self.err(key, e))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::parse_config;
    use super::*;

    fn file_proxies(text: &str) -> Result<Option<Proxies>, ConfigError> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text).map(|(c, _)| c.proxy)
    }

    #[test]
    fn reads_every_key() {
        let p = file_proxies(
            "holdfast:\n  proxy:\n    https: http://u:pw@proxy.site:3128\n    \
             http: proxy.site:3129\n    noProxy: [registry.site, 10.0.0.0/8, \".svc\"]\n",
        )
        .expect("parse")
        .expect("set");
        let https = p.https.as_ref().expect("https");
        assert_eq!(https.to_string(), "http://***@proxy.site:3128");
        assert_eq!(p.http.as_ref().map(ProxyUrl::port), Some(3129));
        assert!(p.no_proxy.matches("registry.site", 443));
        assert!(p.no_proxy.matches("10.1.2.3", 6443));
        assert!(p.no_proxy.matches("api.svc", 443));
        assert!(!p.no_proxy.matches("api.example", 443));
    }

    #[test]
    fn the_section_replaces_the_environment() {
        // An empty section: direct, whatever the environment says.
        let p = file_proxies("holdfast:\n  proxy: {}\n").expect("parse");
        let rules = settings(p.as_ref()).expect("settings");
        assert!(rules.is_empty());
        assert_eq!(file_proxies("holdfast: {}\n").expect("parse"), None);
    }

    #[test]
    fn bad_values_never_show_a_password() {
        for (text, want) in [
            ("https: socks5://u:secret@p:1080", "holdfast.proxy.https"),
            ("http: \"http://u:secret@p:0\"", "holdfast.proxy.http"),
            ("https: [http://u:secret@p]", "expected a proxy URL string"),
            ("noProxy: a.b", "expected a list"),
        ] {
            let e = file_proxies(&format!("holdfast:\n  proxy:\n    {text}\n"))
                .expect_err(text)
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("secret"), "{text}: {e}");
        }
        let (_, warnings) = parse_config(
            Path::new("/etc/holdfast/config.yaml"),
            "holdfast:\n  proxy:\n    noproxy: [a]\n",
        )
        .expect("parse");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }
}
