//! `/exec` and `/attach` (`/portForward` is [`super::portforward`]'s): checks the
//! request, upgrades the connection to the protocol the client asks for
//! ([`super::websocket`] or [`super::spdy`]) and joins it to the command run by the
//! runtime's exec process, or to the container's stdio through its shim's attach
//! socket. Both speak the runtime's exec frames.
//!
//! Between the protocol side and the other side run two bounded channels: input
//! ([`In`]: stdin, end of stdin, terminal size) and output ([`Out`]), plus the final
//! status. The exec process's pipes and the attach socket are blocking, so each
//! direction has a thread of its own; a client that stops reading stops the command's
//! output (its pipe fills) or is detached by the shim, never holding up the agent or
//! the container. A client that goes away ends its exec (the process is killed) or
//! its attach (the container runs on).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use super::http::{error, Resp};
use super::routes::{segments, Query};
use super::{pods, ApiDeps};
use crate::runtime::attach;
use crate::runtime::exec::{ExecExit, ExecRequest, Frame};
use crate::runtime::{ContainerId, RuntimeError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
    PortForward,
}

/// Which of the command's streams the client wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Opts {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// From the client to the command.
#[derive(Debug)]
pub enum In {
    Stdin(Vec<u8>),
    StdinEof,
    Resize(u16, u16),
}

/// From the command to the client.
#[derive(Debug)]
pub enum Out {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// The two ends the protocol side holds.
pub struct Ends {
    pub input: mpsc::Sender<In>,
    pub output: mpsc::Receiver<Out>,
    pub status: oneshot::Receiver<Status>,
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
    if kind == Kind::PortForward {
        return super::portforward::handle(req, path, q, deps).await;
    }
    let seg = segments(path);
    let (ns, pod, uid, container) = match seg.as_slice() {
        [ns, pod, c] => (ns, pod, None, c),
        [ns, pod, uid, c] => (ns, pod, Some(uid.as_str()), c),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "missing namespace, pod or container",
            )
        }
    };
    let mut opts = match parse_opts(q) {
        Ok(o) => o,
        Err(m) => return error(StatusCode::BAD_REQUEST, &m),
    };
    let command = q.all("command");
    if kind == Kind::Exec && command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "you must specify a command");
    }
    let state = match pods::find(&deps, ns, pod, uid).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let spec = match pods::container(&state, container) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if kind == Kind::Attach {
        // Whether the container has a terminal was settled when it started; the
        // kubelet, too, takes it from the spec and not from the request.
        opts.tty = spec.tty.unwrap_or(false);
        opts.stderr &= !opts.tty;
    }
    let running = state
        .status
        .container_statuses
        .iter()
        .flatten()
        .any(|c| &c.name == container && c.state.as_ref().is_some_and(|s| s.running.is_some()));
    let Some(id) = pods::container_id(&state, container, false).filter(|_| running) else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("container {container} is not valid for pod {pod}"),
        );
    };
    let Ok(permit) = deps.streams.clone().try_acquire_owned() else {
        return error(StatusCode::TOO_MANY_REQUESTS, "too many open streams");
    };
    let target = match kind {
        Kind::Attach => Target::Attach {
            container: container.clone(),
        },
        _ => Target::Exec(ExecRequest {
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
    if super::websocket::is_upgrade(&req) {
        super::websocket::upgrade(req, opts, start)
    } else if super::spdy::is_upgrade(&req) {
        super::spdy::upgrade(req, opts, start)
    } else {
        error(
            StatusCode::BAD_REQUEST,
            "Upgrade request required (SPDY/3.1 or websocket)",
        )
    }
}

fn parse_opts(q: &Query) -> Result<Opts, String> {
    let o = Opts {
        stdin: q.flag("stdin").or_else(|_| q.flag("input"))?,
        stdout: q.flag("stdout").or_else(|_| q.flag("output"))?,
        stderr: q.flag("stderr").or_else(|_| q.flag("error"))?,
        tty: q.flag("tty")?,
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

/// The process or socket on the other side, and how to end it early: the exec process
/// is killed, an attach socket shut down (the container runs on).
enum Other {
    Exec(Arc<Mutex<ExecChild>>),
    Attach(UnixStream),
}

struct ExecChild {
    child: Child,
    waited: bool,
}

impl Other {
    fn try_clone(&self) -> Option<Other> {
        match self {
            Other::Exec(c) => Some(Other::Exec(c.clone())),
            Other::Attach(s) => s.try_clone().ok().map(Other::Attach),
        }
    }

    /// Ends it early: the client is gone. The exec process gets SIGTERM, on which it
    /// kills the command and reports how it ended.
    fn stop(&self) {
        match self {
            Other::Exec(c) => {
                if let Ok(c) = c.lock() {
                    // Never a signal to a pid already reaped (and maybe reused).
                    if !c.waited {
                        let pid = nix::unistd::Pid::from_raw(c.child.id() as i32);
                        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                    }
                }
            }
            Other::Attach(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// After the last frame, or once the client is gone (the output pipe closed by
    /// then, so the exec process cannot block writing): the exec process is reaped,
    /// killed if it has not ended within [`REAP_WAIT`].
    fn finish(&self) {
        self.stop();
        let Other::Exec(c) = self else { return };
        let Ok(mut c) = c.lock() else { return };
        if c.waited {
            return;
        }
        let deadline = std::time::Instant::now() + REAP_WAIT;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = c.child.try_wait() {
                c.waited = true;
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = c.child.kill();
        let _ = c.child.wait();
        c.waited = true;
    }
}

/// How long an exec process has to end after SIGTERM.
const REAP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

type Pipes = (Box<dyn Write + Send>, Box<dyn Read + Send>, Other);

fn connect(deps: &ApiDeps, id: &ContainerId, target: &Target) -> Result<Pipes, String> {
    match target {
        Target::Exec(req) => {
            let p = deps.runtime.exec(id, req).map_err(|e| e.to_string())?;
            let child = Arc::new(Mutex::new(ExecChild {
                child: p.child,
                waited: false,
            }));
            Ok((Box::new(p.input), Box::new(p.output), Other::Exec(child)))
        }
        Target::Attach { container } => {
            let sock = deps.runtime.attach(id).map_err(|e| match e {
                RuntimeError::NotRunning { .. } => {
                    format!("container {container} is not running or cannot be attached to")
                }
                e => e.to_string(),
            })?;
            let input = sock.try_clone().map_err(|e| format!("attach: {e}"))?;
            let output = sock.try_clone().map_err(|e| format!("attach: {e}"))?;
            Ok((Box::new(input), Box::new(output), Other::Attach(sock)))
        }
    }
}

impl Start {
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
        let connected = tokio::task::spawn_blocking(move || connect(&deps, &id, &target)).await;
        let (mut input, mut output, other) = match connected {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                let _ = st_tx.send(internal(&e));
                return ends;
            }
            Err(e) => {
                let _ = st_tx.send(internal(&e.to_string()));
                return ends;
            }
        };
        let Some(other_in) = other.try_clone() else {
            other.finish();
            let _ = st_tx.send(internal("cannot share the stream's socket"));
            return ends;
        };
        // Input: frames to the other side until the client's side closes.
        let mut in_rx = in_rx;
        let writer = std::thread::Builder::new()
            .name("api-stream-in".into())
            .spawn(move || {
                while let Some(msg) = in_rx.blocking_recv() {
                    let ok = match msg {
                        // Pieces an attached shim takes (it bounds what it buffers).
                        In::Stdin(d) => d.chunks(attach::MAX_INPUT).all(|c| {
                            crate::runtime::exec::send(&mut input, &Frame::Stdin(c.to_vec()))
                        }),
                        // Only a client that had stdin ends it: with stdinOnce that
                        // closes the container's stdin for good.
                        In::StdinEof if !opts.stdin => true,
                        In::StdinEof => crate::runtime::exec::send(&mut input, &Frame::StdinEof),
                        In::Resize(w, h) => {
                            crate::runtime::exec::send(&mut input, &Frame::Resize(w, h))
                        }
                    };
                    if !ok {
                        return;
                    }
                }
                // The protocol side let go before the end: the client is gone.
                other_in.stop();
            });
        if let Err(e) = writer {
            log::warn!("kubelet API: stream input thread: {e}");
        }
        let reader = std::thread::Builder::new()
            .name("api-stream-out".into())
            .spawn(move || {
                let _permit = permit;
                let mut buf = Vec::new();
                let mut chunk = vec![0u8; 32 * 1024];
                let mut exit = None;
                'read: loop {
                    let n = match output.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    while let Ok(Some((frame, used))) = Frame::decode(&buf) {
                        buf.drain(..used);
                        let msg = match frame {
                            Frame::Stdout(d) if opts.stdout => Out::Stdout(d),
                            Frame::Stderr(d) if opts.stderr => Out::Stderr(d),
                            Frame::Exit(e) => {
                                exit = Some(e);
                                break 'read;
                            }
                            _ => continue,
                        };
                        if out_tx.blocking_send(msg).is_err() {
                            // The client is gone.
                            break 'read;
                        }
                    }
                }
                drop(output);
                other.finish();
                let status = match exit {
                    Some(e) => status_of(&what, &e),
                    None => internal("the stream ended without a status"),
                };
                let _ = st_tx.send(status);
            });
        if let Err(e) = reader {
            log::warn!("kubelet API: stream output thread: {e}");
        }
        ends
    }
}

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

/// A terminal size as clients send it on the resize stream.
#[derive(Debug, serde::Deserialize)]
pub struct Size {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// Every whole JSON size at the front of `buf` (removed from it).
pub fn sizes(buf: &mut Vec<u8>) -> Vec<Size> {
    let mut out = Vec::new();
    let mut used = 0;
    {
        let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<Size>();
        while let Some(Ok(s)) = it.next() {
            out.push(s);
            used = it.byte_offset();
        }
    }
    buf.drain(..used);
    out
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
    fn resize_messages_split_anywhere() {
        let mut buf = br#"{"Width":80,"Height":24}{"Width":100,"#.to_vec();
        let s = sizes(&mut buf);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].width, s[0].height), (80, 24));
        buf.extend_from_slice(br#""Height":30}"#);
        let s = sizes(&mut buf);
        assert_eq!((s[0].width, s[0].height), (100, 30));
        assert!(buf.is_empty());
    }

    #[test]
    fn options() {
        assert!(parse_opts(&Query::parse("command=ls")).is_err());
        let o = parse_opts(&Query::parse("stdout=1&stderr=1&tty=1")).expect("opts");
        assert!(o.stdout && o.tty && !o.stderr);
    }
}
