//! [`Runtime`] on libcontainer, through one shim per container. This side runs in the
//! agent: it prepares the bundle, starts the shim and reads its records; it never calls
//! libcontainer (see the module doc of [`super`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::records::{self, FailedRecord, FailureKind, ShimConfig, ShimPid, StartedRecord};
use super::{
    cgroup, exits, rootfs, sandbox, security, spec, user, ContainerId, ContainerState, ExitInfo,
    Runtime, RuntimeError, StartRequest, Started,
};

/// containerLogMaxSize's default.
pub const DEFAULT_LOG_MAX_SIZE: u64 = 10 * 1024 * 1024;
/// containerLogMaxFiles' default.
pub const DEFAULT_LOG_MAX_FILES: u32 = 5;
const START_TIMEOUT: Duration = Duration::from_secs(30);
const DELETE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a start waits without word on its readiness pipe before it looks whether
/// the shim still lives.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

/// The read end of a shim's readiness pipe. The shim writes one byte once
/// `started.json` or `failed.json` is in place; the pipe ends without one when the shim
/// dies first. The records stay the truth (an agent restarted later reads them): the
/// byte only says when to read them.
struct ReadyPipe(std::fs::File);

impl ReadyPipe {
    /// Waits up to `limit` for the byte or the end of the pipe; true once it has
    /// ended (after it, this returns true at once).
    fn wait(&mut self, limit: Duration) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout};
        use std::io::Read;
        use std::os::fd::AsFd;
        let ms = u16::try_from(limit.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => false,
            Ok(_) => {
                let mut byte = [0u8; 1];
                // Readable: data or the end, so this does not block.
                !matches!(self.0.read(&mut byte), Ok(1))
            }
            // Cannot wait on it: pause as long, and the liveness check still ends the
            // wait.
            Err(_) => {
                std::thread::sleep(limit);
                false
            }
        }
    }
}

pub struct LibcontainerRuntime {
    root: PathBuf,
    cgroup_root: String,
    shim_binary: PathBuf,
    log_max_size: u64,
    log_max_files: u32,
    start_timeout: Duration,
    boot_id: String,
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { context, source }
}

impl LibcontainerRuntime {
    /// A runtime keeping its containers under `root` and their cgroups under
    /// `cgroup_root` (such as `/holdfast`) in every hierarchy. `shim_binary` is the
    /// holdfast executable run as the shim; `None` means this process's own.
    pub fn new(
        root: impl Into<PathBuf>,
        cgroup_root: &str,
        shim_binary: Option<PathBuf>,
    ) -> Result<Self, RuntimeError> {
        let root = root.into();
        let shim_binary = match shim_binary {
            Some(p) => p,
            None => std::env::current_exe().map_err(io_err("find own executable".to_owned()))?,
        };
        let cgroup_root = format!("/{}", cgroup_root.trim_matches('/'));
        let mut rt = LibcontainerRuntime {
            root,
            cgroup_root,
            shim_binary,
            log_max_size: DEFAULT_LOG_MAX_SIZE,
            log_max_files: DEFAULT_LOG_MAX_FILES,
            start_timeout: START_TIMEOUT,
            boot_id: records::boot_id(),
        };
        // `holdfast reset` and tests reach the root through here, not through the agent.
        match super::root_dir::secure(&rt.root) {
            Ok(Some(mode)) => log::warn!(
                "root dir {} was mode {mode:04o}, reachable by other users of the host: now 0700",
                rt.root.display()
            ),
            Ok(None) => {}
            Err(e) => return Err(io_err(format!("secure {}", rt.root.display()))(e)),
        }
        // Compared with mountinfo below, which lists resolved paths.
        rt.root = std::fs::canonicalize(&rt.root)
            .map_err(io_err(format!("resolve {}", rt.root.display())))?;
        let boot = rt.boot_dir();
        match super::root_dir::boot_tmpfs(&boot) {
            Ok(None) => {}
            Ok(Some(why)) => {
                log::warn!("{why}; the containers' boot-scoped records go to the disk")
            }
            Err(e) => return Err(io_err(format!("mount a tmpfs on {}", boot.display()))(e)),
        }
        for dir in [
            rt.root.join("containers"),
            boot.join("containers"),
            rt.exits_dir(),
            rt.state_root(),
        ] {
            super::root_dir::create_private(&dir)
                .map_err(io_err(format!("create {}", dir.display())))?;
        }
        Ok(rt)
    }

    /// Rotate each container log at `max_size` bytes, keeping `max_files` files.
    pub fn with_log_limits(mut self, max_size: u64, max_files: u32) -> Self {
        self.log_max_size = max_size;
        self.log_max_files = max_files.max(1);
        self
    }

    /// How long `start` waits for the shim to report (30 s by default).
    pub fn with_start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// What of a container is on the disk: the overlay's upper and work dirs (what the
    /// container writes) and its exit record.
    pub fn container_dir(&self, id: &ContainerId) -> PathBuf {
        self.root.join("containers").join(&id.0)
    }

    /// What of a container lasts one boot (on the tmpfs at `<root>/boot`): its bundle,
    /// the shim's config, records and log, and the attach socket. A container an
    /// older holdfast started keeps all of it in [`Self::container_dir`].
    pub fn state_dir(&self, id: &ContainerId) -> PathBuf {
        let disk = self.container_dir(id);
        if disk.join(records::SHIM_CONFIG).exists() {
            return disk;
        }
        self.boot_dir().join("containers").join(&id.0)
    }

    /// The tmpfs for what lasts one boot.
    pub fn boot_dir(&self) -> PathBuf {
        self.root.join(super::root_dir::BOOT)
    }

    /// The cgroup under which every container's cgroup is made.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// The container's cgroup, relative to each hierarchy's mount point: where its
    /// shim config says it was made (a pod's containers live under the pod's cgroup).
    pub fn cgroups_path(&self, id: &ContainerId) -> String {
        self.recorded_cgroups_path(id, &self.state_dir(id))
    }

    /// A container's cgroup when its pod has no cgroup of its own.
    fn default_cgroups_path(&self, id: &ContainerId) -> String {
        format!("{}/{}", self.cgroup_root.trim_end_matches('/'), id.0)
    }

    fn exits_dir(&self) -> PathBuf {
        self.boot_dir().join("exits")
    }

    fn state_root(&self) -> PathBuf {
        self.boot_dir().join("run")
    }

    /// libcontainer's state root for `id`: an older holdfast's container has its state
    /// in `<root>/run`.
    fn state_root_of(&self, id: &ContainerId) -> PathBuf {
        let legacy = self.root.join("run");
        if legacy.join(&id.0).exists() {
            return legacy;
        }
        self.state_root()
    }

    /// The holdfast executable the shims run.
    pub(super) fn shim_binary(&self) -> &Path {
        &self.shim_binary
    }

    /// libcontainer's state root for `id`, which `shim exec` needs.
    pub(super) fn state_root_path(&self, id: &ContainerId) -> PathBuf {
        self.state_root_of(id)
    }

    pub(super) fn check_exec_id(id: &ContainerId) -> Result<(), RuntimeError> {
        Self::check_id(id)
    }

    fn check_id(id: &ContainerId) -> Result<(), RuntimeError> {
        let ok = !id.0.is_empty()
            && id.0.len() <= 128
            && id
                .0
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            && !id.0.starts_with('.');
        if ok {
            Ok(())
        } else {
            Err(RuntimeError::Config(format!(
                "invalid container id {:?}",
                id.0
            )))
        }
    }

    /// Everything up to spawning the shim; on error the caller removes the directories.
    /// `dir` is the container's state dir, `disk` its dir on the disk.
    fn prepare(&self, req: &StartRequest<'_>, dir: &Path, disk: &Path) -> Result<(), RuntimeError> {
        let bundle = dir.join("bundle");
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs).map_err(io_err(format!("create {}", rootfs.display())))?;

        let (hosts, resolv_conf, hostname_file) = match req.sandbox {
            Some(sb) => (
                sb.hosts.clone(),
                sb.resolv_conf.clone(),
                sb.hostname.clone(),
            ),
            None => self.write_etc_files(req, dir)?,
        };

        let image_user = image_user(req);
        let sc = security::effective(req.pod, req.container);
        let user_spec = security::user_string(&sc, &image_user).map_err(|e| e.with_id(&req.id))?;
        let ids = user::resolve(&user_spec, &req.image.layers)?;
        let gids =
            security::additional_gids(req.pod, &user::image_groups(ids.0, &req.image.layers)?);
        let nofile_hard_limit =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map(|(_, hard)| hard)
                .unwrap_or(1024);
        // rlim_t is u32 on 32-bit ARM glibc (u64 elsewhere, where a conversion would be a
        // no-op): widen it; RLIM_INFINITY stays above any limit the spec asks for.
        #[cfg(target_pointer_width = "32")]
        let nofile_hard_limit = u64::from(nofile_hard_limit);
        let cgroups_path = match req.sandbox {
            Some(sb) => format!("{}/{}", sb.cgroup_parent.trim_end_matches('/'), req.id.0),
            None => self.default_cgroups_path(&req.id),
        };
        let mut oci = spec::build(&spec::SpecInput {
            pod: req.pod,
            container: req.container,
            env: req.env,
            image: &req.image.config,
            user: ids,
            rootfs: &rootfs,
            cgroups_path: &cgroups_path,
            hosts: &hosts,
            resolv_conf: &resolv_conf,
            hostname_file: &hostname_file,
            nofile_hard_limit,
        })?;
        let host = security::Host {
            cap_last_cap: security::cap_last_cap(),
            bounding: security::own_bounding_set(),
            devices: if sc.privileged {
                security::host_devices()
            } else {
                Vec::new()
            },
            seccomp_root: self.root.join("seccomp"),
        };
        security::apply(&mut oci, req.pod, &sc, &gids, &host).map_err(|e| e.with_id(&req.id))?;
        if let Some(sb) = req.sandbox {
            sandbox::apply(&mut oci, sb, req.mounts)?;
        }
        super::termination::mount(&mut oci, req.container, disk)?;
        oci.set_annotations(Some(super::adoption::annotations(req)));
        let config_path = bundle.join("config.json");
        // The environment in it may hold Secret values: created 0600, root alone reads it.
        let json = serde_json::to_vec(&oci).map_err(|e| RuntimeError::Io {
            context: format!("write {}", config_path.display()),
            source: std::io::Error::other(e.to_string()),
        })?;
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&config_path)
                .and_then(|mut f| f.write_all(&json))
                .map_err(io_err(format!("write {}", config_path.display())))?;
        }

        let shim = ShimConfig {
            id: req.id.0.clone(),
            container_dir: disk.to_owned(),
            state_dir: dir.to_owned(),
            bundle,
            layers: req.image.layers.clone(),
            log_path: req.log_path.clone(),
            log_max_size: self.log_max_size,
            log_max_files: self.log_max_files,
            cgroups_path,
            state_root: self.state_root(),
            exits_dir: self.exits_dir(),
            oom_score_adj: spec::is_best_effort(req.container).then_some(1000),
            boot_id: self.boot_id.clone(),
            stdin: req.container.stdin.unwrap_or(false),
            stdin_once: req.container.stdin_once.unwrap_or(false),
            tty: req.container.tty.unwrap_or(false),
        };
        records::write_boot_scoped(dir, records::SHIM_CONFIG, &shim)
    }

    /// A container on its own (no pod sandbox) gets its own `/etc/hosts`,
    /// `/etc/resolv.conf` (the host's) and `/etc/hostname`.
    fn write_etc_files(
        &self,
        req: &StartRequest<'_>,
        dir: &Path,
    ) -> Result<(PathBuf, PathBuf, PathBuf), RuntimeError> {
        let hostname = spec::hostname(req.pod, req.node_name);
        let hosts = dir.join("hosts");
        let resolv_conf = dir.join("resolv.conf");
        let hostname_file = dir.join("hostname");
        let hosts_text = format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
        );
        let resolv = match std::fs::read("/etc/resolv.conf") {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err("read /etc/resolv.conf".to_owned())(e)),
        };
        for (path, content) in [
            (&hosts, hosts_text.into_bytes()),
            (&resolv_conf, resolv),
            (&hostname_file, format!("{hostname}\n").into_bytes()),
        ] {
            std::fs::write(path, content).map_err(io_err(format!("write {}", path.display())))?;
        }
        Ok((hosts, resolv_conf, hostname_file))
    }

    /// The cgroup a container was given, as its shim config records it.
    fn recorded_cgroups_path(&self, id: &ContainerId, dir: &Path) -> String {
        match records::read::<ShimConfig>(dir, records::SHIM_CONFIG) {
            Ok(Some(c)) => c.cgroups_path,
            _ => self.default_cgroups_path(id),
        }
    }

    /// Runs `shim start`, which detaches the shim; returns the read end of the shim's
    /// readiness pipe (see [`ReadyPipe`]).
    fn spawn_shim(&self, id: &ContainerId, dir: &Path) -> Result<ReadyPipe, RuntimeError> {
        let log_path = dir.join(records::SHIM_LOG);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err(format!("open {}", log_path.display())))?;
        // Close-on-exec here: another thread's child must never hold the write end, or
        // the shim's death would not end the pipe. The child gets it as its stdout.
        let (ready, ready_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
                context: "create the shim's readiness pipe".to_owned(),
                source: e.into(),
            })?;
        // `shim start` detaches the shim and exits at once: waiting for it leaves no
        // zombie and does not wait for the container. The command (and with it this
        // process's copy of the write end) is dropped once it returns.
        let status = Command::new(&self.shim_binary)
            .arg("shim")
            .arg("start")
            .arg(dir)
            .arg(super::shim::READY_ON_STDOUT)
            .stdin(Stdio::null())
            .stdout(Stdio::from(ready_w))
            .stderr(log)
            .status()
            .map_err(io_err(format!("run shim {}", self.shim_binary.display())))?;
        if !status.success() {
            return Err(RuntimeError::Create {
                id: id.0.clone(),
                message: format!("shim start failed ({status}): {}", log_tail(&log_path)),
            });
        }
        Ok(ReadyPipe(std::fs::File::from(ready)))
    }

    /// Waits until the shim has written `started.json` or `failed.json`, it is gone, or
    /// the start timeout is over. The readiness pipe wakes this at once for all of them
    /// but one: a shim killed while libcontainer's init (a clone of it, holding the
    /// write end until it runs the container's command) waits to be started. The shim's
    /// liveness is checked each [`LIVENESS_CHECK`] for that.
    fn wait_started(
        &self,
        id: &ContainerId,
        dir: &Path,
        mut ready: ReadyPipe,
    ) -> Result<Started, RuntimeError> {
        let deadline = Instant::now() + self.start_timeout;
        let mut ended = false;
        loop {
            if let Some(s) = records::read_boot_scoped::<StartedRecord>(dir, records::STARTED)? {
                return Ok(Started {
                    pid: s.init.pid,
                    started_at: s.started_at,
                });
            }
            if let Some(f) = records::read::<FailedRecord>(dir, records::FAILED)? {
                let (id, message) = (id.0.clone(), f.message);
                return Err(match f.kind {
                    FailureKind::Create => RuntimeError::Create { id, message },
                    FailureKind::Start => RuntimeError::Start { id, message },
                });
            }
            let shim: Option<ShimPid> = records::read_boot_scoped(dir, records::SHIM_PID)?;
            // The records were read after the pipe ended or the shim was seen dead, so
            // none comes any more.
            if ended || shim.is_some_and(|s| !s.process.is_alive()) {
                let recheck = records::read_boot_scoped::<StartedRecord>(dir, records::STARTED)?
                    .is_some()
                    || dir.join(records::FAILED).exists();
                if !recheck {
                    return Err(RuntimeError::Create {
                        id: id.0.clone(),
                        message: format!(
                            "shim exited without a record: {}",
                            log_tail(&dir.join(records::SHIM_LOG))
                        ),
                    });
                }
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RuntimeError::Create {
                    id: id.0.clone(),
                    message: format!("shim did not report within {:?}", self.start_timeout),
                });
            }
            ended = ready.wait((deadline - now).min(LIVENESS_CHECK));
        }
    }

    fn shim_alive(&self, dir: &Path) -> Result<bool, RuntimeError> {
        let shim: Option<ShimPid> = records::read_boot_scoped(dir, records::SHIM_PID)?;
        Ok(shim.is_some_and(|s| s.boot_id == self.boot_id && s.process.is_alive()))
    }

    fn delete_state(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let state_root = self.state_root_of(id);
        if !state_root.join(&id.0).exists() {
            return Ok(());
        }
        let mut child = Command::new(&self.shim_binary)
            .arg("shim")
            .arg("delete")
            .arg(&state_root)
            .arg(&id.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err(format!("run shim delete for {id}")))?;
        let deadline = Instant::now() + DELETE_TIMEOUT;
        let status = loop {
            match child
                .try_wait()
                .map_err(io_err(format!("wait for shim delete of {id}")))?
            {
                Some(status) => break status,
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(RuntimeError::Create {
                        id: id.0.clone(),
                        message: "libcontainer delete timed out".to_owned(),
                    });
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        if !status.success() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            return Err(RuntimeError::Create {
                id: id.0.clone(),
                message: format!("libcontainer delete: {}", stderr.trim()),
            });
        }
        Ok(())
    }
}

/// The user the image's config names (`USER`), empty if none.
fn image_user(req: &StartRequest<'_>) -> String {
    req.image
        .config
        .config()
        .as_ref()
        .and_then(|c| c.user().clone())
        .unwrap_or_default()
}

/// The end of a shim's log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(1000);
    String::from_utf8_lossy(&text[start..]).trim().to_owned()
}

impl Runtime for LibcontainerRuntime {
    fn exec_sync(
        &self,
        id: &ContainerId,
        command: &[String],
        timeout: std::time::Duration,
        max_output: usize,
    ) -> Result<super::exec::ExecOutput, RuntimeError> {
        LibcontainerRuntime::exec_sync(self, id, command, timeout, max_output)
    }

    fn start(&self, req: &StartRequest<'_>) -> Result<Started, RuntimeError> {
        Self::check_id(&req.id)?;
        // A container refused for running as root is refused before anything of it is
        // written: its pod retries with back-off, and each retry would otherwise make and
        // remove a directory on the device's flash.
        let sc = security::effective(req.pod, req.container);
        security::verify_run_as_non_root(req.pod, req.container, &sc, &image_user(req))?;
        let disk = self.container_dir(&req.id);
        let dir = self.boot_dir().join("containers").join(&req.id.0);
        if dir.exists() {
            return Err(RuntimeError::Create {
                id: req.id.0.clone(),
                message: "container already exists".to_owned(),
            });
        }
        let made = {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(super::root_dir::MODE)
                .create(&disk)
        };
        match made {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(RuntimeError::Create {
                    id: req.id.0.clone(),
                    message: "container already exists".to_owned(),
                });
            }
            Err(e) => return Err(io_err(format!("create {}", disk.display()))(e)),
        }
        // The upper and work dirs (all the container writes to its root filesystem) are
        // below: a setuid binary or device node it makes there is inert on the host.
        let bound =
            rootfs::bind_nosuid_nodev(&disk, true).map_err(|message| RuntimeError::Create {
                id: req.id.0.clone(),
                message,
            });
        let spawned = bound
            .and_then(|()| {
                super::root_dir::create_private(&dir)
                    .map_err(io_err(format!("create {}", dir.display())))
            })
            .and_then(|()| self.prepare(req, &dir, &disk))
            .and_then(|()| self.spawn_shim(&req.id, &dir));
        let ready = match spawned {
            Ok(ready) => ready,
            Err(e) => {
                // Nothing runs yet: the directories and the bind mount are all there is.
                for d in [&dir, &disk] {
                    if let Err(m) = super::remove_unmounted(d) {
                        log::warn!("container {}: {m}", req.id);
                    }
                }
                return Err(e);
            }
        };
        self.wait_started(&req.id, &dir, ready)
    }

    fn kill(&self, id: &ContainerId, signal: i32) -> Result<(), RuntimeError> {
        Self::check_id(id)?;
        let (dir, disk) = (self.state_dir(id), self.container_dir(id));
        if !dir.exists() && !disk.exists() {
            return Err(RuntimeError::NotFound { id: id.0.clone() });
        }
        let sig = Signal::try_from(signal)
            .map_err(|_| RuntimeError::Config(format!("invalid signal {signal}")))?;
        if let Some(s) = records::read_boot_scoped::<StartedRecord>(&dir, records::STARTED)? {
            if s.boot_id == self.boot_id && s.init.is_alive() {
                return match nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.init.pid), sig) {
                    Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
                    Err(e) => Err(RuntimeError::Io {
                        context: format!("signal container {id}"),
                        source: e.into(),
                    }),
                };
            }
            // Gone: its shim records (or has recorded) the exit.
            return Ok(());
        }
        if disk.join(records::EXIT).exists() || dir.join(records::FAILED).exists() {
            return Ok(());
        }
        Err(RuntimeError::NotRunning { id: id.0.clone() })
    }

    fn state(&self, id: &ContainerId) -> Result<ContainerState, RuntimeError> {
        Self::check_id(id)?;
        let (dir, disk) = (self.state_dir(id), self.container_dir(id));
        if !dir.exists() && !disk.exists() {
            return Err(RuntimeError::NotFound { id: id.0.clone() });
        }
        let ended = |dir: &Path| -> Result<Option<ContainerState>, RuntimeError> {
            // Written before it was synced (see `records`): one a power cut tore is no
            // exit anyone took, so the container is lost, as without one.
            if let Some(mut exit) = records::read_boot_scoped::<ExitInfo>(&disk, records::EXIT)? {
                exit.termination_message = super::termination::read(&disk);
                return Ok(Some(ContainerState::Exited(exit)));
            }
            if let Some(f) = records::read::<FailedRecord>(dir, records::FAILED)? {
                return Ok(Some(ContainerState::Exited(ExitInfo {
                    exit_code: 128,
                    signal: None,
                    oom_killed: false,
                    started_at: None,
                    finished_at: f.at,
                    start_error: Some(f.message),
                    termination_message: None,
                })));
            }
            Ok(None)
        };
        if let Some(s) = ended(&dir)? {
            return Ok(s);
        }
        let shim_alive = self.shim_alive(&dir)?;
        if let Some(s) = records::read_boot_scoped::<StartedRecord>(&dir, records::STARTED)? {
            // The init may be gone while its shim still drains its output: running
            // until the exit record says otherwise.
            if s.boot_id == self.boot_id && (s.init.is_alive() || shim_alive) {
                return Ok(ContainerState::Running {
                    pid: s.init.pid,
                    started_at: s.started_at,
                });
            }
        } else if shim_alive {
            return Ok(ContainerState::Created);
        }
        // The shim may have written its exit record and gone since the first look.
        Ok(ended(&dir)?.unwrap_or(ContainerState::Unknown))
    }

    fn remove(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        Self::check_id(id)?;
        let (dir, disk) = (self.state_dir(id), self.container_dir(id));
        if dir.exists() || disk.exists() {
            match self.state(id)? {
                ContainerState::Running { .. } | ContainerState::Created => {
                    return Err(RuntimeError::StillRunning { id: id.0.clone() });
                }
                ContainerState::Exited(_) | ContainerState::Unknown => {}
            }
            // After the exit record the shim still cleans up, and waits for its exit to
            // be taken: it is, the container goes. Doing the same at once would race it.
            self.exit_recorded(id);
            let deadline = Instant::now() + DELETE_TIMEOUT;
            while self.shim_alive(&dir)? && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let cgroups_path = self.recorded_cgroups_path(id, &dir);
        self.delete_state(id)?;
        cgroup::remove(&cgroups_path).map_err(|message| RuntimeError::Create {
            id: id.0.clone(),
            message,
        })?;
        for dir in [&dir, &disk] {
            // Unmounted first, and never removed through a mount: that would delete
            // the image, or a volume's host files, through it.
            super::remove_unmounted(dir).map_err(|e| RuntimeError::Create {
                id: id.0.clone(),
                message: e.to_string(),
            })?;
        }
        let _ = std::fs::remove_file(self.exits_dir().join(&id.0));
        let _ = std::fs::remove_file(self.root.join("exits").join(&id.0));
        Ok(())
    }

    fn owner(&self, id: &ContainerId) -> Result<Option<super::adoption::Owner>, RuntimeError> {
        Self::check_id(id)?;
        let path = self.state_dir(id).join("bundle").join("config.json");
        let spec = match oci_spec::runtime::Spec::load(&path) {
            Ok(spec) => spec,
            Err(oci_spec::OciSpecError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => {
                log::warn!("container {id}: read {}: {e}", path.display());
                return Ok(None);
            }
        };
        Ok(spec.annotations().as_ref().and_then(super::adoption::owner))
    }

    fn list(&self) -> Result<Vec<ContainerId>, RuntimeError> {
        let mut ids = Vec::new();
        for dir in [
            self.root.join("containers"),
            self.boot_dir().join("containers"),
        ] {
            let entries =
                std::fs::read_dir(&dir).map_err(io_err(format!("list {}", dir.display())))?;
            for e in entries {
                let e = e.map_err(io_err(format!("list {}", dir.display())))?;
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    if let Some(name) = e.file_name().to_str() {
                        ids.push(ContainerId(name.to_owned()));
                    }
                }
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    fn exit_recorded(&self, id: &ContainerId) {
        if Self::check_id(id).is_ok() {
            let _ = std::fs::remove_file(self.exits_dir().join(&id.0));
        }
    }

    fn watch_exits(&self, tx: tokio::sync::mpsc::Sender<ContainerId>) -> Result<(), RuntimeError> {
        // An older holdfast's shims still running tell of their exits where it listened.
        let legacy = self.root.join("exits");
        if legacy.is_dir() {
            exits::spawn(&legacy, tx.clone())?;
        }
        exits::spawn(&self.exits_dir(), tx)
    }
}
