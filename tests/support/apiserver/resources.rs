//! The resource handlers: create (with admission and defaults), get, list (field and
//! label selectors, limit/continue over a consistent snapshot), update with optimistic
//! concurrency, strategic/merge patch with status subresources, and delete (graceful for
//! pods bound to a node, README semantics 7).

use std::time::{Duration, SystemTime};

use serde_json::{json, Map, Value};

use super::api::{Reply, Route};
use super::auth::User;
use super::authz;
use super::defaults;
use super::http::{base64_decode, base64_url, random_bytes, rfc3339, uuid, Request};
use super::patch;
use super::status::{self, ApiErr};
use super::store::{meta_str, parse_selector, Filter, Res, State};
use super::{lock, Shared};

type Result<T> = std::result::Result<T, ApiErr>;

fn parse_body(req: &Request) -> Result<Value> {
    let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
        status::bad_request(format!(
            "the object provided is unrecognized or invalid: {e}"
        ))
    })?;
    if !v.is_object() {
        return Err(status::bad_request("the request body is not a JSON object"));
    }
    Ok(v)
}

fn node_restricted<'a>(shared: &Shared, user: &'a User) -> Option<&'a str> {
    user.node_name().filter(|_| shared.options.node_restriction)
}

fn not_found(route: &Route) -> ApiErr {
    status::not_found(route.res, &route.name)
}

fn store(shared: &Shared, state: &mut State, res: Res, obj: Value) -> Value {
    let v = state.put(res, obj);
    shared.changed.notify_all();
    v
}

pub fn get(shared: &Shared, route: &Route) -> Result<Reply> {
    if !route.subresource.is_empty() && route.subresource != "status" {
        return Err(status::route_not_found());
    }
    let state = lock(&shared.state);
    match state.get(route.res, &route.namespace, &route.name) {
        Some(o) => Ok(Reply::Json(200, o.clone())),
        None => Err(not_found(route)),
    }
}

pub fn filter(route: &Route, req: &Request) -> Filter {
    Filter {
        namespace: route.namespace.clone(),
        fields: parse_selector(&req.param("fieldSelector").unwrap_or_default()),
        labels: parse_selector(&req.param("labelSelector").unwrap_or_default()),
    }
}

fn continue_token(rv: i64, start: &str) -> String {
    let json = format!(
        "{{\"v\":\"meta.k8s.io/v1\",\"rv\":{rv},\"start\":{}}}",
        Value::from(start)
    );
    base64_url(json.as_bytes())
}

pub fn list(shared: &Shared, route: &Route, req: &Request) -> Result<Reply> {
    let filter = filter(route, req);
    let limit: usize = req
        .param("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let state = lock(&shared.state);
    let (at, after, items) = match req.param("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let bad = || {
                status::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
            };
            let raw = base64_decode(&token).ok_or_else(bad)?;
            let t: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
            let rv = t["rv"].as_u64().ok_or_else(bad)?;
            let start = t["start"].as_str().ok_or_else(bad)?.to_string();
            if rv < state.compacted {
                let mut e = status::ApiErr::new(410, "Expired", "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.");
                e.continue_token = Some(continue_token(-1, start.trim_start_matches('/')));
                return Err(e);
            }
            (rv, Some(start), state.snapshot(route.res, rv))
        }
        None => (state.rv, None, state.current(route.res)),
    };
    drop(state);
    let mut page = Vec::new();
    let mut next = None;
    for (k, o) in items {
        let full = format!("/{k}");
        if after.as_ref().is_some_and(|a| full.as_str() < a.as_str()) || !filter.matches(&o) {
            continue;
        }
        if page.len() == limit {
            next = page
                .last()
                .map(|(k, _): &(String, Value)| format!("/{k}\u{0}"));
            break;
        }
        page.push((k, o));
    }
    let mut meta = json!({"resourceVersion": at.to_string()});
    if let Some(start) = next {
        meta["continue"] = json!(continue_token(at as i64, &start));
    }
    let items: Vec<Value> = page
        .into_iter()
        .map(|(_, mut o)| {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    Ok(Reply::Json(
        200,
        json!({"kind": format!("{}List", route.res.kind()), "apiVersion": route.res.api_version(),
            "metadata": meta, "items": items}),
    ))
}

fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let r: [u8; 5] = random_bytes();
    let suffix: String = r
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("{prefix}{suffix}")
}

pub fn create(shared: &Shared, user: &User, route: &Route, req: &Request) -> Result<Reply> {
    if !route.name.is_empty() {
        return Err(status::method_not_allowed());
    }
    let mut obj = parse_body(req)?;
    let res = route.res;
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if res.namespaced() {
        let ns = meta_str(&obj, "namespace");
        if !ns.is_empty() && ns != route.namespace {
            return Err(status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        obj["metadata"]["namespace"] = json!(route.namespace);
    }
    if meta_str(&obj, "name").is_empty() {
        let prefix = meta_str(&obj, "generateName").to_string();
        if !prefix.is_empty() {
            obj["metadata"]["name"] = json!(generate_name(&prefix));
        }
    }
    obj["kind"] = json!(res.kind());
    obj["apiVersion"] = json!(res.api_version());
    let name = meta_str(&obj, "name").to_string();
    let mut state = lock(&shared.state);
    if let Some(node) = node_restricted(shared, user) {
        match res {
            Res::Pods => authz::admit_pod_create(&state, node, &obj)?,
            Res::Nodes => authz::admit_node(node, &name, &obj, None)?,
            Res::Leases => authz::admit_lease_create(node, &obj)?,
            _ => {}
        }
    }
    match res {
        Res::Pods => defaults::pod(&mut obj),
        Res::Nodes => defaults::node(&mut obj),
        Res::Secrets => defaults::secret(&mut obj),
        Res::EventsV1 => defaults::event_v1(&mut obj),
        _ => {}
    }
    let causes = match res {
        Res::Pods => defaults::validate_pod(&obj),
        _ => defaults::validate_name(&obj),
    };
    if !causes.is_empty() {
        return Err(status::invalid(res, &name, causes));
    }
    if state.get(res, &route.namespace, &name).is_some() {
        return Err(status::already_exists(res, &name));
    }
    if let Some(m) = obj["metadata"].as_object_mut() {
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "managedFields",
        ] {
            m.remove(k);
        }
        m.insert("uid".into(), json!(uuid()));
        m.insert(
            "creationTimestamp".into(),
            json!(rfc3339(SystemTime::now())),
        );
        if res == Res::Pods {
            m.insert("generation".into(), json!(1));
        }
    }
    let stored = store(shared, &mut state, res, obj);
    Ok(Reply::Json(201, stored))
}

/// Builds the object to store from the old one and the proposed one: server-owned
/// metadata kept, status (or everything but status) taken per subresource.
fn merge_update(route: &Route, old: &Value, proposed: Value) -> Value {
    let status_only = route.subresource == "status";
    let mut new = proposed;
    let has_status = matches!(route.res, Res::Pods | Res::Nodes);
    let keep = if status_only { "spec" } else { "status" };
    if status_only || has_status {
        if let Some(m) = new.as_object_mut() {
            match old.get(keep) {
                Some(v) => m.insert(keep.to_string(), v.clone()),
                None => m.remove(keep),
            };
        }
    }
    if let (Some(m), Some(o)) = (new["metadata"].as_object_mut(), old["metadata"].as_object()) {
        let mut keep = vec![
            "name",
            "namespace",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ];
        if status_only {
            keep.push("ownerReferences");
        }
        for k in keep {
            match o.get(k) {
                Some(v) => m.insert(k.to_string(), v.clone()),
                None => m.remove(k),
            };
        }
        m.remove("managedFields");
    }
    if route.res == Res::Secrets {
        defaults::secret(&mut new);
    }
    if route.res == Res::Pods && !status_only && new["spec"] != old["spec"] {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        new["metadata"]["generation"] = json!(g);
    }
    new["kind"] = json!(route.res.kind());
    new["apiVersion"] = json!(route.res.api_version());
    new
}

fn without_rv(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    v
}

/// Admission, validation and the write shared by PUT and PATCH.
fn commit(
    shared: &Shared,
    state: &mut State,
    user: &User,
    route: &Route,
    old: &Value,
    new: Value,
    uid_causes: usize,
) -> Result<Reply> {
    if let Some(node) = node_restricted(shared, user) {
        match (route.res, route.subresource.as_str()) {
            (Res::Pods, "status") => authz::admit_pod_status(node, old, &new)?,
            (Res::Nodes, _) => authz::admit_node(node, &route.name, &new, Some(old))?,
            _ => {}
        }
    }
    let new_uid = meta_str(&new, "uid");
    if !new_uid.is_empty() && new_uid != meta_str(old, "uid") {
        let cause = defaults::uid_changed(new_uid);
        let causes = vec![cause; uid_causes.max(1)];
        return Err(status::invalid(route.res, &route.name, causes));
    }
    let mut new = new;
    new["metadata"]["uid"] = old["metadata"]["uid"].clone();
    if without_rv(&new) == without_rv(old) {
        return Ok(Reply::Json(200, old.clone()));
    }
    let stored = store(shared, state, route.res, new);
    Ok(Reply::Json(200, stored))
}

pub fn update(shared: &Shared, user: &User, route: &Route, req: &Request) -> Result<Reply> {
    let body = parse_body(req)?;
    let body_name = meta_str(&body, "name");
    if body_name != route.name {
        return Err(status::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            route.name
        )));
    }
    let mut state = lock(&shared.state);
    let old = state
        .get(route.res, &route.namespace, &route.name)
        .cloned()
        .ok_or_else(|| not_found(route))?;
    let rv = meta_str(&body, "resourceVersion");
    if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
        return Err(status::conflict(route.res, &route.name));
    }
    let uid = meta_str(&body, "uid");
    if !uid.is_empty() && uid != meta_str(&old, "uid") {
        return Err(ApiErr::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {:?}: Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                status::qualified(route.res),
                route.name,
                meta_str(&old, "uid")
            ),
        ));
    }
    let new = merge_update(route, &old, body);
    commit(shared, &mut state, user, route, &old, new, 1)
}

pub fn patch(shared: &Shared, user: &User, route: &Route, req: &Request) -> Result<Reply> {
    let ct = req.header("content-type").unwrap_or("");
    let kind =
        patch::Kind::from_content_type(ct).ok_or_else(|| status::unsupported_media_type(ct))?;
    let p = parse_body(req)?;
    let mut state = lock(&shared.state);
    let old = state
        .get(route.res, &route.namespace, &route.name)
        .cloned()
        .ok_or_else(|| not_found(route))?;
    let rv = p["metadata"]["resourceVersion"].as_str().unwrap_or("");
    if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
        return Err(status::conflict(route.res, &route.name));
    }
    let mut patched = old.clone();
    kind.apply(&mut patched, &p);
    let new_uid = meta_str(&patched, "uid").to_string();
    let mut new = merge_update(route, &old, patched);
    new["metadata"]["uid"] = json!(new_uid);
    // Pod status validation checks object metadata twice, hence the repeated cause (52).
    let causes = if route.res == Res::Pods && route.subresource == "status" {
        2
    } else {
        1
    };
    commit(shared, &mut state, user, route, &old, new, causes)
}

fn delete_options(req: &Request) -> Result<Value> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    parse_body(req)
}

/// The grace period a pod delete gets (the pod strategy's CheckGracefulDelete).
fn pod_grace(pod: &Value, opts: &Value) -> i64 {
    let mut period = opts["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(0);
    let phase = pod["status"]["phase"].as_str().unwrap_or("");
    if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty()
        || phase == "Succeeded"
        || phase == "Failed"
    {
        period = 0;
    }
    period.max(0)
}

/// Deletes (or starts deleting) an object; returns what the DELETE answers.
pub fn delete_in(shared: &Shared, state: &mut State, route: &Route, opts: &Value) -> Result<Reply> {
    let old = state
        .get(route.res, &route.namespace, &route.name)
        .cloned()
        .ok_or_else(|| not_found(route))?;
    for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        if let Some(want) = opts["preconditions"][field].as_str() {
            let have = meta_str(&old, field);
            if want != have {
                return Err(status::precondition_failed(
                    route.res,
                    &route.name,
                    what,
                    want,
                    have,
                ));
            }
        }
    }
    if route.res != Res::Pods {
        state.remove(route.res, &route.namespace, &route.name);
        shared.changed.notify_all();
        let mut details = Map::new();
        details.insert("name".into(), json!(route.name));
        if !route.res.group().is_empty() {
            details.insert("group".into(), json!(route.res.group()));
        }
        details.insert("kind".into(), json!(route.res.plural()));
        details.insert("uid".into(), old["metadata"]["uid"].clone());
        return Ok(Reply::Json(
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": Value::Object(details)}),
        ));
    }
    let period = pod_grace(&old, opts);
    let now = SystemTime::now();
    let deadline = rfc3339(now + Duration::from_secs(period as u64));
    let mut new = old.clone();
    match old["metadata"]["deletionGracePeriodSeconds"].as_i64() {
        Some(current) if period >= current => return Ok(Reply::Json(200, old)),
        Some(_) => {}
        None => {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(0);
            if g > 0 {
                new["metadata"]["generation"] = json!(g + 1);
            }
        }
    }
    new["metadata"]["deletionTimestamp"] = json!(deadline);
    new["metadata"]["deletionGracePeriodSeconds"] = json!(period);
    let stored = state.put(Res::Pods, new);
    let reply = if period == 0 {
        state
            .remove(Res::Pods, &route.namespace, &route.name)
            .unwrap_or(stored)
    } else {
        stored
    };
    shared.changed.notify_all();
    Ok(Reply::Json(200, reply))
}

pub fn delete(shared: &Shared, user: &User, route: &Route, req: &Request) -> Result<Reply> {
    let opts = delete_options(req)?;
    let mut state = lock(&shared.state);
    if let (Some(node), Res::Pods) = (node_restricted(shared, user), route.res) {
        let pod = state
            .get(Res::Pods, &route.namespace, &route.name)
            .ok_or_else(|| not_found(route))?;
        authz::admit_pod_delete(node, pod)?;
    }
    delete_in(shared, &mut state, route, &opts)
}
