//! Port-forward over WebSocket, the kubelet's channel protocol
//! (`v4.channel.k8s.io`, also taken as `portforward.k8s.io` or no subprotocol): the
//! ports come from the query (`?port=80&port=8080`); port `i` gets channel `2i` for
//! data and `2i + 1` for errors, and the server starts each channel with the port as
//! two little-endian bytes, as the kubelet does. One connection per port is made at
//! once; the session ends when every one of them has closed, or when the client goes.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::tunnel::{forward, Downlink, Target, INPUT_QUEUE};
use crate::server::deps::ApiDeps;
use crate::server::streams::Upgraded;
use crate::server::websocket::{channel_frame, frame, read_message};

pub const PROTOCOLS: [&str; 2] = ["v4.channel.k8s.io", "portforward.k8s.io"];
/// Frames queued for the writer.
const OUT_QUEUE: usize = 32;

pub async fn session(
    io: Upgraded,
    deps: Arc<ApiDeps>,
    target: Target,
    ports: Vec<u16>,
) -> std::io::Result<()> {
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let mut inputs = Vec::with_capacity(ports.len());
    let mut running = JoinSet::new();
    for (i, port) in ports.iter().enumerate() {
        // At most MAX_CONNECTIONS ports (checked with the query): channels fit a byte.
        let channel = u8::try_from(i * 2).unwrap_or(u8::MAX - 1);
        let le = port.to_le_bytes();
        wr.write_all(&channel_frame(channel, &le)).await?;
        wr.write_all(&channel_frame(channel + 1, &le)).await?;
        let (input, waiting) = mpsc::channel(INPUT_QUEUE);
        inputs.push(Some(input));
        let down = Downlink::Ws {
            tx: tx.clone(),
            channel,
        };
        running.spawn(forward(deps.clone(), target.clone(), *port, waiting, down));
    }
    drop(tx);
    // The reader runs on its own: it keeps answering pings and taking data while
    // the pod's output is written.
    let (pong_tx, mut pongs) = mpsc::channel::<Vec<u8>>(4);
    let mut reader = tokio::spawn(async move {
        let mut partial = (None, Vec::new());
        while let Ok((opcode, payload)) = read_message(&mut rd, &mut partial).await {
            match opcode {
                0x8 => break,
                0x9 => {
                    let _ = pong_tx.send(frame(0xA, &payload)).await;
                }
                0x1 | 0x2 => {
                    let Some((&ch, data)) = payload.split_first() else {
                        continue;
                    };
                    // Data channels only; what comes on an error channel is ignored.
                    if ch % 2 != 0 || data.is_empty() {
                        continue;
                    }
                    if let Some(slot) = inputs.get_mut(usize::from(ch / 2)) {
                        let sent = match slot {
                            Some(input) => input.send(data.to_vec()).await.is_ok(),
                            None => true,
                        };
                        if !sent {
                            *slot = None;
                        }
                    }
                }
                _ => {}
            }
        }
    });
    let mut client_gone = false;
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(f) => wr.write_all(&f).await?,
                // Every connection has closed and said all it had.
                None => break,
            },
            Some(p) = pongs.recv() => wr.write_all(&p).await?,
            _ = &mut reader, if !client_gone => {
                client_gone = true;
                running.abort_all();
            }
        }
    }
    while running.join_next().await.is_some() {}
    reader.abort();
    if !client_gone {
        wr.write_all(&frame(0x8, &1000u16.to_be_bytes())).await?;
    }
    wr.flush().await?;
    let _ = wr.shutdown().await;
    Ok(())
}
