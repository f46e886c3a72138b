//! probe: the network actions the kubelet's prober runs for probes and lifecycle hooks
//! (tcpSocket, httpGet, gRPC health), each giving the result and the words the kubelet
//! would. Blocking: callers run them on a blocking thread. Holds no probe state and never
//! touches pods, containers or the apiserver.

pub mod grpc;
pub mod http;
pub mod net;
