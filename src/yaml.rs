//! YAML from outside (manifests, the config file, board profiles, the kubeconfig): read
//! with a bound on its size, then looked at for how deep it nests and how many nodes it
//! holds once its aliases are expanded, from libyaml's own event stream, before
//! serde_yaml decodes it. Every reader of such a file calls [`read_bounded`] and
//! [`prescan`].
//!
//! Why not leave it to serde_yaml: libyaml's scanner keeps one possible simple key per
//! open flow collection and walks all of them for every token, so a file of nested
//! `{a: {a: ...` costs the square of its depth (80 KB took 2.3 s on x86_64, 1 MiB would
//! take minutes on a gateway), and serde_yaml only applies its depth limit after the
//! whole document has been scanned. Its alias limit counts jumps, not the nodes they
//! copy, so a small file of aliases to aliases still decodes to gigabytes.
//!
//! Walking the same parser's events and stopping at the first collection past
//! [`MAX_DEPTH`] bounds the scanner's work by the depth, so this look is linear in the
//! file. It uses libyaml itself, not a lexer of our own, so no quoting, comment, block
//! scalar or indentation trick can make it see a different nesting from the decoder.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io::Read;
use std::mem::MaybeUninit;
use std::path::Path;

/// Deepest nesting of mappings and sequences allowed. A pod needs about a dozen levels
/// (spec.affinity.nodeAffinity...matchExpressions[].values[] is 11); 64 leaves room for
/// anything a pod spec holds while keeping the scanner's per-token work small. Measured
/// on x86_64 (release): the worst file let through (100 000 nodes nested 63 deep) is
/// looked at and decoded in 0.1 s; 100 000 nested arrays are refused in 2 ms, where
/// serde_yaml alone took 0.7 s, and 80 KB of nested maps 2.3 s, growing with the square.
pub const MAX_DEPTH: usize = 64;

/// Most nodes a file may hold, counting each alias as the nodes it copies. Real pods
/// have a few hundred to a few thousand; each node costs the decoder about 100 bytes.
pub const MAX_NODES: u64 = 100_000;

/// Ok when the text is shallow and small enough to decode, or is not valid YAML (the
/// decoder then says where). Err gives the reason, with the line and the bound, for the
/// reader to put after the file's name.
pub fn prescan(text: &str) -> Result<(), String> {
    let mut parser = Parser::new(text);
    let mut frames: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut total: u64 = 0;
    loop {
        let Some(event) = parser.next() else {
            return Ok(());
        };
        let added = match event.kind {
            Kind::StreamEnd => return Ok(()),
            Kind::DocumentStart => {
                // Anchors are scoped to their document, as serde_yaml's are.
                anchors.clear();
                frames.clear();
                continue;
            }
            Kind::Other => continue,
            Kind::Scalar => 1,
            Kind::Alias => {
                // An alias to an anchor not (yet) defined is the decoder's error to give.
                let copied = event
                    .anchor
                    .as_ref()
                    .and_then(|a| anchors.get(a))
                    .copied()
                    .unwrap_or(1);
                total = total.saturating_add(copied);
                if total > MAX_NODES {
                    return Err(too_many(event.line, true));
                }
                if let Some(top) = frames.last_mut() {
                    top.size = top.size.saturating_add(copied);
                }
                continue;
            }
            Kind::CollectionStart => {
                if frames.len() >= MAX_DEPTH {
                    return Err(format!(
                        "nested deeper than {MAX_DEPTH} levels (line {}); no pod, config or \
                         kubeconfig needs that many",
                        event.line
                    ));
                }
                total = total.saturating_add(1);
                if total > MAX_NODES {
                    return Err(too_many(event.line, false));
                }
                frames.push(Frame {
                    anchor: event.anchor,
                    size: 1,
                });
                continue;
            }
            Kind::CollectionEnd => {
                let Some(done) = frames.pop() else { continue };
                if let Some(name) = done.anchor {
                    anchors.insert(name, done.size);
                }
                if let Some(top) = frames.last_mut() {
                    top.size = top.size.saturating_add(done.size);
                }
                continue;
            }
        };
        total = total.saturating_add(added);
        if total > MAX_NODES {
            return Err(too_many(event.line, false));
        }
        if let Some(name) = event.anchor {
            anchors.insert(name, added);
        }
        if let Some(top) = frames.last_mut() {
            top.size = top.size.saturating_add(added);
        }
    }
}

/// Most bytes a YAML file from outside may hold. Real pod manifests, config files,
/// profiles and kubeconfigs are a few KiB; a pod must also fit the apiserver as a mirror
/// pod, whose etcd values stop at 1.5 MiB. 1 MiB keeps every real file while bounding
/// what one costs the device: at most 1 MiB read, and under a second of decoding on
/// x86_64 even nested to the depth allowed.
pub const MAX_BYTES: u64 = 1024 * 1024;

/// The text of the file at `path`, reading at most `max` + 1 bytes, so that a file
/// that is too large (or never ends, as /dev/zero) costs no more than the bound. A file
/// over `max` bytes is an `InvalidData` error naming its size and the bound, as is one
/// that is not UTF-8; the other errors are the system's.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bytes_bounded(path, max)?).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8: {}", e.utf8_error()),
        )
    })
}

/// As [`read_bounded`], for files that need not be text (certificates, keys).
pub fn read_bytes_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let too_large = |len: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("file is {len} bytes or more, larger than the {max} bytes allowed"),
        )
    };
    if len > max {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

fn too_many(line: u64, alias: bool) -> String {
    let how = if alias {
        " once its aliases are expanded"
    } else {
        ""
    };
    format!(
        "more than {MAX_NODES} YAML nodes{how} (line {line}); no pod, config or \
         kubeconfig needs that many"
    )
}

/// One open mapping or sequence: its anchor and how many nodes it holds so far.
struct Frame {
    anchor: Option<Vec<u8>>,
    size: u64,
}

enum Kind {
    StreamEnd,
    DocumentStart,
    Scalar,
    Alias,
    CollectionStart,
    CollectionEnd,
    Other,
}

struct Event {
    kind: Kind,
    anchor: Option<Vec<u8>>,
    /// 1-based.
    line: u64,
}

/// A libyaml parser over one string. Boxed: libyaml keeps a pointer to the parser inside
/// it once it has its input.
struct Parser<'a> {
    sys: Box<MaybeUninit<unsafe_libyaml::yaml_parser_t>>,
    _input: &'a str,
    initialised: bool,
    /// After an error libyaml must not be asked again.
    failed: bool,
}

impl<'a> Parser<'a> {
    #[allow(unsafe_code)]
    fn new(input: &'a str) -> Self {
        let mut sys = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
        let p = sys.as_mut_ptr();
        // SAFETY: `p` points to boxed memory that stays put for the parser's life;
        // initialize zeroes it and sets up its buffers (it cannot fail but by aborting
        // on allocation failure). The input outlives the parser (`_input` borrows it),
        // and `Drop` deletes the parser before the borrow ends.
        let ok = unsafe {
            let ok = !unsafe_libyaml::yaml_parser_initialize(p).fail;
            if ok {
                unsafe_libyaml::yaml_parser_set_encoding(p, unsafe_libyaml::YAML_UTF8_ENCODING);
                unsafe_libyaml::yaml_parser_set_input_string(p, input.as_ptr(), input.len() as u64);
            }
            ok
        };
        Parser {
            sys,
            _input: input,
            initialised: ok,
            failed: !ok,
        }
    }

    /// The next event, None at a syntax error (reported later by the decoder) or once
    /// the stream ended.
    #[allow(unsafe_code)]
    fn next(&mut self) -> Option<Event> {
        if self.failed {
            return None;
        }
        let p = self.sys.as_mut_ptr();
        let mut raw = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
        let e = raw.as_mut_ptr();
        // SAFETY: the parser was initialised in `new` (`failed` is false otherwise) and
        // has not reported an error, after which libyaml must not be called again. On success
        // the event is initialised; the anchor pointers are read only for the event
        // kinds whose union member holds them, are NUL-terminated strings owned by the
        // event, copied out before yaml_event_delete frees them.
        let event = unsafe {
            if unsafe_libyaml::yaml_parser_parse(p, e).fail {
                None
            } else {
                let anchor = |ptr: *mut u8| {
                    (!ptr.is_null()).then(|| CStr::from_ptr(ptr.cast()).to_bytes().to_vec())
                };
                let (kind, anchor) = match (*e).type_ {
                    unsafe_libyaml::YAML_STREAM_END_EVENT => (Kind::StreamEnd, None),
                    unsafe_libyaml::YAML_DOCUMENT_START_EVENT => (Kind::DocumentStart, None),
                    unsafe_libyaml::YAML_SCALAR_EVENT => {
                        (Kind::Scalar, anchor((*e).data.scalar.anchor))
                    }
                    unsafe_libyaml::YAML_ALIAS_EVENT => {
                        (Kind::Alias, anchor((*e).data.alias.anchor))
                    }
                    unsafe_libyaml::YAML_SEQUENCE_START_EVENT => (
                        Kind::CollectionStart,
                        anchor((*e).data.sequence_start.anchor),
                    ),
                    unsafe_libyaml::YAML_MAPPING_START_EVENT => (
                        Kind::CollectionStart,
                        anchor((*e).data.mapping_start.anchor),
                    ),
                    unsafe_libyaml::YAML_SEQUENCE_END_EVENT
                    | unsafe_libyaml::YAML_MAPPING_END_EVENT => (Kind::CollectionEnd, None),
                    _ => (Kind::Other, None),
                };
                let line = (*e).start_mark.line.saturating_add(1);
                unsafe_libyaml::yaml_event_delete(e);
                Some(Event { kind, anchor, line })
            }
        };
        if event.is_none() {
            self.failed = true;
        }
        event
    }
}

impl Drop for Parser<'_> {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.initialised {
            // SAFETY: the parser was initialised in `new`; it is deleted once, here.
            unsafe { unsafe_libyaml::yaml_parser_delete(self.sys.as_mut_ptr()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_flow(open: &str, close: &str, depth: usize) -> String {
        format!("{}1{}", open.repeat(depth), close.repeat(depth))
    }

    #[test]
    fn a_pod_manifest_passes() {
        let pod = "apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - key: kubernetes.io/arch
            operator: In
            values: [arm64, arm]
  containers:
  - name: web
    image: busybox
    command: [sh, -c, 'while [ ! -f /x ]; do [[[[ sleep 1; done']
    args:
    - |
      [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
      {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{
    env:
    - {name: A, value: \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}  # [[[[
";
        assert_eq!(prescan(pod), Ok(()));
    }

    #[test]
    fn nesting_at_the_bound_passes_and_past_it_is_refused() {
        assert_eq!(prescan(&nested_flow("[", "]", MAX_DEPTH)), Ok(()));
        for (open, close) in [("[", "]"), ("{a: ", "}"), ("[{a: ", "}]")] {
            let err = prescan(&nested_flow(open, close, MAX_DEPTH + 1)).expect_err(open);
            assert!(err.contains("nested deeper than 64 levels"), "{err}");
        }
    }

    #[test]
    fn block_nesting_counts_too() {
        let mut deep = String::new();
        for i in 0..=MAX_DEPTH {
            deep.push_str(&" ".repeat(i));
            deep.push_str("a:\n");
        }
        deep.push_str(&" ".repeat(MAX_DEPTH + 1));
        deep.push_str("b\n");
        let err = prescan(&deep).expect_err("deep block mapping");
        assert!(err.contains("nested deeper"), "{err}");
        // Sequences in sequences on one line are nested too.
        let err = prescan(&format!("{}x\n", "- ".repeat(MAX_DEPTH + 1))).expect_err("dashes");
        assert!(err.contains("nested deeper"), "{err}");
        // Mixed block and flow.
        let half = MAX_DEPTH / 2 + 1;
        let mut mixed = String::new();
        for i in 0..half {
            mixed.push_str(&" ".repeat(i));
            mixed.push_str("a:\n");
        }
        mixed.push_str(&" ".repeat(half));
        mixed.push_str(&format!("b: {}\n", nested_flow("[", "]", half)));
        assert!(prescan(&mixed).is_err());
    }

    #[test]
    fn brackets_in_strings_comments_and_block_scalars_do_not_count() {
        let many = "[".repeat(10_000);
        for text in [
            format!("a: '{many}'\n"),
            format!("a: \"{many}\"\n"),
            format!("a: b # {many}\n"),
            format!("a: |\n  {many}\n"),
            format!("a: x{many}\n"),
            format!("a: >-\n  {many}\n  {many}\nb: 1\n"),
        ] {
            assert_eq!(prescan(&text), Ok(()), "{}", &text[..20]);
        }
    }

    #[test]
    fn one_hundred_thousand_nested_arrays_are_refused_at_once() {
        let text = nested_flow("[", "]", 100_000);
        let started = std::time::Instant::now();
        assert!(prescan(&text).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // Never closed, and as maps: the same.
        assert!(prescan(&"[".repeat(100_000)).is_err());
        assert!(prescan(&"{a: ".repeat(100_000)).is_err());
    }

    #[test]
    fn alias_bombs_are_refused() {
        // Each level lists the one before ten times: 10^9 nodes from 400 bytes.
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let err = prescan(&text).expect_err("billion laughs");
        assert!(err.contains("once its aliases are expanded"), "{err}");
        // A few aliases, as a manifest might use to share an env list, are fine.
        let shared = "env: &env [{name: A, value: b}]\nmore: *env\nagain: *env\n";
        assert_eq!(prescan(shared), Ok(()));
    }

    #[test]
    fn anchors_belong_to_their_document() {
        let mut text = String::from("--- &big [");
        text.push_str(&"x, ".repeat(60_000));
        text.push_str("x]\n--- [*big, *big]\n");
        // The second document's aliases name no anchor of its own: counted as one node
        // each (the decoder refuses them), not as 60 000.
        assert_eq!(prescan(&text), Ok(()));
    }

    #[test]
    fn reads_stop_one_byte_past_the_bound() {
        let dir = std::env::temp_dir().join(format!("holdfast-yaml-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("f");
        std::fs::write(&path, "a: 1\n").expect("write");
        let at_bound = read_bounded(&path, 5);
        let over = read_bounded(&path, 4);
        std::fs::write(&path, b"a: \xff\n").expect("write");
        let not_text = read_bounded(&path, 5);
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(at_bound.expect("5 bytes of 5"), "a: 1\n");
        let over = over.expect_err("5 bytes of 4").to_string();
        assert!(
            over.contains("5 bytes or more, larger than the 4 bytes allowed"),
            "{over}"
        );
        assert!(not_text
            .expect_err("not UTF-8")
            .to_string()
            .contains("not UTF-8"));
        // A file that never ends (its size says 0) costs the bound, no more.
        let zero = read_bytes_bounded(Path::new("/dev/zero"), 1000).expect_err("endless");
        assert!(zero.to_string().contains("1001 bytes or more"), "{zero}");
    }

    #[test]
    fn not_yaml_is_left_to_the_decoder() {
        assert_eq!(prescan("a: [1, 2\nb: {"), Ok(()));
        assert_eq!(prescan(""), Ok(()));
        assert_eq!(prescan("\u{0}\u{1}"), Ok(()));
    }
}
