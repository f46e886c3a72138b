//! The CLI side of the control socket. Blocking std IO: the CLI has no runtime.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::{ControlError, Request, Response, SOCKET};

/// Sends one request to the agent under `root_dir`.
pub fn call(root_dir: &Path, req: &Request) -> Result<Response, ControlError> {
    call_with_progress(root_dir, req, |_| {})
}

/// Like [`call`], handing each progress line to `on_progress` until the answer comes.
pub fn call_with_progress(
    root_dir: &Path,
    req: &Request,
    mut on_progress: impl FnMut(crate::image::registry::Progress),
) -> Result<Response, ControlError> {
    let path = root_dir.join(SOCKET);
    let shown = path.display().to_string();
    let mut stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(ControlError::NotRunning { path: shown })
        }
        Err(source) => {
            return Err(ControlError::Io {
                path: shown,
                source,
            })
        }
    };
    let io = |source| ControlError::Io {
        path: shown.clone(),
        source,
    };
    let mut line = serde_json::to_vec(req).map_err(|source| ControlError::Decode {
        path: shown.clone(),
        source,
    })?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut reader = BufReader::new(stream);
    let resp = loop {
        let mut answer = String::new();
        reader.read_line(&mut answer).map_err(io)?;
        let resp: Response =
            serde_json::from_str(&answer).map_err(|source| ControlError::Decode {
                path: shown.clone(),
                source,
            })?;
        match resp {
            Response::Progress { progress } => on_progress(progress),
            other => break other,
        }
    };
    match resp {
        Response::Error { message } => Err(ControlError::Remote { message }),
        other => Ok(other),
    }
}
