//! Wall-clock time as Kubernetes reports it, and whether it can be believed.
//!
//! A gateway without a real-time clock boots in 1970 and jumps forward by years when NTP
//! syncs. Timers, back-off and lease schedules use [`std::time::Instant`] and never see
//! the jump; this module deals with the wall times the agent records and reports:
//!
//! - the sanity rule: a wall time before [`FLOOR`] (a date near this release) is not real;
//! - the correction: every clock reading also reads `CLOCK_BOOTTIME`, which counts from
//!   boot and does not jump, so the agent knows `wall - boottime` before the jump and
//!   after it. A time taken while the clock was not sane is moved by the difference once
//!   the clock is sane ([`correct`]);
//! - [`wire_times`], which fixes the time fields of a JSON body just before the uplink
//!   sends it: corrected where that is possible, left out otherwise, so a 1970 time never
//!   reaches the cluster as if it were real.
//!
//! What the process learned of the clock lives in one [`ClockHistory`] behind a mutex;
//! [`now`] feeds it on every reading. Pure logic takes readings as arguments, so tests
//! inject clocks.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;
pub use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// 2026-11-01T00:00:00Z: no real clock reads earlier than this. The build date would be
/// a tighter floor, but capturing it needs a build script; raise this with releases.
pub const FLOOR_UNIX: i64 = 1_793_491_200;
/// [`FLOOR_UNIX`] as people read it.
pub const FLOOR_TEXT: &str = "2026-11-01";

/// The floor as a timestamp.
pub fn floor() -> Timestamp {
    Timestamp::from_second(FLOOR_UNIX).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Whether `t` can be a real wall time: not before [`FLOOR`](FLOOR_UNIX).
pub fn is_sane(t: Timestamp) -> bool {
    t.as_second() >= FLOOR_UNIX
}

/// Now, as a Kubernetes `Time`. Also records the reading, so that a time taken now can
/// be corrected later if the clock is not sane yet.
pub fn now() -> Timestamp {
    let r = Reading::now();
    history().observe(r);
    r.wall
}

/// Whether the wall clock is sane now.
pub fn clock_is_sane() -> bool {
    is_sane(now())
}

/// `t` as a real time: itself if it is sane, moved by the clock's jump if it was taken
/// in this boot before the clock was set, or None when no real time can be given (the
/// clock is still not sane, or `t` is from a clock the agent never saw).
pub fn correct(t: Timestamp) -> Option<Timestamp> {
    if is_sane(t) {
        return Some(t);
    }
    let mut h = history();
    h.observe(Reading::now());
    h.correct(t)
}

/// RFC 3339 with nanoseconds, as CRI log lines carry it.
pub fn rfc3339_nano(t: Timestamp) -> String {
    // jiff prints up to nanosecond precision and trims trailing zeros; CRI readers accept both.
    t.to_string()
}

/// Unix seconds from outside (a certificate's notAfter, a token's expiry) as a log
/// line shows them: RFC 3339, or the number itself if no date can hold it.
pub fn show_unix(unix: i64) -> String {
    match Timestamp::from_second(unix) {
        Ok(t) => t.to_string(),
        Err(_) => format!("{unix} s after the epoch"),
    }
}

/// `t + d`, saturating at the far future rather than failing.
pub fn add(t: Timestamp, d: std::time::Duration) -> Timestamp {
    let span = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_add(span).unwrap_or(Timestamp::MAX)
}

/// One reading of the wall clock and of `CLOCK_BOOTTIME`, taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub wall: Timestamp,
    /// Time since boot, suspend included; never jumps.
    pub boot: Duration,
}

impl Reading {
    pub fn now() -> Reading {
        Reading {
            wall: Timestamp::now(),
            boot: boottime(),
        }
    }

    /// `wall - boot`: the wall time the clock would have shown at boot. Constant while
    /// nobody sets the clock; a jump of the clock moves it by the jump.
    pub fn offset(&self) -> SignedDuration {
        self.wall.as_duration().saturating_sub(signed(self.boot))
    }
}

/// `CLOCK_BOOTTIME`: time since boot, which no setting of the clock moves. It cannot
/// fail on Linux with a valid clock id; if it ever did, the monotonic clock (same
/// origin, suspend excluded) stands in.
pub fn boottime() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    let ts = clock_gettime(ClockId::CLOCK_BOOTTIME)
        .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    Duration::new(
        ts.tv_sec().max(0) as u64,
        ts.tv_nsec().clamp(0, 999_999_999) as u32,
    )
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// Boot times may differ by this much between two readings of one offset (the two
/// clocks are read one after the other, and NTP slews the wall clock a little).
const SLACK: SignedDuration = SignedDuration::from_secs(2);

/// What the process has seen of the clock: the offset (`wall - boot`) while it was not
/// sane and after it became sane.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClockHistory {
    /// The offset of the newest reading before the floor.
    insane: Option<SignedDuration>,
    /// The newest reading.
    last: Option<Reading>,
    /// Where the insane offset is kept for a later process of the same boot.
    memory: Option<Memory>,
}

/// A file that keeps the offset seen before the clock was set, with the boot it was
/// seen in.
#[derive(Debug, Clone, PartialEq)]
struct Memory {
    path: PathBuf,
    boot_id: String,
}

impl ClockHistory {
    /// Takes in a reading; logs the moments the clock is found wrong and is set.
    pub fn observe(&mut self, r: Reading) {
        let was = self.last.map(|l| is_sane(l.wall));
        if !is_sane(r.wall) {
            let offset = r.offset();
            let moved = |o: SignedDuration| o.saturating_sub(offset).unsigned_abs();
            if self.insane.is_none_or(|o| moved(o) > SLACK.unsigned_abs()) {
                if self.insane.is_some() {
                    log::warn!(
                        "wall clock set to {}, still before {FLOOR_TEXT}: times taken \
                         before this may not be correctable",
                        r.wall
                    );
                }
                self.insane = Some(offset);
                self.save();
            }
            if was != Some(false) {
                log::warn!(
                    "wall clock reads {}, before {FLOOR_TEXT}: it is not set; times taken \
                     now are held back from the cluster until it is",
                    r.wall
                );
            }
        } else if was == Some(false) {
            if let Some(insane) = self.insane {
                log::info!(
                    "wall clock set: now {}, a jump of {}s; times taken before are moved by it",
                    r.wall,
                    r.offset().saturating_sub(insane).as_secs()
                );
            }
        }
        self.last = Some(r);
    }

    /// Keeps the offset seen before the clock was set in `path` from now on, and takes
    /// the one kept there if an earlier process of this boot (`boot_id`) saw the clock
    /// unset: an agent restarted after NTP set the clock can still correct the times
    /// its store holds from before. A file from another boot, or one that cannot be
    /// read, is ignored.
    pub fn remember_in(&mut self, path: &Path, boot_id: &str) {
        match std::fs::read_to_string(path) {
            Ok(text) => match parse_memory(&text) {
                Some((id, offset)) if id == boot_id => {
                    if self.insane.is_none() {
                        self.insane = Some(offset);
                    }
                }
                Some(_) => {}
                None => log::warn!(
                    "{}: not a clock record; ignored (it is rewritten when needed)",
                    path.display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("read {}: {e}; ignored", path.display()),
        }
        self.memory = Some(Memory {
            path: path.to_path_buf(),
            boot_id: boot_id.to_string(),
        });
        self.save();
    }

    /// Writes the insane offset when there is one and a place for it. Rare: once per
    /// setting of the clock before the floor, so it costs the flash nothing to speak of.
    fn save(&self) {
        let (Some(m), Some(offset)) = (&self.memory, self.insane) else {
            return;
        };
        let text = format!("{} {}\n", m.boot_id, offset.as_nanos());
        if std::fs::read_to_string(&m.path).is_ok_and(|old| old == text) {
            return;
        }
        let tmp = m.path.with_extension("tmp");
        let written = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &m.path));
        if let Err(e) = written {
            log::warn!("write {}: {e}", m.path.display());
        }
    }

    /// `t` as a real time, if that can be known (see [`correct`]).
    pub fn correct(&self, t: Timestamp) -> Option<Timestamp> {
        if is_sane(t) {
            return Some(t);
        }
        let last = self.last?;
        if !is_sane(last.wall) {
            return None;
        }
        let insane = self.insane?;
        // When, in boot time, was `t` taken if the clock then had the offset the agent
        // saw? Before boot, or after the newest reading, means it was not: `t` is from
        // another boot or another wrong setting of the clock.
        let boot_at = t.as_duration().checked_sub(insane)?;
        if boot_at < -SLACK || boot_at > signed(last.boot).saturating_add(SLACK) {
            return None;
        }
        let real = t.checked_add(last.offset().checked_sub(insane)?).ok()?;
        is_sane(real).then_some(real)
    }
}

fn parse_memory(text: &str) -> Option<(&str, SignedDuration)> {
    let mut parts = text.split_whitespace();
    let id = parts.next()?;
    let nanos: i128 = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    let secs = i64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = i32::try_from(nanos % 1_000_000_000).ok()?;
    // An offset is a wall time less a time since boot: one beyond the range of wall
    // times is not a record this agent wrote, and its arithmetic would overflow.
    let reach = Timestamp::MAX.as_second();
    if !(-reach..=reach).contains(&secs) {
        return None;
    }
    Some((id, SignedDuration::new(secs, sub)))
}

/// This boot's id, from the kernel.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Keeps what this process learns of the clock in `path` (under the agent's root dir)
/// and takes what an earlier agent of this boot kept there; see
/// [`ClockHistory::remember_in`].
pub fn remember_in(path: &Path) {
    let Some(id) = boot_id() else {
        log::warn!("no boot id: times taken before the clock was set are corrected only by the agent that took them");
        return;
    };
    let mut h = history();
    h.observe(Reading::now());
    h.remember_in(path, &id);
}

static HISTORY: Mutex<ClockHistory> = Mutex::new(ClockHistory {
    insane: None,
    last: None,
    memory: None,
});

fn history() -> std::sync::MutexGuard<'static, ClockHistory> {
    // Every update leaves a consistent history: a panic elsewhere does not spoil it.
    HISTORY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keys whose string values are Kubernetes `Time` or `MicroTime` in the objects the
/// uplink sends: object metadata, pod and container status, node conditions, the
/// Lease, Events.
const TIME_KEYS: &[&str] = &[
    "creationTimestamp",
    "deletionTimestamp",
    "startTime",
    "startedAt",
    "finishedAt",
    "lastProbeTime",
    "lastTransitionTime",
    "lastHeartbeatTime",
    "acquireTime",
    "renewTime",
    "firstTimestamp",
    "lastTimestamp",
    "eventTime",
    "lastObservedTime",
];

/// Annotations whose values are times (the kubelet's `config.seen` on mirror pods).
const TIME_ANNOTATIONS: &[&str] = &["kubernetes.io/config.seen"];

/// What [`wire_times`] did to a body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireTimes {
    /// Times taken before the clock was set, moved to the real time.
    pub corrected: usize,
    /// Times that could not be made real, left out of the body.
    pub omitted: usize,
}

/// Fixes the time fields of a body about to go to the apiserver, with the process's
/// clock history: see [`wire_times_with`].
pub fn wire_times(body: &mut Value) -> WireTimes {
    let mut h = history();
    h.observe(Reading::now());
    wire_times_with(&h, body)
}

/// Every time field in `body` before the floor is corrected, or removed when it cannot
/// be. Removing is what the API allows everywhere the agent sends times: they are all
/// optional, and in a strategic-merge patch a missing field leaves the server's value
/// as it was, while `null` would delete it. Labels and annotations other than the
/// known time annotations are user data and left alone.
pub fn wire_times_with(history: &ClockHistory, body: &mut Value) -> WireTimes {
    let mut done = WireTimes::default();
    walk(history, body, &mut done);
    done
}

fn walk(h: &ClockHistory, v: &mut Value, done: &mut WireTimes) {
    match v {
        Value::Array(items) => {
            for item in items {
                walk(h, item, done);
            }
        }
        Value::Object(map) => {
            let mut remove = Vec::new();
            for (key, value) in map.iter_mut() {
                match key.as_str() {
                    k if TIME_KEYS.contains(&k) => {
                        if !fix(h, value, done) {
                            remove.push(key.clone());
                        }
                    }
                    "annotations" => {
                        if let Value::Object(a) = value {
                            let mut gone = Vec::new();
                            for (k, val) in a.iter_mut() {
                                if TIME_ANNOTATIONS.contains(&k.as_str()) && !fix(h, val, done) {
                                    gone.push(k.clone());
                                }
                            }
                            for k in gone {
                                a.remove(&k);
                            }
                        }
                    }
                    "labels" => {}
                    _ => walk(h, value, done),
                }
            }
            for key in remove {
                map.remove(&key);
            }
        }
        _ => {}
    }
}

/// Fixes one time value in place; false when it must be removed.
fn fix(h: &ClockHistory, v: &mut Value, done: &mut WireTimes) -> bool {
    let Value::String(text) = v else {
        return true;
    };
    let Ok(t) = text.parse::<Timestamp>() else {
        return true;
    };
    if is_sane(t) {
        return true;
    }
    match h.correct(t) {
        Some(real) => {
            *text = wire_format(real, text.contains('.'));
            done.corrected += 1;
            true
        }
        None => {
            done.omitted += 1;
            false
        }
    }
}

/// `Time` on the wire is whole seconds; `MicroTime` (and the annotation) has fractions.
fn wire_format(t: Timestamp, fraction: bool) -> String {
    if fraction {
        let micros = Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t);
        micros.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
    } else {
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

/// A year: how far ahead [`instant_after`] places what the monotonic clock cannot hold.
pub const FAR: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// `t + d` on the monotonic clock. Durations from outside (a spec's seconds, the config
/// file's back-off) may be past what the clock holds; then a year on stands in, rather
/// than the panic of `+`.
pub fn instant_after(t: tokio::time::Instant, d: std::time::Duration) -> tokio::time::Instant {
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BOOT_AT: i64 = 1_795_000_000; // 2026-11-18, when the board booted for real

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("ts")
    }

    /// A board that boots with its clock at 0 and reads it `boot` seconds after boot.
    fn at_1970(boot: u64) -> Reading {
        Reading {
            wall: ts(boot as i64),
            boot: Duration::from_secs(boot),
        }
    }

    /// The same board after NTP set its clock: the real time `boot` seconds after boot.
    fn set(boot: u64) -> Reading {
        Reading {
            wall: ts(BOOT_AT + boot as i64),
            boot: Duration::from_secs(boot),
        }
    }

    #[test]
    fn the_floor_separates_sane_from_not() {
        assert!(!is_sane(Timestamp::UNIX_EPOCH));
        assert!(!is_sane(ts(FLOOR_UNIX - 1)));
        assert!(is_sane(ts(FLOOR_UNIX)));
        assert!(is_sane(ts(BOOT_AT)));
        assert_eq!(floor().to_string(), format!("{FLOOR_TEXT}T00:00:00Z"));
    }

    #[test]
    fn a_time_from_before_the_jump_moves_by_the_jump() {
        let mut h = ClockHistory::default();
        h.observe(at_1970(30));
        let crashed = ts(95); // a container exit, 95 s after boot
        h.observe(at_1970(120));
        assert_eq!(
            h.correct(crashed),
            None,
            "no real time before the clock is set"
        );
        h.observe(set(400));
        assert_eq!(h.correct(crashed), Some(ts(BOOT_AT + 95)));
        // Sane times pass as they are.
        assert_eq!(h.correct(ts(BOOT_AT + 500)), Some(ts(BOOT_AT + 500)));
    }

    #[test]
    fn a_clock_set_to_another_wrong_time_first_still_corrects() {
        // fake-hwclock style: the clock comes up at the last shutdown's time, 1971.
        let shut = 31_000_000;
        let mut h = ClockHistory::default();
        h.observe(Reading {
            wall: ts(shut + 10),
            boot: Duration::from_secs(10),
        });
        h.observe(set(60));
        assert_eq!(h.correct(ts(shut + 42)), Some(ts(BOOT_AT + 42)));
    }

    #[test]
    fn times_that_cannot_be_from_this_boot_are_not_corrected() {
        let mut h = ClockHistory::default();
        h.observe(at_1970(100));
        h.observe(set(200));
        // Taken "after" the newest reading: another boot, or a wrong clock the agent
        // never saw.
        assert_eq!(h.correct(ts(5_000)), None);
        // Before boot.
        assert_eq!(h.correct(ts(-50)), None);
        // A process that never saw the clock wrong cannot correct.
        let mut fresh = ClockHistory::default();
        fresh.observe(set(300));
        assert_eq!(fresh.correct(ts(100)), None);
    }

    #[test]
    fn a_clock_that_goes_wrong_again_stops_correction() {
        let mut h = ClockHistory::default();
        h.observe(at_1970(10));
        h.observe(set(20));
        assert!(h.correct(ts(5)).is_some());
        h.observe(at_1970(30));
        assert_eq!(h.correct(ts(5)), None);
    }

    #[test]
    fn readings_of_one_offset_do_not_count_as_a_jump() {
        let mut h = ClockHistory::default();
        h.observe(at_1970(10));
        // Read a millisecond apart: wall and boot disagree by a hair.
        h.observe(Reading {
            wall: ts(11),
            boot: Duration::from_millis(11_001),
        });
        h.observe(set(20));
        assert_eq!(h.correct(ts(10)), Some(ts(BOOT_AT + 10)));
    }

    #[test]
    fn a_later_process_of_the_same_boot_corrects_with_the_kept_offset() {
        let dir = crate::testutil::TempDir::new("clock-memory");
        let path = dir.0.join("clock");
        let mut first = ClockHistory::default();
        first.remember_in(&path, "boot-a");
        assert!(!path.exists(), "nothing to keep while the clock looks set");
        first.observe(at_1970(30));
        let exited = ts(42);
        // The agent dies; NTP sets the clock; a new agent starts.
        let mut second = ClockHistory::default();
        second.observe(set(100));
        assert_eq!(second.correct(exited), None);
        second.remember_in(&path, "boot-a");
        assert_eq!(second.correct(exited), Some(ts(BOOT_AT + 42)));
        // After a reboot the kept offset means nothing.
        let mut rebooted = ClockHistory::default();
        rebooted.observe(set(100));
        rebooted.remember_in(&path, "boot-b");
        assert_eq!(rebooted.correct(exited), None);
        // A damaged file is ignored, and rewritten once there is something to keep.
        std::fs::write(&path, "garbage").expect("write");
        let mut third = ClockHistory::default();
        third.remember_in(&path, "boot-c");
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some("garbage")
        );
        third.observe(at_1970(5));
        let kept = std::fs::read_to_string(&path).expect("kept");
        assert!(kept.starts_with("boot-c "), "{kept}");
    }

    #[test]
    fn a_kept_offset_out_of_any_clock_s_range_is_ignored() {
        let dir = crate::testutil::TempDir::new("clock-memory-hostile");
        let path = dir.0.join("clock");
        for nanos in [
            i128::from(i64::MIN) * 1_000_000_000,
            -(1i128 << 100),
            i128::MAX,
        ] {
            std::fs::write(&path, format!("boot-a {nanos}\n")).expect("write");
            let mut h = ClockHistory::default();
            h.remember_in(&path, "boot-a");
            assert_eq!(h.insane, None, "{nanos}");
            // The arithmetic on readings and times must not overflow either way.
            h.observe(at_1970(5));
            h.observe(set(100));
            assert_eq!(h.correct(Timestamp::MIN), None);
        }
        // The largest offset a clock can show is still taken, and nothing overflows.
        let reach = i128::from(Timestamp::MAX.as_second()) * 1_000_000_000;
        std::fs::write(&path, format!("boot-a -{reach}\n")).expect("write");
        let mut h = ClockHistory::default();
        h.remember_in(&path, "boot-a");
        assert!(h.insane.is_some());
        h.observe(at_1970(5));
        h.observe(set(100));
        assert_eq!(h.correct(Timestamp::MIN), None);
        assert_eq!(h.correct(Timestamp::MAX), Some(Timestamp::MAX));
    }

    fn history_after_jump() -> ClockHistory {
        let mut h = ClockHistory::default();
        h.observe(at_1970(50));
        h.observe(set(1_000));
        h
    }

    #[test]
    fn wire_times_correct_status_fields() {
        let mut body = json!({
            "metadata": {"uid": "u1"},
            "status": {
                "startTime": "1970-01-01T00:00:07Z",
                "conditions": [
                    {"type": "Ready", "lastProbeTime": null, "lastTransitionTime": "1970-01-01T00:00:09Z"}
                ],
                "containerStatuses": [{
                    "name": "app",
                    "state": {"terminated": {"exitCode": 1, "startedAt": "1970-01-01T00:00:08Z", "finishedAt": "1970-01-01T00:00:40Z"}},
                    "lastState": {}
                }]
            }
        });
        let done = wire_times_with(&history_after_jump(), &mut body);
        assert_eq!(
            done,
            WireTimes {
                corrected: 4,
                omitted: 0
            }
        );
        let real = |s: i64| ts(BOOT_AT + s).strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        assert_eq!(body["status"]["startTime"], real(7));
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            real(9)
        );
        assert_eq!(
            body["status"]["conditions"][0]["lastProbeTime"],
            Value::Null
        );
        let term = &body["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(term["startedAt"], real(8));
        assert_eq!(term["finishedAt"], real(40));
        assert_eq!(term["exitCode"], 1);
    }

    #[test]
    fn wire_times_keep_micro_time_precision() {
        let mut body =
            json!({"spec": {"renewTime": "1970-01-01T00:00:30.250000Z", "holderIdentity": "n"}});
        wire_times_with(&history_after_jump(), &mut body);
        let want = Timestamp::from_millisecond((BOOT_AT + 30) * 1000 + 250).expect("ts");
        assert_eq!(
            body["spec"]["renewTime"],
            want.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
        );
        assert!(body["spec"]["renewTime"]
            .as_str()
            .is_some_and(|s| s.ends_with(".250000Z")));
    }

    #[test]
    fn wire_times_leave_out_what_cannot_be_made_real() {
        let mut h = ClockHistory::default();
        h.observe(at_1970(50)); // not set yet
        let mut body = json!({
            "firstTimestamp": "1970-01-01T00:00:20Z",
            "lastTimestamp": "1970-01-01T00:00:20Z",
            "reason": "Started",
            "metadata": {
                "name": "web.1",
                "annotations": {"kubernetes.io/config.seen": "1970-01-01T00:00:10.5Z", "note": "1970-01-01T00:00:10Z"},
                "labels": {"startedAt": "x"}
            }
        });
        let done = wire_times_with(&h, &mut body);
        assert_eq!(
            done,
            WireTimes {
                corrected: 0,
                omitted: 3
            }
        );
        assert_eq!(
            body,
            json!({
                "reason": "Started",
                "metadata": {
                    "name": "web.1",
                    "annotations": {"note": "1970-01-01T00:00:10Z"},
                    "labels": {"startedAt": "x"}
                }
            })
        );
    }

    #[test]
    fn wire_times_pass_sane_bodies_untouched() {
        let mut body = json!({
            "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "2026-11-23T10:00:00Z"}]},
            "startedAt": "not a time",
            "renewTime": 5
        });
        let before = body.clone();
        let done = wire_times_with(&ClockHistory::default(), &mut body);
        assert_eq!(done, WireTimes::default());
        assert_eq!(body, before);
    }

    #[test]
    fn the_process_clock_reads_boottime() {
        let a = Reading::now();
        let b = Reading::now();
        assert!(b.boot >= a.boot);
        assert!(a.boot > Duration::ZERO);
        // On this machine the clock is set: nothing to correct.
        if is_sane(a.wall) {
            assert_eq!(correct(a.wall), Some(a.wall));
        }
    }
}
