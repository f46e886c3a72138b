//! keys: every key the config file takes, by its path from the top of the file. The
//! readers look a key up here before they read it, so a key missing from the list is
//! unknown however a reader would take it: the list cannot fall behind the readers,
//! and what documents the keys can be checked against it.
//!
//! A path is the keys from the top joined by `.` (`authentication.x509.clientCAFile`);
//! `*` stands for any registry name and `[]` for any item of a list
//! (`holdfast.registries.*.mirrors[].host`).

/// Every key of the config file: the KubeletConfiguration keys holdfast reads, then
/// holdfast's own under `holdfast:`.
pub const KEYS: &[&str] = &[
    // The file itself.
    "apiVersion",
    "kind",
    // Pods and their logs.
    "staticPodPath",
    "fileCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "httpCheckFrequency",
    "syncFrequency",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    // Resources, cgroups and eviction.
    "cgroupRoot",
    "systemReserved",
    "kubeReserved",
    "evictionHard",
    "enforceNodeAllocatable",
    "podPidsLimit",
    "allowedUnsafeSysctls",
    // Pods' network and DNS.
    "podCIDR",
    "clusterDNS",
    "clusterDomain",
    "resolvConf",
    // The cluster.
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "maxPods",
    "registerWithTaints",
    // Graceful node shutdown.
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "shutdownGracePeriodByPodPriority[].priority",
    "shutdownGracePeriodByPodPriority[].shutdownGracePeriodSeconds",
    "rotateCertificates",
    "uplinkRetryMax",
    // Images.
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "serializeImagePulls",
    "maxParallelImagePulls",
    // The kubelet API.
    "address",
    "port",
    "readOnlyPort",
    "healthzBindAddress",
    "healthzPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "serverTLSBootstrap",
    "authentication",
    "authentication.x509",
    "authentication.x509.clientCAFile",
    "authentication.webhook",
    "authentication.webhook.enabled",
    "authentication.webhook.cacheTTL",
    "authentication.anonymous",
    "authentication.anonymous.enabled",
    "authorization",
    "authorization.mode",
    "authorization.webhook",
    "authorization.webhook.cacheAuthorizedTTL",
    "authorization.webhook.cacheUnauthorizedTTL",
    // holdfast's own.
    "holdfast",
    "holdfast.rootDir",
    "holdfast.kubeconfig",
    "holdfast.bootstrapKubeconfig",
    "holdfast.apiservers",
    "holdfast.hostnameOverride",
    "holdfast.nodeLabels",
    "holdfast.board",
    "holdfast.boardDir",
    "holdfast.crashLoopBackOffInitial",
    "holdfast.crashLoopBackOffMax",
    "holdfast.crashLoopBackOffReset",
    "holdfast.cniConfDir",
    "holdfast.cniBinDir",
    "holdfast.allowPrivileged",
    "holdfast.staticPodAllowedHostPaths",
    "holdfast.evictionMonitoringPeriod",
    "holdfast.offlineAuthorization",
    "holdfast.offlineAuthorization.users",
    "holdfast.offlineAuthorization.groups",
    "holdfast.dockerConfig",
    "holdfast.imagePullOfflineFallback",
    "holdfast.maxParallelLayerDownloads",
    "holdfast.imagePullBackOffInitial",
    "holdfast.imagePullBackOffMax",
    "holdfast.pinnedImages",
    "holdfast.registries",
    "holdfast.registries.*.server",
    "holdfast.registries.*.caFile",
    "holdfast.registries.*.clientCert",
    "holdfast.registries.*.clientKey",
    "holdfast.registries.*.mirrors",
    "holdfast.registries.*.mirrors[].host",
    "holdfast.registries.*.mirrors[].capabilities",
    "holdfast.registries.*.mirrors[].caFile",
    "holdfast.registries.*.mirrors[].clientCert",
    "holdfast.registries.*.mirrors[].clientKey",
    "holdfast.registries.*.mirrors[].plainHTTP",
    "holdfast.registries.*.mirrors[].skipVerify",
    "holdfast.logindConfigDir",
    "holdfast.proxy",
    "holdfast.proxy.https",
    "holdfast.proxy.http",
    "holdfast.proxy.noProxy",
    "holdfast.tunnel",
    "holdfast.tunnel.servers",
    "holdfast.tunnel.caFile",
    "holdfast.tunnel.serverName",
    "holdfast.tunnel.credential",
    "holdfast.tunnel.serviceAccount",
    "holdfast.tunnel.audience",
    "holdfast.tunnel.identifiers",
    "holdfast.tunnel.keepaliveTime",
];

/// Whether `path` (written as in [`KEYS`]) is a key of the config file.
pub(super) fn known(path: &str) -> bool {
    KEYS.contains(&path)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_yaml::{Mapping, Value};

    use super::*;
    use crate::config::file::parse_config;
    use crate::config::ConfigError;

    /// `path` as YAML holding `leaf`: `a.b` is `{a: {b: leaf}}`, `*` a registry name,
    /// `[]` a list of one.
    fn nest(path: &str, leaf: Value) -> Value {
        path.split('.').rev().fold(leaf, |inner, part| {
            let (name, inner) = match part.strip_suffix("[]") {
                Some(name) => (name, Value::Sequence(vec![inner])),
                None => (part, inner),
            };
            let name = if name == "*" { "docker.io" } else { name };
            let mut m = Mapping::new();
            m.insert(Value::String(name.into()), inner);
            Value::Mapping(m)
        })
    }

    /// The path as the readers name it in errors: `*` a registry, `[]` the first item.
    fn concrete(path: &str) -> String {
        path.replace(".*.", ".docker.io.").replace("[]", "[0]")
    }

    #[test]
    fn every_key_has_a_reader() {
        // A value no key takes: a reader that knows the key refuses it naming the key;
        // a key no reader takes would be a warning instead.
        let odd = Value::Sequence(vec![Value::Sequence(vec![])]);
        for key in KEYS {
            let text = serde_yaml::to_string(&nest(key, odd.clone())).expect("yaml");
            match parse_config(Path::new("/etc/holdfast/config.yaml"), &text) {
                Err(ConfigError::Key { key: named, .. }) => assert!(
                    named.starts_with(&concrete(key)),
                    "{key}: the error names {named}"
                ),
                other => panic!("{key}: no reader refused {text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn keys_are_listed_once() {
        let mut seen = std::collections::BTreeSet::new();
        for key in KEYS {
            assert!(seen.insert(key), "{key} is listed twice");
        }
    }

    #[test]
    fn a_key_off_the_list_is_unknown() {
        let (_, warnings) = parse_config(
            Path::new("/etc/holdfast/config.yaml"),
            "syncFrequency: 1m\nstaticPodPaths: /x\nholdfast:\n  rootdir: /y\n",
        )
        .expect("parse");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        for err in [
            "authentication:\n  x509:\n    clientCaFile: /ca.crt\n",
            "holdfast:\n  offlineAuthorization:\n    user: [a]\n",
            "holdfast:\n  registries:\n    docker.io:\n      cafile: /ca.crt\n",
            "holdfast:\n  registries:\n    docker.io:\n      mirrors: [{host: m.local, plainHttp: true}]\n",
        ] {
            assert!(
                matches!(
                    parse_config(Path::new("/etc/holdfast/config.yaml"), err),
                    Err(ConfigError::Key { .. })
                ),
                "{err}"
            );
        }
    }
}
