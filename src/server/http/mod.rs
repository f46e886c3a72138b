//! The kubelet API's request and response vocabulary, shared by every route: response
//! bodies and the kubelet's errors ([`body`]), who is calling ([`identity`]) and what a
//! request names ([`query`]). Imports nothing else of the server: connections are
//! [`super::connection`]'s, routing [`super::routes`]'.

mod body;
mod identity;
mod query;

pub use body::{error, json, respond, Body, Resp};
pub use identity::{Identity, User};
pub use query::{container_path, segments, Query};
