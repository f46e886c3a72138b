//! The graceful node shutdown's keys, as KubeletConfiguration spells them:
//! `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` (both 0 by default: off),
//! or `shutdownGracePeriodByPodPriority` (one grace period per priority floor); and
//! holdfast's `holdfast.logindConfigDir`, where the drop-in that raises logind's
//! `InhibitDelayMaxSec` goes. The system bus's address comes from
//! `DBUS_SYSTEM_BUS_ADDRESS`, as every D-Bus client takes it.

use std::path::PathBuf;
use std::time::Duration;

use serde_yaml::Value;

use super::duration::parse_duration;
use super::reader::{short, type_name, Reader};
use super::ConfigError;

/// `scheduling.DefaultPriorityWhenNoDefaultClassExists`: the floor of the group that
/// `shutdownGracePeriod` less `shutdownGracePeriodCriticalPods` is for.
pub const DEFAULT_PRIORITY: i32 = 0;
/// `scheduling.SystemCriticalPriority`: the floor of the critical pods' group.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// Where logind reads drop-ins from, as the kubelet writes its own.
pub const DEFAULT_LOGIND_CONF_DIR: &str = "/etc/systemd/logind.conf.d";
/// The longest grace period taken (a year): logind's delay is counted in microseconds.
const MAX_PERIOD_SECONDS: i64 = 365 * 24 * 3600;

/// One priority floor and the grace period of the pods from it up to the next floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityPeriod {
    pub priority: i32,
    pub seconds: i64,
}

/// The shutdown manager's settings; off when `periods` is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct ShutdownConfig {
    /// Sorted by priority, lowest first.
    pub periods: Vec<PriorityPeriod>,
    pub logind_conf_dir: PathBuf,
    pub bus_address: String,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            periods: Vec::new(),
            logind_conf_dir: PathBuf::from(DEFAULT_LOGIND_CONF_DIR),
            bus_address: system_bus_address(),
        }
    }
}

impl ShutdownConfig {
    pub fn enabled(&self) -> bool {
        !self.periods.is_empty()
    }

    /// What logind must let the shutdown wait: the sum of the groups' periods.
    pub fn requested(&self) -> Duration {
        let s: i64 = self.periods.iter().map(|p| p.seconds).sum();
        Duration::from_secs(u64::try_from(s).unwrap_or(0))
    }
}

/// The system bus: `DBUS_SYSTEM_BUS_ADDRESS`, else the well-known socket.
pub fn system_bus_address() -> String {
    std::env::var(crate::dbus::SYSTEM_BUS_ENV)
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| crate::dbus::DEFAULT_SYSTEM_BUS.into())
}

/// What the file sets of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShutdownKeys {
    pub grace_period: Option<Duration>,
    pub critical_pods: Option<Duration>,
    pub by_priority: Option<Vec<PriorityPeriod>>,
    pub logind_conf_dir: Option<PathBuf>,
}

impl ShutdownKeys {
    /// A profile's keys where the file sets none.
    pub fn or(self, profile: ShutdownKeys) -> ShutdownKeys {
        ShutdownKeys {
            grace_period: self.grace_period.or(profile.grace_period),
            critical_pods: self.critical_pods.or(profile.critical_pods),
            by_priority: self.by_priority.or(profile.by_priority),
            logind_conf_dir: self.logind_conf_dir.or(profile.logind_conf_dir),
        }
    }

    /// The settings, checked as the kubelet validates them.
    pub fn settings(&self, path: &std::path::Path) -> Result<ShutdownConfig, ConfigError> {
        let err = |key: &str, reason: &str| ConfigError::Key {
            path: path.to_path_buf(),
            key: key.into(),
            reason: reason.into(),
        };
        let grace = self.grace_period.unwrap_or_default();
        let critical = self.critical_pods.unwrap_or_default();
        if critical > grace {
            return Err(err(
                "shutdownGracePeriodCriticalPods",
                "must be <= shutdownGracePeriod",
            ));
        }
        let mut periods = match &self.by_priority {
            Some(list) if !list.is_empty() => {
                if !grace.is_zero() {
                    return Err(err(
                        "shutdownGracePeriodByPodPriority",
                        "cannot be set together with shutdownGracePeriod",
                    ));
                }
                list.clone()
            }
            // The kubelet's migrateConfig: the non-critical pods get what the critical
            // ones leave, then the critical ones theirs.
            _ if grace.is_zero() => Vec::new(),
            _ => vec![
                PriorityPeriod {
                    priority: DEFAULT_PRIORITY,
                    seconds: secs(grace - critical),
                },
                PriorityPeriod {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    seconds: secs(critical),
                },
            ],
        };
        periods.sort_by_key(|p| p.priority);
        Ok(ShutdownConfig {
            periods,
            logind_conf_dir: self
                .logind_conf_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_LOGIND_CONF_DIR)),
            bus_address: system_bus_address(),
        })
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(MAX_PERIOD_SECONDS)
}

impl Reader<'_> {
    /// Reads `key` into `out` if it is one of this module's keys; false if it is not.
    pub(super) fn shutdown_key(
        &self,
        key: &str,
        value: &Value,
        out: &mut ShutdownKeys,
    ) -> Result<bool, ConfigError> {
        match key {
            "shutdownGracePeriod" => out.grace_period = Some(self.grace(key, value)?),
            "shutdownGracePeriodCriticalPods" => {
                out.critical_pods = Some(self.grace(key, value)?);
            }
            "shutdownGracePeriodByPodPriority" => {
                out.by_priority = Some(self.by_priority(key, value)?);
            }
            "holdfast.logindConfigDir" => {
                let dir = self.path_value(key, value)?;
                if !dir.is_absolute() {
                    return Err(self.err(key, "expected an absolute path".into()));
                }
                out.logind_conf_dir = Some(dir);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A duration of zero or more, at most a year.
    fn grace(&self, key: &str, value: &Value) -> Result<Duration, ConfigError> {
        let Value::String(s) = value else {
            return Err(self.err(
                key,
                format!(
                    "expected a duration string like 30s, got {} {}",
                    type_name(value),
                    short(value)
                ),
            ));
        };
        let d = parse_duration(s)
            .map_err(|reason| self.err(key, format!("expected a duration like 30s: {reason}")))?;
        if d.as_secs() > MAX_PERIOD_SECONDS as u64 {
            return Err(self.err(key, "longer than a year".into()));
        }
        Ok(d)
    }

    fn by_priority(&self, key: &str, value: &Value) -> Result<Vec<PriorityPeriod>, ConfigError> {
        let Value::Sequence(items) = value else {
            return Err(self.err(key, format!("expected a list, got {}", short(value))));
        };
        let mut out: Vec<PriorityPeriod> = Vec::with_capacity(items.len().min(64));
        for (i, item) in items.iter().enumerate() {
            let at = format!("{key}[{i}]");
            let mut period = PriorityPeriod {
                priority: 0,
                seconds: 0,
            };
            let mut seen = (false, false);
            for (k, v) in self.mapping(&at, item)? {
                let name = self.key_name(k, "")?;
                let n = match v {
                    Value::Number(n) => n.as_i64(),
                    _ => None,
                };
                match (name.as_str(), n) {
                    ("priority", Some(n)) if i32::try_from(n).is_ok() => {
                        period.priority = n as i32;
                        seen.0 = true;
                    }
                    ("shutdownGracePeriodSeconds", Some(n))
                        if (0..=MAX_PERIOD_SECONDS).contains(&n) =>
                    {
                        period.seconds = n;
                        seen.1 = true;
                    }
                    ("priority" | "shutdownGracePeriodSeconds", _) => {
                        return Err(self.err(
                            &format!("{at}.{name}"),
                            format!("out of range: {}", short(v)),
                        ))
                    }
                    _ => return Err(self.err(&format!("{at}.{name}"), "unknown key".into())),
                }
            }
            if !(seen.0 && seen.1) {
                return Err(self.err(
                    &at,
                    "each item needs priority and shutdownGracePeriodSeconds".into(),
                ));
            }
            if out.iter().any(|p| p.priority == period.priority) {
                return Err(self.err(key, format!("priority {} twice", period.priority)));
            }
            out.push(period);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::file::parse_config;
    use super::*;

    fn settings(text: &str) -> Result<ShutdownConfig, ConfigError> {
        let path = Path::new("/etc/holdfast/config.yaml");
        let (file, warnings) = parse_config(path, text)?;
        assert!(warnings.is_empty(), "{warnings:?}");
        file.shutdown.settings(path)
    }

    #[test]
    fn off_unless_a_grace_period_is_set() {
        assert!(!settings("").expect("empty").enabled());
        assert!(!settings("shutdownGracePeriod: 0s\n")
            .expect("zero")
            .enabled());
    }

    #[test]
    fn two_periods_become_the_kubelets_two_groups() {
        let s = settings("shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n")
            .expect("valid");
        let p = |priority, seconds| PriorityPeriod { priority, seconds };
        assert_eq!(s.periods, vec![p(0, 20), p(2_000_000_000, 10)]);
        assert_eq!(s.requested(), Duration::from_secs(30));
        assert_eq!(s.logind_conf_dir, Path::new("/etc/systemd/logind.conf.d"));
    }

    #[test]
    fn by_priority_is_sorted_and_exclusive_with_the_two_periods() {
        let text = "shutdownGracePeriodByPodPriority:\n\
                    - {priority: 100000, shutdownGracePeriodSeconds: 5}\n\
                    - {priority: 0, shutdownGracePeriodSeconds: 20}\n\
                    holdfast:\n  logindConfigDir: /run/logind.conf.d\n";
        let s = settings(text).expect("valid");
        assert_eq!(
            s.periods
                .iter()
                .map(|p| (p.priority, p.seconds))
                .collect::<Vec<_>>(),
            vec![(0, 20), (100000, 5)]
        );
        assert_eq!(s.logind_conf_dir, Path::new("/run/logind.conf.d"));
        let both = format!("shutdownGracePeriod: 30s\n{text}");
        assert!(settings(&both).is_err());
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n", "shutdownGracePeriodCriticalPods"),
            ("shutdownGracePeriod: 30\n", "shutdownGracePeriod"),
            ("shutdownGracePeriod: 9000h\n", "shutdownGracePeriod"),
            ("shutdownGracePeriodByPodPriority:\n- {priority: 1}\n", "shutdownGracePeriodByPodPriority[0]"),
            ("shutdownGracePeriodByPodPriority:\n- {priority: 1, shutdownGracePeriodSeconds: -1}\n", "shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds"),
            ("shutdownGracePeriodByPodPriority:\n- {priority: 3000000000, shutdownGracePeriodSeconds: 1}\n", "shutdownGracePeriodByPodPriority[0].priority"),
            ("holdfast:\n  logindConfigDir: etc\n", "holdfast.logindConfigDir"),
        ] {
            match settings(text) {
                Err(ConfigError::Key { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
