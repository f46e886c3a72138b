//! What a probe or a lifecycle hook does, taken from the spec once (ports by name
//! resolved, the host defaulted to the pod's address) and run on a blocking thread.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::http::{http_get, HttpGet};
use super::net::{tcp, Outcome};
use crate::runtime::{ContainerId, Runtime};

/// Output of an exec probe or hook kept for its message (the kubelet reads 10 KiB).
const EXEC_OUTPUT: usize = 10 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Exec(Vec<String>),
    Http(HttpGetAction),
    Tcp {
        host: String,
        port: u16,
    },
    Grpc {
        host: String,
        port: u16,
        service: Option<String>,
    },
    Sleep(Duration),
}

/// [`HttpGet`] in a form that can be cloned and compared.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpGetAction {
    pub https: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Action {
    /// A probe's action; an error names what is wrong with the spec.
    pub fn of_probe(p: &Probe, c: &Container, pod_ip: &str) -> Result<Action, String> {
        if let Some(e) = &p.exec {
            return exec(e.command.as_deref());
        }
        if let Some(h) = &p.http_get {
            return http(h, c, pod_ip);
        }
        if let Some(t) = &p.tcp_socket {
            return Ok(Action::Tcp {
                host: host_or(t.host.as_deref(), pod_ip),
                port: port(&t.port, c)?,
            });
        }
        if let Some(g) = &p.grpc {
            return Ok(Action::Grpc {
                host: pod_ip.to_string(),
                port: number(g.port)?,
                service: g.service.clone().filter(|s| !s.is_empty()),
            });
        }
        Err("probe has no handler (exec, httpGet, tcpSocket or grpc)".into())
    }

    /// A lifecycle hook's action.
    pub fn of_hook(h: &LifecycleHandler, c: &Container, pod_ip: &str) -> Result<Action, String> {
        if let Some(e) = &h.exec {
            return exec(e.command.as_deref());
        }
        if let Some(g) = &h.http_get {
            return http(g, c, pod_ip);
        }
        if let Some(s) = &h.sleep {
            let secs =
                u64::try_from(s.seconds).map_err(|_| "sleep seconds must not be negative")?;
            return Ok(Action::Sleep(Duration::from_secs(secs)));
        }
        if let Some(t) = &h.tcp_socket {
            return Ok(Action::Tcp {
                host: host_or(t.host.as_deref(), pod_ip),
                port: port(&t.port, c)?,
            });
        }
        Err("lifecycle hook has no handler (exec, httpGet or sleep)".into())
    }

    /// Runs the action against container `id` within `timeout`. Blocking.
    pub fn run(&self, runtime: &dyn Runtime, id: &ContainerId, timeout: Duration) -> Outcome {
        match self {
            Action::Exec(command) => run_exec(runtime, id, command, timeout),
            Action::Http(h) => http_get(
                &HttpGet {
                    https: h.https,
                    host: h.host.clone(),
                    port: h.port,
                    path: h.path.clone(),
                    headers: h.headers.clone(),
                },
                timeout,
            ),
            Action::Tcp { host, port } => tcp(host, *port, timeout),
            Action::Grpc {
                host,
                port,
                service,
            } => super::grpc::grpc(host, *port, service.as_deref(), timeout),
            Action::Sleep(d) => {
                std::thread::sleep((*d).min(timeout));
                Outcome::Success
            }
        }
    }

    /// How the kubelet names the handler in hook failure messages.
    pub fn describe(&self) -> String {
        match self {
            Action::Exec(cmd) => format!("{cmd:?}"),
            Action::Http(h) => format!(
                "{}://{}:{}{}",
                if h.https { "https" } else { "http" },
                h.host,
                h.port,
                h.path
            ),
            Action::Tcp { host, port } => format!("{host}:{port}"),
            Action::Grpc { host, port, .. } => format!("{host}:{port}"),
            Action::Sleep(d) => format!("sleep {}s", d.as_secs()),
        }
    }
}

fn exec(command: Option<&[String]>) -> Result<Action, String> {
    match command {
        Some(c) if !c.is_empty() => Ok(Action::Exec(c.to_vec())),
        _ => Err("exec handler has no command".into()),
    }
}

fn http(h: &HTTPGetAction, c: &Container, pod_ip: &str) -> Result<Action, String> {
    let https = match h.scheme.as_deref() {
        None | Some("HTTP") | Some("") => false,
        Some("HTTPS") => true,
        Some(other) => return Err(format!("unsupported httpGet scheme {other:?}")),
    };
    let path = match h.path.as_deref() {
        None | Some("") => "/".to_string(),
        Some(p) if p.starts_with('/') => p.to_string(),
        Some(p) => format!("/{p}"),
    };
    Ok(Action::Http(HttpGetAction {
        https,
        host: host_or(h.host.as_deref(), pod_ip),
        port: port(&h.port, c)?,
        path,
        headers: h
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
    }))
}

fn host_or(host: Option<&str>, pod_ip: &str) -> String {
    match host {
        Some(h) if !h.is_empty() => h.to_string(),
        _ => pod_ip.to_string(),
    }
}

/// A port by number, or by the name of one of the container's ports.
fn port(p: &IntOrString, c: &Container) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => number(*n),
        IntOrString::String(s) => {
            if let Ok(n) = s.parse::<i32>() {
                return number(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .map(|p| number(p.container_port))
                .unwrap_or_else(|| Err(format!("couldn't find port: {s} in container {}", c.name)))
        }
    }
}

fn number(n: i32) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

fn run_exec(
    runtime: &dyn Runtime,
    id: &ContainerId,
    command: &[String],
    timeout: Duration,
) -> Outcome {
    match runtime.exec_sync(id, command, timeout, EXEC_OUTPUT) {
        Ok(out) if out.timed_out => {
            Outcome::Failure(format!("command {:?} timed out", command.join(" ")))
        }
        Ok(out) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            match (out.exit.exit_code, out.exit.error) {
                (Some(0), _) => Outcome::Success,
                (Some(code), _) if text.trim().is_empty() => Outcome::Failure(format!(
                    "command {:?} exited with {code}",
                    command.join(" ")
                )),
                (Some(_), _) => Outcome::Failure(text),
                (None, Some(e)) => Outcome::Failure(e),
                (None, None) => Outcome::Failure(format!(
                    "command {:?} ended without an exit code",
                    command.join(" ")
                )),
            }
        }
        Err(e) => Outcome::Failure(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerPort, ExecAction, GRPCAction, HTTPHeader, SleepAction, TCPSocketAction,
    };

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        }
    }

    #[test]
    fn http_get_defaults_to_the_pod_ip_and_resolves_named_ports() {
        let p = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                path: Some("healthz".into()),
                http_headers: Some(vec![HTTPHeader {
                    name: "X-Probe".into(),
                    value: "1".into(),
                }]),
                ..HTTPGetAction::default()
            }),
            ..Probe::default()
        };
        assert_eq!(
            Action::of_probe(&p, &container(), "10.22.0.5"),
            Ok(Action::Http(HttpGetAction {
                https: false,
                host: "10.22.0.5".into(),
                port: 8080,
                path: "/healthz".into(),
                headers: vec![("X-Probe".into(), "1".into())],
            }))
        );
    }

    #[test]
    fn every_handler_kind() {
        let c = container();
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                host: Some("127.0.0.1".into()),
                port: IntOrString::Int(53),
            }),
            ..Probe::default()
        };
        assert_eq!(
            Action::of_probe(&tcp, &c, "10.0.0.1"),
            Ok(Action::Tcp {
                host: "127.0.0.1".into(),
                port: 53
            })
        );
        let grpc = Probe {
            grpc: Some(GRPCAction {
                port: 9000,
                service: Some(String::new()),
            }),
            ..Probe::default()
        };
        assert_eq!(
            Action::of_probe(&grpc, &c, "10.0.0.1"),
            Ok(Action::Grpc {
                host: "10.0.0.1".into(),
                port: 9000,
                service: None
            })
        );
        let exec = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Probe::default()
        };
        assert_eq!(
            Action::of_probe(&exec, &c, ""),
            Ok(Action::Exec(vec!["true".into()]))
        );
        let sleep = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 2 }),
            ..LifecycleHandler::default()
        };
        assert_eq!(
            Action::of_hook(&sleep, &c, ""),
            Ok(Action::Sleep(Duration::from_secs(2)))
        );
    }

    #[test]
    fn bad_specs_are_errors_not_panics() {
        let c = container();
        let none = Probe::default();
        assert!(Action::of_probe(&none, &c, "").is_err());
        let unknown_port = Probe {
            tcp_socket: Some(TCPSocketAction {
                host: None,
                port: IntOrString::String("metrics".into()),
            }),
            ..Probe::default()
        };
        let err = Action::of_probe(&unknown_port, &c, "").expect_err("no such port");
        assert!(err.contains("couldn't find port: metrics"), "{err}");
        let big = Probe {
            grpc: Some(GRPCAction {
                port: 70000,
                service: None,
            }),
            ..Probe::default()
        };
        assert!(Action::of_probe(&big, &c, "").is_err());
        let empty = Probe {
            exec: Some(ExecAction {
                command: Some(vec![]),
            }),
            ..Probe::default()
        };
        assert!(Action::of_probe(&empty, &c, "").is_err());
        let negative = LifecycleHandler {
            sleep: Some(SleepAction { seconds: -1 }),
            ..LifecycleHandler::default()
        };
        assert!(Action::of_hook(&negative, &c, "").is_err());
        let scheme = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(80),
                scheme: Some("FTP".into()),
                ..HTTPGetAction::default()
            }),
            ..Probe::default()
        };
        assert!(Action::of_probe(&scheme, &c, "").is_err());
    }
}
