//! The static pod URL's keys, as the kubelet names them: `staticPodURL` (where the
//! manifest is fetched), `staticPodURLHeader` (header name to its values, sent with
//! every fetch) and `httpCheckFrequency` (how often, default 20 s). Off unless
//! `staticPodURL` is set.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_yaml::Value;

use super::reader::{short, type_name, Reader};
use super::ConfigError;

/// `httpCheckFrequency`'s default, the kubelet's.
pub const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

/// Where the static pod manifest is fetched from, and what goes with every fetch.
#[derive(Clone, PartialEq)]
pub struct StaticPodUrl {
    /// An `http://` or `https://` URL with a host.
    pub url: String,
    /// Header name and value, each checked as HTTP allows; a name given several values
    /// is sent once per value, in the order given.
    pub headers: Vec<(String, String)>,
    /// `httpCheckFrequency`.
    pub check_frequency: Duration,
}

// The headers often carry a bearer token: their values never reach a log.
impl std::fmt::Debug for StaticPodUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("StaticPodUrl")
            .field("url", &self.url)
            .field("headers", &names)
            .field("check_frequency", &self.check_frequency)
            .finish()
    }
}

/// What the file sets of them.
#[derive(Clone, Default, PartialEq)]
pub struct PodUrlKeys {
    pub url: Option<String>,
    pub headers: Option<Vec<(String, String)>>,
    pub check_frequency: Option<Duration>,
}

impl std::fmt::Debug for PodUrlKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Option<Vec<&str>> = self
            .headers
            .as_ref()
            .map(|h| h.iter().map(|(n, _)| n.as_str()).collect());
        f.debug_struct("PodUrlKeys")
            .field("url", &self.url)
            .field("headers", &names)
            .field("check_frequency", &self.check_frequency)
            .finish()
    }
}

impl PodUrlKeys {
    /// The settings, or `None` when no URL is set (or it is empty, as the kubelet's
    /// default is).
    pub fn settings(&self) -> Option<StaticPodUrl> {
        let url = self.url.clone().filter(|u| !u.is_empty())?;
        Some(StaticPodUrl {
            url,
            headers: self.headers.clone().unwrap_or_default(),
            check_frequency: self.check_frequency.unwrap_or(DEFAULT_HTTP_CHECK_FREQUENCY),
        })
    }
}

impl Reader<'_> {
    /// A key of the static pod URL; false if not one.
    pub(super) fn pod_url_key(
        &self,
        key: &str,
        value: &Value,
        out: &mut PodUrlKeys,
    ) -> Result<bool, ConfigError> {
        match key {
            "staticPodURL" => {
                let url = self.string(key, value)?;
                if !url.is_empty() {
                    check_url(&url).map_err(|reason| self.err(key, reason))?;
                }
                out.url = Some(url);
            }
            "staticPodURLHeader" => out.headers = Some(self.url_headers(key, value)?),
            "httpCheckFrequency" => {
                out.check_frequency = Some(self.positive_duration(key, value)?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `{Name: [value, ...]}`, each name and value one HTTP allows in a header.
    fn url_headers(&self, key: &str, value: &Value) -> Result<Vec<(String, String)>, ConfigError> {
        let mut headers = Vec::new();
        if value.is_null() {
            return Ok(headers);
        }
        // Sorted by name, so that the order sent does not hang on the file's.
        let mut by_name = BTreeMap::new();
        for (name, values) in self.mapping(key, value)? {
            let name = self.string(key, name)?;
            let entry = format!("{key}.{name}");
            if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(self.err(key, format!("{name:?} is not a valid header name")));
            }
            let Value::Sequence(items) = values else {
                return Err(self.err(
                    &entry,
                    format!(
                        "expected a list of values, got {} {}",
                        type_name(values),
                        short(values)
                    ),
                ));
            };
            let mut list = Vec::new();
            for item in items {
                let v = self.string(&entry, item)?;
                // Not quoted back: the value is likely a secret.
                if ureq::http::HeaderValue::from_str(&v).is_err() {
                    return Err(self.err(
                        &entry,
                        "a value holds a character a header cannot (a line break or a control character)".into(),
                    ));
                }
                list.push(v);
            }
            by_name.insert(name, list);
        }
        for (name, values) in by_name {
            headers.extend(values.into_iter().map(|v| (name.clone(), v)));
        }
        Ok(headers)
    }
}

/// An `http://` or `https://` URL with a host, as a request can be made to.
fn check_url(url: &str) -> Result<(), String> {
    let uri: ureq::http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{url:?}: expected an http:// or https:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?}: the URL names no host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse_config;

    fn keys(text: &str) -> Result<PodUrlKeys, String> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text)
            .map(|(c, _)| c.pod_url)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_url_its_headers_and_frequency_are_read() {
        let k = keys(
            "staticPodURL: https://pods.example:8443/node.yaml\n\
             staticPodURLHeader:\n  X-Site: [north]\n  Authorization: ['Bearer t0k', 'Bearer two']\n\
             httpCheckFrequency: 5s\n",
        )
        .expect("parse");
        let s = k.settings().expect("on");
        assert_eq!(s.url, "https://pods.example:8443/node.yaml");
        assert_eq!(
            s.headers,
            [
                ("Authorization".to_string(), "Bearer t0k".to_string()),
                ("Authorization".to_string(), "Bearer two".to_string()),
                ("X-Site".to_string(), "north".to_string()),
            ]
        );
        assert_eq!(s.check_frequency, Duration::from_secs(5));
        let debug = format!("{s:?} {k:?}");
        assert!(!debug.contains("t0k"), "{debug}");
    }

    #[test]
    fn off_by_default_and_20s_when_on() {
        assert_eq!(keys("syncFrequency: 1m\n").expect("parse").settings(), None);
        assert_eq!(keys("staticPodURL: ''\n").expect("parse").settings(), None);
        let s = keys("staticPodURL: http://10.0.0.1/pods\n")
            .expect("parse")
            .settings()
            .expect("on");
        assert_eq!(s.check_frequency, Duration::from_secs(20));
        assert!(s.headers.is_empty());
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, want) in [
            (
                "staticPodURL: ftp://x/pods\n",
                "expected an http:// or https:// URL",
            ),
            (
                "staticPodURL: /pods.yaml\n",
                "expected an http:// or https:// URL",
            ),
            ("staticPodURL: 'http://'\n", "not a URL"),
            (
                "staticPodURLHeader: {'Bad Name': [x]}\n",
                "not a valid header name",
            ),
            (
                "staticPodURLHeader: {X-A: x}\n",
                "expected a list of values",
            ),
            (
                "staticPodURLHeader: {X-A: [\"a\\r\\nInjected: 1\"]}\n",
                "line break",
            ),
            ("httpCheckFrequency: 0s\n", "greater than zero"),
        ] {
            let err = keys(text).expect_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
        let err = keys("staticPodURLHeader: {X-A: [\"s3cret\\n\"]}\n").expect_err("newline");
        assert!(!err.contains("s3cret"), "{err}");
    }
}
