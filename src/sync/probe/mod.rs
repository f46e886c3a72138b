//! probe: probes and lifecycle hooks. What each does, taken from the spec
//! ([`action`]); the network actions the kubelet's prober runs (tcpSocket, httpGet,
//! gRPC health: [`net`], [`http`], [`grpc`]), each giving the result and the words the
//! kubelet would; and one probe's state against its thresholds ([`state`]). Actions
//! block (callers run them on a blocking thread); none touches pods, the store or the
//! apiserver. The pod worker schedules probes and acts on their verdicts.

pub mod action;
pub mod grpc;
pub mod http;
pub mod net;
pub mod state;
