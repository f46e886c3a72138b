//! The pods' side of a graceful node shutdown, as the kubelet's shutdown manager orders
//! it: the active pods grouped by priority (each group from its priority floor up to
//! the next), the groups stopped one after the other from the lowest priority up, each
//! pod with the lesser of its own grace period and its group's, each group waited for
//! at most its grace period. A stopped pod ends Failed with the kubelet's reason,
//! message and DisruptionTarget condition, kept in the store and reported.
//!
//! The loop only hands out the work: the stops run in a task of their own, each pod's
//! in its worker, so that exits and status keep flowing meanwhile.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::worker::{ShutdownStop, WorkerMsg};
use super::SyncLoop;
use crate::config::PriorityPeriod;

/// Admission's reason and message while the node shuts down.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The pod's grace period when its spec sets none.
const DEFAULT_GRACE: i64 = 30;

/// Asks the sync loop to stop every active pod by `periods`; `done` is told the UIDs of
/// the pods it stopped once every group is over.
#[derive(Debug)]
pub struct NodeShutdown {
    pub periods: Vec<PriorityPeriod>,
    pub done: oneshot::Sender<Vec<String>>,
}

/// One pod as the grouping sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub uid: String,
    pub priority: i32,
    pub grace: i64,
}

/// The pods of one priority group and the group's grace period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub period: PriorityPeriod,
    pub pods: Vec<Candidate>,
}

/// The kubelet's `groupByPriority`: `periods` sorted by priority, lowest first; a pod
/// goes to the group with the highest floor at or below its priority (below the lowest
/// floor, the lowest group; above the highest, the highest).
pub fn group_by_priority(periods: &[PriorityPeriod], pods: Vec<Candidate>) -> Vec<Group> {
    let mut groups: Vec<Group> = periods
        .iter()
        .map(|p| Group {
            period: *p,
            pods: Vec::new(),
        })
        .collect();
    if groups.is_empty() {
        return groups;
    }
    for pod in pods {
        let index = groups
            .iter()
            .rposition(|g| g.period.priority <= pod.priority)
            .unwrap_or(0);
        groups[index].pods.push(pod);
    }
    groups
}

/// The grace period a pod gets: its own when shorter than its group's.
fn grace_in(group: &PriorityPeriod, own: i64) -> i64 {
    own.clamp(0, group.seconds.max(0))
}

impl SyncLoop {
    /// Starts stopping the active pods for the node's shutdown; the work goes on in a
    /// task of its own that tells `request.done` when it is over.
    pub(super) fn shut_down(&mut self, request: NodeShutdown) {
        let mut candidates = Vec::new();
        let mut senders = std::collections::HashMap::new();
        for (uid, h) in self.workers.iter().filter(|(_, h)| !h.terminating) {
            let Ok(Some(state)) = self.deps.podstates.tree().get(uid) else {
                continue;
            };
            if matches!(state.status.phase.as_deref(), Some("Succeeded" | "Failed")) {
                continue;
            }
            let spec = state.pod.spec.as_ref();
            candidates.push(Candidate {
                uid: uid.clone(),
                priority: spec.and_then(|s| s.priority).unwrap_or(0),
                grace: spec
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(DEFAULT_GRACE),
            });
            senders.insert(uid.clone(), h.tx.clone());
        }
        let groups = group_by_priority(&request.periods, candidates);
        tokio::spawn(async move {
            let mut stopped = Vec::new();
            for group in groups.into_iter().filter(|g| !g.pods.is_empty()) {
                stopped.extend(stop_group(&group, &senders).await);
            }
            let _ = request.done.send(stopped);
        });
    }
}

/// Stops one group's pods at once and waits for them, at most the group's grace period.
async fn stop_group(
    group: &Group,
    senders: &std::collections::HashMap<String, mpsc::Sender<WorkerMsg>>,
) -> Vec<String> {
    log::info!(
        "node shutdown: stopping {} pod(s) of priority {} and up (grace period {}s)",
        group.pods.len(),
        group.period.priority,
        group.period.seconds
    );
    let wait = Duration::from_secs(u64::try_from(group.period.seconds).unwrap_or(0));
    let deadline = tokio::time::Instant::now() + wait;
    let mut waiting = Vec::new();
    for pod in &group.pods {
        let Some(tx) = senders.get(&pod.uid) else {
            continue;
        };
        let (done, stopped) = oneshot::channel();
        let stop = ShutdownStop {
            grace: grace_in(&group.period, pod.grace),
            done,
        };
        if tx.send(WorkerMsg::ShutDown(stop)).await.is_ok() {
            waiting.push((pod.uid.clone(), stopped));
        }
    }
    let uids = waiting.iter().map(|(u, _)| u.clone()).collect();
    let all = async {
        for (_, stopped) in waiting {
            let _ = stopped.await;
        }
    };
    if tokio::time::timeout_at(deadline, all).await.is_err() {
        log::warn!(
            "node shutdown: pods of priority {} and up not stopped within {}s; going on",
            group.period.priority,
            group.period.seconds
        );
    }
    uids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, priority: i32) -> Candidate {
        Candidate {
            uid: uid.into(),
            priority,
            grace: 30,
        }
    }

    fn uids(g: &Group) -> Vec<&str> {
        g.pods.iter().map(|p| p.uid.as_str()).collect()
    }

    #[test]
    fn the_two_periods_put_critical_pods_last() {
        let periods = [
            PriorityPeriod {
                priority: 0,
                seconds: 20,
            },
            PriorityPeriod {
                priority: 2_000_000_000,
                seconds: 10,
            },
        ];
        let pods = vec![
            pod("node-critical", 2_000_001_000),
            pod("plain", 0),
            pod("cluster-critical", 2_000_000_000),
            pod("high", 1_000_000),
            pod("negative", -5),
        ];
        let groups = group_by_priority(&periods, pods);
        assert_eq!(uids(&groups[0]), vec!["plain", "high", "negative"]);
        assert_eq!(uids(&groups[1]), vec!["node-critical", "cluster-critical"]);
    }

    #[test]
    fn boundaries_go_to_the_lower_group_and_gaps_to_the_floor_below() {
        let p = |priority, seconds| PriorityPeriod { priority, seconds };
        let periods = [p(10, 1), p(100, 2), p(1000, 3)];
        let groups = group_by_priority(
            &periods,
            vec![
                pod("a", 5),
                pod("b", 10),
                pod("c", 99),
                pod("d", 100),
                pod("e", 5000),
            ],
        );
        assert_eq!(uids(&groups[0]), vec!["a", "b", "c"]);
        assert_eq!(uids(&groups[1]), vec!["d"]);
        assert_eq!(uids(&groups[2]), vec!["e"]);
        assert!(group_by_priority(&[], vec![pod("a", 0)]).is_empty());
    }

    #[test]
    fn a_pod_keeps_its_shorter_grace_period() {
        let group = PriorityPeriod {
            priority: 0,
            seconds: 20,
        };
        assert_eq!(grace_in(&group, 5), 5);
        assert_eq!(grace_in(&group, 30), 20);
        assert_eq!(grace_in(&group, -1), 0);
    }
}
