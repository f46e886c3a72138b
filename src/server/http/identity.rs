//! Who is calling: the user that authentication found, or none.

use std::collections::BTreeMap;
use std::sync::Arc;

/// An authenticated user, as a SubjectAccessReview names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Who is calling, as authentication found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A certificate that chains to the client CA, and the user it names.
    Client(Arc<User>),
    /// No valid certificate (or a plain-HTTP port); on the TLS port, why not.
    Anonymous(Option<Arc<str>>),
}
