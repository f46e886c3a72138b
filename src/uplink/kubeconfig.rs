//! kubeconfig files: the current context's cluster and user, with the files they name
//! read and checked, so a wrong path or a bad certificate is one clear error at start.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("kubeconfig {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("kubeconfig {path}: read {file}: {source}")]
    Read {
        path: PathBuf,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
