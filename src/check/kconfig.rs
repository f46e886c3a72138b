//! Kernel `.config` files: parsed into option → value, so that checks can ask what a
//! kernel was built with, whether it came from `/proc/config.gz`, `/boot/config-*` or a
//! file from an image build.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::CheckError;

/// How the kernel was built with one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `=y`: built in.
    Yes,
    /// `=m`: a loadable module.
    Module,
    /// `# CONFIG_X is not set` or `=n`.
    No,
    /// A string or number value (`CONFIG_NR_CPUS=4`).
    Value(String),
}

/// A parsed kernel config. Options it does not mention are treated as not set, as the
/// kernel's own Kconfig does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelConfig {
    options: BTreeMap<String, Setting>,
}

impl KernelConfig {
    /// Parses `.config` text. Lines that are neither an assignment nor the `is not set`
    /// comment are ignored, so excerpts and hand-edited files read fine.
    pub fn parse(text: &str) -> KernelConfig {
        let mut options = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix('#') {
                if let Some(name) = rest.trim().strip_suffix(" is not set") {
                    let name = name.trim();
                    if name.starts_with("CONFIG_") && !name.contains(char::is_whitespace) {
                        options.insert(name.to_string(), Setting::No);
                    }
                }
                continue;
            }
            let Some((name, value)) = line.split_once('=') else {
                continue;
            };
            let name = name.trim();
            if !name.starts_with("CONFIG_") {
                continue;
            }
            let setting = match value.trim() {
                "y" => Setting::Yes,
                "m" => Setting::Module,
                "n" | "" => Setting::No,
                other => Setting::Value(other.trim_matches('"').to_string()),
            };
            options.insert(name.to_string(), setting);
        }
        KernelConfig { options }
    }

    /// Reads a `.config` file, gunzipping it when it is gzip (as `/proc/config.gz` is).
    pub fn read(path: &Path) -> Result<KernelConfig, CheckError> {
        let io = |source| CheckError::Read {
            path: path.to_path_buf(),
            source,
        };
        let bytes = std::fs::read(path).map_err(io)?;
        let text = if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut s = String::new();
            flate2::read::GzDecoder::new(bytes.as_slice())
                .read_to_string(&mut s)
                .map_err(io)?;
            s
        } else {
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(KernelConfig::parse(&text))
    }

    pub fn get(&self, name: &str) -> Option<&Setting> {
        self.options.get(name)
    }

    /// Built in or a module: either is enough for a feature holdfast can load or use.
    pub fn enabled(&self, name: &str) -> bool {
        matches!(self.get(name), Some(Setting::Yes | Setting::Module))
    }

    /// `y`, `m` or `not set`, for a report line.
    pub fn describe(&self, name: &str) -> String {
        match self.get(name) {
            Some(Setting::Yes) => format!("{name}=y"),
            Some(Setting::Module) => format!("{name}=m"),
            Some(Setting::Value(v)) => format!("{name}={v}"),
            Some(Setting::No) | None => format!("{name} not set"),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.options.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "#
# Automatically generated file; DO NOT EDIT.
# Linux/arm64 6.6.22 Kernel Configuration
#
CONFIG_CC_VERSION_TEXT=\"aarch64-linux-gnu-gcc (GCC) 13.2.0\"
CONFIG_NAMESPACES=y
CONFIG_OVERLAY_FS=m
# CONFIG_MEMCG is not set
CONFIG_USER_NS=n
CONFIG_NR_CPUS=4
  CONFIG_PID_NS = y
# CONFIG_VETH is a fine option
not a config line
CONFIG_EMPTY=
";

    #[test]
    fn assignments_comments_and_not_set() {
        let k = KernelConfig::parse(TEXT);
        assert_eq!(k.get("CONFIG_NAMESPACES"), Some(&Setting::Yes));
        assert_eq!(k.get("CONFIG_OVERLAY_FS"), Some(&Setting::Module));
        assert_eq!(k.get("CONFIG_MEMCG"), Some(&Setting::No));
        assert_eq!(k.get("CONFIG_USER_NS"), Some(&Setting::No));
        assert_eq!(k.get("CONFIG_PID_NS"), Some(&Setting::Yes));
        assert_eq!(k.get("CONFIG_EMPTY"), Some(&Setting::No));
        assert_eq!(k.get("CONFIG_NR_CPUS"), Some(&Setting::Value("4".into())));
        assert_eq!(
            k.get("CONFIG_CC_VERSION_TEXT"),
            Some(&Setting::Value("aarch64-linux-gnu-gcc (GCC) 13.2.0".into()))
        );
        // A comment that is not the `is not set` form says nothing about the option.
        assert_eq!(k.get("CONFIG_VETH"), None);
    }

    #[test]
    fn y_and_m_are_enabled_n_and_absent_are_not() {
        let k = KernelConfig::parse(TEXT);
        assert!(k.enabled("CONFIG_NAMESPACES"));
        assert!(k.enabled("CONFIG_OVERLAY_FS"));
        assert!(!k.enabled("CONFIG_MEMCG"));
        assert!(!k.enabled("CONFIG_USER_NS"));
        assert!(!k.enabled("CONFIG_VETH"));
        assert!(!k.enabled("CONFIG_NR_CPUS"));
        assert_eq!(k.describe("CONFIG_OVERLAY_FS"), "CONFIG_OVERLAY_FS=m");
        assert_eq!(k.describe("CONFIG_MEMCG"), "CONFIG_MEMCG not set");
        assert_eq!(k.describe("CONFIG_VETH"), "CONFIG_VETH not set");
    }

    #[test]
    fn gzip_is_read_like_plain_text() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("holdfast-kconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let gz = dir.join("config.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(TEXT.as_bytes()).expect("gzip");
        std::fs::write(&gz, enc.finish().expect("gzip")).expect("write");
        let plain = dir.join("config");
        std::fs::write(&plain, TEXT).expect("write");
        let a = KernelConfig::read(&gz).expect("read gz");
        let b = KernelConfig::read(&plain).expect("read plain");
        assert_eq!(a, b);
        assert!(!a.is_empty());
        assert!(matches!(
            KernelConfig::read(&dir.join("missing")),
            Err(CheckError::Read { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
