//! `/run/{namespace}/{pod}[/{uid}]/{container}` (POST, `?cmd=`): runs a command in the
//! container without input and answers its output, stdout then stderr, as the
//! kubelet's `RunInContainer` does; a command that fails is a 500 that carries it.
//! The command runs through the runtime's exec process on a blocking thread, bounded
//! in time ([`RUN_TIMEOUT`]) and output ([`MAX_OUTPUT`]), holding a stream slot.

use hyper::StatusCode;

use super::deps::ApiDeps;
use super::http::{container_path, error, respond, Query, Resp};
use super::lookup;

/// How long a command may run before it is killed.
pub const RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// The most kept of each of its streams.
pub const MAX_OUTPUT: usize = 1 << 20;

pub async fn run(deps: &ApiDeps, path: &str, q: &Query) -> Resp {
    let at = match container_path(path) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let (ns, pod, uid, container) = (&at.ns, &at.pod, at.uid.as_deref(), &at.container);
    // As the kubelet: the `cmd` parameter split at each space.
    let command: Vec<String> = match q.get("cmd") {
        Some(c) if !c.trim().is_empty() => c.split(' ').map(str::to_owned).collect(),
        _ => return error(StatusCode::BAD_REQUEST, "you must specify a command (cmd)"),
    };
    let state = match lookup::find(deps, ns, pod, uid).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let found = match lookup::container(&state, container) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let id = match found.running_id(pod) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let Ok(_permit) = deps.streams.clone().try_acquire_owned() else {
        return error(StatusCode::TOO_MANY_REQUESTS, "too many open streams");
    };
    let runtime = deps.runtime.clone();
    let cmd = command.clone();
    let ran =
        tokio::task::spawn_blocking(move || runtime.exec_sync(&id, &cmd, RUN_TIMEOUT, MAX_OUTPUT))
            .await;
    let out = match ran {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &format!("run: {e}")),
    };
    let mut data = out.stdout;
    data.extend_from_slice(&out.stderr);
    match (out.exit.exit_code, out.exit.error) {
        (Some(0), _) => respond(StatusCode::OK, "application/json", data),
        (Some(code), _) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "command {command:?} exited with {code}: {}",
                String::from_utf8_lossy(&data)
            ),
        ),
        (None, why) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "command {command:?} did not run: {}",
                why.as_deref().unwrap_or("unknown error")
            ),
        ),
    }
}
