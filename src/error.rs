//! The top-level error: every module's error, gathered for `main` to map to an exit code.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Image(#[from] crate::image::ImageError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    /// The config describes a Node the cluster would refuse.
    #[error(transparent)]
    Node(#[from] crate::node::NodeStatusError),
    /// A CLI request that could not be carried out, in words for the user.
    #[error("{0}")]
    Cli(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The process exit code `main` returns for this error: 2 for bad input from the
    /// user (flags, config), 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::Node(_) => 2,
            _ => 1,
        }
    }
}

/// An error and its causes, as one line: `open store at X: IO error: ...`.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
