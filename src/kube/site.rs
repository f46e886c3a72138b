//! What every reader of a kubeconfig shares: where it is (errors point there, and
//! relative paths resolve against its folder), the raw user entry as the file holds it,
//! where a credential's bytes came from, and the error each reader gives. No reading of
//! the file as a whole (`kubeconfig`) and no checking of credentials (`credentials`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::yaml::{read_bytes_bounded, MAX_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The kubeconfig itself cannot be read (wrong path, permissions).
    #[error("read kubeconfig {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not a kubeconfig: bad YAML, or no usable context.
    #[error("kubeconfig {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// A field is missing, malformed, unsupported or refused.
    #[error("kubeconfig {path}: {field}: {message}")]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
    /// A file a field names cannot be read.
    #[error("kubeconfig {path}: {field}: read {file}: {source}")]
    Read {
        path: PathBuf,
        field: String,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The client certificate is outside its validity window by this machine's clock.
    #[error("kubeconfig {path}: {field}: {message}")]
    Validity {
        path: PathBuf,
        field: String,
        message: String,
    },
}

impl KubeconfigError {
    /// Whether the error depends on the system clock, which on a gateway without a
    /// battery-backed RTC may be wrong until NTP has run: loading again later can succeed.
    pub fn is_clock_dependent(&self) -> bool {
        matches!(self, KubeconfigError::Validity { .. })
    }
}

/// Where a PEM blob came from: a file the kubeconfig names, or its `*-data` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(PathBuf),
    Data,
}

impl Source {
    /// The kubeconfig field that held it (`client-key` or `client-key-data`).
    pub fn field(&self, base: &str) -> String {
        match self {
            Source::File(_) => base.to_string(),
            Source::Data => format!("{base}-data"),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawUser {
    pub(super) client_certificate: Option<String>,
    pub(super) client_certificate_data: Option<String>,
    pub(super) client_key: Option<String>,
    pub(super) client_key_data: Option<String>,
    pub(super) token: Option<String>,
    #[serde(rename = "tokenFile")]
    pub(super) token_file: Option<String>,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) exec: Option<serde_yaml::Value>,
    pub(super) auth_provider: Option<serde_yaml::Value>,
}

/// Where errors point: the kubeconfig's path and directory, and a field prefix.
pub(super) struct Site<'a> {
    pub(super) path: &'a Path,
    pub(super) dir: &'a Path,
    pub(super) prefix: String,
}

impl Site<'_> {
    pub(super) fn field(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    pub(super) fn error(&self, name: &str, message: impl Into<String>) -> KubeconfigError {
        KubeconfigError::Field {
            path: self.path.to_path_buf(),
            field: self.field(name),
            message: message.into(),
        }
    }

    /// A path from the kubeconfig, relative to its directory as client-go resolves it.
    pub(super) fn resolve(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The file named by `name`, or the base64 of `data_name`: exactly one of them.
    pub(super) fn file_or_data(
        &self,
        name: &str,
        file: Option<&str>,
        data_name: &str,
        data: Option<&str>,
    ) -> Result<Option<(Source, Vec<u8>)>, KubeconfigError> {
        match (
            file.filter(|f| !f.is_empty()),
            data.filter(|d| !d.is_empty()),
        ) {
            (Some(_), Some(_)) => Err(self.error(
                data_name,
                format!("{data_name} and {name} are both set; keep one"),
            )),
            (Some(f), None) => {
                let file = self.resolve(f);
                let bytes = read_bytes_bounded(&file, MAX_BYTES).map_err(|source| {
                    KubeconfigError::Read {
                        path: self.path.to_path_buf(),
                        field: self.field(name),
                        file: file.clone(),
                        source,
                    }
                })?;
                Ok(Some((Source::File(file), bytes)))
            }
            (None, Some(d)) => {
                let bytes = crate::wire::base64_decode(d)
                    .map_err(|e| self.error(data_name, format!("not base64: {e}")))?;
                Ok(Some((Source::Data, bytes)))
            }
            (None, None) => Ok(None),
        }
    }
}
