//! A sled tree whose values are one serde type, stored as JSON.

use std::marker::PhantomData;

use super::pending::Op;
use super::{Store, StoreError};

/// A typed view of one tree of the store.
pub struct Tree<T> {
    name: &'static str,
    store: Store,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for Tree<T> {
    fn clone(&self) -> Self {
        Tree {
            name: self.name,
            store: self.store.clone(),
            _value: PhantomData,
        }
    }
}

impl<T> Tree<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    pub(super) fn new(name: &'static str, store: Store) -> Self {
        Tree {
            name,
            store,
            _value: PhantomData,
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

    /// The tree's name in the store.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The store this tree is part of.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn get(&self, key: &str) -> Result<Option<T>, StoreError> {
        match self.store.get_raw(self.name, key)? {
            Some(bytes) => Ok(Some(self.decode(key, &bytes)?)),
            None => Ok(None),
        }
    }

    /// Writes `value` under `key` unless the stored bytes are already the same, so a
    /// periodic resync that finds nothing changed writes nothing to flash. Returns
    /// whether anything was written.
    pub fn put(&self, key: &str, value: &T) -> Result<bool, StoreError> {
        let bytes = self.encode(key, value)?;
        if self.store.get_raw(self.name, key)?.as_deref() == Some(bytes.as_slice()) {
            return Ok(false);
        }
        self.store.write(vec![Op {
            tree: self.name,
            key: key.to_string(),
            value: Some(bytes),
        }])?;
        Ok(true)
    }

    /// Removes `key`, returning what it held; an absent key writes nothing.
    pub fn remove(&self, key: &str) -> Result<Option<T>, StoreError> {
        let Some(old) = self.store.get_raw(self.name, key)? else {
            return Ok(None);
        };
        self.store.write(vec![Op {
            tree: self.name,
            key: key.to_string(),
            value: None,
        }])?;
        Ok(Some(self.decode(key, &old)?))
    }

    /// Every key, in order.
    pub fn keys(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .store
            .scan_raw(self.name, "")?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Every record, in key order. A record that does not decode is an error naming it,
    /// not a silent skip.
    pub fn entries(&self) -> Result<Vec<(String, T)>, StoreError> {
        self.scan_prefix("")
    }

    /// Records whose key starts with `prefix`.
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, T)>, StoreError> {
        self.store
            .scan_raw(self.name, prefix)?
            .into_iter()
            .map(|(key, bytes)| {
                let value = self.decode(&key, &bytes)?;
                Ok((key, value))
            })
            .collect()
    }
}
