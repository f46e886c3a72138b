//! `/exec`, `/attach` and `/portForward`: checks the request, upgrades the connection
//! to the protocol the client asks for ([`super::websocket`] or [`super::spdy`]) and
//! joins it to the command run by the runtime's exec process.
//!
//! Between the protocol side and the exec side run two bounded channels: input
//! ([`In`]: stdin, end of stdin, terminal size) and output ([`Out`]), plus the final
//! status. The exec process's pipes are blocking, so each direction has a thread of
//! its own; a client that stops reading stops the command's output (its pipe fills),
//! never the agent.

use std::io::Read;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use super::http::{error, Resp};
use super::routes::{segments, Query};
use super::{pods, ApiDeps};
use crate::runtime::exec::{ExecExit, ExecRequest, Frame};

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
    let seg = segments(path);
    if kind == Kind::PortForward || kind == Kind::Attach {
        // Known routes whose streams holdfast does not serve yet: say so plainly.
        let what = if kind == Kind::Attach {
            "attach"
        } else {
            "port-forward"
        };
        return error(
            StatusCode::NOT_IMPLEMENTED,
            &format!("{what} is not supported by holdfast yet; use exec"),
        );
    }
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
    let opts = match parse_opts(q) {
        Ok(o) => o,
        Err(m) => return error(StatusCode::BAD_REQUEST, &m),
    };
    let command = q.all("command");
    if command.is_empty() {
        return error(StatusCode::BAD_REQUEST, "you must specify a command");
    }
    let state = match pods::find(&deps, ns, pod, uid).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = pods::container(&state, container) {
        return r;
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
    let exec = ExecRequest {
        command,
        tty: opts.tty,
        stdin: opts.stdin,
        size: None,
    };
    let start = Start {
        deps: deps.clone(),
        id,
        exec,
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

/// What is needed to start the command once the protocol is up.
pub struct Start {
    deps: Arc<ApiDeps>,
    id: crate::runtime::ContainerId,
    exec: ExecRequest,
    permit: OwnedSemaphorePermit,
}

impl Start {
    /// Starts the command; returns the protocol side's ends. The permit is held until
    /// the command has ended and its output is read.
    pub async fn run(self, opts: Opts) -> Ends {
        let (in_tx, in_rx) = mpsc::channel::<In>(QUEUE);
        let (out_tx, out_rx) = mpsc::channel::<Out>(QUEUE);
        let (st_tx, st_rx) = oneshot::channel();
        let rt = self.deps.runtime.clone();
        let (id, req, permit) = (self.id, self.exec, self.permit);
        let command = req.command.clone();
        let spawned = tokio::task::spawn_blocking(move || rt.exec(&id, &req)).await;
        let process = match spawned {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                let _ = st_tx.send(internal(&e.to_string()));
                return Ends {
                    input: in_tx,
                    output: out_rx,
                    status: st_rx,
                };
            }
            Err(e) => {
                let _ = st_tx.send(internal(&e.to_string()));
                return Ends {
                    input: in_tx,
                    output: out_rx,
                    status: st_rx,
                };
            }
        };
        let crate::runtime::exec::ExecProcess {
            mut child,
            mut input,
            mut output,
        } = process;
        // Input: frames to the exec process until the client's side closes.
        let mut in_rx = in_rx;
        let writer = std::thread::Builder::new()
            .name("api-exec-in".into())
            .spawn(move || {
                while let Some(msg) = in_rx.blocking_recv() {
                    let frame = match msg {
                        In::Stdin(d) => Frame::Stdin(d),
                        In::StdinEof => Frame::StdinEof,
                        In::Resize(w, h) => Frame::Resize(w, h),
                    };
                    if !crate::runtime::exec::send(&mut input, &frame) {
                        return;
                    }
                }
            });
        if let Err(e) = writer {
            log::warn!("kubelet API: exec input thread: {e}");
        }
        let reader = std::thread::Builder::new()
            .name("api-exec-out".into())
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
                            // The client is gone: end the command.
                            let _ = child.kill();
                            break 'read;
                        }
                    }
                }
                let _ = child.kill();
                let _ = child.wait();
                let status = match exit {
                    Some(e) => status_of(&command, &e),
                    None => internal("the exec process ended without a status"),
                };
                let _ = st_tx.send(status);
            });
        if let Err(e) = reader {
            log::warn!("kubelet API: exec output thread: {e}");
        }
        Ends {
            input: in_tx,
            output: out_rx,
            status: st_rx,
        }
    }
}

/// The error stream's status as the kubelet writes it (v4 protocols).
pub fn status_of(command: &[String], exit: &ExecExit) -> Status {
    match (exit.exit_code, &exit.error) {
        (Some(0), _) => Status {
            status: Some("Success".into()),
            ..Default::default()
        },
        (Some(code), _) => Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            message: Some(format!(
                "command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"
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
        (None, e) => internal(&format!(
            "error executing command in container: {}",
            e.as_deref().unwrap_or("unknown error")
        )),
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
            &["sh".into()],
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
            &[],
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
