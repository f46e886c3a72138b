//! A container's command line and environment by Kubernetes rules: `command` replaces
//! the image's Entrypoint and drops its Cmd, `args` alone replace Cmd, and `$(VAR)` in
//! command and args expands from the container's own env (resolved by `sync::env`,
//! which expands env values with [`expand`] too).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Container;
use oci_spec::image::Config as ImageConfig;

use super::RuntimeError;

/// The `PATH` a container starts from, as containerd's default spec gives it: an
/// image whose config sets no `PATH` (built `FROM scratch`, or by a tool that writes
/// no Env) still finds its `sh`.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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
    let set = |name: &str, value: String, ordered: &mut Vec<(String, String)>| match ordered
        .iter_mut()
        .find(|(n, _)| n == name)
    {
        Some(slot) => slot.1 = value,
        None => ordered.push((name.to_owned(), value)),
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

/// The process's argv.
pub fn argv(
    container: &Container,
    image: Option<&ImageConfig>,
    env: &HashMap<String, String>,
) -> Result<Vec<String>, RuntimeError> {
    let entrypoint = image
        .and_then(|c| c.entrypoint().clone())
        .unwrap_or_default();
    let cmd = image.and_then(|c| c.cmd().clone()).unwrap_or_default();
    let command = container.command.clone().unwrap_or_default();
    let args = container.args.clone().unwrap_or_default();

    let command: Vec<String> = command.iter().map(|s| expand(s, env)).collect();
    let args: Vec<String> = args.iter().map(|s| expand(s, env)).collect();
    let argv: Vec<String> = match (command.is_empty(), args.is_empty()) {
        (false, _) => command.into_iter().chain(args).collect(),
        (true, false) => entrypoint.into_iter().chain(args).collect(),
        (true, true) => entrypoint.into_iter().chain(cmd).collect(),
    };
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
}
