//! HTTP/1.1 as kube-apiserver speaks it to a non-browser client: requests with
//! `Content-Length` or chunked bodies, keep-alive, and responses carrying the headers
//! the recorded server sends (`Audit-Id`, `Cache-Control`, `Content-Type:
//! application/json`, the priority-and-fairness pair). Bodies up to 2048 bytes get a
//! `Content-Length`, larger ones and every watch are chunked (Go's response buffer).

use std::io::{self, BufRead, Write};
use std::time::{SystemTime, UNIX_EPOCH};

/// One parsed request.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path, percent-decoded, without the query.
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A query parameter, percent-decoded (`+` is a space).
    pub fn param(&self, key: &str) -> Option<String> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k) == key).then(|| percent_decode(v))
        })
    }

    pub fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn read_line<R: BufRead>(r: &mut R) -> io::Result<Option<String>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    while line.ends_with('\n') || line.ends_with('\r') {
        line.pop();
    }
    Ok(Some(line))
}

/// Reads one request; `None` when the peer closed the connection between requests.
pub fn read_request<R: BufRead>(r: &mut R) -> io::Result<Option<Request>> {
    let line = loop {
        match read_line(r)? {
            None => return Ok(None),
            Some(l) if l.is_empty() => continue,
            Some(l) => break l,
        }
    };
    let mut parts = line.split(' ');
    let method = parts.next().ok_or_else(|| bad("no method"))?.to_string();
    let target = parts.next().ok_or_else(|| bad("no target"))?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Vec::new();
    loop {
        let l = read_line(r)?.ok_or_else(|| bad("eof in headers"))?;
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').ok_or_else(|| bad("bad header"))?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut req = Request {
        method,
        path: percent_decode(path),
        query: query.to_string(),
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let size = read_line(r)?.ok_or_else(|| bad("eof in chunk"))?;
            let size = size.split(';').next().unwrap_or("").trim();
            let n = usize::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
            if n == 0 {
                while !read_line(r)?
                    .ok_or_else(|| bad("eof in trailer"))?
                    .is_empty()
                {}
                break;
            }
            let start = req.body.len();
            req.body.resize(start + n, 0);
            r.read_exact(&mut req.body[start..])?;
            read_line(r)?;
        }
    } else if let Some(n) = req.header("content-length") {
        let n: usize = n.parse().map_err(|_| bad("bad content-length"))?;
        req.body.resize(n, 0);
        r.read_exact(&mut req.body)?;
    }
    Ok(Some(req))
}

pub fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// Go's `http` buffer: bodies larger than this are sent chunked.
pub const CHUNK_THRESHOLD: usize = 2048;

fn head(code: u16, audit_id: &str, extra: &[(&str, &str)], framing: &str) -> String {
    let mut h = format!(
        "HTTP/1.1 {code} {}\r\nAudit-Id: {audit_id}\r\nCache-Control: no-cache, private\r\n\
         Content-Type: application/json\r\n",
        reason_phrase(code)
    );
    for (n, v) in extra {
        h.push_str(&format!("{n}: {v}\r\n"));
    }
    h.push_str(&format!(
        "Date: {}\r\n{framing}\r\n\r\n",
        http_date(SystemTime::now())
    ));
    h
}

/// A complete response: `Content-Length` when small, chunked (in one chunk) otherwise.
pub fn write_response<W: Write>(
    w: &mut W,
    code: u16,
    audit_id: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    if body.len() <= CHUNK_THRESHOLD {
        let h = head(
            code,
            audit_id,
            extra,
            &format!("Content-Length: {}", body.len()),
        );
        w.write_all(h.as_bytes())?;
        w.write_all(body)?;
    } else {
        let h = head(code, audit_id, extra, "Transfer-Encoding: chunked");
        w.write_all(h.as_bytes())?;
        write_chunk(w, body)?;
        write_last_chunk(w)?;
    }
    w.flush()
}

/// The head of a chunked (streamed) response.
pub fn write_stream_head<W: Write>(
    w: &mut W,
    code: u16,
    audit_id: &str,
    extra: &[(&str, &str)],
) -> io::Result<()> {
    w.write_all(head(code, audit_id, extra, "Transfer-Encoding: chunked").as_bytes())?;
    w.flush()
}

pub fn write_chunk<W: Write>(w: &mut W, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    w.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    w.write_all(data)?;
    w.write_all(b"\r\n")?;
    w.flush()
}

pub fn write_last_chunk<W: Write>(w: &mut W) -> io::Result<()> {
    w.write_all(b"0\r\n\r\n")?;
    w.flush()
}

/// (year, month, day, hour, minute, second, weekday 0=Sunday) in UTC.
fn civil(t: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400) as u32;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as u32;
    (
        year,
        month,
        day,
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        weekday,
        d.subsec_micros(),
    )
}

/// `Sun, 22 Nov 2026 07:30:39 GMT`.
pub fn http_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, s, wd, _) = civil(t);
    format!(
        "{}, {d:02} {} {y} {h:02}:{mi:02}:{s:02} GMT",
        DAYS[wd as usize],
        MONTHS[(mo - 1) as usize]
    )
}

/// RFC 3339 with second precision, as `metav1.Time`: `2026-11-22T07:30:40Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _, _) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// RFC 3339 with microseconds, as `metav1.MicroTime`: `2026-11-22T07:30:41.123456Z`.
pub fn rfc3339_micro(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _, us) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z")
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard or URL-safe base64, padded or not; `None` on bad input.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// URL-safe base64 without padding (continue tokens).
pub fn base64_url(data: &[u8]) -> String {
    base64(data)
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// Random bytes from the ring provider.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b)
        .expect("random bytes");
    b
}

/// A random (version 4) UUID string.
pub fn uuid() -> String {
    let mut b: [u8; 16] = random_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}
