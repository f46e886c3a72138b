//! `holdfast image pull` through a running agent: the pull joins the agent's pulls (one
//! per image at a time, within its limits) and its progress is streamed to the client as
//! one JSON line per step, then the answer.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot};

use super::Response;
use crate::image::registry::{Keyring, Progress, PullRequest, Puller};
use crate::image::Platform;

/// Progress lines held for a slow client before later ones are dropped.
const PROGRESS_QUEUE: usize = 64;

pub(super) async fn serve(
    puller: Option<&Puller>,
    reference: String,
    platform: Option<String>,
    creds: Option<String>,
    write: &mut OwnedWriteHalf,
) -> Response {
    let fail = |message: String| Response::Error { message };
    let Some(puller) = puller else {
        return fail("this agent does not pull images".into());
    };
    let platform = match platform.as_deref().map(Platform::parse).transpose() {
        Ok(p) => p.unwrap_or_else(Platform::host),
        Err(e) => return fail(e),
    };
    let keyring = match creds {
        Some(path) => {
            let path = std::path::PathBuf::from(path);
            match tokio::task::spawn_blocking(move || Keyring::load(&path)).await {
                Ok(Ok(k)) => k,
                Ok(Err(e)) => return fail(format!("--creds: {e}")),
                Err(e) => return fail(format!("--creds: {e}")),
            }
        }
        None => Keyring::default(),
    };
    let (tx, mut rx) = mpsc::channel::<Progress>(PROGRESS_QUEUE);
    let progress = Arc::new(move |p: Progress| {
        // A client that reads slowly loses progress lines, never the pull.
        let _ = tx.try_send(p);
    });
    let (done_tx, mut done_rx) = oneshot::channel::<()>();
    let job = puller.pull(
        PullRequest {
            reference: reference.clone(),
            platform,
            keyring,
            progress: Some(progress),
        },
        move || {
            let _ = done_tx.send(());
        },
    );
    loop {
        tokio::select! {
            Some(p) = rx.recv() => send(write, &Response::Progress { progress: p }).await,
            _ = &mut done_rx => break,
        }
    }
    while let Ok(p) = rx.try_recv() {
        send(write, &Response::Progress { progress: p }).await;
    }
    match job.outcome() {
        Some(Ok(done)) => Response::Pulled {
            image: done.record,
            downloaded: done.downloaded,
            seconds: done.pull_duration.as_secs_f64(),
        },
        Some(Err(e)) => fail(format!("pull {reference}: {}", e.message)),
        None => fail(format!("pull {reference}: ended without a result")),
    }
}

async fn send(write: &mut OwnedWriteHalf, resp: &Response) {
    if let Ok(mut line) = serde_json::to_vec(resp) {
        line.push(b'\n');
        if let Err(e) = write.write_all(&line).await {
            log::debug!("control socket: write progress: {e}");
        }
    }
}
