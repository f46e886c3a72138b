//! What every route reads: [`ApiDeps`], the handles the agent gives the kubelet API
//! (store tree, runtime, uplink view, settings, samplers, the stream permits). Owns
//! none of what they point at.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::auth::Auth;
use super::sampler::Sampler;
use crate::config::ServerConfig;
use crate::runtime::LibcontainerRuntime;
use crate::sync::PodStates;

/// How many long-lived streams (log follows, exec, attach, port-forward) may be open at
/// once; one more is refused with 429 (as the kubelet's streaming server does when
/// full). Each holds a thread or a process and a few bounded buffers.
pub const MAX_STREAMS: usize = 32;

/// What the API reads. Cheap to clone (handles).
#[derive(Clone)]
pub struct ApiDeps {
    pub node_name: String,
    /// `port`: the HTTPS port.
    pub port: u16,
    pub root_dir: PathBuf,
    pub podstates: PodStates,
    pub runtime: Arc<LibcontainerRuntime>,
    pub uplink: Option<crate::uplink::UplinkView>,
    /// What `/configz` shows: the running configuration.
    pub configz: Arc<serde_json::Value>,
    pub settings: ServerConfig,
    /// CPU samples for usageNanoCores.
    pub sampler: Arc<Sampler>,
    pub streams: Arc<Semaphore>,
    /// Authentication and authorization of the secure port ([`super::auth`]).
    pub auth: Arc<Auth>,
}
