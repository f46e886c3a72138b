//! Several changes, to one or more trees, made as one: after a power cut either all of
//! them are in the store or none is.

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::{Store, StoreError, Tree};

struct Op {
    tree: sled::Tree,
    name: &'static str,
    key: String,
    /// `None` removes the key.
    value: Option<Vec<u8>>,
}

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
            tree: tree.raw().clone(),
            name: tree.name(),
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
            tree: tree.raw().clone(),
            name: tree.name(),
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
        if batch.ops.is_empty() {
            return Ok(0);
        }
        // Leave out what would not change anything, so a resync writes nothing.
        let mut ops = Vec::with_capacity(batch.ops.len());
        for op in batch.ops {
            let old = op.tree.get(&op.key).map_err(|source| StoreError::Db {
                op: "get",
                tree: op.name,
                key: op.key.clone(),
                source,
            })?;
            let same = match (&old, &op.value) {
                (Some(old), Some(new)) => old.as_ref() == new.as_slice(),
                (None, None) => true,
                _ => false,
            };
            if !same {
                ops.push(op);
            }
        }
        if ops.is_empty() {
            return Ok(0);
        }
        // One transactional view per distinct tree; ops point at their view.
        let mut trees: Vec<sled::Tree> = Vec::new();
        let mut index = Vec::with_capacity(ops.len());
        for op in &ops {
            let at = match trees.iter().position(|t| t.name() == op.tree.name()) {
                Some(at) => at,
                None => {
                    trees.push(op.tree.clone());
                    trees.len() - 1
                }
            };
            index.push(at);
        }
        let refs: Vec<&sled::Tree> = trees.iter().collect();
        let result = refs.as_slice().transaction(|views| {
            for (op, &at) in ops.iter().zip(&index) {
                let view = &views[at];
                match &op.value {
                    Some(v) => {
                        view.insert(op.key.as_bytes(), v.as_slice())?;
                    }
                    None => {
                        view.remove(op.key.as_bytes())?;
                    }
                }
            }
            Ok::<(), ConflictableTransactionError<()>>(())
        });
        match result {
            Ok(()) => Ok(ops.len()),
            Err(TransactionError::Storage(source)) => Err(StoreError::Db {
                op: "transaction",
                tree: ops[0].name,
                key: ops[0].key.clone(),
                source,
            }),
            Err(TransactionError::Abort(())) => Err(StoreError::Db {
                op: "transaction",
                tree: ops[0].name,
                key: ops[0].key.clone(),
                source: sled::Error::Unsupported("transaction aborted".into()),
            }),
        }
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
