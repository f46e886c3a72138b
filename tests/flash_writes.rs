//! What a pod costs the flash: the agent's root dir on a loop-mounted ext4 (data=ordered,
//! the default 5 s commit, as on a device), 20 static pods started and stopped one
//! after another, and the bytes the kernel wrote to the loop device meanwhile, journal
//! included, divided by the pods. A measurement, not a check: it prints the figure
//! (run with `--ignored --nocapture`, as root).

use support::loopfs;

use std::time::Duration;

use loopfs::LoopFs;
use support::agent::{need_root, sh_pod, Agent};

const PODS: usize = 20;

#[test]
#[ignore]
fn bytes_written_per_pod() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("flash-writes");
    let image = a.dir.join("busybox.tar");
    std::fs::rename(a.root.join("images/busybox.tar"), &image).expect("keep the image");
    let fs = LoopFs::mount(&a.root, 512).expect("loop filesystem");
    std::fs::create_dir_all(a.root.join("images")).expect("images dir");
    std::fs::copy(&image, a.root.join("images/busybox.tar")).expect("image");
    // HOLDFAST_FLASH_TMPFS=containers,logs,...: those dirs of the root on a tmpfs each,
    // for attribution (what is left is what the rest costs).
    let tmpfs: Vec<std::path::PathBuf> = std::env::var("HOLDFAST_FLASH_TMPFS")
        .unwrap_or_default()
        .split(',')
        .filter(|d| !d.is_empty() && !d.contains('/') && *d != "..")
        .map(|d| {
            let dir = a.root.join(d);
            std::fs::create_dir_all(&dir).expect("tmpfs mount point");
            nix::mount::mount(
                Some("tmpfs"),
                &dir,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some("mode=0700"),
            )
            .expect("mount tmpfs");
            dir
        })
        .collect();
    a.start();
    // One pod first, so that the image is unpacked and the store's trees exist: what
    // follows is what every further pod costs.
    cycle(&a, "warm");
    settle();
    let pods = std::env::var("HOLDFAST_FLASH_PODS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=1000).contains(n))
        .unwrap_or(PODS);
    // HOLDFAST_FLASH_STRACE=<file>: the agent and its shims' syncs, renames and writes
    // logged by strace (with the files) over the measured window, for attribution.
    let strace = std::env::var_os("HOLDFAST_FLASH_STRACE").map(|out| {
        let pid = a.pid().expect("agent pid");
        let child = std::process::Command::new("strace")
            .args(["-f", "-y", "-qq", "-e"])
            .arg("trace=fsync,fdatasync,rename,renameat2,pwrite64,fallocate")
            .arg("-o")
            .arg(out)
            .arg("-p")
            .arg(pid.to_string())
            .spawn()
            .expect("spawn strace");
        // strace attaches before its first report; the window starts after that.
        std::thread::sleep(Duration::from_secs(1));
        child
    });
    let (bytes, ()) = fs
        .bytes_written_during(|| {
            for i in 0..pods {
                cycle(&a, &format!("p{i}"));
            }
            settle();
        })
        .expect("read the loop device's counters");
    if let Some(mut child) = strace {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = child.wait();
    }
    a.stop();
    for dir in &tmpfs {
        let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    }
    drop(fs);
    println!(
        "flash writes: {bytes} bytes for {pods} pods started and stopped: {} bytes ({:.1} KiB) per pod",
        bytes / pods as u64,
        bytes as f64 / pods as f64 / 1024.0
    );
}

/// What is still only in memory (the store's once-a-second flush, ext4's 5 s commit)
/// gets written before the figure is read: the measured window must hold all of it.
fn settle() {
    std::thread::sleep(Duration::from_secs(6));
}

/// One pod started, seen running, removed and seen gone. `HOLDFAST_FLASH_RESTART=Never`
/// (or `OnFailure`): pods of that restart policy, whose container records are synced.
fn cycle(a: &Agent, name: &str) {
    let file = format!("{name}.yaml");
    let policy = std::env::var("HOLDFAST_FLASH_RESTART")
        .ok()
        .filter(|p| ["Always", "OnFailure", "Never"].contains(&p.as_str()))
        .unwrap_or_else(|| "Always".into());
    a.write_manifest(
        &file,
        &sh_pod(
            name,
            &format!("  terminationGracePeriodSeconds: 2\n  restartPolicy: {policy}\n"),
            "c",
            "trap 'exit 0' TERM; while true; do sleep 1; done",
            "",
        ),
    );
    a.wait_pod(name, "running", Duration::from_secs(60), |p| {
        p["status"]["phase"] == "Running"
    });
    a.remove_manifest(&file);
    a.wait_gone(name, Duration::from_secs(60));
}
