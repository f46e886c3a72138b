//! The agent side of the control socket.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use super::{Request, Response, SOCKET};
use crate::image::ImageStore;
use crate::sync::PodStates;

/// Longest request line accepted: requests are tiny; anything longer is not ours.
const MAX_REQUEST: usize = 64 * 1024;

pub struct Control {
    pub images: Arc<ImageStore>,
    pub podstates: PodStates,
    /// Asks the sync loop to look again (an image arrived).
    pub resync: mpsc::Sender<()>,
    pub root_dir: std::path::PathBuf,
    /// The uplink's link and outbox; `None` standalone.
    pub uplink: Option<crate::uplink::UplinkView>,
    /// The agent's pulls, which `holdfast image pull` joins.
    pub puller: Option<crate::image::registry::Puller>,
    /// Image GC, which looks again after an import.
    pub gc: Option<crate::image::service::GcTrigger>,
}

/// Binds the socket (replacing a stale one) with mode 0600.
pub fn bind(root_dir: &Path) -> std::io::Result<UnixListener> {
    let path = root_dir.join(SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

impl Control {
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.handle(stream).await });
                }
                Err(e) => {
                    log::warn!("control socket: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn handle(&self, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read).take(MAX_REQUEST as u64);
        let mut line = String::new();
        let resp = match reader.read_line(&mut line).await {
            Ok(_) => match serde_json::from_str::<Request>(&line) {
                Ok(Request::ImagePull {
                    reference,
                    platform,
                    creds,
                }) => {
                    super::pull::serve(self.puller.as_ref(), reference, platform, creds, &mut write)
                        .await
                }
                Ok(req) => self.answer(req).await,
                Err(e) => Response::Error {
                    message: format!("bad request: {e}"),
                },
            },
            Err(e) => Response::Error {
                message: format!("read request: {e}"),
            },
        };
        let mut out = serde_json::to_vec(&resp).unwrap_or_else(|e| {
            format!("{{\"result\":\"error\",\"message\":\"encode answer: {e}\"}}").into_bytes()
        });
        out.push(b'\n');
        if let Err(e) = write.write_all(&out).await {
            log::debug!("control socket: write answer: {e}");
        }
    }

    async fn answer(&self, req: Request) -> Response {
        if matches!(req, Request::Status) {
            let podstates = self.podstates.clone();
            let root = self.root_dir.clone();
            let uplink = self.uplink.clone();
            return tokio::task::spawn_blocking(move || Response::Status {
                status: super::status::from_agent(&root, &podstates, uplink.as_ref()),
            })
            .await
            .unwrap_or_else(|e| Response::Error {
                message: format!("request failed: {e}"),
            });
        }
        let images = self.images.clone();
        let podstates = self.podstates.clone();
        let resync = matches!(req, Request::ImageImport { .. });
        let resp = tokio::task::spawn_blocking(move || super::execute(&images, &podstates, req))
            .await
            .unwrap_or_else(|e| Response::Error {
                message: format!("request failed: {e}"),
            });
        if resync && matches!(resp, Response::Images { .. }) {
            let _ = self.resync.try_send(());
            if let Some(gc) = &self.gc {
                gc.kick();
            }
        }
        resp
    }
}
