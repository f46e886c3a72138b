//! The apiserver client: one `ureq` agent over rustls, trusting the cluster CA only,
//! authenticating with a client certificate or a bearer token from the kubeconfig.
//! Blocking: callers run it on the uplink threads, never on the sync loop.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, WatchEvent};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::ApiError;
use super::kubeconfig::KubeconfigError;

/// How a PATCH body is to be read by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Patch {
    /// `application/strategic-merge-patch+json`: lists with a merge key (conditions by
    /// `type`, container statuses by `name`) merge element by element.
    Strategic,
    /// `application/merge-patch+json` (RFC 7386): lists are replaced whole.
    Merge,
}

/// A handle on the apiserver. Cheap to clone; clones share connections and counters.
#[derive(Clone)]
pub struct Client {
    _todo: (),
}

impl Client {
    /// Reads the kubeconfig at `path` and builds a client for its current context.
    pub fn from_kubeconfig(_path: &Path) -> Result<Client, KubeconfigError> {
        todo!()
    }

    /// The server URL, for log lines.
    pub fn server(&self) -> &str {
        todo!()
    }

    /// How many requests this client (and its clones) has sent, watches included.
    pub fn requests_sent(&self) -> u64 {
        todo!()
    }

    /// GET `path` (path and query, e.g. `/api/v1/nodes/n1`).
    pub fn get<T: DeserializeOwned>(&self, _path: &str) -> Result<T, ApiError> {
        todo!()
    }

    /// POST `body` as JSON.
    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        _path: &str,
        _body: &B,
    ) -> Result<T, ApiError> {
        todo!()
    }

    /// PUT `body` as JSON.
    pub fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        _path: &str,
        _body: &B,
    ) -> Result<T, ApiError> {
        todo!()
    }

    /// PATCH with `body` read as `kind`.
    pub fn patch<T: DeserializeOwned>(
        &self,
        _path: &str,
        _kind: Patch,
        _body: &serde_json::Value,
    ) -> Result<T, ApiError> {
        todo!()
    }

    /// DELETE with `options` as the body.
    pub fn delete<T: DeserializeOwned>(
        &self,
        _path: &str,
        _options: &DeleteOptions,
    ) -> Result<T, ApiError> {
        todo!()
    }

    /// Opens a watch (`path` carries `watch=true`, `resourceVersion`, `timeoutSeconds`);
    /// `timeout` bounds how long the body may take, a little beyond `timeoutSeconds`.
    pub fn watch<T: DeserializeOwned>(
        &self,
        _path: &str,
        _timeout: Duration,
    ) -> Result<Watch<T>, ApiError> {
        todo!()
    }
}

/// The events of one watch, one JSON object per line, until the server ends the stream
/// (`None`) or the connection breaks (`Some(Err(..))`, then `None`).
pub struct Watch<T> {
    _todo: std::marker::PhantomData<T>,
}

impl<T: DeserializeOwned> Iterator for Watch<T> {
    type Item = Result<WatchEvent<T>, ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        todo!()
    }
}
