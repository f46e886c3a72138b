//! CNI plugin calls, as the CNI spec (1.0) and libcni make them: a plugin is an
//! executable found in the plugin directories by its `type`, run with the `CNI_*`
//! environment and its network configuration on stdin. A network configuration list
//! runs its plugins in order for ADD, each given the previous one's result as
//! `prevResult`, and in reverse for DEL and CHECK, which get the cached result of the
//! ADD. `runtimeConfig` goes only to plugins that declare the capability.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Map, Value};

use super::NetworkError;

/// How long one plugin call may take before it is killed.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// ADD, DEL or CHECK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    Add,
    Del,
    Check,
}

impl CniCommand {
    fn as_str(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
            CniCommand::Check => "CHECK",
        }
    }
}

/// What identifies one attachment of a container to a network.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RuntimeArgs {
    pub container_id: String,
    /// Empty for a DEL after the namespace is gone (the spec allows it).
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS`: `IgnoreUnknown=1;K8S_POD_NAMESPACE=...;...`.
    pub args: String,
    /// Capability name to value, e.g. `portMappings`.
    pub runtime_config: Map<String, Value>,
}

/// Runs `command` for the network configuration list `list` (already normalised to a
/// list, see [`super::conf`]). For ADD returns the final result; for DEL and CHECK,
/// `cached` is the ADD's result.
pub fn run_list(
    bin_dirs: &[PathBuf],
    list: &Value,
    command: CniCommand,
    rt: &RuntimeArgs,
    cached: Option<&Value>,
) -> Result<Option<Value>, NetworkError> {
    let name = list["name"].as_str().unwrap_or("").to_owned();
    let version = list["cniVersion"].as_str().unwrap_or("0.4.0").to_owned();
    let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
    match command {
        CniCommand::Add => {
            let mut prev: Option<Value> = None;
            for p in &plugins {
                let conf = plugin_conf(p, &name, &version, prev.as_ref(), rt)?;
                prev = invoke(bin_dirs, &conf, command, rt)?;
            }
            Ok(prev)
        }
        CniCommand::Del | CniCommand::Check => {
            if command == CniCommand::Check
                && (!at_least(&version, (0, 4, 0))
                    || list["disableCheck"].as_bool().unwrap_or(false))
            {
                return Ok(None);
            }
            let prev = if at_least(&version, (0, 4, 0)) {
                cached
            } else {
                None
            };
            // Every plugin gets its DEL even if one fails, so the IPAM lease is
            // released whatever went wrong before it; the first error is returned.
            let mut first_err = None;
            for p in plugins.iter().rev() {
                let conf = plugin_conf(p, &name, &version, prev, rt)?;
                match invoke(bin_dirs, &conf, command, rt) {
                    Ok(_) => {}
                    Err(e) if command == CniCommand::Check => return Err(e),
                    // A plugin that is not there never ran (or was uninstalled since):
                    // nothing can be released through it.
                    Err(e @ NetworkError::PluginMissing { .. }) => {
                        log::warn!("network {name:?}: DEL skipped: {e}");
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(None),
            }
        }
    }
}

/// One plugin's configuration as libcni's `buildOneConfig` makes it.
fn plugin_conf(
    plugin: &Value,
    name: &str,
    version: &str,
    prev: Option<&Value>,
    rt: &RuntimeArgs,
) -> Result<Value, NetworkError> {
    let Value::Object(mut conf) = plugin.clone() else {
        return Err(NetworkError::Config {
            path: PathBuf::new(),
            reason: format!("plugin in network {name:?} is not an object"),
        });
    };
    conf.insert("name".into(), Value::String(name.to_owned()));
    conf.insert("cniVersion".into(), Value::String(version.to_owned()));
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    let caps = conf
        .get("capabilities")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut runtime_config = Map::new();
    for (cap, value) in &rt.runtime_config {
        if caps.get(cap).and_then(Value::as_bool) == Some(true) {
            runtime_config.insert(cap.clone(), value.clone());
        }
    }
    if !runtime_config.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
    }
    Ok(Value::Object(conf))
}

/// Runs one plugin. Its result (ADD) or nothing.
fn invoke(
    bin_dirs: &[PathBuf],
    conf: &Value,
    command: CniCommand,
    rt: &RuntimeArgs,
) -> Result<Option<Value>, NetworkError> {
    let typ = conf["type"].as_str().unwrap_or("").to_owned();
    let plugin = find_plugin(bin_dirs, &typ)?;
    let stdin = serde_json::to_vec(conf).map_err(|e| NetworkError::Config {
        path: PathBuf::new(),
        reason: format!("encode plugin config: {e}"),
    })?;
    let cni_path = std::env::join_paths(bin_dirs).unwrap_or_default();
    let mut cmd = Command::new(&plugin);
    cmd.env("CNI_COMMAND", command.as_str())
        .env("CNI_CONTAINERID", &rt.container_id)
        .env("CNI_IFNAME", &rt.ifname)
        .env("CNI_ARGS", &rt.args)
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if rt.netns.is_empty() {
        cmd.env_remove("CNI_NETNS");
    } else {
        cmd.env("CNI_NETNS", &rt.netns);
    }
    // The plugins run iptables and ip: they need a PATH even when the agent has none.
    if std::env::var_os("PATH").is_none() {
        cmd.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    }
    let output = run_bounded(cmd, stdin, &plugin)?;
    let failed = |message: String| NetworkError::Plugin {
        plugin: typ.clone(),
        command: command.as_str(),
        message,
    };
    if !output.status.success() {
        // A CNI error is JSON on stdout: {"code", "msg", "details"}.
        let text = String::from_utf8_lossy(&output.stdout);
        let message = match serde_json::from_str::<Value>(&text) {
            Ok(v) if v.get("msg").is_some() => {
                let msg = v["msg"].as_str().unwrap_or("");
                match v["details"].as_str().filter(|d| !d.is_empty()) {
                    Some(d) => format!("{msg}: {d}"),
                    None => msg.to_owned(),
                }
            }
            _ => {
                let err = String::from_utf8_lossy(&output.stderr);
                format!("{} {}", text.trim(), err.trim()).trim().to_owned()
            }
        };
        return Err(failed(message));
    }
    if command != CniCommand::Add {
        return Ok(None);
    }
    serde_json::from_slice(&output.stdout)
        .map(Some)
        .map_err(|e| failed(format!("result is not JSON: {e}")))
}

fn run_bounded(
    mut cmd: Command,
    stdin: Vec<u8>,
    plugin: &Path,
) -> Result<std::process::Output, NetworkError> {
    let io = |context: String| move |source| NetworkError::Io { context, source };
    let mut child = cmd
        .spawn()
        .map_err(io(format!("run {}", plugin.display())))?;
    if let Some(mut input) = child.stdin.take() {
        use std::io::Write;
        input
            .write_all(&stdin)
            .map_err(io(format!("write config to {}", plugin.display())))?;
    }
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(PLUGIN_TIMEOUT) {
        Ok(out) => out.map_err(io(format!("wait for {}", plugin.display()))),
        Err(_) => {
            // The waiting thread reaps it once it is killed.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            Err(NetworkError::Plugin {
                plugin: plugin.display().to_string(),
                command: "",
                message: format!("did not answer within {PLUGIN_TIMEOUT:?}"),
            })
        }
    }
}

/// The plugin executable `typ` in the first of `bin_dirs` that has it.
pub fn find_plugin(bin_dirs: &[PathBuf], typ: &str) -> Result<PathBuf, NetworkError> {
    let plain = !typ.is_empty() && !typ.contains('/') && typ != "." && typ != "..";
    if plain {
        for dir in bin_dirs {
            let p = dir.join(typ);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(NetworkError::PluginMissing {
        plugin: typ.to_owned(),
        dirs: bin_dirs.to_vec(),
    })
}

/// Whether CNI version `v` (`1.0.0`, `0.4.0`) is at least `min`.
pub fn at_least(v: &str, min: (u32, u32, u32)) -> bool {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let got = (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    );
    got >= min
}

/// The addresses a result gives the pod, IPv4 first: `ips[].address` (0.3.0 and
/// later) or `ip4.ip`/`ip6.ip` (0.2.0), without their prefix length.
pub fn pod_ips(result: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |cidr: &str| {
        let ip = cidr.split('/').next().unwrap_or("").to_owned();
        if !ip.is_empty() && !out.contains(&ip) {
            out.push(ip);
        }
    };
    if let Some(ips) = result["ips"].as_array() {
        for ip in ips {
            if let Some(a) = ip["address"].as_str() {
                push(a);
            }
        }
    }
    for key in ["ip4", "ip6"] {
        if let Some(a) = result[key]["ip"].as_str() {
            push(a);
        }
    }
    out.sort_by_key(|ip| ip.contains(':'));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rt() -> RuntimeArgs {
        RuntimeArgs {
            container_id: "uid".into(),
            netns: "/r/ns/net".into(),
            ifname: "eth0".into(),
            args: String::new(),
            runtime_config: Map::from_iter([(
                "portMappings".to_string(),
                json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
            )]),
        }
    }

    #[test]
    fn a_plugin_gets_the_lists_name_version_result_and_its_capabilities_only() {
        let bridge = json!({"type": "bridge", "bridge": "b0"});
        let c =
            plugin_conf(&bridge, "net", "1.0.0", Some(&json!({"ips": []})), &rt()).expect("conf");
        assert_eq!(c["name"], "net");
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["prevResult"], json!({"ips": []}));
        assert!(c.get("runtimeConfig").is_none(), "{c}");
        let portmap = json!({"type": "portmap", "capabilities": {"portMappings": true}});
        let c = plugin_conf(&portmap, "net", "1.0.0", None, &rt()).expect("conf");
        assert_eq!(c["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
        assert!(c.get("prevResult").is_none());
    }

    #[test]
    fn versions_and_addresses() {
        assert!(at_least("1.0.0", (0, 4, 0)));
        assert!(at_least("0.4.0", (0, 4, 0)));
        assert!(!at_least("0.3.1", (0, 4, 0)));
        let r = json!({"ips": [
            {"address": "fd00::5/64"},
            {"address": "10.1.0.5/24", "gateway": "10.1.0.1"}
        ]});
        assert_eq!(pod_ips(&r), ["10.1.0.5", "fd00::5"]);
        assert_eq!(
            pod_ips(&json!({"ip4": {"ip": "10.2.0.3/16"}})),
            ["10.2.0.3"]
        );
    }

    #[test]
    fn plugins_are_found_by_plain_name_only() {
        let dirs = [PathBuf::from("/nonexistent"), PathBuf::from("/bin")];
        assert!(find_plugin(&dirs, "sh").is_ok());
        assert!(matches!(
            find_plugin(&dirs, "../bin/sh"),
            Err(NetworkError::PluginMissing { .. })
        ));
        assert!(matches!(
            find_plugin(&dirs, "no-such-plugin"),
            Err(NetworkError::PluginMissing { .. })
        ));
    }
}
