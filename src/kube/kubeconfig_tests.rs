//! Kubeconfig parsing: every field form and every error, with certificates from rcgen.

use std::time::SystemTime;

use super::*;
use crate::kube::credentials::Token;
use crate::kube::testpki::{base64, Leaf, Pki, Scratch};

struct Fixture {
    dir: Scratch,
    pki: Pki,
    leaf: Leaf,
}

impl Fixture {
    fn new() -> Fixture {
        let pki = Pki::new("test-ca");
        let leaf = pki.client("system:node:edge-node-1");
        let dir = Scratch::new("kubeconfig");
        dir.write("ca.crt", &pki.ca_pem);
        dir.write("node.crt", &leaf.cert);
        dir.write("node.key", &leaf.key);
        Fixture { dir, pki, leaf }
    }

    /// A kubeconfig with one cluster `c` and user `u` whose bodies are given.
    fn config(&self, cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\n\
             clusters:\n- name: c\n  cluster:\n{cluster}\
             users:\n- name: u\n  user:\n{user}\
             contexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\n"
        )
    }

    fn load(&self, text: &str) -> Result<Kubeconfig, KubeconfigError> {
        let path = self.dir.write("kubeconfig", text);
        Kubeconfig::load(&path)
    }

    fn error(&self, text: &str) -> String {
        let err = self.load(text).expect_err("kubeconfig should be refused");
        let message = err.to_string();
        let path = self.dir.path().join("kubeconfig");
        assert!(
            message.contains(&path.display().to_string()),
            "{message:?} names the kubeconfig"
        );
        message
    }
}

const CLUSTER: &str = "    server: https://10.0.0.1:6443/\n    certificate-authority: ca.crt\n";
const USER: &str = "    client-certificate: node.crt\n    client-key: node.key\n";

fn indent(field: &str, value: &str) -> String {
    format!("    {field}: {value}\n")
}

#[test]
fn loads_files_relative_to_the_kubeconfig() {
    let f = Fixture::new();
    let kc = f.load(&f.config(CLUSTER, USER)).expect("load");
    assert_eq!(kc.server, "https://10.0.0.1:6443", "trailing slash dropped");
    assert_eq!((kc.context.as_str(), kc.cluster.as_str()), ("ctx", "c"));
    assert_eq!(kc.ca.len(), 1);
    let identity = kc.identity.expect("client certificate");
    assert_eq!(identity.chain.len(), 1);
    assert!(identity.validity.not_after > identity.validity.not_before);
    assert!(kc.token.is_none());
    assert!(kc.tls_server_name.is_none());
}

#[test]
fn data_fields_load_the_same_material_as_files() {
    let f = Fixture::new();
    let cluster = format!(
        "    server: https://10.0.0.1:6443\n{}{}",
        indent(
            "certificate-authority-data",
            &base64(f.pki.ca_pem.as_bytes())
        ),
        indent("tls-server-name", "kubernetes.default.svc")
    );
    let user = format!(
        "{}{}",
        indent("client-certificate-data", &base64(f.leaf.cert.as_bytes())),
        indent("client-key-data", &base64(f.leaf.key.as_bytes()))
    );
    let from_data = f.load(&f.config(&cluster, &user)).expect("load data");
    let from_files = f.load(&f.config(CLUSTER, USER)).expect("load files");
    assert_eq!(from_data.ca, from_files.ca);
    let (a, b) = (
        from_data.identity.expect("identity"),
        from_files.identity.expect("identity"),
    );
    assert_eq!(a.chain, b.chain);
    assert_eq!(a.key.secret_der(), b.key.secret_der());
    let name = from_data.tls_server_name.expect("tls-server-name");
    assert_eq!(name.to_str(), "kubernetes.default.svc");
}

#[test]
fn tokens_inline_and_from_a_file() {
    let f = Fixture::new();
    let kc = f
        .load(&f.config(CLUSTER, &indent("token", "abc.def")))
        .expect("inline token");
    assert!(matches!(kc.token, Some(Token::Inline(ref t)) if t == "abc.def"));
    assert!(kc.identity.is_none());

    f.dir.write("token", "  from-file\n");
    let kc = f
        .load(&f.config(CLUSTER, &indent("tokenFile", "token")))
        .expect("token file");
    match kc.token {
        Some(Token::File { path, initial }) => {
            assert_eq!(path, f.dir.path().join("token"));
            assert_eq!(initial, "from-file");
        }
        other => panic!("expected a token file, got {other:?}"),
    }

    let both = format!("{USER}{}", indent("token", "abc"));
    let kc = f.load(&f.config(CLUSTER, &both)).expect("cert and token");
    assert!(kc.identity.is_some() && kc.token.is_some());
}

#[test]
fn the_only_context_serves_without_current_context() {
    let f = Fixture::new();
    let text = f
        .config(CLUSTER, USER)
        .replace("current-context: ctx\n", "");
    assert_eq!(f.load(&text).expect("load").context, "ctx");

    let two = format!("{text}- name: other\n  context:\n    cluster: c\n    user: u\n");
    let message = f.error(&two);
    assert!(message.contains("no current-context to choose among contexts (ctx, other)"));
}

#[test]
fn plain_http_needs_no_ca() {
    let f = Fixture::new();
    let kc = f
        .load(&f.config(&indent("server", "http://127.0.0.1:8080"), USER))
        .expect("http");
    assert!(kc.ca.is_empty());
}

#[test]
fn a_missing_kubeconfig_names_its_path() {
    let f = Fixture::new();
    let missing = f.dir.path().join("nope");
    let err = Kubeconfig::load(&missing).expect_err("missing");
    assert!(matches!(err, KubeconfigError::Open { .. }));
    assert!(err.to_string().contains(&missing.display().to_string()));
}

#[test]
fn structural_errors() {
    let f = Fixture::new();
    assert!(f.error("clusters: [\n").contains("not a kubeconfig"));
    let text = f.config(CLUSTER, USER);
    let cases = [
        (
            text.replace("current-context: ctx", "current-context: gone"),
            "current-context \"gone\" is not among contexts (ctx)",
        ),
        (
            text.replace("    cluster: c\n    user", "    cluster: x\n    user"),
            "context \"ctx\" names cluster \"x\", which is not among clusters (c)",
        ),
        (
            text.replace("    user: u\n", "    user: x\n"),
            "context \"ctx\" names user \"x\", which is not among users (u)",
        ),
        (
            "apiVersion: v1\nkind: Config\n".to_string(),
            "no current-context and no contexts",
        ),
    ];
    for (text, expected) in cases {
        let message = f.error(&text);
        assert!(message.contains(expected), "{message:?} has {expected:?}");
    }
}

#[test]
fn cluster_field_errors() {
    let f = Fixture::new();
    let ca = indent("certificate-authority", "ca.crt");
    let https = indent("server", "https://10.0.0.1:6443");
    let cases = [
        (ca.clone(), "clusters[c].server: missing"),
        (
            format!("{ca}{}", indent("server", "ftp://x")),
            "clusters[c].server: \"ftp://x\" is not an http:// or https:// URL",
        ),
        (https.clone(), "clusters[c].certificate-authority: missing"),
        (
            format!("{https}{ca}{}", indent("insecure-skip-tls-verify", "true")),
            "clusters[c].insecure-skip-tls-verify: refused",
        ),
        (
            format!("{https}{}", indent("certificate-authority", "nope.crt")),
            "clusters[c].certificate-authority: read ",
        ),
        (
            format!("{https}{}", indent("certificate-authority", "node.key")),
            "clusters[c].certificate-authority: no certificate found",
        ),
        (
            format!(
                "{https}{}",
                indent("certificate-authority-data", "\"@@@@\"")
            ),
            "clusters[c].certificate-authority-data: not base64",
        ),
        (
            format!(
                "{https}{ca}{}",
                indent(
                    "certificate-authority-data",
                    &base64(f.pki.ca_pem.as_bytes())
                )
            ),
            "clusters[c].certificate-authority-data: certificate-authority-data and \
             certificate-authority are both set",
        ),
        (
            format!("{https}{ca}{}", indent("tls-server-name", "\"not a name\"")),
            "clusters[c].tls-server-name: \"not a name\" is not a host name",
        ),
        (
            format!(
                "{https}{ca}{}",
                indent("proxy-url", "socks5://u:pw@proxy:1080")
            ),
            "clusters[c].proxy-url: proxy socks5://***@proxy:1080: scheme \"socks5\" is not \
             supported",
        ),
    ];
    for (cluster, expected) in cases {
        let message = f.error(&f.config(&cluster, USER));
        assert!(message.contains(expected), "{message:?} has {expected:?}");
    }
}

#[test]
fn proxy_url_is_the_clusters_proxy() {
    let f = Fixture::new();
    let kc = f.load(&f.config(CLUSTER, USER)).expect("no proxy-url");
    assert_eq!(kc.proxy_route(), crate::proxy::Route::Rules);
    let cluster = format!(
        "{CLUSTER}{}",
        indent("proxy-url", "http://u:pw@proxy.site:3128")
    );
    let kc = f.load(&f.config(&cluster, USER)).expect("proxy-url");
    let shown = kc.proxy_url.as_ref().map(ToString::to_string);
    assert_eq!(shown.as_deref(), Some("http://***@proxy.site:3128"));
    // NO_PROXY aside: the cluster's proxy is used for it whatever the host.
    let route = kc.proxy_route();
    let proxy = route.proxy_for(true, "10.0.0.1", 6443).expect("fixed");
    assert_eq!(proxy.authority(), "proxy.site:3128");
}

#[test]
fn user_field_errors() {
    let f = Fixture::new();
    f.dir.write("empty-token", "\n");
    f.dir.write("garbage.pem", "hello\n");
    let cert = indent("client-certificate", "node.crt");
    let key = indent("client-key", "node.key");
    let cases = [
        (
            "    {}\n".to_string(),
            "users[u].user: no credentials: set client-certificate and client-key, token or \
             tokenFile",
        ),
        (cert.clone(), "users[u].client-key: missing"),
        (key.clone(), "users[u].client-certificate: missing"),
        (
            format!("{cert}{}", indent("client-key", "node.crt")),
            "users[u].client-key: no private key found",
        ),
        (
            format!("{key}{}", indent("client-certificate", "garbage.pem")),
            "users[u].client-certificate: no certificate found",
        ),
        (
            format!("{key}{}", indent("client-certificate", "missing.crt")),
            "users[u].client-certificate: read ",
        ),
        (
            format!("{cert}{}", indent("client-key-data", "abc")),
            "users[u].client-key-data: not base64",
        ),
        (
            format!("{cert}{key}{}", indent("client-key-data", &base64(b"x"))),
            "users[u].client-key-data: client-key-data and client-key are both set",
        ),
        (
            format!("{}{}", indent("token", "a"), indent("tokenFile", "t")),
            "users[u].tokenFile: token and tokenFile are both set",
        ),
        (
            indent("tokenFile", "missing-token"),
            "users[u].tokenFile: read ",
        ),
        (indent("tokenFile", "empty-token"), "users[u].tokenFile: "),
        (
            "    exec:\n      command: aws\n".to_string(),
            "users[u].exec: credential plugins are not supported",
        ),
        (
            "    auth-provider:\n      name: gcp\n".to_string(),
            "users[u].auth-provider: auth providers are not supported",
        ),
        (
            format!("{}{}", indent("username", "a"), indent("password", "b")),
            "users[u].username: basic authentication is not supported",
        ),
    ];
    for (user, expected) in cases {
        let message = f.error(&f.config(CLUSTER, &user));
        assert!(message.contains(expected), "{message:?} has {expected:?}");
    }
    let message = f.error(&f.config(CLUSTER, &indent("tokenFile", "empty-token")));
    assert!(message.ends_with("empty-token is empty"), "{message:?}");
}

#[test]
fn an_expired_client_certificate_is_refused_at_load() {
    let f = Fixture::new();
    let expired = f.pki.client_between("system:node:edge-node-1", 2000, 2001);
    f.dir.write("old.crt", &expired.cert);
    f.dir.write("old.key", &expired.key);
    let user = format!(
        "{}{}",
        indent("client-certificate", "old.crt"),
        indent("client-key", "old.key")
    );
    let path = f.dir.write("kubeconfig", &f.config(CLUSTER, &user));
    let err = Kubeconfig::load(&path).expect_err("expired");
    assert!(err.is_clock_dependent());
    let message = err.to_string();
    assert!(
        message.contains(
            "users[u].client-certificate: client certificate expired at 2001-01-01T00:00:00Z"
        ),
        "{message:?}"
    );

    // The same certificate judged by a clock in 2000 is fine, and before 2000 it is early.
    let mid_2000 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(962_000_000);
    assert!(Kubeconfig::load_at(&path, mid_2000).is_ok());
    let err = Kubeconfig::load_at(&path, SystemTime::UNIX_EPOCH).expect_err("too early");
    assert!(err.is_clock_dependent());
    assert!(
        err.to_string().contains(
            "client certificate is not valid before 2000-01-01T00:00:00Z and the clock says \
             1970-01-01T00:00:00Z; is the system clock set?"
        ),
        "{err}"
    );
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let f = Fixture::new();
    let user = format!("{USER}{}", indent("token", "s3cret-token"));
    let kc = f.load(&f.config(CLUSTER, &user)).expect("load");
    let shown = format!("{kc:?}");
    assert!(!shown.contains("s3cret-token"), "{shown}");
    assert!(shown.contains("<redacted>"));
}

#[test]
fn a_key_of_another_certificate_is_refused_when_the_client_is_built() {
    let f = Fixture::new();
    let other = f.pki.client("someone-else");
    f.dir.write("other.key", &other.key);
    let user = format!(
        "{}{}",
        indent("client-certificate", "node.crt"),
        indent("client-key", "other.key")
    );
    let path = f.dir.write("kubeconfig", &f.config(CLUSTER, &user));
    let kc = Kubeconfig::load(&path).expect("each file is fine on its own");
    let err = match crate::kube::Client::new(&kc) {
        Ok(_) => panic!("a mismatched key must be refused"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        message.contains(
            "users[u].client-key: the client key does not belong to the client certificate"
        ),
        "{message:?}"
    );
    assert!(message.contains(&path.display().to_string()));
}

#[test]
fn deep_nesting_is_refused_at_once_naming_the_file_the_line_and_the_bound() {
    let f = Fixture::new();
    let head = f.config(CLUSTER, USER);
    let text = format!("{head}preferences: {}", "[".repeat(60_000));
    let started = std::time::Instant::now();
    let message = f.error(&text);
    assert!(started.elapsed() < std::time::Duration::from_millis(200));
    let line = format!(
        "nested deeper than 64 levels (line {})",
        head.lines().count() + 1
    );
    assert!(message.contains(&line), "{message}");
    // The same kubeconfig without the brackets still loads.
    f.load(&f.config(CLUSTER, USER)).expect("kubeconfig");
}

#[test]
fn a_kubeconfig_over_the_bound_is_refused_naming_its_size() {
    let f = Fixture::new();
    let text = format!("{}# {}\n", f.config(CLUSTER, USER), "x".repeat(1024 * 1024));
    let message = f.error(&text);
    let size = format!("{} bytes", text.len());
    assert!(message.contains(&size), "{message}");
    assert!(message.contains("1048576 bytes allowed"), "{message}");
}

#[test]
fn a_certificate_file_that_never_ends_is_refused() {
    let f = Fixture::new();
    let cluster = "    server: https://10.0.0.1:6443/\n    certificate-authority: /dev/zero\n";
    let message = f.error(&f.config(cluster, USER));
    assert!(message.contains("/dev/zero"), "{message}");
    assert!(message.contains("bytes allowed"), "{message}");
}
