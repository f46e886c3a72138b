//! The D-Bus wire format (little-endian only, as every Linux bus speaks to its
//! clients): types from signatures, values marshalled with their alignment, and
//! messages (fixed header, header fields, body). Pure: no IO.
//!
//! Everything read comes from another process: every length is checked against the
//! bytes actually there before anything is allocated or sliced, nesting is bounded as
//! the specification bounds it, strings must be UTF-8 with their terminating NUL.

use super::DbusError;

/// The longest message accepted, header and body (the specification allows 128 MiB;
/// nothing the agent asks for or listens to comes near 1 MiB).
pub const MAX_MESSAGE: usize = 1 << 20;
/// Arrays and structs may each nest 32 deep.
const MAX_DEPTH: usize = 64;

/// A type, as a signature spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    Byte,
    Bool,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F64,
    Str,
    Path,
    Sig,
    Fd,
    Variant,
    Array(Box<Type>),
    Struct(Vec<Type>),
    Dict(Box<Type>, Box<Type>),
}

/// A value with its type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Byte(u8),
    Bool(bool),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Path(String),
    Sig(String),
    /// An index into the message's file descriptors.
    Fd(u32),
    Variant(Box<Value>),
    /// The element type, so that an empty array still has one.
    Array(Type, Vec<Value>),
    Struct(Vec<Value>),
    DictEntry(Box<(Value, Value)>),
}

fn protocol(what: impl Into<String>) -> DbusError {
    DbusError::Protocol(what.into())
}

/// Parses a signature into its complete types.
pub fn parse_signature(sig: &str) -> Result<Vec<Type>, DbusError> {
    if sig.len() > 255 {
        return Err(protocol("signature longer than 255 bytes"));
    }
    let bytes = sig.as_bytes();
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        out.push(one_type(bytes, &mut at, 0)?);
    }
    Ok(out)
}

fn one_type(b: &[u8], at: &mut usize, depth: usize) -> Result<Type, DbusError> {
    if depth > MAX_DEPTH {
        return Err(protocol("signature nested too deep"));
    }
    let c = *b
        .get(*at)
        .ok_or_else(|| protocol("signature ends inside a type"))?;
    *at += 1;
    Ok(match c {
        b'y' => Type::Byte,
        b'b' => Type::Bool,
        b'n' => Type::I16,
        b'q' => Type::U16,
        b'i' => Type::I32,
        b'u' => Type::U32,
        b'x' => Type::I64,
        b't' => Type::U64,
        b'd' => Type::F64,
        b's' => Type::Str,
        b'o' => Type::Path,
        b'g' => Type::Sig,
        b'h' => Type::Fd,
        b'v' => Type::Variant,
        b'a' if b.get(*at) == Some(&b'{') => {
            *at += 1;
            let key = one_type(b, at, depth + 1)?;
            if matches!(
                key,
                Type::Variant | Type::Array(_) | Type::Struct(_) | Type::Dict(..)
            ) {
                return Err(protocol("a dict entry's key must be a basic type"));
            }
            let value = one_type(b, at, depth + 1)?;
            if b.get(*at) != Some(&b'}') {
                return Err(protocol("dict entry not closed after two types"));
            }
            *at += 1;
            Type::Dict(Box::new(key), Box::new(value))
        }
        b'a' => Type::Array(Box::new(one_type(b, at, depth + 1)?)),
        b'(' => {
            let mut fields = Vec::new();
            while b.get(*at) != Some(&b')') {
                fields.push(one_type(b, at, depth + 1)?);
            }
            *at += 1;
            if fields.is_empty() {
                return Err(protocol("empty struct in signature"));
            }
            Type::Struct(fields)
        }
        other => return Err(protocol(format!("unknown type code {:?}", other as char))),
    })
}

impl Type {
    pub fn signature(&self) -> String {
        let mut s = String::new();
        self.write_signature(&mut s);
        s
    }

    fn write_signature(&self, s: &mut String) {
        let c = match self {
            Type::Byte => 'y',
            Type::Bool => 'b',
            Type::I16 => 'n',
            Type::U16 => 'q',
            Type::I32 => 'i',
            Type::U32 => 'u',
            Type::I64 => 'x',
            Type::U64 => 't',
            Type::F64 => 'd',
            Type::Str => 's',
            Type::Path => 'o',
            Type::Sig => 'g',
            Type::Fd => 'h',
            Type::Variant => 'v',
            Type::Array(t) => {
                s.push('a');
                return t.write_signature(s);
            }
            Type::Struct(fields) => {
                s.push('(');
                fields.iter().for_each(|f| f.write_signature(s));
                s.push(')');
                return;
            }
            Type::Dict(k, v) => {
                s.push_str("a{");
                k.write_signature(s);
                v.write_signature(s);
                s.push('}');
                return;
            }
        };
        s.push(c);
    }

    fn alignment(&self) -> usize {
        match self {
            Type::Byte | Type::Sig | Type::Variant => 1,
            Type::I16 | Type::U16 => 2,
            Type::Bool | Type::I32 | Type::U32 | Type::Str | Type::Path | Type::Fd => 4,
            Type::Array(_) | Type::Dict(..) => 4,
            Type::I64 | Type::U64 | Type::F64 | Type::Struct(_) => 8,
        }
    }
}

impl Value {
    /// The value's type.
    pub fn type_of(&self) -> Type {
        match self {
            Value::Byte(_) => Type::Byte,
            Value::Bool(_) => Type::Bool,
            Value::I16(_) => Type::I16,
            Value::U16(_) => Type::U16,
            Value::I32(_) => Type::I32,
            Value::U32(_) => Type::U32,
            Value::I64(_) => Type::I64,
            Value::U64(_) => Type::U64,
            Value::F64(_) => Type::F64,
            Value::Str(_) => Type::Str,
            Value::Path(_) => Type::Path,
            Value::Sig(_) => Type::Sig,
            Value::Fd(_) => Type::Fd,
            Value::Variant(_) => Type::Variant,
            Value::Array(t, _) => match t {
                // An array of dict entries is a dict.
                Type::Dict(k, v) => Type::Dict(k.clone(), v.clone()),
                t => Type::Array(Box::new(t.clone())),
            },
            Value::Struct(f) => Type::Struct(f.iter().map(Value::type_of).collect()),
            Value::DictEntry(e) => Type::Dict(Box::new(e.0.type_of()), Box::new(e.1.type_of())),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) | Value::Path(s) | Value::Sig(s) => Some(s),
            _ => None,
        }
    }
}

/// The signature of a body of values.
pub fn signature_of(values: &[Value]) -> String {
    values.iter().map(|v| v.type_of().signature()).collect()
}

/// Writes values, each at its alignment counted from the start of the buffer.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    fn pad(&mut self, align: usize) {
        while !self.buf.len().is_multiple_of(align) {
            self.buf.push(0);
        }
    }

    fn u32(&mut self, n: u32) {
        self.pad(4);
        self.buf.extend_from_slice(&n.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.u32(u32::try_from(s.len()).unwrap_or(u32::MAX));
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    fn sig(&mut self, s: &str) {
        self.buf.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    pub fn value(&mut self, v: &Value) {
        match v {
            Value::Byte(b) => self.buf.push(*b),
            Value::Bool(b) => self.u32(u32::from(*b)),
            Value::I16(n) => self.fixed(2, &n.to_le_bytes()),
            Value::U16(n) => self.fixed(2, &n.to_le_bytes()),
            Value::I32(n) => self.fixed(4, &n.to_le_bytes()),
            Value::U32(n) | Value::Fd(n) => self.u32(*n),
            Value::I64(n) => self.fixed(8, &n.to_le_bytes()),
            Value::U64(n) => self.fixed(8, &n.to_le_bytes()),
            Value::F64(n) => self.fixed(8, &n.to_le_bytes()),
            Value::Str(s) | Value::Path(s) => self.string(s),
            Value::Sig(s) => self.sig(s),
            Value::Variant(inner) => {
                self.sig(&inner.type_of().signature());
                self.value(inner);
            }
            Value::Array(t, items) => {
                self.u32(0);
                let len_at = self.buf.len() - 4;
                // The length does not count the padding before the first element.
                let align = match t {
                    Type::Dict(..) => 8,
                    t => t.alignment(),
                };
                self.pad(align);
                let start = self.buf.len();
                items.iter().for_each(|i| self.value(i));
                let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
                self.buf[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
            }
            Value::Struct(fields) => {
                self.pad(8);
                fields.iter().for_each(|f| self.value(f));
            }
            Value::DictEntry(e) => {
                self.pad(8);
                self.value(&e.0);
                self.value(&e.1);
            }
        }
    }

    fn fixed(&mut self, align: usize, bytes: &[u8]) {
        self.pad(align);
        self.buf.extend_from_slice(bytes);
    }
}

/// Reads values from a buffer whose first byte is at alignment 0.
pub struct Reader<'a> {
    buf: &'a [u8],
    pub at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn align(&mut self, align: usize) -> Result<(), DbusError> {
        let to = self.at.next_multiple_of(align);
        let pad = self.take(to - self.at)?;
        if pad.iter().any(|b| *b != 0) {
            return Err(protocol("non-zero padding"));
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DbusError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| protocol("value runs past the end of the message"))?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DbusError> {
        self.align(N)?;
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u32(&mut self) -> Result<u32, DbusError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn text(&mut self, len: usize) -> Result<String, DbusError> {
        let bytes = self.take(len)?;
        if self.take(1)? != [0] {
            return Err(protocol("string not terminated by NUL"));
        }
        if bytes.contains(&0) {
            return Err(protocol("NUL inside a string"));
        }
        String::from_utf8(bytes.to_vec()).map_err(|_| protocol("string not UTF-8"))
    }

    fn string(&mut self) -> Result<String, DbusError> {
        let len = self.u32()? as usize;
        self.text(len)
    }

    fn sig(&mut self) -> Result<String, DbusError> {
        let len = usize::from(self.take(1)?[0]);
        self.text(len)
    }

    /// Reads one value of type `t`.
    pub fn value(&mut self, t: &Type) -> Result<Value, DbusError> {
        self.value_at(t, 0)
    }

    fn value_at(&mut self, t: &Type, depth: usize) -> Result<Value, DbusError> {
        if depth > MAX_DEPTH {
            return Err(protocol("value nested too deep"));
        }
        Ok(match t {
            Type::Byte => Value::Byte(self.take(1)?[0]),
            Type::Bool => match self.u32()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                n => return Err(protocol(format!("boolean {n}"))),
            },
            Type::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            Type::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            Type::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            Type::U32 => Value::U32(self.u32()?),
            Type::Fd => Value::Fd(self.u32()?),
            Type::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            Type::U64 => Value::U64(u64::from_le_bytes(self.array()?)),
            Type::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
            Type::Str => Value::Str(self.string()?),
            Type::Path => Value::Path(self.string()?),
            Type::Sig => Value::Sig(self.sig()?),
            Type::Variant => {
                let sig = self.sig()?;
                let mut types = parse_signature(&sig)?;
                if types.len() != 1 {
                    return Err(protocol("a variant holds one complete type"));
                }
                let inner = types.remove(0);
                Value::Variant(Box::new(self.value_at(&inner, depth + 1)?))
            }
            Type::Array(elem) => {
                let items = self.elements(elem, 4.max(elem.alignment()), depth)?;
                Value::Array((**elem).clone(), items)
            }
            Type::Dict(..) => Value::Array(t.clone(), self.elements(t, 8, depth)?),
            Type::Struct(fields) => {
                self.align(8)?;
                let mut out = Vec::with_capacity(fields.len());
                for f in fields {
                    out.push(self.value_at(f, depth + 1)?);
                }
                Value::Struct(out)
            }
        })
    }

    /// An array's elements; `elem` is a `Dict` for a dict's entries.
    fn elements(
        &mut self,
        elem: &Type,
        align: usize,
        depth: usize,
    ) -> Result<Vec<Value>, DbusError> {
        let len = self.u32()? as usize;
        if len > (1 << 26) {
            return Err(protocol("array longer than 64 MiB"));
        }
        self.align(align)?;
        let end = self
            .at
            .checked_add(len)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| protocol("array runs past the end of the message"))?;
        // No element is empty, so the count is bounded by the bytes checked above.
        let mut items = Vec::new();
        while self.at < end {
            let item = match elem {
                Type::Dict(k, v) => {
                    self.align(8)?;
                    let key = self.value_at(k, depth + 1)?;
                    let value = self.value_at(v, depth + 1)?;
                    Value::DictEntry(Box::new((key, value)))
                }
                t => self.value_at(t, depth + 1)?,
            };
            items.push(item);
        }
        if self.at != end {
            return Err(protocol("array elements overrun its length"));
        }
        Ok(items)
    }
}

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Call = 1,
    Return = 2,
    Error = 3,
    Signal = 4,
}

/// A message without its file descriptors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Header {
    pub kind: Option<Kind>,
    pub flags: u8,
    pub serial: u32,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
    pub error_name: Option<String>,
    pub reply_serial: Option<u32>,
    pub destination: Option<String>,
    pub sender: Option<String>,
    pub signature: String,
    pub unix_fds: u32,
}

/// The flag: no reply is wanted.
pub const NO_REPLY_EXPECTED: u8 = 1;

/// A whole message: header and body values.
pub fn encode(header: &Header, body: &[Value]) -> Vec<u8> {
    let mut b = Writer::default();
    body.iter().for_each(|v| b.value(v));
    let mut fields = Vec::new();
    let mut field = |code: u8, v: Value| {
        fields.push(Value::Struct(vec![
            Value::Byte(code),
            Value::Variant(Box::new(v)),
        ]));
    };
    let strings = [
        (1, header.path.as_ref().map(|p| Value::Path(p.clone()))),
        (2, header.interface.clone().map(Value::Str)),
        (3, header.member.clone().map(Value::Str)),
        (4, header.error_name.clone().map(Value::Str)),
        (5, header.reply_serial.map(Value::U32)),
        (6, header.destination.clone().map(Value::Str)),
        (7, header.sender.clone().map(Value::Str)),
    ];
    for (code, v) in strings {
        if let Some(v) = v {
            field(code, v);
        }
    }
    let sig = signature_of(body);
    if !sig.is_empty() {
        field(8, Value::Sig(sig));
    }
    if header.unix_fds > 0 {
        field(9, Value::U32(header.unix_fds));
    }
    let mut w = Writer::default();
    w.buf
        .extend_from_slice(&[b'l', header.kind.map_or(0, |k| k as u8), header.flags, 1]);
    w.u32(u32::try_from(b.buf.len()).unwrap_or(u32::MAX));
    w.u32(header.serial);
    let field_type = Type::Struct(vec![Type::Byte, Type::Variant]);
    w.value(&Value::Array(field_type, fields));
    w.pad(8);
    w.buf.extend_from_slice(&b.buf);
    w.buf
}

/// How long the message starting `fixed` (its first 16 bytes) is in all, checked
/// against [`MAX_MESSAGE`] before anything of it is read.
pub fn message_len(fixed: &[u8; 16]) -> Result<usize, DbusError> {
    if fixed[0] != b'l' {
        return Err(protocol("big-endian message (the bus should not send one)"));
    }
    if fixed[3] != 1 {
        return Err(protocol(format!("protocol version {}", fixed[3])));
    }
    let body = u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]) as usize;
    let fields = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]) as usize;
    let total = 16usize
        .checked_add(fields)
        .map(|n| n.next_multiple_of(8))
        .and_then(|n| n.checked_add(body))
        .filter(|n| *n <= MAX_MESSAGE)
        .ok_or_else(|| protocol(format!("message of {body} + {fields} bytes refused")))?;
    Ok(total)
}

/// Decodes a whole message (as long as [`message_len`] said).
pub fn decode(msg: &[u8]) -> Result<(Header, Vec<Value>), DbusError> {
    let mut r = Reader::new(msg);
    let fixed = r.take(4)?;
    let kind = match fixed[1] {
        1 => Kind::Call,
        2 => Kind::Return,
        3 => Kind::Error,
        4 => Kind::Signal,
        // Unknown types must be ignored: read as nothing.
        _ => return Ok((Header::default(), Vec::new())),
    };
    let mut h = Header {
        kind: Some(kind),
        flags: fixed[2],
        ..Header::default()
    };
    let body_len = r.u32()? as usize;
    h.serial = r.u32()?;
    let field_type = Type::Array(Box::new(Type::Struct(vec![Type::Byte, Type::Variant])));
    let Value::Array(_, fields) = r.value(&field_type)? else {
        return Err(protocol("header fields"));
    };
    for f in fields {
        header_field(&mut h, f)?;
    }
    r.align(8)?;
    let body = &msg[r.at..];
    if body.len() != body_len {
        return Err(protocol("body length does not match the header"));
    }
    let mut br = Reader::new(body);
    let mut values = Vec::new();
    for t in parse_signature(&h.signature)? {
        values.push(br.value(&t)?);
    }
    if br.at != body.len() {
        return Err(protocol("bytes left after the body's values"));
    }
    Ok((h, values))
}

fn header_field(h: &mut Header, field: Value) -> Result<(), DbusError> {
    let Value::Struct(mut f) = field else {
        return Err(protocol("header field"));
    };
    let (Some(Value::Variant(v)), Some(Value::Byte(code))) = (f.pop(), f.pop()) else {
        return Err(protocol("header field"));
    };
    let text = || v.as_str().map(str::to_owned);
    match code {
        1 => h.path = text(),
        2 => h.interface = text(),
        3 => h.member = text(),
        4 => h.error_name = text(),
        5 => {
            h.reply_serial = if let Value::U32(n) = *v {
                Some(n)
            } else {
                None
            }
        }
        6 => h.destination = text(),
        7 => h.sender = text(),
        8 => h.signature = text().unwrap_or_default(),
        9 => h.unix_fds = if let Value::U32(n) = *v { n } else { 0 },
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(member: &str) -> Header {
        Header {
            kind: Some(Kind::Call),
            serial: 7,
            path: Some("/org/freedesktop/login1".into()),
            interface: Some("org.freedesktop.login1.Manager".into()),
            member: Some(member.into()),
            destination: Some("org.freedesktop.login1".into()),
            ..Header::default()
        }
    }

    #[test]
    fn a_hello_is_the_bytes_the_specification_gives() {
        let h = Header {
            kind: Some(Kind::Call),
            serial: 1,
            path: Some("/org/freedesktop/DBus".into()),
            interface: Some("org.freedesktop.DBus".into()),
            member: Some("Hello".into()),
            destination: Some("org.freedesktop.DBus".into()),
            ..Header::default()
        };
        let bytes = encode(&h, &[]);
        // Fixed part: 'l', method call, no flags, version 1, empty body, serial 1.
        assert_eq!(
            &bytes[..12],
            b"l\x01\x00\x01\x00\x00\x00\x00\x01\x00\x00\x00"
        );
        // The path field: code 1, signature "o", then the string at offset 4 of the
        // struct (the struct starts 8-aligned at 16).
        assert_eq!(&bytes[16..24], b"\x01\x01o\x00\x15\x00\x00\x00");
        assert_eq!(&bytes[24..46], b"/org/freedesktop/DBus\x00");
        assert_eq!(bytes.len() % 8, 0);
        let (back, body) = decode(&bytes).expect("decode");
        assert_eq!(back, h);
        assert!(body.is_empty());
    }

    #[test]
    fn an_inhibit_call_and_its_fd_reply_round_trip() {
        let body = vec![
            Value::Str("shutdown".into()),
            Value::Str("holdfast".into()),
            Value::Str("stop pods".into()),
            Value::Str("delay".into()),
        ];
        let bytes = encode(&call("Inhibit"), &body);
        let (h, back) = decode(&bytes).expect("decode");
        assert_eq!(h.signature, "ssss");
        assert_eq!(back, body);
        let reply = Header {
            kind: Some(Kind::Return),
            reply_serial: Some(7),
            unix_fds: 1,
            ..Header::default()
        };
        let (h, back) = decode(&encode(&reply, &[Value::Fd(0)])).expect("decode");
        assert_eq!(
            (h.reply_serial, h.unix_fds, h.signature.as_str()),
            (Some(7), 1, "h")
        );
        assert_eq!(back, vec![Value::Fd(0)]);
    }

    #[test]
    fn nested_values_keep_their_alignment() {
        let inhibitor = |who: &str, pid: u32| {
            Value::Struct(vec![
                Value::Str("shutdown".into()),
                Value::Str(who.into()),
                Value::Str("why".into()),
                Value::Str("delay".into()),
                Value::U32(0),
                Value::U32(pid),
            ])
        };
        let elem = parse_signature("(ssssuu)").expect("sig").remove(0);
        let list = Value::Array(elem, vec![inhibitor("holdfast", 42), inhibitor("x", 7)]);
        let dict = Value::Array(
            parse_signature("a{sv}").expect("sig").remove(0),
            vec![Value::DictEntry(Box::new((
                Value::Str("InhibitDelayMaxUSec".into()),
                Value::Variant(Box::new(Value::U64(30_000_000))),
            )))],
        );
        let body = vec![
            Value::Byte(1),
            list,
            Value::Byte(2),
            dict,
            Value::Bool(true),
        ];
        let bytes = encode(&call("X"), &body);
        let (h, back) = decode(&bytes).expect("decode");
        assert_eq!(h.signature, "ya(ssssuu)ya{sv}b");
        assert_eq!(back, body);
        // An empty array of 8-aligned elements still pads to its first element.
        let empty = vec![Value::Array(Type::U64, vec![])];
        let (_, back) = decode(&encode(&call("Y"), &empty)).expect("decode");
        assert_eq!(back, empty);
    }

    #[test]
    fn lengths_from_the_peer_are_checked_before_use() {
        // A header that claims a body of 4 GiB is refused before anything is read.
        let mut fixed = [0u8; 16];
        fixed[..4].copy_from_slice(b"l\x02\x00\x01");
        fixed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(message_len(&fixed).is_err());
        fixed[4..8].copy_from_slice(&8u32.to_le_bytes());
        fixed[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(message_len(&fixed).is_err());
        // A string, array or signature longer than what is there.
        let mut bytes = encode(&call("Z"), &[Value::Str("abc".into())]);
        let body_at = bytes.len() - 8;
        bytes[body_at..body_at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode(&bytes).is_err());
        let mut r = Reader::new(b"\xff\xff\xff\x7f");
        assert!(r.value(&Type::Array(Box::new(Type::Byte))).is_err());
        let mut r = Reader::new(b"\x05ab\x00");
        assert!(r.value(&Type::Sig).is_err());
        // Every truncation of a valid message is an error, never a panic.
        let good = encode(
            &call("Inhibit"),
            &[Value::Str("shutdown".into()), Value::U64(1)],
        );
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "truncated to {n}");
        }
    }

    #[test]
    fn bad_signatures_and_values_are_refused() {
        for sig in ["a", "(", "()", "a{vs}", "a{ss", "z", "(i"] {
            assert!(parse_signature(sig).is_err(), "{sig}");
        }
        let deep = format!("{}i", "a".repeat(70));
        assert!(parse_signature(&deep).is_err());
        assert!(Reader::new(b"\x02\x00\x00\x00").value(&Type::Bool).is_err());
        assert!(Reader::new(b"\x01\x00\x00\x00\xff\x00")
            .value(&Type::Str)
            .is_err());
        assert!(Reader::new(b"\x01\x00\x00\x00a\x01")
            .value(&Type::Str)
            .is_err());
    }
}
