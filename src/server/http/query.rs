//! What a request names: its query (`key=value`, percent-decoded) and its path's
//! segments after the route's own.

use hyper::StatusCode;

use super::body::{error, Resp};

/// A request's query: every `key=value`, percent-decoded, in order.
#[derive(Debug, Default, Clone)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(q: &str) -> Query {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order (`command=sh&command=-c`).
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// A boolean as Go's strconv.ParseBool reads it; absent is false, present with no
    /// value is true (`?follow`).
    pub fn flag(&self, key: &str) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(false),
            Some("") | Some("1") | Some("t") | Some("T") | Some("true") | Some("TRUE")
            | Some("True") => Ok(true),
            Some("0") | Some("f") | Some("F") | Some("false") | Some("FALSE") | Some("False") => {
                Ok(false)
            }
            Some(other) => Err(format!("{key}: invalid boolean {other:?}")),
        }
    }

    /// An integer; absent is None.
    pub fn int(&self, key: &str) -> Result<Option<i64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{key}: invalid integer {v:?}")),
        }
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a container's route points (`/exec/{ns}/{pod}[/{uid}]/{container}`).
pub struct ContainerPath {
    pub ns: String,
    pub pod: String,
    pub uid: Option<String>,
    pub container: String,
}

/// A container route's segments; else the kubelet's 400.
pub fn container_path(path: &str) -> Result<ContainerPath, Box<Resp>> {
    let mut seg = segments(path);
    let uid = match seg.len() {
        3 => None,
        4 => Some(seg.remove(2)),
        _ => {
            return Err(Box::new(error(
                StatusCode::BAD_REQUEST,
                "missing namespace, pod or container",
            )))
        }
    };
    let container = seg.pop().unwrap_or_default();
    let pod = seg.pop().unwrap_or_default();
    let ns = seg.pop().unwrap_or_default();
    Ok(ContainerPath {
        ns,
        pod,
        uid,
        container,
    })
}

/// The path segments after the route's own (`/exec/ns/pod/c` → `[ns, pod, c]`),
/// percent-decoded.
pub fn segments(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .skip(1)
        .map(decode)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_repeat() {
        let q = Query::parse("command=sh&command=-c&command=echo%20hi+there&stdout=1&tty");
        assert_eq!(q.all("command"), vec!["sh", "-c", "echo hi there"]);
        assert_eq!(q.flag("stdout"), Ok(true));
        assert_eq!(q.flag("tty"), Ok(true));
        assert_eq!(q.flag("stdin"), Ok(false));
        assert!(Query::parse("follow=maybe").flag("follow").is_err());
        assert_eq!(Query::parse("tailLines=5").int("tailLines"), Ok(Some(5)));
        assert!(Query::parse("tailLines=x").int("tailLines").is_err());
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%41%zz"), "A%zz");
    }

    #[test]
    fn segments_are_decoded() {
        assert_eq!(segments("/exec/ns/my%2Dpod/c"), vec!["ns", "my-pod", "c"]);
    }
}
