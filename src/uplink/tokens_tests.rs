//! The token manager against a scripted minter and a real store: when it mints, what it
//! serves offline, what it forgets.

use std::sync::Mutex;
use std::time::Instant;

use super::*;
use crate::testutil::TempDir;

/// 2026-11-25T00:00:00Z.
const NOW: i64 = 1_795_564_800;

/// Answers with the next scripted result and counts the calls.
struct Script {
    answers: Mutex<Vec<Result<CachedToken, ApiError>>>,
    calls: Mutex<Vec<String>>,
}

impl Minter for Script {
    fn mint(&self, key: &TokenKey) -> Result<CachedToken, ApiError> {
        self.calls.lock().expect("calls").push(key.store_key());
        let mut a = self.answers.lock().expect("answers");
        if a.is_empty() {
            return Err(transport());
        }
        a.remove(0)
    }
}

fn script(answers: Vec<Result<CachedToken, ApiError>>) -> Arc<Script> {
    Arc::new(Script {
        answers: Mutex::new(answers),
        calls: Mutex::new(Vec::new()),
    })
}

fn calls(s: &Script) -> usize {
    s.calls.lock().expect("calls").len()
}

fn token(value: &str, issued: i64, ttl: i64) -> CachedToken {
    CachedToken {
        token: value.into(),
        expiration: issued + ttl,
        expiration_seconds: ttl,
    }
}

fn transport() -> ApiError {
    ApiError::Transport {
        method: "POST",
        path: "/api/v1/namespaces/apps/serviceaccounts/default/token".into(),
        message: "connection refused".into(),
    }
}

fn forbidden() -> ApiError {
    ApiError::Status {
        method: "POST",
        path: "/api/v1/namespaces/apps/serviceaccounts/default/token".into(),
        code: 403,
        reason: "Forbidden".into(),
        message: "serviceaccounts \"default\" is forbidden: User \"system:node:gw-1\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"apps\": no relationship found between node 'gw-1' and this object".into(),
    }
}

fn key(uid: &str, ttl: i64) -> TokenKey {
    TokenKey {
        namespace: "apps".into(),
        service_account: "default".into(),
        audience: String::new(),
        expiration_seconds: ttl,
        pod_name: "web".into(),
        pod_uid: uid.into(),
    }
}

fn up_link() -> Link {
    let link = Link::new(std::time::Duration::from_secs(1));
    link.node_ready(Instant::now(), crate::time::now());
    link
}

fn manager(tmp: &TempDir, link: Link) -> (Store, TokenManager) {
    let store = Store::open(&tmp.0.join("db")).expect("store");
    let tm = TokenManager::open(&store, Some(link)).expect("tokens");
    (store, tm)
}

#[test]
fn the_request_is_the_kubelets() {
    let mut k = key("u1", 3607);
    let v = serde_json::to_value(k.request()).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "metadata": {}, "spec": {"audiences": [], "expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u1"}}})
    );
    assert_eq!(
        k.path(),
        "/api/v1/namespaces/apps/serviceaccounts/default/token"
    );
    k.audience = "vault".into();
    assert_eq!(k.request().spec.audiences, vec!["vault".to_string()]);
    assert_eq!(k.store_key(), "u1/apps/default/vault/3607");
}

#[test]
fn the_answer_gives_token_and_expiry() {
    let tr: TokenRequest = serde_json::from_value(serde_json::json!({
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3607,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "u1"}},
        "status": {"token": "eyJ.a.b", "expirationTimestamp": "2026-11-25T01:00:07Z"}
    }))
    .expect("tr");
    let c = CachedToken::from_response(&tr, 600).expect("token");
    assert_eq!(c.token, "eyJ.a.b");
    assert_eq!(c.expiration, NOW + 3607);
    assert_eq!(c.expiration_seconds, 3607);
    let mut empty = tr.clone();
    empty.status.as_mut().expect("status").token.clear();
    assert!(CachedToken::from_response(&empty, 600).is_err());
}

#[test]
fn refresh_at_80_percent_of_the_ttl_or_after_24_hours() {
    // 600 s, the shortest the apiserver gives: refreshed after 480 s.
    let t = token("t", NOW, 600);
    assert!(!t.requires_refresh(NOW, 0));
    assert!(!t.requires_refresh(NOW + 480, 0));
    assert!(t.requires_refresh(NOW + 481, 0));
    // The jitter brings it forward by up to 10 s.
    assert!(t.requires_refresh(NOW + 471, 10));
    assert!(!t.requires_refresh(NOW + 470, 10));
    // kube-api-access's 3607 s: 20 % is 721 s (whole seconds, as the kubelet's
    // integer division), so after 2886 s.
    let t = token("t", NOW, 3607);
    assert!(!t.requires_refresh(NOW + 2886, 0));
    assert!(t.requires_refresh(NOW + 2887, 0));
    // A week-long token is refreshed after a day.
    let t = token("t", NOW, 7 * 86_400);
    assert!(!t.requires_refresh(NOW + 86_400, 0));
    assert!(t.requires_refresh(NOW + 86_401, 0));
    assert!(t.requires_refresh(NOW + 86_391, 10));
}

#[test]
fn a_token_is_minted_once_then_served_until_it_needs_a_refresh() {
    let tmp = TempDir::new("tokens-refresh");
    let (_store, tm) = manager(&tmp, up_link());
    let s = script(vec![
        Ok(token("first", NOW, 600)),
        Ok(token("second", NOW + 481, 600)),
    ]);
    tm.set_minter(s.clone());
    let k = key("u1", 600);
    assert_eq!(tm.get_at(&k, NOW, 0).expect("get"), "first");
    assert_eq!(tm.get_at(&k, NOW + 300, 0).expect("get"), "first");
    assert_eq!(tm.get_at(&k, NOW + 480, 0).expect("get"), "first");
    assert_eq!(calls(&s), 1);
    assert_eq!(tm.get_at(&k, NOW + 481, 0).expect("get"), "second");
    assert_eq!(calls(&s), 2);
    assert_eq!(tm.get_at(&k, NOW + 600, 0).expect("get"), "second");
    assert_eq!(calls(&s), 2);
}

#[test]
fn a_failed_refresh_keeps_the_last_token_even_expired() {
    let tmp = TempDir::new("tokens-keep");
    let (_store, tm) = manager(&tmp, up_link());
    let s = script(vec![Ok(token("first", NOW, 600)), Err(forbidden())]);
    tm.set_minter(s.clone());
    let k = key("u1", 600);
    assert_eq!(tm.get_at(&k, NOW, 0).expect("get"), "first");
    assert_eq!(tm.get_at(&k, NOW + 500, 0).expect("get"), "first");
    // Expired, and the apiserver out of reach: still the last one.
    assert_eq!(tm.get_at(&k, NOW + 5000, 0).expect("get"), "first");
    assert_eq!(calls(&s), 3);
    let said = tm.last_said(&k.store_key()).expect("a word");
    assert!(said.contains("expired at 2026-11-25T00:10:00"), "{said}");
}

#[test]
fn with_nothing_cached_a_failure_is_the_kubelets_failed_mount() {
    let tmp = TempDir::new("tokens-fail");
    let (_store, tm) = manager(&tmp, up_link());
    let k = key("u1", 3607);
    let e = tm.get_at(&k, NOW, 0).expect_err("no apiserver yet");
    assert_eq!(
        e.to_string(),
        "failed to fetch token: the node has not reached the apiserver yet"
    );
    let s = script(vec![Err(forbidden()), Err(transport())]);
    tm.set_minter(s.clone());
    let e = tm.get_at(&k, NOW, 0).expect_err("refused");
    // The apiserver's message, as client-go's error carries it.
    assert_eq!(
        e.to_string(),
        format!(
            "failed to fetch token: {}",
            match forbidden() {
                ApiError::Status { message, .. } => message,
                _ => unreachable!(),
            }
        )
    );
    let e = tm.get_at(&k, NOW, 0).expect_err("transport");
    assert!(
        e.to_string()
            .starts_with("failed to fetch token: POST /api/v1/namespaces/apps/serviceaccounts/default/token: connection refused"),
        "{e}"
    );
}

#[test]
fn offline_the_stored_token_survives_a_restart_and_is_served_without_asking() {
    let tmp = TempDir::new("tokens-offline");
    let k = key("u1", 3607);
    {
        let (store, tm) = manager(&tmp, up_link());
        tm.set_minter(script(vec![Ok(token("kept", NOW, 3607))]));
        assert_eq!(tm.get_at(&k, NOW, 0).expect("get"), "kept");
        store.flush().expect("flush");
    }
    // A reboot with the link down: no minter, the link not up.
    let down = Link::new(std::time::Duration::from_secs(1));
    let (_store, tm) = manager(&tmp, down);
    let s = script(vec![]);
    tm.set_minter(s.clone());
    assert_eq!(tm.get_at(&k, NOW + 86_400 * 30, 0).expect("get"), "kept");
    assert_eq!(calls(&s), 0, "a link known down is not tried");
    // And it says that the token it serves has expired, and since when.
    let said = tm
        .last_said(&k.store_key())
        .expect("a word on the expired token");
    assert!(
        said.contains("expired at 2026-11-25T01:00:07")
            && said.contains("the apiserver is out of reach"),
        "{said}"
    );
}

#[test]
fn a_token_still_valid_offline_is_served_without_a_word() {
    let tmp = TempDir::new("tokens-offline-fresh");
    let k = key("u1", 3607);
    {
        let (store, tm) = manager(&tmp, up_link());
        tm.set_minter(script(vec![Ok(token("kept", NOW, 3607))]));
        assert_eq!(tm.get_at(&k, NOW, 0).expect("get"), "kept");
        store.flush().expect("flush");
    }
    let (_store, tm) = manager(&tmp, Link::new(std::time::Duration::from_secs(1)));
    assert_eq!(tm.get_at(&k, NOW + 3000, 0).expect("get"), "kept");
    assert_eq!(tm.last_said(&k.store_key()), None);
}

#[test]
fn tokens_go_with_their_pod() {
    let tmp = TempDir::new("tokens-forget");
    let (_store, tm) = manager(&tmp, up_link());
    let s = script(vec![
        Ok(token("a", NOW, 3607)),
        Ok(token("b", NOW, 3607)),
        Ok(token("c", NOW, 3607)),
        Ok(token("a2", NOW, 3607)),
    ]);
    tm.set_minter(s.clone());
    let mut audience = key("u1", 3607);
    audience.audience = "vault".into();
    tm.get_at(&key("u1", 3607), NOW, 0).expect("a");
    tm.get_at(&audience, NOW, 0).expect("b");
    tm.get_at(&key("u2", 3607), NOW, 0).expect("c");
    assert_eq!(tm.forget("u1").expect("forget"), 2);
    assert_eq!(tm.tree.keys().expect("keys"), vec!["u2/apps/default//3607"]);
    // Asked again, it is minted again.
    assert_eq!(tm.get_at(&key("u1", 3607), NOW, 0).expect("a2"), "a2");
    tm.retain(|uid| uid == "u2").expect("retain");
    assert_eq!(tm.tree.keys().expect("keys"), vec!["u2/apps/default//3607"]);
}
