//! sync::worker::termination: the message a finished container's status carries, as
//! the kubelet makes it: what the container left at its `terminationMessagePath`, or,
//! with `terminationMessagePolicy: FallbackToLogsOnError` and nothing there, when it
//! failed, the end of its log (its last 80 lines, at most 2 KiB of them); after what
//! holdfast itself has to say of the end (a start error, why it was killed), `: `
//! between.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;

use super::super::record::Terminated;
use super::{blocking, Worker};
use crate::runtime::log_read::{self, LogOptions};
use crate::runtime::ExitInfo;

/// The kubelet's MaxContainerTerminationMessageLogLines and ...LogLength.
const LOG_LINES: u64 = 80;
const LOG_BYTES: usize = 2048;

impl Worker {
    /// Adds to `t` the message of instance `restart` of container `name`, which ended
    /// as `exit` says.
    pub(super) async fn add_termination_message(
        &self,
        name: &str,
        restart: u32,
        exit: &ExitInfo,
        t: &mut Terminated,
    ) {
        let Some(c) = self.container_spec(name) else {
            return;
        };
        let log = self.log_dir().join(name).join(format!("{restart}.log"));
        let message = match exit.termination_message.clone() {
            Some(m) => Some(m),
            None if falls_back(&c, exit) => blocking(move || last_output(log)).await,
            None => None,
        };
        if let Some(m) = message.filter(|m| !m.is_empty()) {
            t.message = Some(match t.message.take().filter(|s| !s.is_empty()) {
                Some(ours) => format!("{ours}: {m}"),
                None => m,
            });
        }
    }
}

/// Whether the log stands in for an empty message: the policy says so and the
/// container ran and failed.
fn falls_back(c: &Container, exit: &ExitInfo) -> bool {
    c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
        && exit.exit_code != 0
        && exit.start_error.is_none()
}

/// The container's last output: its last [`LOG_LINES`] lines, the last [`LOG_BYTES`]
/// of them.
fn last_output(log: PathBuf) -> Option<String> {
    let opts = LogOptions {
        tail_lines: Some(LOG_LINES),
        ..LogOptions::default()
    };
    let mut out: Vec<u8> = Vec::new();
    if let Err(e) = log_read::stream(&log, &opts, None, &|_| false, &mut out) {
        log::debug!("termination message from {}: {e}", log.display());
        return None;
    }
    let from = out.len().saturating_sub(LOG_BYTES);
    (from < out.len()).then(|| String::from_utf8_lossy(&out[from..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32, start_error: Option<&str>) -> ExitInfo {
        ExitInfo {
            exit_code: code,
            signal: None,
            oom_killed: false,
            started_at: None,
            finished_at: crate::time::now(),
            start_error: start_error.map(str::to_string),
            termination_message: None,
        }
    }

    fn container(policy: &str) -> Container {
        Container {
            name: "c".into(),
            termination_message_policy: Some(policy.into()),
            ..Container::default()
        }
    }

    #[test]
    fn the_log_stands_in_only_for_a_failed_run_under_its_policy() {
        let fallback = container("FallbackToLogsOnError");
        assert!(falls_back(&fallback, &exit(1, None)));
        assert!(!falls_back(&fallback, &exit(0, None)));
        assert!(!falls_back(&fallback, &exit(128, Some("exec: not found"))));
        assert!(!falls_back(&container("File"), &exit(1, None)));
    }

    #[test]
    fn the_last_lines_of_the_log_at_most_2_kib() {
        let dir = crate::testutil::TempDir::new("termination-log");
        let log = dir.0.join("0.log");
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!(
                "2026-12-02T13:00:00.000000000Z stdout F line {i}\n"
            ));
        }
        text.push_str("2026-12-02T13:00:00.000000000Z stderr P no newl\n");
        text.push_str("2026-12-02T13:00:00.000000000Z stderr F ine\n");
        std::fs::write(&log, &text).expect("log");
        let got = last_output(log.clone()).expect("output");
        assert!(got.ends_with("line 98\nline 99\nno newline\n"), "{got}");
        assert!(
            got.lines().count() <= 80 && !got.contains("line 19\n"),
            "{got}"
        );
        let mut long = String::new();
        for _ in 0..10 {
            long.push_str(&format!(
                "2026-12-02T13:00:00.000000000Z stdout F {}\n",
                "y".repeat(1000)
            ));
        }
        std::fs::write(&log, &long).expect("log");
        let got = last_output(log.clone()).expect("output");
        assert_eq!(got.len(), LOG_BYTES);
        assert!(last_output(dir.0.join("none.log")).is_none());
    }
}
