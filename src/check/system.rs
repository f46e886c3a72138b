//! System checks that never fail the report: free space under the root dir, and a clock
//! that can be trusted with TLS certificates.

use super::{Facts, Item, Status};
// A clock before the floor is certainly wrong; the agent holds back times taken before it.
use crate::time::{FLOOR_TEXT as CLOCK_FLOOR_TEXT, FLOOR_UNIX as CLOCK_FLOOR_UNIX};

/// Below this, an image pull or a day of logs can fill the disk.
const MIN_FREE_BYTES: u64 = 500 * 1024 * 1024;
const MIN_FREE_INODES_PERCENT: u64 = 5;

pub fn checks(f: &Facts, required: &mut Vec<Item>) {
    match &f.disk {
        Some(Ok(d)) => {
            let path = d.path.display();
            let status = if d.free_bytes < MIN_FREE_BYTES {
                Status::Warn
            } else {
                Status::Ok
            };
            let mut detail = format!("{} free under {path}", human(d.free_bytes));
            if status == Status::Warn {
                detail.push_str(&format!(
                    ", below {}: images and logs need room",
                    human(MIN_FREE_BYTES)
                ));
            }
            required.push(Item::new("disk space", status, detail));
            required.push(inodes(d.free_inodes, d.total_inodes, &path.to_string()));
            required.push(kept(d.in_memory, &path.to_string()));
        }
        Some(Err(e)) => required.push(Item::new("disk space", Status::Warn, e.clone())),
        None => required.push(Item::new("disk space", Status::Warn, "not measured")),
    }
    required.push(clock(f));
}

/// Whether the store outlives a power cut: not on a filesystem in memory (a read-only
/// rootfs binds /var/lib to a tmpfs unless a partition is mounted there).
fn kept(in_memory: bool, path: &str) -> Item {
    if in_memory {
        Item::new(
            "state kept across power cuts",
            Status::Warn,
            format!(
                "{path} is in memory (tmpfs): a reboot or power cut loses every pod's state; \
                 mount a persistent partition there (docs/boards.md, read-only root filesystems)"
            ),
        )
    } else {
        Item::new(
            "state kept across power cuts",
            Status::Ok,
            format!("{path} is on a persistent filesystem"),
        )
    }
}

fn inodes(free: u64, total: u64, path: &str) -> Item {
    if total == 0 {
        return Item::new(
            "free inodes",
            Status::Ok,
            format!("the filesystem under {path} has no fixed inode count"),
        );
    }
    let percent = free.saturating_mul(100) / total;
    if percent < MIN_FREE_INODES_PERCENT {
        Item::new(
            "free inodes",
            Status::Warn,
            format!(
                "{percent}% free under {path}, below {MIN_FREE_INODES_PERCENT}%: \
                 unpacked layers use many small files"
            ),
        )
    } else {
        Item::new(
            "free inodes",
            Status::Ok,
            format!("{percent}% free under {path}"),
        )
    }
}

fn clock(f: &Facts) -> Item {
    let Some(now) = f.now else {
        return Item::new("clock", Status::Warn, "not read");
    };
    let shown = now.strftime("%Y-%m-%d %H:%M:%S UTC");
    if now.as_second() >= CLOCK_FLOOR_UNIX {
        Item::new("clock", Status::Ok, shown.to_string())
    } else {
        Item::new(
            "clock",
            Status::Warn,
            format!(
                "{shown} is before {CLOCK_FLOOR_TEXT}: certificates will look invalid; \
                 without a real-time clock, start holdfast after NTP has synced \
                 (systemd-time-wait-sync)"
            ),
        )
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::super::facts::Disk;
    use super::*;
    use crate::time::Timestamp;

    fn items(f: &Facts) -> Vec<Item> {
        let mut v = Vec::new();
        checks(f, &mut v);
        v
    }

    #[test]
    fn low_disk_state_in_memory_and_old_clock_warn() {
        let f = Facts {
            disk: Some(Ok(Disk {
                path: "/var/lib".into(),
                free_bytes: 100 * 1024 * 1024,
                free_inodes: 10,
                total_inodes: 1000,
                in_memory: true,
            })),
            now: Timestamp::from_second(1_704_067_200).ok(),
            ..Facts::default()
        };
        let v = items(&f);
        assert!(v.iter().all(|i| i.status == Status::Warn), "{v:?}");
        assert!(v[0].detail.contains("100.0 MiB"), "{}", v[0].detail);
        assert!(v[1].detail.contains("1%"), "{}", v[1].detail);
        assert!(v[2].detail.contains("in memory (tmpfs)"), "{}", v[2].detail);
        assert!(v[3].detail.contains("2024-01-01"), "{}", v[3].detail);
    }

    #[test]
    fn plenty_of_room_and_a_good_clock() {
        let f = Facts {
            disk: Some(Ok(Disk {
                path: "/".into(),
                free_bytes: 8 * 1024 * 1024 * 1024,
                free_inodes: 500,
                total_inodes: 1000,
                in_memory: false,
            })),
            now: Timestamp::from_second(CLOCK_FLOOR_UNIX + 86_400).ok(),
            ..Facts::default()
        };
        let v = items(&f);
        assert!(v.iter().all(|i| i.status == Status::Ok), "{v:?}");
        assert!(v[0].detail.starts_with("8.0 GiB"), "{}", v[0].detail);
    }
}
