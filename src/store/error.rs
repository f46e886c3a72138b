//! The store's errors, and which of them mean a broken store.

use std::path::PathBuf;

use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("open store at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    #[error("store at {path} has schema version {found}, newer than this holdfast understands ({supported}); upgrade holdfast or move the store away")]
    TooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("store at {path} is held by another process (is another holdfast running?)")]
    Busy { path: PathBuf },
    #[error("lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store at {path} has an unreadable schema version")]
    BadSchema { path: PathBuf },
    #[error("store at {path} holds records but no schema version")]
    NoSchema { path: PathBuf },
    #[error("open store at {path}: no space left on its filesystem, even with the store's own headroom given back; free some space")]
    NoSpace { path: PathBuf },
    #[error("store at {path} is closed: opening it again after a write error failed; it is tried again every second")]
    Closed { path: PathBuf },
    #[error("store at {path} went back in time: sled holds generation {store}, but generation {file} had been flushed; its newest records are lost and the rest may be stale")]
    WentBack {
        path: PathBuf,
        store: u64,
        file: u64,
    },
    #[error("open store at {path}: sled panicked: {message}")]
    Panicked { path: PathBuf, message: String },
    #[error("compact store at {path}")]
    Compact {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("move the broken store at {path} to {to}")]
    MoveAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store {op} in tree {tree} key {key}")]
    Db {
        op: &'static str,
        tree: &'static str,
        key: String,
        #[source]
        source: sled::Error,
    },
    #[error("decode {tree} record {key}")]
    Decode {
        tree: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("encode {tree} record {key}")]
    Encode {
        tree: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    /// Whether the store itself is unreadable (rather than busy, too new or out of
    /// reach): the case for moving it aside and starting afresh.
    pub fn is_broken_store(&self) -> bool {
        match self {
            // A full disk breaks nothing: the store is fine once there is room.
            StoreError::Open { source, .. } => !is_no_space(source),
            StoreError::Panicked { .. }
            | StoreError::WentBack { .. }
            | StoreError::BadSchema { .. }
            | StoreError::NoSchema { .. } => true,
            _ => false,
        }
    }
}

/// Whether sled failed because the filesystem is full.
pub(super) fn is_no_space(e: &sled::Error) -> bool {
    match e {
        sled::Error::Io(io) => {
            io.kind() == std::io::ErrorKind::StorageFull
                || io.raw_os_error() == Some(Errno::ENOSPC as i32)
                || io.to_string().contains("No space left")
        }
        _ => false,
    }
}
