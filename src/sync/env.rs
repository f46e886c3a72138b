//! A container's environment as the kubelet builds it (`makeEnvironmentVariables`):
//! `envFrom` first, then `env` in order, each `value` with `$(VAR)` expanded against what
//! came before, each `valueFrom` resolved from the pod (`fieldRef`), the container's
//! resources (`resourceFieldRef`) or the cached ConfigMaps and Secrets; then the
//! variables of the Services the pod sees (see [`service_env`](super::service_env)),
//! except those the container sets itself. `$(VAR)` can refer to them.
//!
//! Reads the store's copy of ConfigMaps and Secrets ([`ObjectCache`]) and never the
//! apiserver, so a pod from the cluster gets its environment after a reboot with no
//! uplink. An object that is not cached is "not found", as the kubelet says when the
//! apiserver has no such object; the worker retries on resync and at once when the
//! object arrives. The Services too come from the store: the list read since the agent
//! started or, while the apiserver cannot be reached, the one kept from before (the
//! caller logs that); else a cluster pod's container waits, as with the kubelet.
//!
//! Secret values pass through here: nothing in this file logs or formats a value, and
//! [`Environment`] has no `Debug`. Errors name objects and keys, never values.
//!
//! Sizes are bounded before anything is allocated: `$(VAR)` expansion doubles a value
//! with a dozen bytes of manifest (`B: $(A)$(A)`, `C: $(B)$(B)`, ...), so each value's
//! expanded length is counted first and refused past [`MAX_VAR_BYTES`], and the whole
//! environment past [`MAX_ENV_BYTES`].

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVarSource, Pod, Secret};

use crate::pod::downward::{
    field_ref, namespace, resource_field_ref, DownwardError, DownwardInputs,
};
use crate::runtime::{expand, expanded_len};
use crate::uplink::objects::{ObjectCache, ObjectsError};
use crate::uplink::services::{ListState, ServiceCache};

/// The most one variable may take, `NAME=value` and its NUL: the kernel's
/// `MAX_ARG_STRLEN`, as for one argument. execve refuses a longer string with E2BIG,
/// so no container could start with one; refusing it here costs nothing that could run.
pub const MAX_VAR_BYTES: usize = crate::runtime::MAX_ARG_STRLEN;

/// The most a container's own environment may take, every `NAME=value` and its NUL
/// added up. execve takes argv and the environment together up to a quarter of the
/// stack limit (2 MiB under the usual 8 MiB); half of that for what the pod spec sets
/// leaves the other half to the command line and the image's environment. A real
/// workload's environment is a few KiB; a ConfigMap (1 MiB at most) may not be
/// poured whole into one through envFrom.
pub const MAX_ENV_BYTES: usize = crate::runtime::spec::MAX_ENV_BYTES;

/// Why a container's environment cannot be built: the kubelet's
/// CreateContainerConfigError, with the kubelet's message.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// `configmap "x" not found`, `secret "x" not found`.
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// `couldn't find key k in ConfigMap ns/x`.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    /// A static pod has no API objects to read (the apiserver refuses mirror pods that
    /// reference them).
    #[error("couldn't get {kind} {namespace}/{name}, static pods cannot reference API objects")]
    StaticPod {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// The store could not be read; the error names the tree and key only.
    #[error("read {kind} {namespace}/{name}: {source}")]
    Cache {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<ObjectsError>,
    },
    /// A `fieldRef` or `resourceFieldRef` the kubelet does not support.
    #[error(transparent)]
    Downward(#[from] DownwardError),
    /// A name the runtime cannot pass on.
    #[error("env name {name:?} of container {container:?} is not valid")]
    InvalidName { name: String, container: String },
    /// A value with a NUL byte, which no process environment can hold.
    #[error("env {name:?} of container {container:?}: the value contains a NUL byte")]
    NulInValue { name: String, container: String },
    /// A variable longer than a process can be given (checked before it is expanded).
    #[error(
        "env {name:?} of container {container:?} would take {bytes} bytes (NAME=value, \
         $(VAR) references expanded), more than the {MAX_VAR_BYTES} bytes one variable \
         may take (the kernel's MAX_ARG_STRLEN): shorten it or the variables it refers to"
    )]
    VarTooLong {
        name: String,
        container: String,
        bytes: usize,
    },
    /// An environment larger than this agent gives a container.
    #[error(
        "environment of container {container:?} would take {bytes} bytes with env {name:?}, \
         more than the {MAX_ENV_BYTES} bytes (1 MiB) a container's env and envFrom may \
         take: mount large values as a volume instead"
    )]
    EnvTooLarge {
        name: String,
        container: String,
        bytes: usize,
    },
    /// The kubelet's words: a cluster pod waits until the Services have been read
    /// once (here: or a list of them was kept from before).
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotRead,
    /// The kept Services could not be read.
    #[error("failed to list services when setting up env vars: {0}")]
    Services(#[source] crate::store::StoreError),
    /// The variables of the namespace's Services do not fit beside the container's own.
    #[error(
        "environment of container {container:?} would take {bytes} bytes with the variables \
         of the {services} Service(s) it sees, more than the {MAX_ENV_BYTES} bytes (1 MiB) a \
         container's environment may take: set enableServiceLinks: false"
    )]
    ServiceEnvTooLarge {
        container: String,
        services: usize,
        bytes: usize,
    },
}

/// What resolution needs besides the pod and container.
pub struct EnvInputs<'a> {
    pub objects: &'a ObjectCache,
    /// The cluster's Services, on a node with an apiserver; `None` standalone, where,
    /// as with a kubelet without one, containers get no Service variables.
    pub services: Option<&'a ServiceCache>,
    /// Where the pod runs, for `fieldRef` and `resourceFieldRef`.
    pub downward: DownwardInputs<'a>,
}

/// A container's own environment, resolved. No `Debug`: it holds secret values.
#[derive(Default, PartialEq)]
pub struct Environment {
    /// `(name, value)` in the order the container declares them; a later name replaces
    /// an earlier one in place.
    pub vars: Vec<(String, String)>,
    /// Warning events the kubelet records (`InvalidEnvironmentVariableNames`), as
    /// messages; names only, never values.
    pub invalid_names: Vec<String>,
    /// Where the Service variables came from; `None` on a node without an apiserver.
    pub services: Option<ListState>,
    /// What `vars` takes, as [`entry_bytes`] counts it.
    bytes: usize,
}

/// What `NAME=value` takes in a process's environment, with its NUL.
fn entry_bytes(name: &str, value_len: usize) -> usize {
    name.len().saturating_add(value_len).saturating_add(2)
}

impl Environment {
    /// Sets `name`, within [`MAX_VAR_BYTES`] and [`MAX_ENV_BYTES`].
    fn set(
        &mut self,
        index: &mut HashMap<String, usize>,
        container: &str,
        name: String,
        value: String,
    ) -> Result<(), EnvError> {
        let entry = check_var(&name, value.len(), container)?;
        let replaced = index
            .get(&name)
            .map_or(0, |&i| entry_bytes(&self.vars[i].0, self.vars[i].1.len()));
        let bytes = self.bytes.saturating_sub(replaced).saturating_add(entry);
        if bytes > MAX_ENV_BYTES {
            return Err(EnvError::EnvTooLarge {
                name,
                container: container.to_string(),
                bytes,
            });
        }
        self.bytes = bytes;
        match index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
        Ok(())
    }
}

/// The bytes of variable `name` with a value of `value_len` bytes, or the error when
/// that is more than one variable may take.
fn check_var(name: &str, value_len: usize, container: &str) -> Result<usize, EnvError> {
    let bytes = entry_bytes(name, value_len);
    if bytes > MAX_VAR_BYTES {
        return Err(EnvError::VarTooLong {
            name: name.to_string(),
            container: container.to_string(),
            bytes,
        });
    }
    Ok(bytes)
}

/// The event reason for envFrom keys that are skipped.
pub const INVALID_NAMES_REASON: &str = "InvalidEnvironmentVariableNames";

/// Builds `container`'s environment by the kubelet's rules. Blocks on store reads.
pub fn resolve(
    pod: &Pod,
    container: &Container,
    inputs: &EnvInputs<'_>,
) -> Result<Environment, EnvError> {
    let mut objects = Lookup {
        cache: inputs.objects,
        namespace: namespace(pod),
        is_static: crate::pod::is_static_pod(pod),
        config_maps: HashMap::new(),
        secrets: HashMap::new(),
    };
    let services = service_vars(pod, inputs)?;
    let mut env = Environment {
        services: services.list,
        ..Environment::default()
    };
    let mut index: HashMap<String, usize> = HashMap::new();
    // The names `$(VAR)` can refer to: envFrom's and the earlier env entries, then the
    // Services' (the kubelet looks in the container's own first).
    let mut defined: HashMap<String, String> = services.vars.iter().cloned().collect();

    // envFrom first, so that env overrides it.
    add_env_from(container, &mut objects, &mut env, &mut index, &mut defined)?;

    for var in container.env.iter().flatten() {
        if var.name.is_empty() || var.name.contains('=') || var.name.contains('\0') {
            return Err(EnvError::InvalidName {
                name: var.name.clone(),
                container: container.name.clone(),
            });
        }
        let literal = var.value.as_deref().unwrap_or("");
        // As the kubelet: a non-empty value wins over valueFrom.
        let value = if !literal.is_empty() {
            check_var(&var.name, expanded_len(literal, &defined), &container.name)?;
            expand(literal, &defined)
        } else if let Some(from) = &var.value_from {
            let resolved = value_from(pod, container, from, inputs, &mut objects)?;
            // An optional reference to nothing leaves the variable unset.
            let Some(value) = resolved else { continue };
            value
        } else {
            String::new()
        };
        env.set(&mut index, &container.name, var.name.clone(), value.clone())?;
        defined.insert(var.name.clone(), value);
    }

    add_service_vars(&mut env, &mut index, &container.name, services)?;

    if let Some((name, _)) = env.vars.iter().find(|(_, v)| v.contains('\0')) {
        return Err(EnvError::NulInValue {
            name: name.clone(),
            container: container.name.clone(),
        });
    }
    Ok(env)
}

/// The variables of the Services a pod sees.
#[derive(Default)]
struct ServiceVars {
    /// Where the list came from; `None` on a node without an apiserver.
    list: Option<ListState>,
    /// How many Services made them.
    services: usize,
    vars: Vec<(String, String)>,
}

/// The variables of the Services the pod sees. A cluster pod waits while this run's
/// list is not read, unless the apiserver cannot be reached and a list was kept; a
/// static pod does not wait (the kubelet gives it what it has).
fn service_vars(pod: &Pod, inputs: &EnvInputs<'_>) -> Result<ServiceVars, EnvError> {
    let Some(cache) = inputs.services else {
        return Ok(ServiceVars::default());
    };
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    let visible = cache
        .visible(&namespace(pod), links)
        .map_err(EnvError::Services)?;
    let unread = matches!(visible.list, ListState::Unread | ListState::Stale);
    if unread && !crate::pod::is_static_pod(pod) {
        return Err(EnvError::ServicesNotRead);
    }
    Ok(ServiceVars {
        list: Some(visible.list),
        services: visible.services.len(),
        vars: super::service_env::service_vars(&visible.services),
    })
}

/// Appends the Service variables the container does not set itself (env and envFrom
/// win), within [`MAX_ENV_BYTES`].
fn add_service_vars(
    env: &mut Environment,
    index: &mut HashMap<String, usize>,
    container: &str,
    services: ServiceVars,
) -> Result<(), EnvError> {
    let own: Vec<bool> = services
        .vars
        .iter()
        .map(|(n, _)| index.contains_key(n))
        .collect();
    for ((name, value), own) in services.vars.into_iter().zip(own) {
        if own {
            continue;
        }
        env.set(index, container, name, value)
            .map_err(|e| match e {
                EnvError::EnvTooLarge { bytes, .. } => EnvError::ServiceEnvTooLarge {
                    container: container.to_string(),
                    services: services.services,
                    bytes,
                },
                e => e,
            })?;
    }
    Ok(())
}

/// `envFrom`: every valid key of each ConfigMap or Secret, prefixed; invalid keys are
/// skipped and named in a warning, as the kubelet does.
fn add_env_from(
    container: &Container,
    objects: &mut Lookup<'_>,
    env: &mut Environment,
    index: &mut HashMap<String, usize>,
    defined: &mut HashMap<String, String>,
) -> Result<(), EnvError> {
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.as_deref().unwrap_or("");
        let (kind, name, pairs) = if let Some(r) = &source.config_map_ref {
            let Some(cm) = objects.config_map(&r.name, r.optional == Some(true))? else {
                continue;
            };
            let pairs: Vec<(String, String)> = cm
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            ("configMap", r.name.clone(), pairs)
        } else if let Some(r) = &source.secret_ref {
            let Some(secret) = objects.secret(&r.name, r.optional == Some(true))? else {
                continue;
            };
            let pairs: Vec<(String, String)> = secret
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), text(&v.0)))
                .collect();
            ("secret", r.name.clone(), pairs)
        } else {
            continue;
        };
        let mut invalid = Vec::new();
        for (key, value) in pairs {
            let var = format!("{prefix}{key}");
            if !is_env_var_name(&var) {
                invalid.push(var);
                continue;
            }
            env.set(index, &container.name, var.clone(), value.clone())?;
            defined.insert(var, value);
        }
        if !invalid.is_empty() {
            invalid.sort();
            env.invalid_names.push(format!(
                "Keys [{}] from the EnvFrom {kind} {}/{name} were skipped since they are \
                 considered invalid environment variable names.",
                invalid.join(", "),
                objects.namespace
            ));
        }
    }
    Ok(())
}

/// `valueFrom`: a field or resource of the pod, or a ConfigMap or Secret key; `None`
/// for an optional reference to nothing.
fn value_from(
    pod: &Pod,
    container: &Container,
    from: &EnvVarSource,
    inputs: &EnvInputs<'_>,
    objects: &mut Lookup<'_>,
) -> Result<Option<String>, EnvError> {
    Ok(if let Some(f) = &from.field_ref {
        Some(field_ref(pod, f, &inputs.downward)?)
    } else if let Some(r) = &from.resource_field_ref {
        Some(resource_field_ref(
            pod,
            container,
            r,
            inputs.downward.allocatable,
        )?)
    } else if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional == Some(true);
        match objects.config_map(&r.name, optional)? {
            None => None,
            Some(cm) => match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => Some(v.clone()),
                None if optional => None,
                None => return Err(objects.missing_key("ConfigMap", &r.name, &r.key)),
            },
        }
    } else if let Some(r) = &from.secret_key_ref {
        let optional = r.optional == Some(true);
        match objects.secret(&r.name, optional)? {
            None => None,
            Some(s) => match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                Some(v) => Some(text(&v.0)),
                None if optional => None,
                None => return Err(objects.missing_key("Secret", &r.name, &r.key)),
            },
        }
    } else {
        Some(String::new())
    })
}

/// Secret bytes as an environment string. The kubelet passes bytes on and the runtime's
/// JSON spec replaces what is not UTF-8 with U+FFFD; so does this.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// ConfigMaps and Secrets of the pod's namespace, each read from the store once.
struct Lookup<'a> {
    cache: &'a ObjectCache,
    namespace: String,
    is_static: bool,
    config_maps: HashMap<String, Option<ConfigMap>>,
    secrets: HashMap<String, Option<Secret>>,
}

impl Lookup<'_> {
    /// The ConfigMap, or None when it is missing and `optional`.
    fn config_map(&mut self, name: &str, optional: bool) -> Result<Option<&ConfigMap>, EnvError> {
        if self.is_static {
            return Err(self.static_pod("configMap", name));
        }
        if !self.config_maps.contains_key(name) {
            let found = self
                .cache
                .config_map(&self.namespace, name)
                .map_err(|source| self.cache_error("configmap", name, source))?;
            self.config_maps.insert(name.to_string(), found);
        }
        match self.config_maps.get(name).and_then(Option::as_ref) {
            Some(cm) => Ok(Some(cm)),
            None if optional => Ok(None),
            None => Err(EnvError::NotFound {
                kind: "configmap",
                name: name.to_string(),
            }),
        }
    }

    /// The Secret, or None when it is missing and `optional`.
    fn secret(&mut self, name: &str, optional: bool) -> Result<Option<&Secret>, EnvError> {
        if self.is_static {
            return Err(self.static_pod("secret", name));
        }
        if !self.secrets.contains_key(name) {
            let found = self
                .cache
                .secret(&self.namespace, name)
                .map_err(|source| self.cache_error("secret", name, source))?;
            self.secrets.insert(name.to_string(), found);
        }
        match self.secrets.get(name).and_then(Option::as_ref) {
            Some(s) => Ok(Some(s)),
            None if optional => Ok(None),
            None => Err(EnvError::NotFound {
                kind: "secret",
                name: name.to_string(),
            }),
        }
    }

    fn static_pod(&self, kind: &'static str, name: &str) -> EnvError {
        EnvError::StaticPod {
            kind,
            namespace: self.namespace.clone(),
            name: name.to_string(),
        }
    }

    fn cache_error(&self, kind: &'static str, name: &str, source: ObjectsError) -> EnvError {
        EnvError::Cache {
            kind,
            namespace: self.namespace.clone(),
            name: name.to_string(),
            source: Box::new(source),
        }
    }

    fn missing_key(&self, kind: &'static str, name: &str, key: &str) -> EnvError {
        EnvError::MissingKey {
            kind,
            namespace: self.namespace.clone(),
            name: name.to_string(),
            key: key.to_string(),
        }
    }
}

/// The kubelet's `IsEnvVarName`, by which envFrom keys are kept or skipped: a C-like
/// identifier that may also hold `-` and `.`, and is not `.`, `..` or `..`-prefixed.
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if first.is_ascii_digit() || !ok(first) || !chars.all(ok) {
        return false;
    }
    name != "." && !name.starts_with("..")
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "env_services_tests.rs"]
mod services_tests;
