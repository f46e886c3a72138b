//! http2::frame: HTTP/2 framing (RFC 9113) shared by holdfast's HTTP/2 clients (the
//! gRPC probe and the konnectivity tunnel): frame types, flags, settings, and writing a
//! frame. Reading is the caller's: each bounds what it reads in its own way.

/// What a client sends first on an HTTP/2 connection (RFC 9113 section 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE's default, which holdfast's clients never raise.
pub const MAX_FRAME: usize = 16 * 1024;
/// SETTINGS_HEADER_TABLE_SIZE's default, which holdfast's clients keep.
pub const HEADER_TABLE_SIZE: usize = 4096;

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PUSH_PROMISE: u8 = 5;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const CONTINUATION: u8 = 9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

pub const SETTINGS_ENABLE_PUSH: u16 = 2;

/// Appends one frame; `payload` is at most `MAX_FRAME` bytes.
pub fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len().to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_FRAME_SIZE (RFC 9113 section 6.5.2).
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 5;
pub const WINDOW_UPDATE: u8 = 8;
/// The initial flow-control window of a connection and of a stream (RFC 9113 6.9.2).
pub const DEFAULT_WINDOW: u32 = 65_535;

pub fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// RFC 9113 section 7's name of an error code.
pub fn error_name(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(
            || format!("unknown error code 0x{code:x}"),
            |n| n.to_string(),
        )
}
