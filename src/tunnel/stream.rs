//! tunnel::stream: one gRPC stream `/AgentService/Connect` to one proxy server, on an
//! HTTP/2 connection of its own over TLS: the request with the agent's metadata, the
//! response headers (`serverid`, `servercount`), then packets both ways. Flow control
//! both ways: what the server sends is acknowledged only once it has been written to
//! the kubelet API's socket, so the window bounds what waits in memory. Pings keep the
//! server's keepalive policy (no more often than it allows) and find a dead stream. A
//! stopping agent's stream says DRAIN, ends its side, and waits for the server's end.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::frames::{read_frames, Frame, Keepalive, Messages, PING_TIMEOUT};
use super::packet::Packet;
use super::splice::{Conns, Out};
use super::TunnelError;
use crate::http2::frame::{
    self, be_u32, error_name, ACK, CONTINUATION, DATA, DEFAULT_WINDOW, END_HEADERS, END_STREAM,
    GOAWAY, HEADERS, HEADER_TABLE_SIZE, MAX_FRAME, PADDED, PING, PREFACE, PRIORITY, PUSH_PROMISE,
    RST_STREAM, SETTINGS, SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_UPDATE,
};
use crate::http2::hpack;

/// The stream this client opens.
const STREAM: u32 = 1;
/// The window granted to the server, for the connection and the stream alike: what may
/// wait on its way to the kubelet API.
const WINDOW: u32 = 512 << 10;
/// The largest gRPC message taken: a message is acknowledged once whole, so one larger
/// than the window could never arrive.
const MAX_MESSAGE: usize = WINDOW as usize;
/// Packets taken from the connections at once, while this much is not sent yet.
const BATCH: usize = 32 << 10;
/// After this many bytes carried, once `QUIET` has passed without a packet, the stream
/// gives back what the burst left (see [`Session::release`]).
const BURST: u64 = 256 << 10;
const QUIET: Duration = Duration::from_secs(2);
/// The most header bytes taken in one block.
const MAX_HEADERS: usize = 16 << 10;

/// What the agent tells the server about itself.
pub(super) struct Hello<'a> {
    pub authority: &'a str,
    pub agent_id: &'a str,
    pub identifiers: &'a str,
    /// A ServiceAccount token, sent as `authorization: Bearer <token>`.
    pub token: Option<&'a str>,
}

/// An open stream, its response headers read.
pub(super) struct Session<S> {
    pub server_id: String,
    pub server_count: usize,
    addr: String,
    frames: mpsc::Receiver<Result<Frame, TunnelError>>,
    reader: tokio::task::JoinHandle<()>,
    wr: WriteHalf<S>,
    decoder: hpack::Decoder,
    /// Send windows: the connection's and the stream's.
    conn_window: i64,
    stream_window: i64,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE.
    peer_initial: i64,
    /// gRPC messages not sent yet (the windows were closed), encoded.
    pending: Vec<u8>,
    /// Frames on their way out, written together.
    wbuf: Vec<u8>,
    /// Received bytes handled and not yet given back with WINDOW_UPDATE.
    unacked: u64,
    /// The gRPC messages in the received DATA.
    messages: Messages,
    /// Bytes of packets carried both ways since the last [`Session::release`], and when
    /// the last one was.
    carried: u64,
    last: Instant,
    /// Header block fragments until END_HEADERS.
    block: Option<Vec<u8>>,
    /// This side of the stream is ended (END_STREAM sent, after DRAIN): nothing more
    /// goes out on it.
    half_closed: bool,
    /// The server ended its side after this one.
    ended: bool,
}

impl<S> Drop for Session<S> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Sends the connection preface and the request, then reads until the response
/// headers. `io` is the TLS stream, ALPN h2 already agreed.
pub(super) async fn open<S>(io: S, addr: &str, hello: &Hello<'_>) -> Result<Session<S>, TunnelError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let (tx, frames) = mpsc::channel(16);
    let reader = tokio::spawn(read_frames(rd, addr.to_string(), tx));
    let mut s = Session {
        server_id: String::new(),
        server_count: 1,
        addr: addr.to_string(),
        frames,
        reader,
        wr,
        decoder: hpack::Decoder::new(HEADER_TABLE_SIZE),
        conn_window: i64::from(DEFAULT_WINDOW),
        stream_window: i64::from(DEFAULT_WINDOW),
        peer_initial: i64::from(DEFAULT_WINDOW),
        pending: Vec::new(),
        wbuf: Vec::new(),
        unacked: 0,
        messages: Messages::default(),
        carried: 0,
        last: Instant::now(),
        block: None,
        half_closed: false,
        ended: false,
    };
    let mut out = PREFACE.to_vec();
    let mut settings = Vec::new();
    for (id, value) in [
        (SETTINGS_ENABLE_PUSH, 0),
        (SETTINGS_INITIAL_WINDOW_SIZE, WINDOW),
    ] {
        settings.extend_from_slice(&id.to_be_bytes());
        settings.extend_from_slice(&value.to_be_bytes());
    }
    frame::frame(&mut out, SETTINGS, 0, 0, &settings);
    frame::frame(
        &mut out,
        WINDOW_UPDATE,
        0,
        0,
        &(WINDOW - DEFAULT_WINDOW).to_be_bytes(),
    );
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/AgentService/Connect"),
        (":authority", hello.authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        (
            "user-agent",
            concat!("holdfast/", env!("CARGO_PKG_VERSION")),
        ),
        ("agentid", hello.agent_id),
        ("agentidentifiers", hello.identifiers),
    ] {
        hpack::encode_literal(&mut block, name, value);
    }
    if let Some(token) = hello.token {
        hpack::encode_never_indexed(&mut block, "authorization", &format!("Bearer {token}"));
    }
    if block.len() > MAX_FRAME {
        return Err(s.protocol("request headers larger than one frame".into()));
    }
    frame::frame(&mut out, HEADERS, END_HEADERS, STREAM, &block);
    s.write(&out).await?;
    loop {
        let f = s.next_frame().await?;
        let fields = s.on_control(f, None)?;
        s.flush().await?;
        if let Some(fields) = fields {
            return s.response(&fields);
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> Session<S> {
    fn protocol(&self, reason: String) -> TunnelError {
        TunnelError::Protocol {
            addr: self.addr.clone(),
            reason,
        }
    }

    /// Writes what `wbuf` holds.
    async fn send(&mut self) -> Result<(), TunnelError> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.wbuf);
        let r = self.write(&out).await;
        self.wbuf = out;
        self.wbuf.clear();
        r
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), TunnelError> {
        let r = async {
            self.wr.write_all(bytes).await?;
            self.wr.flush().await
        };
        r.await.map_err(|source| TunnelError::Io {
            addr: self.addr.clone(),
            source,
        })
    }

    async fn next_frame(&mut self) -> Result<Frame, TunnelError> {
        match self.frames.recv().await {
            Some(r) => r,
            None => Err(self.protocol("connection closed".into())),
        }
    }

    /// The response headers: HTTP 200, gRPC, and the server's id and count.
    fn response(mut self, fields: &[hpack::Field]) -> Result<Session<S>, TunnelError> {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name.as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        if let Some(status) = get("grpc-status").filter(|s| s != "0") {
            return Err(TunnelError::Refused {
                addr: self.addr.clone(),
                status,
                message: get("grpc-message").unwrap_or_default(),
            });
        }
        match get(":status").as_deref() {
            Some("200") => {}
            other => {
                return Err(self.protocol(format!("http status {}", other.unwrap_or("missing"))))
            }
        }
        self.server_id =
            get("serverid").ok_or_else(|| self.protocol("no serverid header".into()))?;
        let count = get("servercount").unwrap_or_else(|| "1".into());
        self.server_count = count
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| self.protocol(format!("servercount {count:?} is not 1 to 64")))?;
        Ok(self)
    }

    /// Handles a frame that is not the stream's data (answers go to `wbuf`); returns a
    /// whole header block's fields when one ends. `ping` is `None` before the response
    /// headers.
    fn on_control(
        &mut self,
        f: Frame,
        ping: Option<&mut Keepalive>,
    ) -> Result<Option<Vec<hpack::Field>>, TunnelError> {
        match f.kind {
            SETTINGS if f.flags & ACK == 0 => {
                self.settings(&f.payload)?;
                frame::frame(&mut self.wbuf, SETTINGS, ACK, 0, &[]);
            }
            PING if f.flags & ACK == 0 => {
                frame::frame(&mut self.wbuf, PING, ACK, 0, &f.payload);
            }
            PING => {
                if let Some(k) = ping {
                    k.answered();
                }
            }
            WINDOW_UPDATE => {
                let inc = i64::from(be_u32(&f.payload, 0).unwrap_or(0) & 0x7fff_ffff);
                match f.stream {
                    0 => self.conn_window += inc,
                    STREAM => self.stream_window += inc,
                    _ => {}
                }
            }
            HEADERS | CONTINUATION if f.stream == STREAM => return self.headers(&f),
            RST_STREAM if f.stream == STREAM && self.half_closed => self.ended = true,
            RST_STREAM if f.stream == STREAM => {
                let code = be_u32(&f.payload, 0).unwrap_or(0);
                return Err(self.protocol(format!("stream reset: {}", error_name(code))));
            }
            GOAWAY => {
                let code = be_u32(&f.payload, 4).unwrap_or(0);
                let debug = String::from_utf8_lossy(f.payload.get(8..).unwrap_or_default());
                if code != 0 {
                    return Err(self.protocol(format!("goaway {}: {debug}", error_name(code))));
                }
                log::info!("tunnel: proxy server {} is going away", self.addr);
            }
            PUSH_PROMISE => return Err(self.protocol("push promise, push is disabled".into())),
            _ => {}
        }
        Ok(None)
    }

    fn settings(&mut self, payload: &[u8]) -> Result<(), TunnelError> {
        if !payload.len().is_multiple_of(6) {
            return Err(self.protocol("settings frame of a bad length".into()));
        }
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let value = i64::from(u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
            if id == SETTINGS_INITIAL_WINDOW_SIZE {
                // The change applies to the open stream's window (RFC 9113 6.9.2).
                self.stream_window += value - self.peer_initial;
                self.peer_initial = value;
            }
        }
        Ok(())
    }

    fn headers(&mut self, f: &Frame) -> Result<Option<Vec<hpack::Field>>, TunnelError> {
        let mut payload = &f.payload[..];
        if f.kind == HEADERS {
            let mut skip = 0usize;
            let mut pad = 0usize;
            if f.flags & PADDED != 0 {
                pad = usize::from(*payload.first().unwrap_or(&0));
                skip = 1;
            }
            if f.flags & PRIORITY != 0 {
                skip += 5;
            }
            payload = payload
                .len()
                .checked_sub(pad)
                .and_then(|end| payload.get(skip..end))
                .ok_or_else(|| self.protocol("headers padding longer than its frame".into()))?;
            self.block = Some(Vec::new());
        }
        let block = self.block.as_mut().ok_or_else(|| TunnelError::Protocol {
            addr: self.addr.clone(),
            reason: "continuation without headers".into(),
        })?;
        if block.len() + payload.len() > MAX_HEADERS {
            return Err(self.protocol(format!("header block over {MAX_HEADERS} bytes")));
        }
        block.extend_from_slice(payload);
        if f.flags & END_HEADERS == 0 {
            return Ok(None);
        }
        let block = self.block.take().unwrap_or_default();
        let fields = self
            .decoder
            .decode(&block, MAX_HEADERS)
            .map_err(|e| self.protocol(e.to_string()))?;
        Ok(Some(fields))
    }

    /// Carries packets until the stream is lost (the error says why) or, once `stop` is
    /// set, until it has said DRAIN, ended its side and seen the server end its own (Ok).
    /// `stop` is held until then: the stopping agent waits for it. Ending the stream,
    /// not only the connection, is what has the server read all that was sent: when a
    /// connection closes, grpc-go cancels the stream and may drop what it had not read.
    pub(super) async fn run(
        mut self,
        conns: &mut Conns,
        out_rx: &mut mpsc::Receiver<Out>,
        keepalive: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), TunnelError> {
        let mut ping = Keepalive::new(keepalive);
        let mut draining = false;
        let consumed = conns.consumed();
        loop {
            self.flush().await?;
            if draining && !self.half_closed && self.pending.is_empty() {
                self.half_close().await?;
            }
            self.acknowledge(consumed.take()).await?;
            let wake = ping.wake();
            tokio::select! {
                f = self.frames.recv() => {
                    let f = f.ok_or_else(|| self.protocol("connection closed".into()))??;
                    self.on_frame(f, conns, &mut ping).await?;
                    if self.ended {
                        return Ok(());
                    }
                }
                out = out_rx.recv(), if self.pending.is_empty() => {
                    // Conns hold a sender of their own: the channel never closes here.
                    if let Some(out) = out {
                        self.take_out(out, conns, out_rx);
                    }
                }
                () = consumed.notified() => {}
                () = tokio::time::sleep_until(wake) => {
                    if ping.dead() {
                        return Err(TunnelError::Dead { addr: self.addr.clone(), after: PING_TIMEOUT });
                    }
                    frame::frame(&mut self.wbuf, PING, 0, 0, &[0u8; 8]);
                    self.send().await?;
                    ping.sent();
                }
                () = tokio::time::sleep_until(self.last + QUIET), if self.carried >= BURST => {
                    self.release();
                }
                r = stop.changed(), if !draining => {
                    draining = true;
                    if r.is_ok() {
                        log::info!("tunnel: draining the stream to {}", self.addr);
                        self.queue(&Packet::Drain);
                    }
                }
            }
        }
    }

    /// Queues what conns sent, as many as are waiting (up to a batch).
    fn take_out(&mut self, first: Out, conns: &mut Conns, out_rx: &mut mpsc::Receiver<Out>) {
        let mut next = Some(first);
        while let Some(out) = next.take() {
            match out {
                Out::Packet(p) => self.queue(&p),
                Out::Gone(id) => conns.gone(id),
            }
            if self.pending.len() < BATCH {
                next = out_rx.try_recv().ok();
            }
        }
    }

    fn queue(&mut self, p: &Packet) {
        if self.half_closed {
            // The connections it carried end with the stream.
            return;
        }
        let before = self.pending.len();
        p.encode_grpc(&mut self.pending);
        self.carried += (self.pending.len() - before) as u64;
        self.last = Instant::now();
    }

    /// Ends this side of the stream (an empty DATA frame with END_STREAM), DRAIN sent:
    /// the server reads all before the end, then ends its side.
    async fn half_close(&mut self) -> Result<(), TunnelError> {
        frame::frame(&mut self.wbuf, DATA, END_STREAM, STREAM, &[]);
        self.half_closed = true;
        self.send().await
    }

    /// Sends what is pending as far as the windows allow, with whatever else waits in
    /// `wbuf`, in one write.
    async fn flush(&mut self) -> Result<(), TunnelError> {
        let mut at = 0;
        while at < self.pending.len() {
            let window = self.conn_window.min(self.stream_window);
            let n = usize::try_from(window)
                .unwrap_or(0)
                .min(MAX_FRAME)
                .min(self.pending.len() - at);
            if n == 0 {
                break;
            }
            frame::frame(&mut self.wbuf, DATA, 0, STREAM, &self.pending[at..at + n]);
            at += n;
            self.conn_window -= n as i64;
            self.stream_window -= n as i64;
        }
        self.pending.drain(..at);
        self.send().await
    }

    /// Gives received bytes back to the server's windows once enough have been handled.
    async fn acknowledge(&mut self, handled: u64) -> Result<(), TunnelError> {
        self.unacked += handled;
        if self.unacked < u64::from(WINDOW / 4) {
            return Ok(());
        }
        let inc = u32::try_from(self.unacked).unwrap_or(WINDOW).min(WINDOW);
        self.unacked -= u64::from(inc);
        frame::frame(&mut self.wbuf, WINDOW_UPDATE, 0, 0, &inc.to_be_bytes());
        frame::frame(&mut self.wbuf, WINDOW_UPDATE, 0, STREAM, &inc.to_be_bytes());
        self.send().await
    }

    /// After a burst, once quiet: the buffers it grew are dropped, and the allocator
    /// hands its free pages back (on a blocking thread: it walks every arena under its
    /// lock). Without this, the heap a burst grew stays resident, its free pages held
    /// between blocks that live on.
    fn release(&mut self) {
        self.carried = 0;
        if self.pending.is_empty() {
            self.pending = Vec::new();
        }
        self.wbuf = Vec::new();
        drop(tokio::task::spawn_blocking(|| {
            crate::malloc::trim_and_log("tunnel traffic")
        }));
    }

    async fn on_frame(
        &mut self,
        f: Frame,
        conns: &mut Conns,
        ping: &mut Keepalive,
    ) -> Result<(), TunnelError> {
        if f.kind != DATA || f.stream != STREAM {
            if self.on_control(f, Some(ping))?.is_some() {
                // Trailers: the server ended the stream.
                return self.server_ended();
            }
            // Answers in `wbuf` go with the next flush, which follows at once.
            return Ok(());
        }
        let total = f.payload.len() as u64;
        let mut data = f.payload;
        if f.flags & PADDED != 0 {
            let pad = usize::from(*data.first().unwrap_or(&0));
            let end = data
                .len()
                .checked_sub(pad)
                .filter(|end| *end >= 1)
                .ok_or_else(|| self.protocol("data padding longer than its frame".into()))?;
            data = data.slice(1..end);
        }
        self.carried += total;
        self.last = Instant::now();
        // Padding and packets are handled at once, but for a DATA packet's bytes (once
        // written) and a message not yet whole.
        let partial = self.messages.partial() as u64;
        let mut deferred = 0u64;
        let mut replies = Vec::new();
        loop {
            let msg = match self.messages.next(&mut data, MAX_MESSAGE) {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => return Err(self.protocol(e)),
            };
            let packet = Packet::decode(&msg).map_err(|e| self.protocol(e.to_string()))?;
            deferred += conns.handle(packet, &mut replies) as u64;
        }
        for r in &replies {
            self.queue(r);
        }
        let handled = (total + partial).saturating_sub(self.messages.partial() as u64 + deferred);
        self.acknowledge(handled).await?;
        if f.flags & END_STREAM != 0 {
            return self.server_ended();
        }
        Ok(())
    }

    /// The server ended its side: the end of a stream this side ended first, else a loss.
    fn server_ended(&mut self) -> Result<(), TunnelError> {
        if !self.half_closed {
            return Err(self.protocol("the server ended the stream".into()));
        }
        self.ended = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, DuplexStream};

    use super::*;
    use crate::tunnel::splice::Policy;

    /// One frame as the server reads it: kind, flags, stream, payload.
    async fn read_frame(io: &mut DuplexStream) -> (u8, u8, u32, Vec<u8>) {
        let mut head = [0u8; 9];
        io.read_exact(&mut head).await.expect("frame head");
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.expect("frame payload");
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        (head[3], head[4], stream, payload)
    }

    fn headers(out: &mut Vec<u8>, fields: &[(&str, &str)], flags: u8) {
        let mut block = Vec::new();
        for (name, value) in fields {
            hpack::encode_literal(&mut block, name, value);
        }
        frame::frame(out, HEADERS, END_HEADERS | flags, STREAM, &block);
    }

    /// A proxy server's side of the stream, as grpc-go's: the response headers, then what
    /// the agent sends on the stream until it ends its side, then the trailers.
    async fn server(mut io: DuplexStream) -> Vec<u8> {
        let mut preface = [0u8; 24];
        io.read_exact(&mut preface).await.expect("preface");
        assert_eq!(&preface[..], PREFACE);
        while read_frame(&mut io).await.0 != HEADERS {}
        let mut out = Vec::new();
        frame::frame(&mut out, SETTINGS, 0, 0, &[]);
        headers(
            &mut out,
            &[
                (":status", "200"),
                ("serverid", "kas-0"),
                ("servercount", "1"),
            ],
            0,
        );
        io.write_all(&out).await.expect("response");
        let mut sent = Vec::new();
        loop {
            let (kind, flags, stream, payload) = read_frame(&mut io).await;
            if kind == DATA && stream == STREAM {
                sent.extend(payload);
                if flags & END_STREAM != 0 {
                    break;
                }
            }
        }
        let mut out = Vec::new();
        headers(&mut out, &[("grpc-status", "0")], END_STREAM);
        io.write_all(&out).await.expect("trailers");
        sent
    }

    #[tokio::test]
    async fn a_stopping_stream_says_drain_ends_its_side_and_waits_for_the_server() {
        let (agent_io, server_io) = tokio::io::duplex(64 << 10);
        let server = tokio::spawn(server(server_io));
        let hello = Hello {
            authority: "kas:8132",
            agent_id: "gw-1",
            identifiers: "host=gw-1",
            token: None,
        };
        let session = open(agent_io, "kas:8132", &hello).await.expect("open");
        assert_eq!(session.server_id, "kas-0");
        let policy = Arc::new(Policy {
            hosts: vec!["gw-1".into()],
            port: 10250,
            target: "127.0.0.1:10250".parse().expect("addr"),
        });
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let (stop_tx, stop_rx) = watch::channel(false);
        let run = tokio::spawn(async move {
            let mut conns = Conns::new(policy, out_tx, "kas-0".into());
            let keepalive = Duration::from_secs(30);
            let r = session.run(&mut conns, &mut out_rx, keepalive, stop_rx);
            r.await.map_err(|e| e.to_string())
        });

        stop_tx.send(true).expect("stop");
        let within = Duration::from_secs(5);
        let sent = tokio::time::timeout(within, server)
            .await
            .expect("the agent ends its side of the stream")
            .expect("server");
        // What the stream carried: one gRPC message, DRAIN, then its end.
        let len = be_u32(&sent, 1).expect("a message") as usize;
        assert_eq!((sent[0], sent.len()), (0, 5 + len));
        let msg = Bytes::copy_from_slice(&sent[5..]);
        assert_eq!(Packet::decode(&msg), Ok(Packet::Drain));
        // The server's end is the stream's: it lets the stopping agent go.
        tokio::time::timeout(within, stop_tx.closed())
            .await
            .expect("stop let go");
        assert_eq!(run.await.expect("run"), Ok(()));
    }
}
