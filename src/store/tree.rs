//! A sled tree whose values are one serde type, stored as JSON.

use std::marker::PhantomData;

use super::StoreError;

/// A typed view of one sled tree.
pub struct Tree<T> {
    name: &'static str,
    tree: sled::Tree,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for Tree<T> {
    fn clone(&self) -> Self {
        Tree {
            name: self.name,
            tree: self.tree.clone(),
            _value: PhantomData,
        }
    }
}

impl<T> Tree<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    pub(super) fn new(name: &'static str, tree: sled::Tree) -> Self {
        Tree {
            name,
            tree,
            _value: PhantomData,
        }
    }

    fn db_err(&self, op: &'static str, key: &str) -> impl FnOnce(sled::Error) -> StoreError {
        let tree = self.name;
        let key = key.to_string();
        move |source| StoreError::Db {
            op,
            tree,
            key,
            source,
        }
    }

    fn decode(&self, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
        serde_json::from_slice(bytes).map_err(|source| StoreError::Decode {
            tree: self.name,
            key: key.to_string(),
            source,
        })
    }

    pub(super) fn encode(&self, key: &str, value: &T) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            tree: self.name,
            key: key.to_string(),
            source,
        })
    }

    pub(super) fn raw(&self) -> &sled::Tree {
        &self.tree
    }

    /// The tree's name in the store.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn get(&self, key: &str) -> Result<Option<T>, StoreError> {
        match self.tree.get(key).map_err(self.db_err("get", key))? {
            Some(bytes) => Ok(Some(self.decode(key, &bytes)?)),
            None => Ok(None),
        }
    }

    /// Writes `value` under `key` unless the stored bytes are already the same, so a
    /// periodic resync that finds nothing changed writes nothing to flash. Returns
    /// whether anything was written.
    pub fn put(&self, key: &str, value: &T) -> Result<bool, StoreError> {
        let bytes = self.encode(key, value)?;
        let old = self.tree.get(key).map_err(self.db_err("get", key))?;
        if old.as_deref() == Some(bytes.as_slice()) {
            return Ok(false);
        }
        self.tree
            .insert(key, bytes)
            .map_err(self.db_err("insert", key))?;
        Ok(true)
    }

    pub fn remove(&self, key: &str) -> Result<Option<T>, StoreError> {
        match self.tree.remove(key).map_err(self.db_err("remove", key))? {
            Some(bytes) => Ok(Some(self.decode(key, &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every key, in order.
    pub fn keys(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.iter().keys() {
            let key = item.map_err(self.db_err("iterate", ""))?;
            out.push(String::from_utf8_lossy(&key).into_owned());
        }
        Ok(out)
    }

    /// Every record, in key order. A record that does not decode is an error naming it,
    /// not a silent skip.
    pub fn entries(&self) -> Result<Vec<(String, T)>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.iter() {
            let (key, bytes) = item.map_err(self.db_err("iterate", ""))?;
            let key = String::from_utf8_lossy(&key).into_owned();
            let value = self.decode(&key, &bytes)?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// Records whose key starts with `prefix`.
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, T)>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.scan_prefix(prefix) {
            let (key, bytes) = item.map_err(self.db_err("scan", prefix))?;
            let key = String::from_utf8_lossy(&key).into_owned();
            let value = self.decode(&key, &bytes)?;
            out.push((key, value));
        }
        Ok(out)
    }
}
