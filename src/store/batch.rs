//! Several changes, to one or more trees, made as one: after a power cut either all of
//! them are in the store or none is.

use super::pending::Op;
use super::{Store, StoreError, Tree};

/// Changes collected to be applied by [`Store::apply`] in one sled transaction.
#[derive(Default)]
pub struct Batch {
    ops: Vec<Op>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Writes `value` under `key` in `tree` (encoded now, so an encoding error names the
    /// record before anything is written).
    pub fn put<T>(&mut self, tree: &Tree<T>, key: &str, value: &T) -> Result<(), StoreError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let bytes = tree.encode(key, value)?;
        self.ops.push(Op {
            tree: tree.name(),
            key: key.to_string(),
            value: Some(bytes),
        });
        Ok(())
    }

    /// Removes `key` from `tree`.
    pub fn remove<T>(&mut self, tree: &Tree<T>, key: &str)
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        self.ops.push(Op {
            tree: tree.name(),
            key: key.to_string(),
            value: None,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

impl Store {
    /// Applies every change in `batch` as one transaction, in order. Puts whose bytes
    /// equal what is stored and removes of absent keys write nothing; returns how many
    /// keys changed (0: nothing was written to flash).
    pub fn apply(&self, batch: Batch) -> Result<usize, StoreError> {
        // Leave out what would not change anything, so a resync writes nothing. A key
        // the batch changes twice is compared with what the batch made of it.
        let mut seen: std::collections::HashMap<(&'static str, String), Option<Vec<u8>>> =
            std::collections::HashMap::new();
        let mut ops = Vec::with_capacity(batch.ops.len());
        for op in batch.ops {
            let id = (op.tree, op.key.clone());
            let old = match seen.get(&id) {
                Some(v) => v.clone(),
                None => self.get_raw(op.tree, &op.key)?,
            };
            if old != op.value {
                seen.insert(id, op.value.clone());
                ops.push(op);
            }
        }
        self.write(ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_spans_trees_and_skips_what_is_unchanged() {
        let tmp = crate::testutil::TempDir::new("batch");
        let store = Store::open(&tmp.0.join("db")).expect("open");
        let a: Tree<String> = store.tree("a").expect("a");
        let b: Tree<u32> = store.tree("b").expect("b");
        a.put("gone", &"x".to_string()).expect("put");

        let mut batch = Batch::new();
        batch.put(&a, "k", &"v".to_string()).expect("put");
        batch.put(&b, "n", &7).expect("put");
        batch.remove(&a, "gone");
        batch.remove(&b, "never");
        assert_eq!(store.apply(batch).expect("apply"), 3);
        assert_eq!(a.get("k").expect("get"), Some("v".to_string()));
        assert_eq!(b.get("n").expect("get"), Some(7));
        assert_eq!(a.get("gone").expect("get"), None);

        let mut again = Batch::new();
        again.put(&a, "k", &"v".to_string()).expect("put");
        again.put(&b, "n", &7).expect("put");
        assert_eq!(store.apply(again).expect("apply"), 0, "nothing changed");
    }
}
