//! http2: the parts of HTTP/2 that holdfast's own clients share (frames and HPACK), a
//! leaf below every module that speaks it: the gRPC probe (`sync::probe::grpc`) and the
//! konnectivity tunnel (`tunnel`). No IO here.

pub mod frame;
pub mod hpack;
