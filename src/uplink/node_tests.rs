//! The node controller's schedule on a virtual clock, against a fake apiserver.

use std::cell::RefCell;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use super::*;
use crate::kube::link::Stage;

#[derive(Default)]
struct Fake {
    node: RefCell<Option<Node>>,
    lease: RefCell<Option<Lease>>,
    calls: RefCell<Vec<String>>,
    down: RefCell<bool>,
    rv: RefCell<u64>,
}

impl Fake {
    fn call(&self, what: &str) -> Result<(), ApiError> {
        self.calls.borrow_mut().push(what.to_string());
        if *self.down.borrow() {
            return Err(ApiError::Transport {
                method: "GET",
                path: "/".into(),
                message: "connection refused".into(),
            });
        }
        Ok(())
    }
    fn status(code: u16, reason: &str) -> ApiError {
        ApiError::Status {
            method: "X",
            path: "/".into(),
            code,
            reason: reason.into(),
            message: String::new(),
        }
    }
    fn next_rv(&self) -> String {
        *self.rv.borrow_mut() += 1;
        self.rv.borrow().to_string()
    }
    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.borrow_mut())
    }
}

impl NodeApi for Fake {
    fn reconnected(&self) {
        self.calls.borrow_mut().push("reconnected".into());
    }
    fn create_node(&self, node: &Node) -> Result<Node, ApiError> {
        self.call("create_node")?;
        if self.node.borrow().is_some() {
            return Err(Fake::status(409, "AlreadyExists"));
        }
        let mut n = node.clone();
        n.metadata.uid = Some(format!("uid-{}", self.next_rv()));
        *self.node.borrow_mut() = Some(n.clone());
        Ok(n)
    }
    fn get_node(&self, _name: &str) -> Result<Node, ApiError> {
        self.call("get_node")?;
        self.node
            .borrow()
            .clone()
            .ok_or(Fake::status(404, "NotFound"))
    }
    fn patch_node(&self, _name: &str, _body: &Value) -> Result<Node, ApiError> {
        self.call("patch_node")?;
        self.node
            .borrow()
            .clone()
            .ok_or(Fake::status(404, "NotFound"))
    }
    fn patch_node_status(&self, _name: &str, body: &Value) -> Result<Node, ApiError> {
        self.call("patch_node_status")?;
        let mut node = self.node.borrow_mut();
        let n = node.as_mut().ok_or(Fake::status(404, "NotFound"))?;
        let status: NodeStatus = serde_json::from_value(body["status"].clone()).unwrap_or_default();
        n.status = Some(status);
        Ok(n.clone())
    }
    fn get_lease(&self, _name: &str) -> Result<Lease, ApiError> {
        self.call("get_lease")?;
        self.lease
            .borrow()
            .clone()
            .ok_or(Fake::status(404, "NotFound"))
    }
    fn create_lease(&self, lease: &Lease) -> Result<Lease, ApiError> {
        self.call("create_lease")?;
        let mut l = lease.clone();
        l.metadata.resource_version = Some(self.next_rv());
        *self.lease.borrow_mut() = Some(l.clone());
        Ok(l)
    }
    fn update_lease(&self, _held: &Lease, lease: &Lease) -> Result<Lease, ApiError> {
        self.call("update_lease")?;
        let mut stored = self.lease.borrow_mut();
        let Some(cur) = stored.as_ref() else {
            // The apiserver's answer to a PUT that names a resourceVersion of a Lease
            // that is gone: leases may be created by an update, so not a 404.
            return Err(Fake::status(409, "Conflict"));
        };
        if cur.metadata.resource_version != lease.metadata.resource_version {
            return Err(Fake::status(409, "Conflict"));
        }
        let mut l = lease.clone();
        l.metadata.resource_version = Some(self.next_rv());
        *stored = Some(l.clone());
        Ok(l)
    }
}

/// A model whose Ready condition follows `ready`.
struct Model {
    ready: std::rc::Rc<RefCell<bool>>,
    /// The `old` of the last status patch.
    patched_from: std::rc::Rc<RefCell<Option<NodeStatus>>>,
}

impl NodeModel for Model {
    fn registration(&self, now: Timestamp) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(self.status(None, now)),
        }
    }
    fn status(&self, _previous: Option<&NodeStatus>, _now: Timestamp) -> NodeStatus {
        NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if *self.ready.borrow() {
                    "True"
                } else {
                    "False"
                }
                .into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }
    }
    fn status_patch(&self, old: Option<&NodeStatus>, new: &NodeStatus) -> Value {
        *self.patched_from.borrow_mut() = old.cloned();
        serde_json::json!({ "status": new })
    }
    fn changed(&self, old: &NodeStatus, new: &NodeStatus) -> bool {
        old != new
    }
    fn lease(&self, node_uid: &str, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                namespace: Some("kube-node-lease".into()),
                owner_references: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: "n1".into(),
                        uid: node_uid.into(),
                        ..Default::default()
                    },
                ]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("n1".into()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(now)),
                ..LeaseSpec::default()
            }),
        }
    }
}

const TIMING: Timing = Timing {
    renew: Duration::from_secs(10),
    report: Duration::from_secs(300),
    retry: Backoff {
        initial: Duration::from_millis(800),
        max: Duration::from_secs(30),
    },
};

struct Clock {
    t0: Instant,
    wall0: Timestamp,
}

impl Clock {
    fn wall(&self, at: Instant) -> Timestamp {
        let d = at.duration_since(self.t0);
        crate::time::add(self.wall0, d)
    }
}

fn setup() -> (
    Fake,
    NodeController<Model>,
    std::rc::Rc<RefCell<bool>>,
    Clock,
) {
    let ready = std::rc::Rc::new(RefCell::new(true));
    let c = NodeController::new(
        "n1".into(),
        Model {
            ready: ready.clone(),
            patched_from: Default::default(),
        },
        TIMING,
        new_node_uid(),
    );
    let clock = Clock {
        t0: Instant::now(),
        wall0: Timestamp::from_second(1_800_000_000).expect("ts"),
    };
    (Fake::default(), c, ready, clock)
}

/// Steps the controller from `from` until `until` on the virtual clock, as the thread
/// would; returns the time it stopped at.
fn run(
    c: &mut NodeController<Model>,
    api: &Fake,
    clock: &Clock,
    from: Instant,
    until: Instant,
) -> Instant {
    let mut now = from;
    while now <= until {
        let next = c.step(api, now, clock.wall(now), 0);
        assert!(next > now, "the controller must not spin");
        now = next;
    }
    now
}

#[test]
fn registers_then_renews_every_ten_seconds_and_reports_every_five_minutes() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    run(&mut c, &api, &clock, t0, t0);
    assert!(c.is_registered());
    assert_eq!(
        api.calls(),
        ["create_node", "get_lease", "create_lease"],
        "a fresh node reports the status it registered with"
    );
    // 10 minutes: a renewal every 10 s (60), a full status at 5 and 10 minutes.
    run(
        &mut c,
        &api,
        &clock,
        t0 + Duration::from_secs(10),
        t0 + Duration::from_secs(600),
    );
    let calls = api.calls();
    let renewals = calls.iter().filter(|c| *c == "update_lease").count();
    let reports = calls.iter().filter(|c| *c == "patch_node_status").count();
    assert_eq!(renewals, 60, "{calls:?}");
    assert_eq!(reports, 2, "{calls:?}");
    assert_eq!(calls.len(), 62, "nothing else at steady state: {calls:?}");
    let lease = api.lease.borrow().clone().expect("lease");
    let renewed = lease.spec.and_then(|s| s.renew_time).expect("renewTime").0;
    assert_eq!(renewed, clock.wall(t0 + Duration::from_secs(600)));
}

#[test]
fn a_status_change_is_reported_at_the_next_renewal() {
    let (api, mut c, ready, clock) = setup();
    let t0 = clock.t0;
    let now = run(&mut c, &api, &clock, t0, t0 + Duration::from_secs(30));
    api.calls();
    *ready.borrow_mut() = false;
    run(&mut c, &api, &clock, now, now);
    assert_eq!(api.calls(), ["update_lease", "patch_node_status"]);
    let node = api.node.borrow().clone().expect("node");
    let cond = &node.status.and_then(|s| s.conditions).expect("conditions")[0];
    assert_eq!(cond.status, "False");
}

#[test]
fn a_deleted_node_is_registered_again() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    let now = run(&mut c, &api, &clock, t0, t0 + Duration::from_secs(20));
    let first_uid = api
        .node
        .borrow()
        .as_ref()
        .and_then(|n| n.metadata.uid.clone());
    *api.node.borrow_mut() = None;
    *api.lease.borrow_mut() = None; // garbage-collected with its owner
    api.calls();
    run(&mut c, &api, &clock, now, now + Duration::from_secs(20));
    let calls = api.calls();
    assert!(calls.contains(&"create_node".to_string()), "{calls:?}");
    let uid = api
        .node
        .borrow()
        .as_ref()
        .and_then(|n| n.metadata.uid.clone());
    assert!(uid.is_some() && uid != first_uid);
    let lease = api.lease.borrow().clone().expect("lease");
    let owner = &lease.metadata.owner_references.expect("owner")[0];
    assert_eq!(
        Some(owner.uid.clone()),
        uid,
        "the new lease names the new Node"
    );
}

#[test]
fn an_existing_node_is_taken_over() {
    let (api, mut c, _ready, clock) = setup();
    *api.node.borrow_mut() = Some(Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            uid: Some("old-uid".into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    });
    run(&mut c, &api, &clock, clock.t0, clock.t0);
    let calls = api.calls();
    assert_eq!(&calls[..2], ["create_node", "get_node"]);
    assert!(
        calls.contains(&"patch_node_status".to_string()),
        "{calls:?}"
    );
    assert_eq!(
        *c.node_uid.lock().expect("lock"),
        Some("old-uid".to_string())
    );
}

#[test]
fn a_dead_uplink_is_probed_once_a_renewal_interval() {
    let (api, mut c, _ready, clock) = setup();
    *api.down.borrow_mut() = true;
    let t0 = clock.t0;
    let mut now = t0;
    let link = c.link();
    let mut waits = Vec::new();
    // An hour down: the probes never thin out to the minutes a back-off grows to.
    for _ in 0..360 {
        let next = c.step(&api, now, clock.wall(now), u64::MAX);
        assert!(next > now && next <= now + TIMING.renew);
        waits.push(next - now);
        now = next;
    }
    assert_eq!(api.calls().len(), 360, "one attempt per step while down");
    assert!(waits[0] <= TIMING.renew, "a random phase first: {waits:?}");
    assert!(
        waits[1..].iter().all(|w| *w == TIMING.renew),
        "then one probe per renewal interval: {waits:?}"
    );
    assert!(!c.is_registered());
    let report = link.report();
    assert_eq!(report.stage, Stage::Down);
    assert_eq!(report.failures, 360);
    assert_eq!(report.next_retry, Some(clock.wall(now)));
    *api.down.borrow_mut() = false;
    c.step(&api, now, clock.wall(now), 0);
    assert!(c.is_registered());
    assert_eq!(link.stage(), Stage::NodeReady);
    assert_eq!(link.report().failures, 0);
}

#[test]
fn after_an_outage_the_lease_goes_first_then_full_status_even_if_unchanged() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    let link = c.link();
    let mut now = run(&mut c, &api, &clock, t0, t0 + Duration::from_secs(30));
    link.drained();
    api.calls();
    *api.down.borrow_mut() = true;
    for _ in 0..3 {
        now = c.step(&api, now, clock.wall(now), 1);
    }
    assert_eq!(link.stage(), Stage::Down);
    assert_eq!(api.calls().len(), 3, "one probe per step");
    // Meanwhile the node controller marked the node Unknown.
    let unknown = NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "Unknown".into(),
            reason: Some("NodeStatusUnknown".into()),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    };
    if let Some(n) = api.node.borrow_mut().as_mut() {
        n.status = Some(unknown.clone());
    }
    *api.down.borrow_mut() = false;
    c.step(&api, now, clock.wall(now), 0);
    assert_eq!(
        api.calls(),
        [
            "update_lease",
            "get_node",
            "patch_node_status",
            "reconnected"
        ],
        "lease first, then the status although it did not change, against the Node as it \
         is; then connections from before the outage go, before the other threads use them"
    );
    assert_eq!(
        c.model.patched_from.borrow().as_ref(),
        Some(&unknown),
        "the patch turns the cluster's Unknown into Ready, not just heartbeats"
    );
    let node = api.node.borrow().clone().expect("node");
    let cond = &node.status.and_then(|s| s.conditions).expect("conditions")[0];
    assert_eq!(cond.status, "True");
    assert_eq!(link.stage(), Stage::NodeReady);
    assert_eq!(link.report().since, Some(clock.wall(now)));
    // Back to the usual schedule: a renewal, no status.
    c.step(&api, now + TIMING.renew, clock.wall(now + TIMING.renew), 0);
    assert_eq!(api.calls(), ["update_lease"]);
}

#[test]
fn a_node_deleted_under_a_running_agent_is_back_within_a_renewal_interval() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    let now = run(&mut c, &api, &clock, t0, t0 + Duration::from_secs(20));
    let old_uid = c.uid();
    // Deleted; the garbage collector deletes the Lease it owned.
    *api.node.borrow_mut() = None;
    *api.lease.borrow_mut() = None;
    api.calls();
    let end = run(&mut c, &api, &clock, now, now + Duration::from_secs(60));
    let calls = api.calls();
    assert_eq!(
        &calls[..5],
        [
            "update_lease",
            "get_node",
            "create_node",
            "get_lease",
            "create_lease"
        ],
        "one conflict, then the Node (with its status) and its Lease again: {calls:?}"
    );
    assert!(
        calls[5..].iter().all(|c| c == "update_lease"),
        "then renewals only: {calls:?}"
    );
    let new_uid = c.uid();
    assert!(new_uid.is_some() && new_uid != old_uid);
    assert_eq!(
        new_uid,
        api.node
            .borrow()
            .as_ref()
            .and_then(|n| n.metadata.uid.clone())
    );
    let lease = api.lease.borrow().clone().expect("lease");
    assert_eq!(
        lease.metadata.owner_references.expect("owner")[0].uid,
        new_uid.clone().unwrap_or_default()
    );
    assert!(end > now);
}

#[test]
fn a_node_made_again_by_someone_else_is_taken_over_with_its_uid() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    let now = run(&mut c, &api, &clock, t0, t0 + Duration::from_secs(20));
    // An operator deleted the Node and made it again; the old Lease is collected.
    if let Some(n) = api.node.borrow_mut().as_mut() {
        n.metadata.uid = Some("operator-uid".into());
    }
    *api.lease.borrow_mut() = None;
    api.calls();
    run(&mut c, &api, &clock, now, now + Duration::from_secs(20));
    assert_eq!(c.uid().as_deref(), Some("operator-uid"));
    let lease = api.lease.borrow().clone().expect("lease");
    assert_eq!(
        lease.metadata.owner_references.expect("owner")[0].uid,
        "operator-uid"
    );
}

#[test]
fn a_lease_owned_by_an_old_uid_is_given_the_current_one() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    let now = run(&mut c, &api, &clock, t0, t0);
    let uid = c.uid().expect("uid");
    if let Some(l) = api.lease.borrow_mut().as_mut() {
        if let Some(o) = l.metadata.owner_references.as_mut() {
            o[0].uid = "stale".into();
        }
    }
    c.lease = None;
    run(&mut c, &api, &clock, now + TIMING.renew, now + TIMING.renew);
    let lease = api.lease.borrow().clone().expect("lease");
    assert_eq!(lease.metadata.owner_references.expect("owner")[0].uid, uid);
}

#[test]
fn a_refusal_is_not_a_dead_link() {
    let (api, mut c, _ready, clock) = setup();
    let link = c.link();
    *api.node.borrow_mut() = Some(Node::default());
    // create_node conflicts and get_node answers: registration works; a forbidden
    // lease is the apiserver answering, not the link going down.
    struct Refusing<'a>(&'a Fake);
    impl NodeApi for Refusing<'_> {
        fn create_node(&self, n: &Node) -> Result<Node, ApiError> {
            self.0.create_node(n)
        }
        fn get_node(&self, n: &str) -> Result<Node, ApiError> {
            self.0.get_node(n)
        }
        fn patch_node(&self, n: &str, b: &Value) -> Result<Node, ApiError> {
            self.0.patch_node(n, b)
        }
        fn patch_node_status(&self, n: &str, b: &Value) -> Result<Node, ApiError> {
            self.0.patch_node_status(n, b)
        }
        fn get_lease(&self, _n: &str) -> Result<Lease, ApiError> {
            Err(Fake::status(403, "Forbidden"))
        }
        fn create_lease(&self, l: &Lease) -> Result<Lease, ApiError> {
            self.0.create_lease(l)
        }
        fn update_lease(&self, held: &Lease, l: &Lease) -> Result<Lease, ApiError> {
            self.0.update_lease(held, l)
        }
    }
    let now = clock.t0;
    let next = c.step(&Refusing(&api), now, clock.wall(now), u64::MAX);
    assert!(next <= now + TIMING.renew);
    assert_eq!(link.report().failures, 0, "only transport trouble counts");
    assert_eq!(
        link.stage(),
        Stage::NodeReady,
        "the apiserver answers: statuses and the pod source need not wait"
    );
}

#[test]
fn a_lease_written_by_someone_else_is_read_again() {
    let (api, mut c, _ready, clock) = setup();
    let t0 = clock.t0;
    let now = run(&mut c, &api, &clock, t0, t0);
    if let Some(l) = api.lease.borrow_mut().as_mut() {
        l.metadata.resource_version = Some("999".into());
    }
    api.calls();
    let next = c.step(&api, now + TIMING.renew, clock.wall(now + TIMING.renew), 0);
    let next = c.step(&api, next, clock.wall(next), 0);
    c.step(&api, next, clock.wall(next), 0);
    let calls = api.calls();
    assert_eq!(
        &calls[..4],
        ["update_lease", "get_node", "get_lease", "update_lease"],
        "{calls:?}"
    );
}

#[test]
fn nothing_is_sent_before_the_clock_is_set_and_the_lease_follows_a_jump() {
    let (api, mut c, _ready, _) = setup();
    // A board that booted in 1970: its wall clock is 40 s past the epoch.
    let booted = Clock {
        t0: Instant::now(),
        wall0: Timestamp::from_second(40).expect("ts"),
    };
    let t0 = booted.t0;
    let mut now = t0;
    for _ in 0..6 {
        let next = c.step(&api, now, booted.wall(now), 0);
        assert_eq!(
            next,
            now + TIMING.renew,
            "the usual schedule, no retry storm"
        );
        now = next;
    }
    assert!(api.calls().is_empty(), "no 1970 lease or status may go out");
    assert!(!c.is_registered());
    // NTP sets the clock years forward: registration and the lease go out at once, with
    // the new time, and renewals keep the monotonic 10 s schedule.
    let set = Clock {
        t0,
        wall0: Timestamp::from_second(1_800_000_000).expect("ts"),
    };
    let next = c.step(&api, now, set.wall(now), 0);
    assert_eq!(api.calls(), ["create_node", "get_lease", "create_lease"]);
    assert_eq!(next, now + TIMING.renew);
    let renewed = api
        .lease
        .borrow()
        .as_ref()
        .and_then(|l| l.spec.as_ref()?.renew_time.clone())
        .map(|t| t.0);
    assert_eq!(renewed, Some(set.wall(now)));
    run(&mut c, &api, &set, next, next + Duration::from_secs(30));
    let renewals = api.calls().iter().filter(|c| *c == "update_lease").count();
    assert_eq!(renewals, 4);
}
