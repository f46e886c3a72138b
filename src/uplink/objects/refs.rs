//! Which ConfigMaps and Secrets a pod references. Pure: reads the pod spec only.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Pod, Volume};

use super::{ObjectKey, ObjectKind};

/// The ConfigMaps and Secrets some pods reference, as `(namespace, name)` pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    pub config_maps: BTreeSet<(String, String)>,
    pub secrets: BTreeSet<(String, String)>,
}

impl References {
    pub fn is_empty(&self) -> bool {
        self.config_maps.is_empty() && self.secrets.is_empty()
    }

    /// Adds everything `other` references.
    pub fn extend(&mut self, other: References) {
        self.config_maps.extend(other.config_maps);
        self.secrets.extend(other.secrets);
    }

    /// Every reference as an [`ObjectKey`], ConfigMaps first, each kind in name order.
    pub fn keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        let cms = self
            .config_maps
            .iter()
            .map(|(ns, name)| ObjectKey::new(ObjectKind::ConfigMap, ns, name));
        let secrets = self
            .secrets
            .iter()
            .map(|(ns, name)| ObjectKey::new(ObjectKind::Secret, ns, name));
        cms.chain(secrets)
    }

    fn config_map(&mut self, ns: &str, name: &str) {
        if !name.is_empty() {
            self.config_maps.insert((ns.to_string(), name.to_string()));
        }
    }

    fn secret(&mut self, ns: &str, name: &str) {
        if !name.is_empty() {
            self.secrets.insert((ns.to_string(), name.to_string()));
        }
    }

    fn env(&mut self, ns: &str, env: Option<&Vec<EnvVar>>, env_from: Option<&Vec<EnvFromSource>>) {
        for var in env.into_iter().flatten() {
            let Some(from) = &var.value_from else {
                continue;
            };
            if let Some(r) = &from.config_map_key_ref {
                self.config_map(ns, &r.name);
            }
            if let Some(r) = &from.secret_key_ref {
                self.secret(ns, &r.name);
            }
        }
        for source in env_from.into_iter().flatten() {
            if let Some(r) = &source.config_map_ref {
                self.config_map(ns, &r.name);
            }
            if let Some(r) = &source.secret_ref {
                self.secret(ns, &r.name);
            }
        }
    }

    fn volume(&mut self, ns: &str, volume: &Volume) {
        if let Some(cm) = &volume.config_map {
            self.config_map(ns, &cm.name);
        }
        if let Some(name) = volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref())
        {
            self.secret(ns, name);
        }
        let sources = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        for source in sources.into_iter().flatten() {
            if let Some(cm) = &source.config_map {
                self.config_map(ns, &cm.name);
            }
            if let Some(s) = &source.secret {
                self.secret(ns, &s.name);
            }
        }
    }
}

/// The ConfigMaps and Secrets `pod` references: `env[].valueFrom.configMapKeyRef` and
/// `secretKeyRef`, `envFrom[].configMapRef` and `secretRef` of its containers, init
/// containers and ephemeral containers; its `configMap`, `secret` and `projected`
/// (configMap and secret sources) volumes; and its `imagePullSecrets`. All in the
/// pod's namespace (`default` when it has none). Empty names are skipped.
pub fn references(pod: &Pod) -> References {
    let mut refs = References::default();
    let ns = match pod.metadata.namespace.as_deref() {
        None | Some("") => "default",
        Some(ns) => ns,
    };
    let Some(spec) = &pod.spec else {
        return refs;
    };
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        refs.env(ns, c.env.as_ref(), c.env_from.as_ref());
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        refs.env(ns, c.env.as_ref(), c.env_from.as_ref());
    }
    for v in spec.volumes.iter().flatten() {
        refs.volume(ns, v);
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        refs.secret(ns, &s.name);
    }
    refs
}

/// Everything any of `pods` references.
pub fn references_all<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> References {
    let mut all = References::default();
    for pod in pods {
        all.extend(references(pod));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("pod yaml")
    }

    fn set(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// The pod of fixture 24 (env from ConfigMap app-config, Secret volume app-secret).
    const FIXTURE_24: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"app-with-refs","namespace":"default","labels":{"app":"refs"}},"spec":{"nodeName":"edge-node-1","containers":[{"name":"app","image":"busybox:1.36","command":["sh","-c","echo $GREETING; cat /etc/app-secret/password; sleep 3600"],"env":[{"name":"GREETING","valueFrom":{"configMapKeyRef":{"name":"app-config","key":"greeting"}}}],"volumeMounts":[{"name":"app-secret","mountPath":"/etc/app-secret","readOnly":true}]}],"volumes":[{"name":"app-secret","secret":{"secretName":"app-secret"}}]}}"#;

    #[test]
    fn fixture_pod_references_its_configmap_and_secret() {
        let p: Pod = serde_json::from_str(FIXTURE_24).expect("fixture 24 pod");
        let r = references(&p);
        assert_eq!(r.config_maps, set(&[("default", "app-config")]));
        assert_eq!(r.secrets, set(&[("default", "app-secret")]));
    }

    #[test]
    fn every_kind_of_reference_in_every_kind_of_container() {
        let p = pod(r#"
metadata: {name: p, namespace: apps}
spec:
  imagePullSecrets: [{name: regcred}, {name: ""}]
  initContainers:
  - name: init
    image: busybox
    env:
    - {name: A, valueFrom: {configMapKeyRef: {name: init-cm, key: k}}}
    envFrom:
    - secretRef: {name: init-env-secret}
  containers:
  - name: main
    image: busybox
    env:
    - {name: PLAIN, value: x}
    - {name: FIELD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: B, valueFrom: {secretKeyRef: {name: main-secret, key: k}}}
    envFrom:
    - configMapRef: {name: main-env-cm}
      prefix: P_
  - name: side
    image: busybox
    env:
    - {name: C, valueFrom: {configMapKeyRef: {name: main-env-cm, key: other}}}
  ephemeralContainers:
  - name: debug
    image: busybox
    env:
    - {name: D, valueFrom: {secretKeyRef: {name: debug-secret, key: k}}}
    envFrom:
    - configMapRef: {name: debug-cm}
  volumes:
  - {name: v1, configMap: {name: vol-cm}}
  - {name: v2, secret: {secretName: vol-secret}}
  - {name: v3, secret: {}}
  - {name: v4, emptyDir: {}}
  - name: v5
    projected:
      sources:
      - configMap: {name: proj-cm}
      - secret: {name: proj-secret}
      - downwardAPI: {items: [{path: n, fieldRef: {fieldPath: metadata.name}}]}
      - serviceAccountToken: {path: token}
"#);
        let r = references(&p);
        assert_eq!(
            r.config_maps,
            set(&[
                ("apps", "debug-cm"),
                ("apps", "init-cm"),
                ("apps", "main-env-cm"),
                ("apps", "proj-cm"),
                ("apps", "vol-cm"),
            ])
        );
        assert_eq!(
            r.secrets,
            set(&[
                ("apps", "debug-secret"),
                ("apps", "init-env-secret"),
                ("apps", "main-secret"),
                ("apps", "proj-secret"),
                ("apps", "regcred"),
                ("apps", "vol-secret"),
            ])
        );
    }

    #[test]
    fn a_pod_without_refs_or_spec_references_nothing() {
        let p = pod("metadata: {name: p}\nspec:\n  containers: [{name: c, image: busybox}]\n");
        assert!(references(&p).is_empty());
        let p = pod("metadata: {name: p}\n");
        assert!(references(&p).is_empty());
    }

    #[test]
    fn namespace_defaults_to_default() {
        let p = pod(r#"
metadata: {name: p}
spec:
  containers: [{name: c, image: busybox, envFrom: [{configMapRef: {name: cm}}]}]
"#);
        assert_eq!(references(&p).config_maps, set(&[("default", "cm")]));
    }

    #[test]
    fn same_name_in_two_namespaces_is_two_references() {
        let a = pod(r#"
metadata: {name: a, namespace: one}
spec:
  containers: [{name: c, image: busybox}]
  volumes: [{name: v, secret: {secretName: shared}}]
"#);
        let b = pod(r#"
metadata: {name: b, namespace: two}
spec:
  containers: [{name: c, image: busybox}]
  imagePullSecrets: [{name: shared}]
"#);
        let all = references_all([&a, &b, &a]);
        assert_eq!(all.secrets, set(&[("one", "shared"), ("two", "shared")]));
        assert!(all.config_maps.is_empty());
        let keys: Vec<String> = all.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, vec!["secret one/shared", "secret two/shared"]);
    }

    #[test]
    fn keys_list_configmaps_before_secrets_with_the_same_name() {
        let p = pod(r#"
metadata: {name: p, namespace: ns}
spec:
  containers:
  - name: c
    image: busybox
    envFrom: [{configMapRef: {name: x}}, {secretRef: {name: x}}]
"#);
        let keys: Vec<ObjectKey> = references(&p).keys().collect();
        assert_eq!(
            keys,
            vec![
                ObjectKey::new(ObjectKind::ConfigMap, "ns", "x"),
                ObjectKey::new(ObjectKind::Secret, "ns", "x"),
            ]
        );
        assert_eq!(keys[0].store_key(), "ns/x");
    }
}
