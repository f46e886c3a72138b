//! Registry authentication: the `WWW-Authenticate` challenge on a 401 decides between
//! Basic (credentials on every request) and Bearer (a token from the challenge's realm,
//! asked for with the credentials, cached until it expires). Credentials are tried in
//! the keyring's order, anonymous when there are none. Tokens and passwords never reach
//! a log line or an error message.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use ureq::http::Response;
use ureq::Body;

use super::hosts::Endpoint;
use super::http::{status_error, Call, Http};
use super::keyring::Credential;
use super::RegistryError;
use crate::wire::base64_encode;

/// A token's life when the token service does not say (the distribution spec's default).
const DEFAULT_TOKEN_LIFE: Duration = Duration::from_secs(60);
/// Tokens are renewed this long before they expire, to outlast a slow request.
const TOKEN_MARGIN: Duration = Duration::from_secs(10);
/// Largest token response read.
const TOKEN_BODY_LIMIT: u64 = 64 * 1024;

/// Tokens by (realm, service, scope, credential), shared by every pull; and the
/// `Authorization` that last worked per endpoint, repository and credentials, so the
/// next request starts with it instead of a 401 round trip.
#[derive(Default)]
pub(crate) struct TokenCache {
    tokens: Mutex<HashMap<String, (String, Instant)>>,
    working: Mutex<HashMap<String, String>>,
}

impl TokenCache {
    fn get(&self, key: &str) -> Option<String> {
        self.get_at(key, Instant::now())
    }

    fn get_at(&self, key: &str, now: Instant) -> Option<String> {
        let tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        tokens
            .get(key)
            .filter(|(_, until)| now < *until)
            .map(|(t, _)| t.clone())
    }

    fn recall(&self, key: &str) -> Option<String> {
        let working = self.working.lock().unwrap_or_else(PoisonError::into_inner);
        working.get(key).cloned()
    }

    fn remember(&self, key: String, header: String) {
        let mut working = self.working.lock().unwrap_or_else(PoisonError::into_inner);
        // Bounded by what a node pulls from; a stale entry only costs one 401.
        if working.len() >= 256 {
            working.clear();
        }
        working.insert(key, header);
    }

    fn put(&self, key: String, token: String, life: Duration) {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        tokens.retain(|_, (_, until)| *until > now);
        let life = life
            .saturating_sub(TOKEN_MARGIN)
            .max(Duration::from_secs(1));
        tokens.insert(key, (token, now + life));
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Reads `Bearer realm="...",service="...",scope="..."` or `Basic realm="..."`.
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    let params = parse_params(params);
    let get = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        });
    }
    None
}

/// `a="x, y",b=z` → [(a, "x, y"), (b, z)]; commas inside quotes stay.
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((name, after)) = rest.split_once('=') else {
            break;
        };
        let name = name.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &q[end.min(q.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        out.push((name, value));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// One repository at one endpoint, with the credentials that may be used there. Keeps
/// the `Authorization` value that worked, so later requests of the pull reuse it.
pub(crate) struct Session<'a> {
    pub http: &'a Http,
    pub tokens: &'a TokenCache,
    pub endpoint: &'a Endpoint,
    /// Repository path (`library/busybox`).
    pub repository: String,
    /// In the order to try; empty means anonymous.
    pub credentials: Vec<Credential>,
    authorization: Option<String>,
    /// Key of the working `Authorization` in the cache.
    key: String,
}

impl<'a> Session<'a> {
    pub(crate) fn new(
        http: &'a Http,
        tokens: &'a TokenCache,
        endpoint: &'a Endpoint,
        repository: &str,
        credentials: Vec<Credential>,
    ) -> Session<'a> {
        // Credentials go only over verified TLS.
        let credentials = if endpoint.may_carry_credentials() {
            credentials
        } else {
            Vec::new()
        };
        let mut h = Sha256::new();
        for c in &credentials {
            h.update(c.username.as_bytes());
            h.update([0]);
            h.update(c.password.as_bytes());
            h.update([0]);
        }
        let key = format!(
            "{}\n{repository}\n{}",
            endpoint.base,
            super::super::digest::hex(&h.finalize())
        );
        let authorization = tokens.recall(&key);
        Session {
            http,
            tokens,
            endpoint,
            repository: repository.to_string(),
            credentials,
            authorization,
            key,
        }
    }

    /// `GET`s `path` (below the endpoint's base), authenticating on a 401. Returns
    /// any other answer as it is.
    pub(crate) fn get(
        &mut self,
        path: &str,
        headers: Vec<(&'static str, String)>,
        body_timeout: Option<Duration>,
    ) -> Result<Response<Body>, RegistryError> {
        let url = format!("{}{path}", self.endpoint.base);
        let call = Call {
            method: "GET",
            url: url.clone(),
            headers: headers.clone(),
            auth: self.authorization.as_deref(),
            body_timeout,
        };
        let response = self.http.send(self.endpoint, &call)?;
        if response.status().as_u16() != 401 {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let first = status_error("GET", &url, response);
        let Some(challenge) = challenge else {
            return Err(first);
        };
        let candidates: Vec<Option<Credential>> = if self.credentials.is_empty() {
            vec![None]
        } else {
            self.credentials.iter().cloned().map(Some).collect()
        };
        let mut refusals = Vec::new();
        for cred in candidates {
            let tried = match &cred {
                Some(c) => format!("credentials from {} (user {})", c.source, c.username),
                None => "no credentials".to_string(),
            };
            let header = match self.authorize(&challenge, cred.as_ref()) {
                Ok(h) => h,
                Err(e @ RegistryError::Transport { .. }) => return Err(e),
                Err(e) => {
                    refusals.push(format!("{tried}: {e}"));
                    continue;
                }
            };
            let again = Call {
                method: "GET",
                url: url.clone(),
                headers: headers.clone(),
                auth: Some(&header),
                body_timeout,
            };
            let response = self.http.send(self.endpoint, &again)?;
            let status = response.status().as_u16();
            if status == 401 || status == 403 {
                refusals.push(format!("{tried}: {}", status_error("GET", &url, response)));
                continue;
            }
            self.tokens.remember(self.key.clone(), header.clone());
            self.authorization = Some(header);
            return Ok(response);
        }
        Err(RegistryError::Unauthorized {
            registry: self.endpoint.base.clone(),
            message: format!(
                "authentication failed for repository {}: {}",
                self.repository,
                refusals.join("; ")
            ),
        })
    }

    fn authorize(
        &self,
        challenge: &Challenge,
        cred: Option<&Credential>,
    ) -> Result<String, RegistryError> {
        match challenge {
            Challenge::Basic => match cred {
                Some(c) => Ok(basic(c)),
                None => Err(RegistryError::Unauthorized {
                    registry: self.endpoint.base.clone(),
                    message: "the registry asks for a username and password".into(),
                }),
            },
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let scope = scope
                    .clone()
                    .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let who = cred.map(|c| {
                    let mut h = Sha256::new();
                    h.update(c.username.as_bytes());
                    h.update([0]);
                    h.update(c.password.as_bytes());
                    super::super::digest::hex(&h.finalize())
                });
                let key = format!(
                    "{realm}\n{}\n{scope}\n{}",
                    service.as_deref().unwrap_or(""),
                    who.unwrap_or_default()
                );
                if let Some(token) = self.tokens.get(&key) {
                    return Ok(format!("Bearer {token}"));
                }
                let (token, life) = self.fetch_token(realm, service.as_deref(), &scope, cred)?;
                self.tokens.put(key, token.clone(), life);
                Ok(format!("Bearer {token}"))
            }
        }
    }

    fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        cred: Option<&Credential>,
    ) -> Result<(String, Duration), RegistryError> {
        let token_err = |message: String| RegistryError::Token {
            realm: realm.to_string(),
            message,
        };
        if cred.is_some() && !realm.starts_with("https://") {
            return Err(token_err(
                "the token service is not https; credentials are not sent over plain HTTP".into(),
            ));
        }
        let mut url = realm.to_string();
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for (k, v) in [("service", service), ("scope", Some(scope))] {
            if let Some(v) = v {
                url.push(sep);
                url.push_str(k);
                url.push('=');
                url.push_str(&crate::wire::escape(v));
                sep = '&';
            }
        }
        let header = cred.map(basic);
        // The realm is reached through the endpoint's agent: the same CA trusts it. The
        // credentials go to the realm's own origin only, never on along a redirect.
        let call = Call {
            method: "GET",
            url: url.clone(),
            headers: vec![("Accept", "application/json".to_string())],
            auth: header.as_deref(),
            body_timeout: Some(Duration::from_secs(30)),
        };
        let response = self.http.send(self.endpoint, &call)?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(token_err(format!("answered {status}")));
        }
        let (_, mut body) = response.into_parts();
        let bytes = body
            .with_config()
            .limit(TOKEN_BODY_LIMIT)
            .read_to_vec()
            .map_err(|e| token_err(format!("read the answer: {e}")))?;
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            #[serde(default)]
            token: Option<String>,
            #[serde(default)]
            access_token: Option<String>,
            #[serde(default)]
            expires_in: Option<u64>,
        }
        let answer: TokenAnswer = serde_json::from_slice(&bytes)
            .map_err(|e| token_err(format!("not a token answer: {e}")))?;
        let token = answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| token_err("no token in the answer".into()))?;
        let life = answer
            .expires_in
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_TOKEN_LIFE);
        Ok((token, life))
    }
}

fn basic(c: &Credential) -> String {
    format!(
        "Basic {}",
        base64_encode(format!("{}:{}", c.username, c.password).as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge("Bearer service=x"), None);
    }

    #[test]
    fn tokens_expire() {
        let cache = TokenCache::default();
        cache.put("k".into(), "t".into(), Duration::from_secs(60));
        assert_eq!(cache.get("k").as_deref(), Some("t"));
        // Kept for its life less the margin, so a slow request does not outlive it.
        let later = Instant::now() + Duration::from_secs(51);
        assert_eq!(cache.get_at("k", later), None);
    }
}
