//! probe::grpc: the gRPC action, `grpc.health.v1.Health/Check` over plaintext HTTP/2
//! with prior knowledge (h2c), as the kubelet's gRPC prober calls it. Its own minimal
//! HTTP/2 client for one stream: the request is tiny and the answer is bounded (16 KiB a
//! frame, 64 KiB in all), so flow control never comes into play.

mod h2;
use crate::http2::hpack;

use std::time::{Duration, Instant};

use super::net::{deadline, dial, join_host_port, remaining, DialError, Outcome};
use h2::{
    be_u32, frame, h2_error_name, unpad, Conn, ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM,
    GOAWAY, HEADERS, HEADER_TABLE_SIZE, MAX_FRAME, MAX_RESPONSE, PING, PREFACE, PRIORITY,
    PUSH_PROMISE, RST_STREAM, SETTINGS, SETTINGS_ENABLE_PUSH, STREAM,
};

/// grpc-go's user agent as the kubelet sets it (`kube-probe/<major>.<minor>`).
const USER_AGENT: &str = "kube-probe/1.34";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// gRPC status codes this module names.
const DEADLINE_EXCEEDED: u32 = 4;
const UNIMPLEMENTED: u32 = 12;
const INTERNAL: u32 = 13;
const UNAVAILABLE: u32 = 14;

/// Why the check did not pass, in the kubelet's words.
#[derive(Debug, thiserror::Error)]
enum GrpcError {
    #[error("timeout: failed to connect service {addr:?} within {}: {source}", go_duration(*timeout))]
    Connect {
        addr: String,
        timeout: Duration,
        #[source]
        source: DialError,
    },
    #[error("timeout: health rpc did not complete within {}", go_duration(*timeout))]
    Deadline { timeout: Duration },
    #[error(
        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
    )]
    Unimplemented { message: String },
    #[error("error: health rpc probe failed: rpc error: code = {} desc = {message}", code_name(*code))]
    Rpc { code: u32, message: String },
    #[error("service unhealthy (responded with {status:?})")]
    Unhealthy { status: String },
}

/// The gRPC action: the health service answers SERVING for `service` (the server's
/// overall health when `None` or empty).
pub fn grpc(host: &str, port: u16, service: Option<&str>, timeout: Duration) -> Outcome {
    match check(
        host,
        port,
        HEALTH_CHECK,
        service.unwrap_or_default(),
        timeout,
    ) {
        Ok(()) => Outcome::Success,
        Err(e) => Outcome::Failure(e.to_string()),
    }
}

fn check(
    host: &str,
    port: u16,
    path: &str,
    service: &str,
    timeout: Duration,
) -> Result<(), GrpcError> {
    let deadline = deadline(timeout);
    let addr = join_host_port(host, port);
    let stream = dial(host, port, deadline).map_err(|source| GrpcError::Connect {
        addr: addr.clone(),
        timeout,
        source,
    })?;
    // A few small writes and then reads: Nagle would only add a delay.
    let _ = stream.set_nodelay(true);
    let mut conn = Conn {
        stream,
        deadline,
        timeout,
        read: 0,
    };
    conn.send(&request(&addr, path, service, deadline)?)?;
    let response = read_response(&mut conn)?;
    let message = response.message(timeout)?;
    let status = health_status(message)?;
    if status == 1 {
        Ok(())
    } else {
        Err(GrpcError::Unhealthy {
            status: status_name(status),
        })
    }
}

/// The connection preface, SETTINGS (push off), and stream 1: HEADERS as literals
/// without indexing and one DATA frame with the HealthCheckRequest.
fn request(
    authority: &str,
    path: &str,
    service: &str,
    deadline: Instant,
) -> Result<Vec<u8>, GrpcError> {
    let too_long = |what: &str| GrpcError::Rpc {
        code: INTERNAL,
        message: format!("{what} too long for one HTTP/2 frame"),
    };
    // HealthCheckRequest { string service = 1; }, the field left out when empty.
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a);
        varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let length = u32::try_from(message.len()).map_err(|_| too_long("service name"))?;
    let mut data = vec![0u8];
    data.extend_from_slice(&length.to_be_bytes());
    data.extend_from_slice(&message);
    if data.len() > MAX_FRAME {
        return Err(too_long("service name"));
    }
    // grpc-go sends what is left of the deadline, and the server may give up by it.
    let left = remaining(deadline).unwrap_or_default();
    let grpc_timeout = format!("{}m", left.as_millis().clamp(1, 99_999_999));
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", USER_AGENT),
        ("grpc-timeout", &grpc_timeout),
    ] {
        hpack::encode_literal(&mut block, name, value);
    }
    if block.len() > MAX_FRAME {
        return Err(too_long("request header"));
    }
    let mut out = PREFACE.to_vec();
    let mut settings = SETTINGS_ENABLE_PUSH.to_be_bytes().to_vec();
    settings.extend_from_slice(&0u32.to_be_bytes());
    frame(&mut out, SETTINGS, 0, 0, &settings);
    frame(&mut out, HEADERS, END_HEADERS, STREAM, &block);
    frame(&mut out, DATA, END_STREAM, STREAM, &data);
    Ok(out)
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn protocol(message: String) -> GrpcError {
    GrpcError::Rpc {
        code: INTERNAL,
        message: format!("http2: {message}"),
    }
}

/// What came back on stream 1.
struct Response {
    /// Header blocks in order: the response headers, then the trailers if any.
    blocks: Vec<Vec<hpack::Field>>,
    data: Vec<u8>,
    /// The stream ended with a header block (trailers, or a Trailers-Only response).
    ended_by_headers: bool,
}

/// Reads frames until stream 1 ends, answering PING and SETTINGS on the way.
fn read_response(conn: &mut Conn) -> Result<Response, GrpcError> {
    let mut decoder = hpack::Decoder::new(HEADER_TABLE_SIZE);
    let mut decode = |block: &[u8]| {
        decoder
            .decode(block, MAX_RESPONSE)
            .map_err(|e| protocol(e.to_string()))
    };
    let mut response = Response {
        blocks: Vec::new(),
        data: Vec::new(),
        ended_by_headers: false,
    };
    // A header block split over CONTINUATION frames, and whether it ends the stream.
    let mut pending: Option<(Vec<u8>, bool)> = None;
    loop {
        let f = conn.frame()?;
        if let Some((mut block, end_stream)) = pending.take() {
            if f.kind != CONTINUATION || f.stream != STREAM {
                return Err(protocol("a header block was interrupted".to_string()));
            }
            block.extend_from_slice(&f.payload);
            if f.flags & END_HEADERS == 0 {
                pending = Some((block, end_stream));
                continue;
            }
            response.blocks.push(decode(&block)?);
            if end_stream {
                response.ended_by_headers = true;
                return Ok(response);
            }
            continue;
        }
        match f.kind {
            DATA if f.stream == STREAM => {
                response.data.extend_from_slice(unpad(&f)?);
                if f.flags & END_STREAM != 0 {
                    return Ok(response);
                }
            }
            DATA if f.stream == 0 => return Err(protocol("DATA on stream 0".to_string())),
            HEADERS => {
                let fragment = header_fragment(&f)?;
                let end_stream = f.flags & END_STREAM != 0;
                if f.flags & END_HEADERS == 0 {
                    pending = Some((fragment.to_vec(), end_stream));
                    continue;
                }
                response.blocks.push(decode(fragment)?);
                if end_stream {
                    response.ended_by_headers = true;
                    return Ok(response);
                }
            }
            RST_STREAM | SETTINGS | PUSH_PROMISE | PING | GOAWAY => control(conn, &f)?,
            CONTINUATION => return Err(protocol("CONTINUATION out of place".to_string())),
            // PRIORITY, WINDOW_UPDATE, acknowledgements, other streams and frame types
            // this client does not know: nothing to do (RFC 9113 section 4.1).
            _ => {}
        }
    }
}

/// A frame about the connection or the stream's end, not its content: answered (a
/// SETTINGS or PING acknowledged), or the error that ends the call.
fn control(conn: &mut Conn, f: &h2::Frame) -> Result<(), GrpcError> {
    match f.kind {
        RST_STREAM if f.stream == STREAM => {
            let code = be_u32(&f.payload, 0)
                .ok_or_else(|| protocol("short RST_STREAM frame".to_string()))?;
            return Err(GrpcError::Rpc {
                code: rst_code(code),
                message: format!(
                    "stream terminated by RST_STREAM with error code: {}",
                    h2_error_name(code)
                ),
            });
        }
        SETTINGS if f.flags & ACK == 0 => {
            if f.stream != 0 || !f.payload.len().is_multiple_of(6) {
                return Err(protocol("malformed SETTINGS frame".to_string()));
            }
            // Nothing the server asks for changes what this client sends.
            let mut ack = Vec::new();
            frame(&mut ack, SETTINGS, ACK, 0, &[]);
            conn.send(&ack)?;
        }
        PUSH_PROMISE => {
            return Err(protocol("PUSH_PROMISE though push is off".to_string()));
        }
        PING if f.flags & ACK == 0 => {
            if f.payload.len() != 8 {
                return Err(protocol("malformed PING frame".to_string()));
            }
            let mut pong = Vec::new();
            frame(&mut pong, PING, ACK, 0, &f.payload);
            conn.send(&pong)?;
        }
        GOAWAY => {
            let (Some(last), Some(code)) = (be_u32(&f.payload, 0), be_u32(&f.payload, 4)) else {
                return Err(protocol("short GOAWAY frame".to_string()));
            };
            // A graceful GOAWAY (a server shutting down) that covers stream 1 still
            // lets it finish.
            if code != 0 || last & 0x7fff_ffff < STREAM {
                return Err(GrpcError::Rpc {
                    code: UNAVAILABLE,
                    message: format!(
                        "the server sent GOAWAY with error code {}",
                        h2_error_name(code)
                    ),
                });
            }
        }
        // An acknowledgement, or a reset of another stream: nothing to do.
        _ => {}
    }
    Ok(())
}

/// A HEADERS frame's part of its header block: padding and priority stripped.
fn header_fragment(f: &h2::Frame) -> Result<&[u8], GrpcError> {
    if f.stream != STREAM {
        return Err(protocol(format!("HEADERS on stream {}", f.stream)));
    }
    let fragment = unpad(f)?;
    if f.flags & PRIORITY != 0 {
        fragment
            .get(5..)
            .ok_or_else(|| protocol("short HEADERS frame".to_string()))
    } else {
        Ok(fragment)
    }
}

impl Response {
    /// The response message, once the headers and trailers say the call succeeded; the
    /// same checks as grpc-go, whose errors the kubelet reports.
    fn message(&self, timeout: Duration) -> Result<&[u8], GrpcError> {
        let headers = self
            .blocks
            .first()
            .ok_or_else(|| protocol("the stream ended without headers".to_string()))?;
        let trailers = if self.ended_by_headers {
            self.blocks.last()
        } else {
            None
        };
        let http_status = field(headers, ":status");
        let content_type = field(headers, "content-type").unwrap_or_default();
        let is_grpc = content_type.starts_with("application/grpc");
        if http_status.as_deref() != Some("200") || !is_grpc {
            let mut why = Vec::new();
            let code = match http_status.as_deref() {
                None => {
                    why.push("malformed header: missing HTTP status".to_string());
                    INTERNAL
                }
                Some("200") => 2,
                Some(status) => {
                    let number = status.parse::<u16>().unwrap_or_default();
                    why.push(format!(
                        "unexpected HTTP status code received from server: {status} ({})",
                        http_status_text(number)
                    ));
                    http_status_code(number)
                }
            };
            if !is_grpc {
                why.push(format!(
                    "transport: received unexpected content-type {content_type:?}"
                ));
            }
            return Err(status_error(code, why.join("; "), timeout));
        }
        let trailers = trailers.ok_or_else(|| GrpcError::Rpc {
            code: INTERNAL,
            message: "server closed the stream without sending trailers".to_string(),
        })?;
        let status = field(trailers, "grpc-status").ok_or_else(|| GrpcError::Rpc {
            code: INTERNAL,
            message: "malformed header: missing grpc-status".to_string(),
        })?;
        let code = status.parse::<u32>().map_err(|_| GrpcError::Rpc {
            code: INTERNAL,
            message: format!("transport: malformed grpc-status: {status:?}"),
        })?;
        if code != 0 {
            let message = field(trailers, "grpc-message")
                .map(|m| percent_decode(&m))
                .unwrap_or_default();
            return Err(status_error(code, message, timeout));
        }
        first_message(&self.data)
    }
}

/// The first value of header `name`, as text.
fn field(fields: &[hpack::Field], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// The first length-prefixed message of a gRPC body.
fn first_message(data: &[u8]) -> Result<&[u8], GrpcError> {
    let internal = |message: &str| GrpcError::Rpc {
        code: INTERNAL,
        message: message.to_string(),
    };
    let (&compressed, rest) = data
        .split_first()
        .ok_or_else(|| internal("the server sent no response message"))?;
    if compressed != 0 {
        return Err(internal(
            "grpc: compressed response though no compression was offered",
        ));
    }
    let len = be_u32(rest, 0).ok_or_else(|| internal("truncated response message"))?;
    rest.get(4..)
        .and_then(|body| body.get(..usize::try_from(len).ok()?))
        .ok_or_else(|| internal("truncated response message"))
}

/// `HealthCheckResponse.status` (field 1, an enum); 0 (UNKNOWN) when absent, as
/// protobuf reads it.
fn health_status(message: &[u8]) -> Result<i32, GrpcError> {
    let bad = |what: &str| GrpcError::Rpc {
        code: INTERNAL,
        message: format!("grpc: failed to unmarshal the received message: {what}"),
    };
    let mut pos = 0;
    let mut status = 0;
    while pos < message.len() {
        let key = read_varint(message, &mut pos).ok_or_else(|| bad("bad field key"))?;
        match key & 7 {
            0 => {
                let value = read_varint(message, &mut pos).ok_or_else(|| bad("bad varint"))?;
                if key >> 3 == 1 {
                    // An enum is an int32 sent as a (sign-extended) varint.
                    status = value as i32;
                }
            }
            1 => pos += 8,
            2 => {
                let len = read_varint(message, &mut pos).ok_or_else(|| bad("bad length"))?;
                pos = usize::try_from(len)
                    .ok()
                    .and_then(|len| pos.checked_add(len))
                    .ok_or_else(|| bad("bad length"))?;
            }
            5 => pos += 4,
            _ => return Err(bad("unknown wire type")),
        }
        if pos > message.len() {
            return Err(bad("truncated field"));
        }
    }
    Ok(status)
}

fn read_varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*pos)?;
        *pos += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// `HealthCheckResponse.ServingStatus` as Go's protobuf prints it.
fn status_name(status: i32) -> String {
    match status {
        0 => "UNKNOWN".to_string(),
        1 => "SERVING".to_string(),
        2 => "NOT_SERVING".to_string(),
        3 => "SERVICE_UNKNOWN".to_string(),
        n => n.to_string(),
    }
}

/// A non-OK status as the kubelet words it: two codes have messages of their own.
fn status_error(code: u32, message: String, timeout: Duration) -> GrpcError {
    match code {
        UNIMPLEMENTED => GrpcError::Unimplemented { message },
        DEADLINE_EXCEEDED => GrpcError::Deadline { timeout },
        code => GrpcError::Rpc { code, message },
    }
}

/// grpc-go's name of a status code.
fn code_name(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("Code({code})"), |name| name.to_string())
}

/// The status grpc-go gives a stream reset with `code`.
fn rst_code(code: u32) -> u32 {
    match code {
        3 | 11 => 8,  // FLOW_CONTROL_ERROR, ENHANCE_YOUR_CALM: ResourceExhausted
        7 => 14,      // REFUSED_STREAM: Unavailable
        8 => 1,       // CANCEL: Canceled
        12 => 7,      // INADEQUATE_SECURITY: PermissionDenied
        0..=13 => 13, // Internal
        _ => 2,       // Unknown
    }
}

/// The status grpc-go gives a response whose HTTP status is not 200.
fn http_status_code(status: u16) -> u32 {
    match status {
        400 => INTERNAL,
        401 => 16,
        403 => 7,
        404 => UNIMPLEMENTED,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => 2,
    }
}

fn http_status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

/// grpc-message is percent-encoded (gRPC over HTTP/2, "Responses"); a `%` not followed
/// by two hex digits stands for itself.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|_| bytes[i] == b'%')
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A duration as Go prints one (`1s`, `1.5s`, `500ms`, `2m0s`), as the kubelet's
/// messages show the timeout.
fn go_duration(d: Duration) -> String {
    fn fraction(value: u128, unit: u128, digits: usize) -> String {
        let rest = value % unit;
        if rest == 0 {
            return (value / unit).to_string();
        }
        let rest = format!("{rest:0digits$}");
        format!("{}.{}", value / unit, rest.trim_end_matches('0'))
    }
    let nanos = d.as_nanos();
    match nanos {
        0 => "0s".to_string(),
        1..=999 => format!("{nanos}ns"),
        1_000..=999_999 => format!("{}µs", fraction(nanos, 1_000, 3)),
        1_000_000..=999_999_999 => format!("{}ms", fraction(nanos, 1_000_000, 6)),
        _ => {
            let secs = d.as_secs();
            let seconds = fraction(
                u128::from(secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos()),
                1_000_000_000,
                9,
            );
            match (secs / 3600, secs % 3600 / 60) {
                (0, 0) => format!("{seconds}s"),
                (0, m) => format!("{m}m{seconds}s"),
                (h, m) => format!("{h}h{m}m{seconds}s"),
            }
        }
    }
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;
