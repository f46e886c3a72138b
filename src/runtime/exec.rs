//! Running a command in a running container: the one way to do it, for the kubelet
//! API's exec and for exec probes and lifecycle hooks.
//!
//! The agent never calls libcontainer (it forks), so an exec is a process of its own:
//! `holdfast shim exec <state root> <container id> <request json>`, single-threaded,
//! which joins the container with libcontainer's tenant support, gives the command
//! pipes or a pseudo-terminal, relays between them and its own stdin/stdout, waits
//! for the command and reports how it ended. Its stdin and stdout carry typed frames
//! (`[kind u8][length u32 BE][payload]`, see [`Frame`]), so data, terminal resizes,
//! the end of input and the exit status share two pipes and need no extra fds.
//!
//! Two forms:
//! - interactive ([`LibcontainerRuntime::exec`]): the caller gets the process and its
//!   framed pipes and streams (the kubelet API wraps them for its clients);
//! - non-interactive ([`LibcontainerRuntime::exec_sync`]): command, timeout, output
//!   captured up to a cap, exit code; blocking, for probes and hooks.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{ContainerId, LibcontainerRuntime, RuntimeError};

/// What to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub command: Vec<String>,
    /// A pseudo-terminal for stdin/stdout/stderr (stderr is merged into stdout).
    pub tty: bool,
    /// Whether the command gets input (else /dev/null).
    pub stdin: bool,
    /// The terminal's first size (columns, rows), with `tty`.
    pub size: Option<(u16, u16)>,
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecExit {
    /// The command's exit code (128 + signal when a signal killed it); None when it
    /// never ran.
    pub exit_code: Option<i32>,
    /// Why it never ran (not found, not executable, the container is not running).
    pub error: Option<String>,
}

/// One frame on an exec process's pipes.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// To the command's stdin.
    Stdin(Vec<u8>),
    /// The command's stdin is closed.
    StdinEof,
    /// New terminal size (columns, rows).
    Resize(u16, u16),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The last frame: how it ended.
    Exit(ExecExit),
}

/// Frames larger than this are refused (a corrupt stream, not data).
pub const MAX_FRAME: usize = 1 << 20;

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            Frame::Stdin(_) => 0,
            Frame::Stdout(_) => 1,
            Frame::Stderr(_) => 2,
            Frame::Exit(_) => 3,
            Frame::Resize(..) => 4,
            Frame::StdinEof => 5,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let payload: Vec<u8> = match self {
            Frame::Stdin(d) | Frame::Stdout(d) | Frame::Stderr(d) => d.clone(),
            Frame::StdinEof => Vec::new(),
            Frame::Resize(w, h) => [w.to_be_bytes(), h.to_be_bytes()].concat(),
            Frame::Exit(e) => serde_json::to_vec(e).unwrap_or_default(),
        };
        let mut out = Vec::with_capacity(payload.len() + 5);
        out.push(self.kind());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// One frame from the front of `buf`: the frame and its encoded length, None if
    /// `buf` holds less than a whole frame.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, String> {
        if buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > MAX_FRAME {
            return Err(format!("exec frame of {len} bytes"));
        }
        if buf.len() < 5 + len {
            return Ok(None);
        }
        let p = &buf[5..5 + len];
        let frame = match buf[0] {
            0 => Frame::Stdin(p.to_vec()),
            1 => Frame::Stdout(p.to_vec()),
            2 => Frame::Stderr(p.to_vec()),
            3 => {
                Frame::Exit(serde_json::from_slice(p).map_err(|e| format!("exec exit frame: {e}"))?)
            }
            4 if p.len() == 4 => Frame::Resize(
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            ),
            5 => Frame::StdinEof,
            k => return Err(format!("unknown exec frame kind {k}")),
        };
        Ok(Some((frame, 5 + len)))
    }
}

/// An exec process: write [`Frame::Stdin`], [`Frame::StdinEof`] and
/// [`Frame::Resize`] to `input`, read output frames and the final [`Frame::Exit`]
/// from `output`. Kill `child` to end it early; it must be waited for.
pub struct ExecProcess {
    pub child: Child,
    pub input: ChildStdin,
    pub output: ChildStdout,
}

/// What [`LibcontainerRuntime::exec_sync`] captured.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutput {
    pub exit: ExecExit,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Output beyond the cap was dropped.
    pub truncated: bool,
    /// The timeout passed and the exec was killed.
    pub timed_out: bool,
}

impl LibcontainerRuntime {
    /// Starts `req` in the running container `id`; returns at once.
    pub fn exec(&self, id: &ContainerId, req: &ExecRequest) -> Result<ExecProcess, RuntimeError> {
        Self::check_exec_id(id)?;
        let json = serde_json::to_string(req).map_err(|e| RuntimeError::Config(e.to_string()))?;
        let log_path = self.state_dir(id).join("exec.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null());
        let mut child = Command::new(self.shim_binary())
            .arg("shim")
            .arg("exec")
            .arg(self.state_root_path(id))
            .arg(&id.0)
            .arg(json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|source| RuntimeError::Io {
                context: format!("run exec in container {id}"),
                source,
            })?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RuntimeError::Create {
                id: id.0.clone(),
                message: "exec process without pipes".into(),
            });
        };
        Ok(ExecProcess {
            child,
            input,
            output,
        })
    }

    /// Runs `command` in container `id` without input and waits up to `timeout`,
    /// keeping at most `max_output` bytes of each stream. Blocking.
    pub fn exec_sync(
        &self,
        id: &ContainerId,
        command: &[String],
        timeout: Duration,
        max_output: usize,
    ) -> Result<ExecOutput, RuntimeError> {
        let req = ExecRequest {
            command: command.to_vec(),
            tty: false,
            stdin: false,
            size: None,
        };
        let mut p = self.exec(id, &req)?;
        drop(p.input);
        let deadline = Instant::now() + timeout;
        let pid = nix::unistd::Pid::from_raw(p.child.id() as i32);
        // A watchdog ends the exec at the deadline: SIGTERM, on which the exec process
        // kills the command and reports; SIGKILL if it does not within a second.
        // Reading ends with it.
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let left = deadline.saturating_duration_since(Instant::now());
            let timed_out = done_rx.recv_timeout(left).is_err();
            if timed_out {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                if done_rx.recv_timeout(Duration::from_secs(1)).is_err() {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
            timed_out
        });
        let mut out = ExecOutput {
            exit: ExecExit {
                exit_code: None,
                error: None,
            },
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
            timed_out: false,
        };
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        'read: loop {
            let n = match p.output.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            buf.extend_from_slice(&chunk[..n]);
            loop {
                match Frame::decode(&buf) {
                    Ok(Some((frame, used))) => {
                        buf.drain(..used);
                        let (dst, data) = match frame {
                            Frame::Stdout(d) => (&mut out.stdout, d),
                            Frame::Stderr(d) => (&mut out.stderr, d),
                            Frame::Exit(e) => {
                                out.exit = e;
                                break 'read;
                            }
                            _ => continue,
                        };
                        let room = max_output.saturating_sub(dst.len());
                        out.truncated |= data.len() > room;
                        dst.extend_from_slice(&data[..data.len().min(room)]);
                    }
                    Ok(None) => break,
                    Err(_) => break 'read,
                }
            }
        }
        let _ = done_tx.send(());
        out.timed_out = watchdog.join().unwrap_or(false);
        let _ = p.child.kill();
        let _ = p.child.wait();
        if out.timed_out && out.exit.exit_code.is_none() {
            out.exit.error = Some(format!("command timed out after {timeout:?}"));
        }
        Ok(out)
    }
}

/// Writes one frame; false once the exec process is gone.
pub fn send(input: &mut impl Write, frame: &Frame) -> bool {
    input.write_all(&frame.encode()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Stdin(b"hello".to_vec()),
            Frame::StdinEof,
            Frame::Resize(120, 40),
            Frame::Stdout(vec![0; 3]),
            Frame::Stderr(Vec::new()),
            Frame::Exit(ExecExit {
                exit_code: Some(3),
                error: None,
            }),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(f.encode());
        }
        let mut got = Vec::new();
        let mut at = 0;
        while let Some((f, used)) = Frame::decode(&wire[at..]).expect("decode") {
            got.push(f);
            at += used;
        }
        assert_eq!(got, frames);
        assert_eq!(Frame::decode(&wire[..4]), Ok(None));
        assert!(Frame::decode(&[9, 0, 0, 0, 0]).is_err());
        assert!(Frame::decode(&[1, 0xff, 0, 0, 0]).is_err());
    }
}
