//! What a kubeconfig's credentials hold: the cluster CA, the client certificate and key
//! (checked against the clock before the first handshake), and the bearer token (re-read
//! from its file as client-go does, so a rotated token is picked up). Never logs a secret.

use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use super::site::Source;
use super::site::{KubeconfigError, RawUser, Site};
use crate::tls::der::{self, Validity};

/// A client certificate chain and its private key.
pub struct ClientIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The leaf certificate's validity window.
    pub validity: Validity,
}

impl Clone for ClientIdentity {
    fn clone(&self) -> Self {
        ClientIdentity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            validity: self.validity,
        }
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("chain", &self.chain.len())
            .field("key", &"<redacted>")
            .field("validity", &self.validity)
            .finish()
    }
}

/// A bearer token, inline in the kubeconfig or in a file read again from time to time.
#[derive(Clone)]
pub enum Token {
    Inline(String),
    File { path: PathBuf, initial: String },
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Inline(_) => f.write_str("Token::Inline(<redacted>)"),
            Token::File { path, .. } => write!(f, "Token::File({})", path.display()),
        }
    }
}

/// Reads the CA bundle: every PEM certificate in it, each one usable as a trust anchor.
pub(super) use crate::tls::ca_certificates;
use crate::tls::{certificates, private_key};

/// The user's client certificate and token, at least one of them.
pub(super) fn load_user(
    site: &Site<'_>,
    raw: &RawUser,
    now: SystemTime,
) -> Result<(Option<ClientIdentity>, Option<Token>), KubeconfigError> {
    if raw.exec.is_some() {
        return Err(site.error(
            "exec",
            "credential plugins are not supported; use a client certificate or a token",
        ));
    }
    if raw.auth_provider.is_some() {
        return Err(site.error(
            "auth-provider",
            "auth providers are not supported; use a client certificate or a token",
        ));
    }
    if raw.username.is_some() || raw.password.is_some() {
        return Err(site.error(
            "username",
            "basic authentication is not supported (Kubernetes removed it in 1.19)",
        ));
    }
    let cert = site.file_or_data(
        "client-certificate",
        raw.client_certificate.as_deref(),
        "client-certificate-data",
        raw.client_certificate_data.as_deref(),
    )?;
    let key = site.file_or_data(
        "client-key",
        raw.client_key.as_deref(),
        "client-key-data",
        raw.client_key_data.as_deref(),
    )?;
    let identity = match (cert, key) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(site.error("client-key", "missing: client-certificate needs a key"))
        }
        (None, Some(_)) => {
            return Err(site.error(
                "client-certificate",
                "missing: client-key needs a certificate",
            ))
        }
        (Some((cert_source, cert)), Some((key_source, key))) => {
            let cert_field = cert_source.field("client-certificate");
            let chain = certificates(&cert).map_err(|m| site.error(&cert_field, m))?;
            let key =
                private_key(&key).map_err(|m| site.error(&key_source.field("client-key"), m))?;
            let validity = der::validity(&chain[0])
                .map_err(|m| site.error(&cert_field, format!("unreadable certificate: {m}")))?;
            check_validity(site, &cert_field, validity, now)?;
            Some(ClientIdentity {
                chain,
                key,
                validity,
            })
        }
    };
    let inline = raw.token.as_deref().filter(|t| !t.is_empty());
    let file = raw.token_file.as_deref().filter(|t| !t.is_empty());
    let token = match (inline, file) {
        (Some(_), Some(_)) => {
            return Err(site.error("tokenFile", "token and tokenFile are both set; keep one"))
        }
        (Some(t), None) => Some(Token::Inline(t.to_string())),
        (None, Some(f)) => {
            let path = site.resolve(f);
            let initial = read_token(&path).map_err(|e| match e {
                TokenFileError::Io(source) => KubeconfigError::Read {
                    path: site.path.to_path_buf(),
                    field: site.field("tokenFile"),
                    file: path.clone(),
                    source,
                },
                TokenFileError::Empty => {
                    site.error("tokenFile", format!("{} is empty", path.display()))
                }
            })?;
            Some(Token::File { path, initial })
        }
        (None, None) => None,
    };
    if identity.is_none() && token.is_none() {
        return Err(site.error(
            "user",
            "no credentials: set client-certificate and client-key, token or tokenFile \
             (without them the apiserver takes the agent for system:anonymous, which may \
             not register a node)",
        ));
    }
    Ok((identity, token))
}

fn check_validity(
    site: &Site<'_>,
    field: &str,
    validity: Validity,
    now: SystemTime,
) -> Result<(), KubeconfigError> {
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    let message = if now < validity.not_before {
        format!(
            "client certificate is not valid before {} and the clock says {}; is the \
             system clock set?",
            show(validity.not_before),
            show(now)
        )
    } else if now > validity.not_after {
        format!(
            "client certificate expired at {} (now {}); renew it",
            show(validity.not_after),
            show(now)
        )
    } else {
        return Ok(());
    };
    Err(KubeconfigError::Validity {
        path: site.path.to_path_buf(),
        field: site.field(field),
        message,
    })
}

fn show(unix: i64) -> String {
    match crate::time::Timestamp::from_second(unix) {
        Ok(t) => t.to_string(),
        Err(_) => format!("{unix} s after the epoch"),
    }
}

enum TokenFileError {
    Io(std::io::Error),
    Empty,
}

/// A token file's content without surrounding whitespace, as client-go reads it.
fn read_token(path: &std::path::Path) -> Result<String, TokenFileError> {
    let text =
        crate::yaml::read_bounded(path, crate::yaml::MAX_BYTES).map_err(TokenFileError::Io)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenFileError::Empty);
    }
    Ok(token.to_string())
}

/// How often client-go's cached file token source reads its file again.
pub const TOKEN_FILE_PERIOD: Duration = Duration::from_secs(60);

/// The `Authorization` header's token, read again from its file at most every `period`.
/// A failed read keeps the last good token: a half-written file must not log the node out.
pub(super) struct BearerToken {
    file: Option<PathBuf>,
    period: Duration,
    state: Mutex<(String, Instant)>,
}

impl BearerToken {
    pub(super) fn new(token: &Token, period: Duration) -> BearerToken {
        let (file, value) = match token {
            Token::Inline(t) => (None, t.clone()),
            Token::File { path, initial } => (Some(path.clone()), initial.clone()),
        };
        BearerToken {
            file,
            period,
            state: Mutex::new((value, Instant::now())),
        }
    }

    /// The header value, `Bearer <token>`.
    pub(super) fn header(&self) -> String {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = &self.file {
            if state.1.elapsed() >= self.period {
                match read_token(path) {
                    Ok(token) => state.0 = token,
                    Err(TokenFileError::Io(e)) => log::warn!(
                        "read tokenFile {}: {e}; keeping the previous token",
                        path.display()
                    ),
                    Err(TokenFileError::Empty) => log::warn!(
                        "tokenFile {} is empty; keeping the previous token",
                        path.display()
                    ),
                }
                state.1 = Instant::now();
            }
        }
        format!("Bearer {}", state.0)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn token_file_is_read_again_after_the_period_and_a_bad_read_keeps_the_old_one() {
        let dir = std::env::temp_dir().join(format!("holdfast-token-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("token");
        fs::write(&path, "first\n").expect("write");
        let token = Token::File {
            path: path.clone(),
            initial: "first".to_string(),
        };

        let cached = BearerToken::new(&token, Duration::from_secs(3600));
        fs::write(&path, "second").expect("write");
        assert_eq!(
            cached.header(),
            "Bearer first",
            "read again before the period"
        );

        let fresh = BearerToken::new(&token, Duration::ZERO);
        assert_eq!(fresh.header(), "Bearer second");
        fs::write(&path, "  \n").expect("write");
        assert_eq!(
            fresh.header(),
            "Bearer second",
            "empty file keeps the token"
        );
        fs::remove_file(&path).expect("rm");
        assert_eq!(
            fresh.header(),
            "Bearer second",
            "missing file keeps the token"
        );
        fs::write(&path, "third").expect("write");
        assert_eq!(fresh.header(), "Bearer third");
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn inline_token_is_sent_as_is() {
        let token = BearerToken::new(&Token::Inline("abc".to_string()), Duration::ZERO);
        assert_eq!(token.header(), "Bearer abc");
        assert_eq!(
            format!("{:?}", Token::Inline("abc".into())),
            "Token::Inline(<redacted>)"
        );
    }
}
