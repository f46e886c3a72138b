//! The payloads of configMap, secret, downwardAPI and projected volumes, as the
//! kubelet's volume plugins build them: `items` pick keys and name their paths (all
//! keys otherwise), modes come from `items[].mode`, else `defaultMode`, else 0644;
//! with fsGroup the files belong to that group. Errors name objects and keys, never
//! values.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource, Secret,
    ServiceAccountTokenProjection,
};

use super::atomic_writer::{FileProjection, Payload};
use super::VolumeError;
use crate::pod::downward::{field_ref, resource_field_ref, DownwardInputs};
use crate::uplink::objects::{ObjectCache, ObjectKind};
use crate::uplink::tokens::{TokenKey, TokenManager, DEFAULT_EXPIRATION_SECONDS};

/// The kubelet's default file mode for these volumes.
pub const DEFAULT_MODE: i32 = 0o644;

/// What a payload is built from besides the pod.
pub struct Sources<'a> {
    pub objects: &'a ObjectCache,
    /// Where the pod runs, for `downwardAPI` files.
    pub downward: DownwardInputs<'a>,
    /// fsGroup of the pod.
    pub fs_group: Option<u32>,
    /// Service-account tokens; `None` on a node with no apiserver, where a pod that
    /// asks for one cannot start (the kubelet's standalone mode says the same).
    pub tokens: Option<&'a TokenManager>,
    /// The host paths the pod may use (a static pod under
    /// `holdfast.staticPodAllowedHostPaths`); `None`: any.
    pub allowed_host_paths: Option<&'a [std::path::PathBuf]>,
}

fn mode(item: Option<i32>, default: Option<i32>) -> u32 {
    let m = item.or(default).unwrap_or(DEFAULT_MODE);
    (m & 0o7777) as u32
}

/// One ConfigMap or Secret as a volume (or a projected source) takes it.
struct Keys<'a> {
    volume: &'a str,
    kind: &'static str,
    name: &'a str,
    items: Option<&'a Vec<KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
}

/// `key -> path` with `items`, or every key to its own name.
fn project(
    keys: &Keys<'_>,
    data: BTreeMap<String, Vec<u8>>,
    fs_group: Option<u32>,
    out: &mut Payload,
) -> Result<(), VolumeError> {
    let Keys {
        volume,
        kind,
        name,
        items,
        default_mode,
        optional,
    } = *keys;
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (key, bytes) in data {
                out.insert(
                    key,
                    FileProjection {
                        data: bytes,
                        mode: mode(None, default_mode),
                        gid: fs_group,
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(bytes) => {
                        out.insert(
                            item.path.clone(),
                            FileProjection {
                                data: bytes.clone(),
                                mode: mode(item.mode, default_mode),
                                gid: fs_group,
                            },
                        );
                    }
                    None if optional => {}
                    None => {
                        return Err(VolumeError::MissingKey {
                            volume: volume.to_owned(),
                            kind,
                            name: name.to_owned(),
                            key: item.key.clone(),
                        })
                    }
                }
            }
        }
    }
    Ok(())
}

fn namespace(pod: &Pod) -> &str {
    match pod.metadata.namespace.as_deref() {
        None | Some("") => "default",
        Some(ns) => ns,
    }
}

/// The ConfigMap or None (optional and missing); static pods cannot have one.
fn config_map(
    pod: &Pod,
    volume: &str,
    name: &str,
    optional: bool,
    objects: &ObjectCache,
) -> Result<Option<ConfigMap>, VolumeError> {
    if crate::pod::is_static_pod(pod) {
        return Err(VolumeError::StaticPod {
            volume: volume.to_owned(),
            kind: "configmap",
            name: name.to_owned(),
        });
    }
    let found = objects
        .config_map(namespace(pod), name)
        .map_err(|e| VolumeError::Cache {
            volume: volume.to_owned(),
            reason: e.to_string(),
        })?;
    match found {
        Some(cm) => Ok(Some(cm)),
        None if optional => Ok(None),
        None if !objects.known(ObjectKind::ConfigMap, namespace(pod), name) => {
            Err(VolumeError::NotSynced {
                volume: volume.to_owned(),
                kind: "configmap",
                name: name.to_owned(),
            })
        }
        None => Err(VolumeError::NotFound {
            volume: volume.to_owned(),
            kind: "configmap",
            name: name.to_owned(),
        }),
    }
}

fn secret(
    pod: &Pod,
    volume: &str,
    name: &str,
    optional: bool,
    objects: &ObjectCache,
) -> Result<Option<Secret>, VolumeError> {
    if crate::pod::is_static_pod(pod) {
        return Err(VolumeError::StaticPod {
            volume: volume.to_owned(),
            kind: "secret",
            name: name.to_owned(),
        });
    }
    let found = objects
        .secret(namespace(pod), name)
        .map_err(|e| VolumeError::Cache {
            volume: volume.to_owned(),
            reason: e.to_string(),
        })?;
    match found {
        Some(s) => Ok(Some(s)),
        None if optional => Ok(None),
        None if !objects.known(ObjectKind::Secret, namespace(pod), name) => {
            Err(VolumeError::NotSynced {
                volume: volume.to_owned(),
                kind: "secret",
                name: name.to_owned(),
            })
        }
        None => Err(VolumeError::NotFound {
            volume: volume.to_owned(),
            kind: "secret",
            name: name.to_owned(),
        }),
    }
}

fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        data.insert(k.clone(), v.0.clone());
    }
    data
}

fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    // What the apiserver returns has only `data`; a static copy may carry stringData.
    for (k, v) in s.string_data.iter().flatten() {
        data.entry(k.clone())
            .or_insert_with(|| v.as_bytes().to_vec());
    }
    data
}

/// A `configMap` volume's payload.
pub fn config_map_payload(
    pod: &Pod,
    volume: &str,
    src: &k8s_openapi::api::core::v1::ConfigMapVolumeSource,
    s: &Sources<'_>,
) -> Result<Payload, VolumeError> {
    let optional = src.optional == Some(true);
    let mut out = Payload::new();
    if let Some(cm) = config_map(pod, volume, &src.name, optional, s.objects)? {
        project(
            &Keys {
                volume,
                kind: "configmap",
                name: &src.name,
                items: src.items.as_ref(),
                default_mode: src.default_mode,
                optional,
            },
            config_map_data(&cm),
            s.fs_group,
            &mut out,
        )?;
    }
    Ok(out)
}

/// A `secret` volume's payload.
pub fn secret_payload(
    pod: &Pod,
    volume: &str,
    src: &k8s_openapi::api::core::v1::SecretVolumeSource,
    s: &Sources<'_>,
) -> Result<Payload, VolumeError> {
    let optional = src.optional == Some(true);
    let name = src.secret_name.clone().unwrap_or_default();
    let mut out = Payload::new();
    if let Some(secret) = secret(pod, volume, &name, optional, s.objects)? {
        project(
            &Keys {
                volume,
                kind: "secret",
                name: &name,
                items: src.items.as_ref(),
                default_mode: src.default_mode,
                optional,
            },
            secret_data(&secret),
            s.fs_group,
            &mut out,
        )?;
    }
    Ok(out)
}

/// A `downwardAPI` volume's (or projected source's) files.
pub fn downward_api_payload(
    pod: &Pod,
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    s: &Sources<'_>,
    out: &mut Payload,
) -> Result<(), VolumeError> {
    let first = pod.spec.as_ref().and_then(|sp| sp.containers.first());
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_ref(pod, f, &s.downward)
        } else if let Some(r) = &item.resource_field_ref {
            let Some(c) = first else { continue };
            resource_field_ref(pod, c, r, s.downward.allocatable)
        } else {
            continue;
        }
        .map_err(|e| VolumeError::DownwardApi {
            volume: volume.to_owned(),
            reason: e.to_string(),
        })?;
        out.insert(
            item.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: mode(item.mode, default_mode),
                gid: s.fs_group,
            },
        );
    }
    Ok(())
}

/// A `projected` volume's payload: its configMap, secret, downwardAPI and
/// serviceAccountToken sources in order. A token is minted by the apiserver (or the
/// last one kept, offline); without one the volume fails as the kubelet's does, and
/// the pod waits.
pub fn projected_payload(
    pod: &Pod,
    volume: &str,
    src: &ProjectedVolumeSource,
    s: &Sources<'_>,
    skipped: &mut Vec<String>,
) -> Result<Payload, VolumeError> {
    let mut out = Payload::new();
    for source in src.sources.iter().flatten() {
        if let Some(cm) = &source.config_map {
            let optional = cm.optional == Some(true);
            if let Some(found) = config_map(pod, volume, &cm.name, optional, s.objects)? {
                project(
                    &Keys {
                        volume,
                        kind: "configmap",
                        name: &cm.name,
                        items: cm.items.as_ref(),
                        default_mode: src.default_mode,
                        optional,
                    },
                    config_map_data(&found),
                    s.fs_group,
                    &mut out,
                )?;
            }
        }
        if let Some(sec) = &source.secret {
            let optional = sec.optional == Some(true);
            if let Some(found) = secret(pod, volume, &sec.name, optional, s.objects)? {
                project(
                    &Keys {
                        volume,
                        kind: "secret",
                        name: &sec.name,
                        items: sec.items.as_ref(),
                        default_mode: src.default_mode,
                        optional,
                    },
                    secret_data(&found),
                    s.fs_group,
                    &mut out,
                )?;
            }
        }
        if let Some(d) = &source.downward_api {
            downward_api_payload(
                pod,
                volume,
                d.items.as_deref().unwrap_or(&[]),
                src.default_mode,
                s,
                &mut out,
            )?;
        }
        if let Some(t) = &source.service_account_token {
            let token = service_account_token(pod, volume, t, s)?;
            out.insert(
                t.path.clone(),
                FileProjection {
                    data: token.into_bytes(),
                    mode: token_mode(src.default_mode, s.fs_group),
                    gid: s.fs_group,
                },
            );
        }
        if source.cluster_trust_bundle.is_some() {
            skipped.push(format!(
                "volume {volume:?}: clusterTrustBundle sources are not provided"
            ));
        }
    }
    Ok(out)
}

/// The token file's mode: `defaultMode`; 0600 with fsGroup, which the writer opens to
/// the group (0640), as the kubelet leaves SetVolumeOwnership to do.
fn token_mode(default_mode: Option<i32>, fs_group: Option<u32>) -> u32 {
    match fs_group {
        Some(_) => 0o600,
        None => mode(None, default_mode),
    }
}

/// The pod's token for one `serviceAccountToken` source.
fn service_account_token(
    pod: &Pod,
    volume: &str,
    src: &ServiceAccountTokenProjection,
    s: &Sources<'_>,
) -> Result<String, VolumeError> {
    let fail = |reason: String| VolumeError::Token {
        volume: volume.to_owned(),
        reason,
    };
    if crate::pod::is_static_pod(pod) {
        return Err(fail(
            "failed to fetch token: static pods cannot use service-account tokens".into(),
        ));
    }
    let Some(tokens) = s.tokens else {
        return Err(fail(
            "failed to fetch token: cannot use the token manager on a node with no apiserver"
                .into(),
        ));
    };
    let spec = pod.spec.as_ref();
    let service_account = spec
        .and_then(|sp| sp.service_account_name.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let key = TokenKey {
        namespace: namespace(pod).to_owned(),
        service_account: service_account.to_owned(),
        audience: src.audience.clone().unwrap_or_default(),
        expiration_seconds: src.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    tokens.get(&key).map_err(|e| fail(e.to_string()))
}
