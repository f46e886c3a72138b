//! Writes the store has taken but cannot yet call durable.
//!
//! Normally these are the writes sled holds in memory until the next flush (at most a
//! second's worth): if sled's log writer fails before then (a full disk), sled loses
//! them when it is opened again, so they are kept here to be written once more. While
//! the store is *holding* (the disk is full), every write lands here only, and reads
//! see it here first. Newest wins per key, so what is held is bounded by the number of
//! records, never by how long the disk stays full.

use std::collections::BTreeMap;

use crate::time::Timestamp;

/// One change to one key: `None` removes it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Op {
    pub tree: &'static str,
    pub key: String,
    pub value: Option<Vec<u8>>,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    value: Option<Vec<u8>>,
}

/// Why and since when writes are held.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    pub since: Timestamp,
    pub reason: String,
}

#[derive(Debug, Default)]
pub(super) struct Pending {
    entries: BTreeMap<(&'static str, String), Entry>,
    next_seq: u64,
    holding: Option<Holding>,
    /// sled's log writer failed: it must be opened again before anything is replayed.
    pub sled_failed: bool,
}

impl Pending {
    /// Records `ops` (already given to sled, or held).
    pub fn record(&mut self, ops: &[Op]) {
        for op in ops {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.entries.insert(
                (op.tree, op.key.clone()),
                Entry {
                    seq,
                    value: op.value.clone(),
                },
            );
        }
    }

    /// The sequence number the next write will take: a flush that starts now makes
    /// every write below it durable.
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// Forgets the writes below `mark`, which a flush made durable.
    pub fn durable_below(&mut self, mark: u64) {
        self.entries.retain(|_, e| e.seq >= mark);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The pending value of `tree`/`key`: `Some(None)` for a pending removal, `None`
    /// when nothing is pending for it.
    pub fn lookup(&self, tree: &'static str, key: &str) -> Option<Option<&[u8]>> {
        self.entries
            .get(&(tree, key.to_string()))
            .map(|e| e.value.as_deref())
    }

    /// Pending changes in `tree` to keys starting with `prefix`, in key order.
    pub fn in_tree<'a>(
        &'a self,
        tree: &'static str,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, Option<&'a [u8]>)> + 'a {
        self.entries
            .range((tree, prefix.to_string())..)
            .take_while(move |((t, k), _)| *t == tree && k.starts_with(prefix))
            .map(|((_, k), e)| (k.as_str(), e.value.as_deref()))
    }

    /// Every pending change, to be written again in one transaction.
    pub fn all(&self) -> Vec<Op> {
        self.entries
            .iter()
            .map(|((tree, key), e)| Op {
                tree,
                key: key.clone(),
                value: e.value.clone(),
            })
            .collect()
    }

    pub fn holding(&self) -> Option<&Holding> {
        self.holding.as_ref()
    }

    /// Starts holding (the first reason and time stay). Returns whether it just began.
    pub fn hold(&mut self, reason: String, now: Timestamp) -> bool {
        if self.holding.is_some() {
            return false;
        }
        self.holding = Some(Holding { since: now, reason });
        true
    }

    /// Everything pending was written and flushed.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.holding = None;
        self.sled_failed = false;
    }
}

/// `stored` (a tree's records under a prefix, in key order) with `pending`'s changes
/// laid over it.
pub(super) fn overlay<'a>(
    stored: Vec<(String, Vec<u8>)>,
    pending: impl Iterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> Vec<(String, Vec<u8>)> {
    let mut merged: BTreeMap<String, Vec<u8>> = stored.into_iter().collect();
    for (key, value) in pending {
        match value {
            Some(v) => {
                merged.insert(key.to_string(), v.to_vec());
            }
            None => {
                merged.remove(key);
            }
        }
    }
    merged.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(tree: &'static str, key: &str, v: &str) -> Op {
        Op {
            tree,
            key: key.into(),
            value: Some(v.as_bytes().to_vec()),
        }
    }

    #[test]
    fn newest_wins_and_a_flush_forgets_only_what_it_covered() {
        let mut p = Pending::default();
        p.record(&[put("a", "k", "1"), put("a", "j", "x")]);
        let mark = p.mark();
        p.record(&[put("a", "k", "2")]);
        assert_eq!(p.len(), 2, "one entry per key");
        p.durable_below(mark);
        assert_eq!(p.len(), 1, "k was written again after the flush began");
        assert_eq!(p.lookup("a", "k"), Some(Some(b"2".as_slice())));
        assert_eq!(p.lookup("a", "j"), None);
    }

    #[test]
    fn overlay_applies_puts_and_removals_within_a_tree_and_prefix() {
        let mut p = Pending::default();
        p.record(&[
            put("pods", "ns/a", "new"),
            Op {
                tree: "pods",
                key: "ns/b".into(),
                value: None,
            },
            put("pods", "other/c", "no"),
            put("podz", "ns/d", "no"),
        ]);
        let stored = vec![
            ("ns/a".to_string(), b"old".to_vec()),
            ("ns/b".to_string(), b"gone".to_vec()),
            ("ns/e".to_string(), b"kept".to_vec()),
        ];
        let merged = overlay(stored, p.in_tree("pods", "ns/"));
        assert_eq!(
            merged,
            vec![
                ("ns/a".to_string(), b"new".to_vec()),
                ("ns/e".to_string(), b"kept".to_vec()),
            ]
        );
    }

    #[test]
    fn holding_keeps_its_first_reason_until_cleared() {
        let mut p = Pending::default();
        let t = Timestamp::from_second(1_800_000_000).expect("time");
        assert!(p.hold("no space".into(), t));
        assert!(!p.hold("other".into(), t));
        assert_eq!(p.holding().map(|h| h.reason.as_str()), Some("no space"));
        p.record(&[put("a", "k", "1")]);
        p.clear();
        assert!(p.holding().is_none() && p.is_empty());
    }
}
