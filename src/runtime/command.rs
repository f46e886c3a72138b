//! A container's command line and environment by Kubernetes rules: `command` replaces
//! the image's Entrypoint and drops its Cmd, `args` alone replace Cmd, and `$(VAR)` in
//! command and args expands from the container's own env (resolved by `sync::env`,
//! which expands env values with [`expand`] too).
//!
//! Sizes are bounded before anything is allocated: `$(VAR)` turns four bytes of
//! manifest into a whole variable (up to 128 KiB), so each argument's expanded length is
//! counted first with [`expanded_len`] and refused past [`MAX_ARG_STRLEN`], and the
//! whole command line past [`MAX_ARGV_BYTES`].

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Container;
use oci_spec::image::Config as ImageConfig;

use super::RuntimeError;

/// The `PATH` a container starts from, as containerd's default spec gives it: an
/// image whose config sets no `PATH` (built `FROM scratch`, or by a tool that writes
/// no Env) still finds its `sh`.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The most one argument or `NAME=value` may take with its NUL: the kernel's
/// `MAX_ARG_STRLEN` (32 pages of 4 KiB). execve refuses a longer string with E2BIG, so
/// no container could start with one; refusing it here costs nothing that could run.
pub const MAX_ARG_STRLEN: usize = 128 * 1024;

/// The most a container's command line may take, every argument and its NUL added up.
/// execve takes argv and the environment together up to a quarter of the stack limit
/// (2 MiB under the usual 8 MiB); the environment the pod spec sets has 1 MiB of it
/// ([`spec::MAX_ENV_BYTES`](super::spec::MAX_ENV_BYTES)), so the command line gets the
/// other 1 MiB. A real command line is a few hundred bytes; a bigger one is a mistake
/// or an attack.
pub const MAX_ARGV_BYTES: usize = 1024 * 1024;

/// The container's environment as `NAME=value` strings: [`DEFAULT_PATH`], the image's
/// Env, then the container's own variables (already resolved, see `sync::env`), a
/// later name replacing an earlier one in place (containerd's order).
///
/// Also returns the container's own variables, which are what `$(VAR)` in command and
/// args refers to.
pub fn environment(
    own: &[(String, String)],
    image: Option<&ImageConfig>,
) -> Result<(Vec<String>, HashMap<String, String>), RuntimeError> {
    let mut ordered: Vec<(String, String)> = vec![("PATH".to_owned(), DEFAULT_PATH.to_owned())];
    // By name, so that a hundred thousand variables merge in linear time.
    let mut index: HashMap<String, usize> = HashMap::from([("PATH".to_owned(), 0)]);
    let mut set =
        |name: &str, value: String, ordered: &mut Vec<(String, String)>| match index.get(name) {
            Some(&i) => ordered[i].1 = value,
            None => {
                index.insert(name.to_owned(), ordered.len());
                ordered.push((name.to_owned(), value));
            }
        };
    for entry in image.and_then(|c| c.env().as_ref()).into_iter().flatten() {
        let (name, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        set(name, value.to_owned(), &mut ordered);
    }

    let mut vars: HashMap<String, String> = HashMap::new();
    for (name, value) in own {
        if name.is_empty() || name.contains('=') {
            // Names never reach here unchecked; the message names no value.
            return Err(RuntimeError::Config(format!(
                "env name {name:?} is not valid"
            )));
        }
        vars.insert(name.clone(), value.clone());
        set(name, value.clone(), &mut ordered);
    }
    let env = ordered
        .into_iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    Ok((env, vars))
}

/// The process's argv. Each argument is measured before it is expanded, and refused
/// past [`MAX_ARG_STRLEN`]; the whole of it past [`MAX_ARGV_BYTES`].
pub fn argv(
    container: &Container,
    image: Option<&ImageConfig>,
    env: &HashMap<String, String>,
) -> Result<Vec<String>, RuntimeError> {
    let none: &[String] = &[];
    let entrypoint = image
        .and_then(|c| c.entrypoint().as_deref())
        .unwrap_or(none);
    let cmd = image.and_then(|c| c.cmd().as_deref()).unwrap_or(none);
    let command = container.command.as_deref().unwrap_or(none);
    let args = container.args.as_deref().unwrap_or(none);

    // (where it comes from, its words, whether `$(VAR)` expands in them)
    let parts: [(&str, &[String], bool); 2] = match (command.is_empty(), args.is_empty()) {
        (false, _) => [("command", command, true), ("args", args, true)],
        (true, false) => [
            ("the image's Entrypoint", entrypoint, false),
            ("args", args, true),
        ],
        (true, true) => [
            ("the image's Entrypoint", entrypoint, false),
            ("the image's Cmd", cmd, false),
        ],
    };
    let mut total = 0usize;
    for (field, words, expands) in parts {
        for (i, word) in words.iter().enumerate() {
            let len = if expands {
                expanded_len(word, env)
            } else {
                word.len()
            };
            let bytes = len.saturating_add(1);
            if bytes > MAX_ARG_STRLEN {
                return Err(RuntimeError::Config(format!(
                    "container {:?}: {field}[{i}] would take {bytes} bytes ($(VAR) \
                     references expanded, with its NUL), more than the {MAX_ARG_STRLEN} \
                     bytes one argument may take (the kernel's MAX_ARG_STRLEN): shorten it \
                     or the variables it refers to",
                    container.name
                )));
            }
            total = total.saturating_add(bytes);
            if total > MAX_ARGV_BYTES {
                return Err(RuntimeError::Config(format!(
                    "container {:?}: the command line would take {total} bytes up to \
                     {field}[{i}] ($(VAR) references expanded), more than the \
                     {MAX_ARGV_BYTES} bytes (1 MiB) a command line may take: pass large \
                     data in a volume instead",
                    container.name
                )));
            }
        }
    }

    let argv: Vec<String> = parts
        .iter()
        .flat_map(|(_, words, expands)| {
            words
                .iter()
                .map(move |w| if *expands { expand(w, env) } else { w.clone() })
        })
        .collect();
    if argv.first().is_none_or(|a| a.is_empty()) {
        return Err(RuntimeError::Config(format!(
            "container {:?}: no command given and the image has none",
            container.name
        )));
    }
    Ok(argv)
}

/// Kubernetes `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`,
/// anything else (unknown names, unclosed references) stays as written.
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match vars.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The length [`expand`] gives `input`, counted without building it (saturating): the
/// same grammar, so an expansion is refused before it allocates.
pub fn expanded_len(input: &str, vars: &HashMap<String, String>) -> usize {
    let mut len = 0usize;
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        len = len.saturating_add(pos);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            len = len.saturating_add(1);
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    // An unknown name stays as written: `$(`, the name and `)`.
                    let value = vars
                        .get(name)
                        .map_or(name.len().saturating_add(3), String::len);
                    len = len.saturating_add(value);
                    rest = &inner[end + 1..];
                }
                None => {
                    len = len.saturating_add(2);
                    rest = inner;
                }
            }
        } else {
            len = len.saturating_add(1);
            rest = after;
        }
    }
    len.saturating_add(rest.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::image::ConfigBuilder;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn image(entrypoint: &[&str], cmd: &[&str], env: &[&str]) -> ImageConfig {
        let to = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ConfigBuilder::default()
            .entrypoint(to(entrypoint))
            .cmd(to(cmd))
            .env(to(env))
            .build()
            .expect("image config")
    }

    fn container(command: &[&str], args: &[&str]) -> Container {
        let to = |v: &[&str]| (!v.is_empty()).then(|| v.iter().map(|s| s.to_string()).collect());
        Container {
            name: "c".into(),
            command: to(command),
            args: to(args),
            ..Default::default()
        }
    }

    fn pairs(env: &[(&str, &str)]) -> Vec<(String, String)> {
        env.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expansion() {
        let v = vars(&[("A", "x"), ("B", "y y")]);
        assert_eq!(expand("$(A)", &v), "x");
        assert_eq!(expand("pre-$(A)-$(B)-post", &v), "pre-x-y y-post");
        assert_eq!(expand("$$(A)", &v), "$(A)");
        assert_eq!(expand("$(UNKNOWN)", &v), "$(UNKNOWN)");
        assert_eq!(expand("$A $", &v), "$A $");
        assert_eq!(expand("$(A", &v), "$(A");
        assert_eq!(expand("$$$$", &v), "$$");
        assert_eq!(expand("$()", &v), "$()");
    }

    #[test]
    fn command_and_args_rules() {
        let img = image(&["/entry"], &["cmd1", "cmd2"], &[]);
        let env = HashMap::new();
        let c = container(&[], &[]);
        assert_eq!(
            argv(&c, Some(&img), &env).ok(),
            Some(vec!["/entry".into(), "cmd1".into(), "cmd2".into()])
        );
        let c = container(&["/bin/sh", "-c"], &[]);
        assert_eq!(
            argv(&c, Some(&img), &env).ok(),
            Some(vec!["/bin/sh".into(), "-c".into()])
        );
        let c = container(&[], &["a1"]);
        assert_eq!(
            argv(&c, Some(&img), &env).ok(),
            Some(vec!["/entry".into(), "a1".into()])
        );
        let c = container(&["/x"], &["a1"]);
        assert_eq!(
            argv(&c, Some(&img), &env).ok(),
            Some(vec!["/x".into(), "a1".into()])
        );
        let empty = image(&[], &[], &[]);
        assert!(matches!(
            argv(&container(&[], &[]), Some(&empty), &env),
            Err(RuntimeError::Config(_))
        ));
    }

    #[test]
    fn env_merge_and_expansion() {
        let img = image(&[], &["sh"], &["PATH=/bin", "A=image", "NOVALUE"]);
        let c = container(&["echo", "$(A)", "$(PATH)", "$$(A)"], &[]);
        let own = pairs(&[("A", "mine"), ("B", "mine-b")]);
        let (env, vars) = environment(&own, Some(&img)).expect("env");
        assert_eq!(env, vec!["PATH=/bin", "A=mine", "NOVALUE=", "B=mine-b"]);
        // Only the container's own env expands: PATH came from the image.
        let args = argv(&c, Some(&img), &vars).expect("argv");
        assert_eq!(args, vec!["echo", "mine", "$(PATH)", "$(A)"]);
    }

    #[test]
    fn an_image_without_path_gets_the_default_one() {
        let img = image(&[], &["sh"], &["HOME=/root"]);
        let (env, _) = environment(&pairs(&[("A", "x")]), Some(&img)).expect("env");
        assert_eq!(
            env,
            vec![
                format!("PATH={DEFAULT_PATH}"),
                "HOME=/root".into(),
                "A=x".into()
            ]
        );
        let (env, _) = environment(&[], None).expect("env");
        assert_eq!(env, vec![format!("PATH={DEFAULT_PATH}")]);
        // The pod's own PATH wins, in the same place.
        let (env, _) = environment(&pairs(&[("PATH", "/opt/bin")]), Some(&img)).expect("env");
        assert_eq!(env, vec!["PATH=/opt/bin", "HOME=/root"]);
    }

    #[test]
    fn a_bad_name_is_a_config_error() {
        let err = environment(&pairs(&[("A=B", "x")]), None).expect_err("bad name");
        assert!(matches!(err, RuntimeError::Config(_)), "{err}");
    }

    fn config_message(result: Result<Vec<String>, RuntimeError>) -> String {
        match result {
            Err(RuntimeError::Config(m)) => m,
            Err(other) => panic!("not a config error: {other}"),
            Ok(argv) => panic!("accepted {} arguments", argv.len()),
        }
    }

    #[test]
    fn an_argument_that_expands_past_max_arg_strlen_is_refused() {
        // Two references to a 100 000-byte variable: 200 000 bytes from 14 of manifest.
        let v = vars(&[("V", &"x".repeat(100_000))]);
        let img = image(&[], &["sh"], &[]);
        let c = container(&["sh", "-c", "true", "$(V)$(V)"], &[]);
        let message = config_message(argv(&c, Some(&img), &v));
        assert_eq!(
            message,
            "container \"c\": command[3] would take 200001 bytes ($(VAR) references \
             expanded, with its NUL), more than the 131072 bytes one argument may take (the \
             kernel's MAX_ARG_STRLEN): shorten it or the variables it refers to"
        );
        let c = container(&["sh"], &["ok", "$(V)$(V)"]);
        assert!(config_message(argv(&c, Some(&img), &v)).contains("args[1] would take 200001"));
        // One reference is within the bound, and comes out whole.
        let c = container(&["echo"], &["$(V)"]);
        let args = argv(&c, Some(&img), &v).expect("one variable fits");
        assert_eq!(args[1].len(), 100_000);
        // Exactly at the bound with the NUL: accepted; one byte more: refused.
        let v = vars(&[("V", &"x".repeat(MAX_ARG_STRLEN - 1))]);
        assert!(argv(&container(&["$(V)"], &[]), None, &v).is_ok());
        let c = container(&["x$(V)"], &[]);
        assert!(config_message(argv(&c, None, &v)).contains("command[0] would take 131073"));
    }

    #[test]
    fn a_command_line_past_one_mebibyte_is_refused() {
        // Each argument fits, but ten of them (1.2 MB) are more than a command line may
        // take.
        let v = vars(&[("V", &"x".repeat(120_000))]);
        let mut command = vec!["echo"];
        command.extend(std::iter::repeat_n("$(V)", 10));
        let message = config_message(argv(&container(&command, &[]), None, &v));
        assert_eq!(
            message,
            "container \"c\": the command line would take 1080014 bytes up to command[9] \
             ($(VAR) references expanded), more than the 1048576 bytes (1 MiB) a command \
             line may take: pass large data in a volume instead"
        );
        // The image's own words count too.
        let big = "y".repeat(120_000);
        let words: Vec<&str> = std::iter::repeat_n(big.as_str(), 9).collect();
        let img = image(&["/entry"], &words, &[]);
        let message = config_message(argv(&container(&[], &[]), Some(&img), &HashMap::new()));
        assert!(message.contains("up to the image's Cmd[8]"), "{message}");
        // Many small ones add up the same way, before any is expanded.
        let many: Vec<&str> = std::iter::repeat_n("$(A)", 600_000).collect();
        let message = config_message(argv(&container(&many, &[]), None, &vars(&[("A", "x")])));
        assert!(message.contains("up to command[524288]"), "{message}");
    }

    #[test]
    fn expanded_len_counts_what_expand_builds() {
        let v = vars(&[("A", "x"), ("B", "y y"), ("EMPTY", ""), ("É", "ü")]);
        for input in [
            "",
            "plain",
            "$(A)",
            "pre-$(A)-$(B)-post",
            "$$(A)",
            "$(UNKNOWN)",
            "$A $",
            "$(A",
            "$$$$",
            "$()",
            "$(EMPTY)$(EMPTY)",
            "$(É)é$",
            "$($(A))",
            "$(A))(",
            "$",
            "$$",
            "$(",
            "$(A)$(B)$(A)$$$(B",
        ] {
            assert_eq!(
                expanded_len(input, &v),
                expand(input, &v).len(),
                "{input:?}"
            );
        }
    }
}
