//! `/exec` and `/attach`: checks the request, upgrades the connection to the protocol
//! the client asks for ([`super::websocket`] or [`super::spdy`]) and joins it to the
//! command run by the runtime's exec process, or to the container's stdio through its
//! shim's attach socket. Both speak the runtime's exec frames.
//!
//! Between the protocol side and the other side run two bounded channels: input
//! ([`In`]: stdin, end of stdin, terminal size) and output ([`Out`]), plus the final
//! status (the [`super::streams`] vocabulary the protocols share). Each direction is a task on the agent's runtime over the exec process's
//! pipes or the attach socket, made non-blocking (no thread per stream); a client that
//! stops reading stops the command's output (its pipe fills) or is detached by the
//! shim, never holding up the agent or the container. A client that goes away ends
//! its exec (the command is killed) or its attach (the container runs on).

use std::os::fd::OwnedFd;
use std::process::Child;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use super::deps::ApiDeps;
use super::http::{container_path, error, Query, Resp};
use super::lookup;
use super::streams::{Ends, In, Launch, Opts, Out};
use super::{spdy, websocket};
use crate::runtime::attach;
use crate::runtime::exec::{ExecExit, ExecRequest, Frame};
use crate::runtime::{ContainerId, RuntimeError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
}

/// Queue depth each way: 16 chunks of at most 32 KiB.
const QUEUE: usize = 16;

pub async fn handle(
    req: Request<Incoming>,
    kind: Kind,
    path: &str,
    q: &Query,
    deps: Arc<ApiDeps>,
) -> Resp {
    let at = match container_path(path) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let (ns, pod, uid, container) = (&at.ns, &at.pod, at.uid.as_deref(), &at.container);
    let mut opts = match parse_opts(q) {
        Ok(o) => o,
        Err(m) => return error(StatusCode::BAD_REQUEST, &m),
    };
    let command = q.all("command");
    if kind == Kind::Exec && command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "you must specify a command");
    }
    let state = match lookup::find(&deps, ns, pod, uid).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let found = match lookup::container(&state, container) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if kind == Kind::Attach {
        // Whether the container has a terminal was settled when it started; the
        // kubelet, too, takes it from the spec and not from the request.
        opts.tty = found.spec.tty.unwrap_or(false);
        opts.stderr &= !opts.tty;
    }
    let id = match found.running_id(pod) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let Ok(permit) = deps.streams.clone().try_acquire_owned() else {
        return error(StatusCode::TOO_MANY_REQUESTS, "too many open streams");
    };
    let target = match kind {
        Kind::Attach => Target::Attach {
            container: container.clone(),
        },
        Kind::Exec => Target::Exec(ExecRequest {
            command,
            tty: opts.tty,
            stdin: opts.stdin,
            size: None,
        }),
    };
    let start = Start {
        deps: deps.clone(),
        id,
        target,
        permit,
    };
    if websocket::is_upgrade(&req) {
        websocket::upgrade(req, opts, start.launch())
    } else if spdy::is_upgrade(&req) {
        spdy::upgrade(req, opts, start.launch())
    } else {
        error(
            StatusCode::BAD_REQUEST,
            "Upgrade request required (SPDY/3.1 or websocket)",
        )
    }
}

/// The streams asked for. The apiserver asks the kubelet with `input`, `output`,
/// `error` and `tty`, each on only as `1` (the kubelet's `NewOptions`); a direct
/// client may also name them `stdin`, `stdout` and `stderr` with any boolean.
fn parse_opts(q: &Query) -> Result<Opts, String> {
    let either = |kubelet: &str, direct: &str| -> Result<bool, String> {
        Ok(q.get(kubelet) == Some("1") || q.flag(direct)?)
    };
    let o = Opts {
        stdin: either("input", "stdin")?,
        stdout: either("output", "stdout")?,
        stderr: either("error", "stderr")?,
        tty: either("tty", "tty")?,
    };
    if !o.stdin && !o.stdout && !o.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(Opts {
        // A terminal has one output stream.
        stderr: o.stderr && !o.tty,
        ..o
    })
}

/// What the streams join: a command run for this request, or the container's own
/// stdio through its shim.
pub enum Target {
    Exec(ExecRequest),
    Attach { container: String },
}

/// What is needed to start the command once the protocol is up.
pub struct Start {
    deps: Arc<ApiDeps>,
    id: crate::runtime::ContainerId,
    target: Target,
    permit: OwnedSemaphorePermit,
}

/// The other side's two directions, as async halves on the agent's runtime: no
/// thread per stream.
type Half<T> = Box<T>;
type Reader = Half<dyn AsyncRead + Send + Unpin>;
type Writer = Half<dyn AsyncWrite + Send + Unpin>;

/// Connects to the other side (blocking: run off the async threads); returns its input
/// and output and, for an exec, its process.
fn connect(
    deps: &ApiDeps,
    id: &ContainerId,
    target: &Target,
) -> Result<(OwnedFd, OwnedFd, Option<Child>), String> {
    match target {
        Target::Exec(req) => {
            let p = deps.runtime.exec(id, req).map_err(|e| e.to_string())?;
            Ok((
                OwnedFd::from(p.input),
                OwnedFd::from(p.output),
                Some(p.child),
            ))
        }
        Target::Attach { container } => {
            let sock = deps.runtime.attach(id).map_err(|e| match e {
                RuntimeError::NotRunning { .. } => {
                    format!("container {container} is not running or cannot be attached to")
                }
                e => e.to_string(),
            })?;
            let other = sock.try_clone().map_err(|e| format!("attach: {e}"))?;
            Ok((OwnedFd::from(sock), OwnedFd::from(other), None))
        }
    }
}

/// The halves for tokio: pipes of the exec process, or the attach socket.
fn halves(input: OwnedFd, output: OwnedFd, exec: bool) -> std::io::Result<(Writer, Reader)> {
    if exec {
        let w = tokio::net::unix::pipe::Sender::from_owned_fd(input)?;
        let r = tokio::net::unix::pipe::Receiver::from_owned_fd(output)?;
        return Ok((Box::new(w), Box::new(r)));
    }
    let sock = std::os::unix::net::UnixStream::from(input);
    drop(output);
    sock.set_nonblocking(true)?;
    let (r, w) = tokio::net::UnixStream::from_std(sock)?.into_split();
    Ok((Box::new(w), Box::new(r)))
}

impl Start {
    /// What a protocol session calls once its streams are open.
    fn launch(self) -> Launch {
        Box::new(move |opts| Box::pin(self.run(opts)))
    }

    /// Starts the command or attaches; returns the protocol side's ends. The permit is
    /// held until the other side has ended and its output is read.
    pub async fn run(self, opts: Opts) -> Ends {
        let (in_tx, in_rx) = mpsc::channel::<In>(QUEUE);
        let (out_tx, out_rx) = mpsc::channel::<Out>(QUEUE);
        let (st_tx, st_rx) = oneshot::channel();
        let ends = Ends {
            input: in_tx,
            output: out_rx,
            status: st_rx,
        };
        let Start {
            deps,
            id,
            target,
            permit,
        } = self;
        let what = match &target {
            Target::Exec(req) => format!("error executing command {:?}", req.command),
            Target::Attach { container } => format!("container {container} exited"),
        };
        let exec = matches!(target, Target::Exec(_));
        let connected = tokio::task::spawn_blocking(move || connect(&deps, &id, &target)).await;
        let (input, output, child) = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                let _ = st_tx.send(internal(&e));
                return ends;
            }
            Err(e) => {
                let _ = st_tx.send(internal(&e.to_string()));
                return ends;
            }
        };
        let (writer, reader) = match halves(input, output, exec) {
            Ok(h) => h,
            Err(e) => {
                if let Some(c) = child {
                    reap(c).await;
                }
                let _ = st_tx.send(internal(&format!("stream: {e}")));
                return ends;
            }
        };
        // Dropped by the input task once the client's side has let go.
        let (gone_tx, gone_rx) = oneshot::channel::<()>();
        tokio::spawn(forward_input(in_rx, writer, opts, gone_tx));
        tokio::spawn(async move {
            let _permit = permit;
            let exit = forward_output(reader, &out_tx, opts, gone_rx, child.as_ref()).await;
            if let Some(c) = child {
                reap(c).await;
            }
            let status = match exit {
                Some(e) => status_of(&what, &e),
                None => internal("the stream ended without a status"),
            };
            let _ = st_tx.send(status);
        });
        ends
    }
}

/// Input: frames to the other side until the client's side lets go; then `gone` is
/// dropped. A failed write (the other side ended) only stops the writing: the client
/// may still read the end of the output.
async fn forward_input(
    mut in_rx: mpsc::Receiver<In>,
    mut writer: Writer,
    opts: Opts,
    gone: oneshot::Sender<()>,
) {
    let mut open = true;
    while let Some(msg) = in_rx.recv().await {
        if !open {
            continue;
        }
        let mut frames = Vec::new();
        match msg {
            // Pieces an attached shim takes (it bounds what it buffers).
            In::Stdin(d) => frames.extend(
                d.chunks(attach::MAX_INPUT)
                    .map(|c| Frame::Stdin(c.to_vec())),
            ),
            // Only a client that had stdin ends it: with stdinOnce that closes the
            // container's stdin for good.
            In::StdinEof if !opts.stdin => {}
            In::StdinEof => frames.push(Frame::StdinEof),
            In::Resize(w, h) => frames.push(Frame::Resize(w, h)),
        }
        for f in frames {
            if writer.write_all(&f.encode()).await.is_err() {
                open = false;
                break;
            }
        }
    }
    drop(gone);
}

/// Output: frames from the other side to the client until the last one (the exit).
/// When the client is gone an exec process gets SIGTERM (it kills the command and
/// still reports) and an attach ends at once (the container runs on).
async fn forward_output(
    mut reader: Reader,
    out_tx: &mpsc::Sender<Out>,
    opts: Opts,
    mut gone: oneshot::Receiver<()>,
    child: Option<&Child>,
) -> Option<ExecExit> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 32 * 1024];
    let mut client_gone = false;
    let end = |client_gone: &mut bool| -> bool {
        if !*client_gone {
            *client_gone = true;
            if let Some(c) = child {
                let pid = nix::unistd::Pid::from_raw(c.id() as i32);
                // Not reaped yet (only `run` reaps, after this returns): the pid is
                // still the exec process's.
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            }
        }
        child.is_some()
    };
    loop {
        let n = tokio::select! {
            r = reader.read(&mut chunk) => match r {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            },
            _ = &mut gone, if !client_gone => {
                if !end(&mut client_gone) {
                    return None;
                }
                continue;
            }
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Some((frame, used))) = Frame::decode(&buf) {
            buf.drain(..used);
            let msg = match frame {
                Frame::Stdout(d) if opts.stdout => Out::Stdout(d),
                Frame::Stderr(d) if opts.stderr => Out::Stderr(d),
                Frame::Exit(e) => return Some(e),
                _ => continue,
            };
            if !client_gone && out_tx.send(msg).await.is_err() && !end(&mut client_gone) {
                return None;
            }
        }
    }
}

/// Reaps an exec process, killing it if it has not ended within [`REAP_WAIT`].
async fn reap(mut child: Child) {
    let deadline = tokio::time::Instant::now() + REAP_WAIT;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    // After SIGKILL the wait is short, but it blocks: not on the async threads.
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
}

/// How long an exec process has to end after its last frame or SIGTERM.
const REAP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The error stream's status as the kubelet writes it (v4 protocols); `what` says what
/// ended (`error executing command [...]`).
pub fn status_of(what: &str, exit: &ExecExit) -> Status {
    match (exit.exit_code, &exit.error) {
        (Some(0), _) => Status {
            status: Some("Success".into()),
            ..Default::default()
        },
        (Some(code), _) => Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            message: Some(format!(
                "command terminated with non-zero exit code: {what}, exit code {code}"
            )),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some(code.to_string()),
                    field: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        (None, e) => internal(e.as_deref().unwrap_or("unknown error")),
    }
}

fn internal(message: &str) -> Status {
    Status {
        status: Some("Failure".into()),
        message: Some(format!("Internal error occurred: {message}")),
        reason: Some("InternalError".into()),
        code: Some(500),
        details: Some(StatusDetails {
            causes: Some(vec![StatusCause {
                message: Some(message.to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_carries_the_exit_code_as_kubectl_reads_it() {
        let s = status_of(
            "error executing command [\"sh\"]",
            &ExecExit {
                exit_code: Some(3),
                error: None,
            },
        );
        let v = serde_json::to_value(&s).expect("json");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
        let ok = serde_json::to_value(status_of(
            "",
            &ExecExit {
                exit_code: Some(0),
                error: None,
            },
        ))
        .expect("json");
        assert_eq!(ok["status"], "Success");
    }

    #[test]
    fn options() {
        assert!(parse_opts(&Query::parse("command=ls")).is_err());
        let o = parse_opts(&Query::parse("stdout=1&stderr=1&tty=1")).expect("opts");
        assert!(o.stdout && o.tty && !o.stderr);
        // What the apiserver sends for `kubectl exec -i` and for `-it`.
        let o = parse_opts(&Query::parse("command=sh&input=1&output=1&error=1")).expect("opts");
        assert_eq!(
            o,
            Opts {
                stdin: true,
                stdout: true,
                stderr: true,
                tty: false
            }
        );
        let o = parse_opts(&Query::parse("command=sh&input=1&output=1&tty=1")).expect("opts");
        assert!(o.stdin && o.stdout && o.tty && !o.stderr);
        // Only `1` turns a kubelet parameter on.
        assert!(parse_opts(&Query::parse("output=true")).is_err());
    }
}
