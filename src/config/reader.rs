//! The config file's reading vocabulary: a `Reader` that names the file and key in every
//! error, and reads one value as a string, path, duration, quantity or count. The leaf
//! under the file's sections (`file`, `images`, `pods`, `server`, `cluster`): they read
//! with it; it knows none of them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::{Mapping, Value};

use super::duration::parse_duration;
use super::ConfigError;
use crate::quantity::parse_bytes as parse_quantity;

pub(super) struct Reader<'a> {
    pub(super) path: &'a Path,
    pub(super) prefix: &'a str,
}

impl Reader<'_> {
    pub(super) fn err(&self, key: &str, reason: String) -> ConfigError {
        ConfigError::Key {
            path: self.path.to_path_buf(),
            key: format!("{}{key}", self.prefix),
            reason,
        }
    }

    /// `value` as a mapping, or an error naming `key`.
    pub(super) fn mapping<'v>(
        &self,
        key: &str,
        value: &'v Value,
    ) -> Result<&'v Mapping, ConfigError> {
        match value {
            Value::Mapping(m) => Ok(m),
            other => Err(self.err(
                key,
                format!(
                    "expected a mapping, got {} {}",
                    type_name(other),
                    short(other)
                ),
            )),
        }
    }

    pub(super) fn unknown(&self, key: &str) -> String {
        format!(
            "config file {}: unknown key {}{key} ignored",
            self.path.display(),
            self.prefix
        )
    }

    pub(super) fn key_name(&self, key: &Value, prefix: &str) -> Result<String, ConfigError> {
        match key {
            Value::String(s) => Ok(format!("{prefix}{s}")),
            other => Err(ConfigError::File {
                path: self.path.to_path_buf(),
                reason: format!(
                    "keys must be strings, found {} key {}",
                    type_name(other),
                    short(other)
                ),
            }),
        }
    }

    pub(super) fn string(&self, key: &str, value: &Value) -> Result<String, ConfigError> {
        match value {
            Value::String(s) => Ok(s.clone()),
            other => Err(self.err(
                key,
                format!(
                    "expected a string, got {} {}",
                    type_name(other),
                    short(other)
                ),
            )),
        }
    }

    pub(super) fn path_value(&self, key: &str, value: &Value) -> Result<PathBuf, ConfigError> {
        let s = self.string(key, value)?;
        if s.is_empty() {
            return Err(self.err(key, "expected a path, got an empty string".into()));
        }
        Ok(PathBuf::from(s))
    }

    pub(super) fn positive_duration(
        &self,
        key: &str,
        value: &Value,
    ) -> Result<Duration, ConfigError> {
        let d = self.duration_or_zero(key, value)?;
        if d.is_zero() {
            return Err(self.err(key, "must be greater than zero".into()));
        }
        Ok(d)
    }

    /// A duration where zero means off.
    pub(super) fn duration_or_zero(
        &self,
        key: &str,
        value: &Value,
    ) -> Result<Duration, ConfigError> {
        let s = match value {
            Value::String(s) => s,
            other => {
                return Err(self.err(
                    key,
                    format!(
                        "expected a duration string like 20s or 1m30s, got {} {}",
                        type_name(other),
                        short(other)
                    ),
                ))
            }
        };
        parse_duration(s).map_err(|reason| {
            self.err(
                key,
                format!("expected a duration like 20s or 1m30s: {reason}"),
            )
        })
    }

    pub(super) fn quantity(&self, key: &str, value: &Value) -> Result<u64, ConfigError> {
        let bytes = match value {
            Value::String(s) => parse_quantity(s).map_err(|reason| {
                self.err(key, format!("expected a quantity like 10Mi: {reason}"))
            })?,
            Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| self.err(key, format!("expected a quantity like 10Mi, got {n}")))?,
            other => {
                return Err(self.err(
                    key,
                    format!(
                        "expected a quantity like 10Mi, got {} {}",
                        type_name(other),
                        short(other)
                    ),
                ))
            }
        };
        if bytes == 0 {
            return Err(self.err(key, "must be greater than zero".into()));
        }
        Ok(bytes)
    }

    pub(super) fn log_max_files(&self, key: &str, value: &Value) -> Result<u32, ConfigError> {
        let n = match value {
            Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        };
        match n {
            Some(n) if n >= 2 => Ok(n),
            _ => Err(self.err(
                key,
                format!("expected an integer of at least 2, got {}", short(value)),
            )),
        }
    }
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "list",
        Value::Mapping(_) => "mapping",
        Value::Tagged(_) => "tagged value",
    }
}

/// A short rendering of a value for an error message; values can be whole subtrees.
pub(super) fn short(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) => "[...]".into(),
        Value::Mapping(_) => "{...}".into(),
        Value::Tagged(t) => format!("!{}", t.tag),
    }
}
