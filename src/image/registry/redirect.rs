//! Where a registry's redirect leads: the `Location` of a redirect answer, followed by
//! the rules of [`crate::redirect`] (never from https down to plain http).

use ureq::http::Response;
use ureq::Body;

use super::RegistryError;
pub(crate) use crate::redirect::{host_of, origin};

/// Where a redirect answer from `url` leads; never from https down to plain http.
pub(crate) fn redirect_target(
    url: &str,
    status: u16,
    response: &Response<Body>,
) -> Result<String, RegistryError> {
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| RegistryError::Invalid {
            what: url.to_string(),
            reason: format!("redirect {status} without a Location"),
        })?;
    crate::redirect::follow(url, location).map_err(|reason| RegistryError::Invalid {
        what: url.to_string(),
        reason,
    })
}
