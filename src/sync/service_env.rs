//! The environment variables a container gets for each Service it sees, as the
//! kubelet's `envvars.FromServices` makes them: `<NAME>_SERVICE_HOST`,
//! `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORT_NAME>` for each
//! named port, and Docker's link variables `<NAME>_PORT`,
//! `<NAME>_PORT_<port>_<PROTO>{,_PROTO,_PORT,_ADDR}`. Which Services a pod sees is the
//! Service cache's business; this only names and formats.

use k8s_openapi::api::core::v1::Service;

use crate::uplink::services::ListState;

/// The variables for `services`, in their order and the kubelet's order within each.
/// A Service without a cluster IP or without ports makes none.
pub fn service_vars(services: &[Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for service in services {
        let Some(spec) = &service.spec else { continue };
        let ip = spec.cluster_ip.as_deref().unwrap_or("");
        let ports = spec.ports.as_deref().unwrap_or(&[]);
        // The apiserver refuses a ClusterIP Service without ports; one read from
        // elsewhere is skipped rather than trusted.
        if ip.is_empty() || ip == "None" || ports.is_empty() {
            continue;
        }
        let prefix = env_name(service.metadata.name.as_deref().unwrap_or(""));
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), ports[0].port.to_string()));
        for p in ports {
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{port_var}_{}", env_name(name)), p.port.to_string()));
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let (lower, upper) = (proto.to_lowercase(), proto.to_uppercase());
            let url = format!("{lower}://{ip}:{}", p.port);
            if i == 0 {
                // Docker special-cases the first port.
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{upper}", p.port);
            out.push((port_prefix.clone(), url));
            out.push((format!("{port_prefix}_PROTO"), lower));
            out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
            out.push((format!("{port_prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// The kubelet's `makeEnvVariableName`: upper case, `-` as `_`. (Service names are
/// DNS-1035 labels and port names IANA service names: no dots, no leading digit to
/// take care of.)
fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// What a log line says of where the Services came from.
pub fn describe(list: ListState) -> &'static str {
    match list {
        ListState::Read => "read from the apiserver",
        ListState::Stored => {
            "the list stored when the apiserver was last reached (not read since the agent \
             started)"
        }
        ListState::Stale => "the list stored before the agent started (being read again)",
        ListState::Unread => "none: the Services have not been read",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"selector": {"bar": "baz"}, "clusterIP": ip, "ports": ports},
        }))
        .expect("service")
    }

    /// The kubelet's own table (`pkg/kubelet/envvars/envvars_test.go`, `TestFromServices`).
    #[test]
    fn the_kubelets_table() {
        let services = [
            service(
                "foo-bar",
                "1.2.3.4",
                serde_json::json!([{"port": 8080, "protocol": "TCP"}]),
            ),
            service(
                "abc-123",
                "5.6.7.8",
                serde_json::json!([
                    {"name": "u-d-p", "port": 8081, "protocol": "UDP"},
                    {"name": "t-c-p", "port": 8081, "protocol": "TCP"},
                ]),
            ),
            service(
                "q-u-u-x",
                "9.8.7.6",
                serde_json::json!([
                    {"port": 8082, "protocol": "TCP"},
                    {"name": "8083", "port": 8083, "protocol": "TCP"},
                ]),
            ),
            service(
                "svrc-clusterip-none",
                "None",
                serde_json::json!([{"port": 8082, "protocol": "TCP"}]),
            ),
            service(
                "svrc-clusterip-empty",
                "",
                serde_json::json!([{"port": 8082, "protocol": "TCP"}]),
            ),
        ];
        let expected = [
            ("FOO_BAR_SERVICE_HOST", "1.2.3.4"),
            ("FOO_BAR_SERVICE_PORT", "8080"),
            ("FOO_BAR_PORT", "tcp://1.2.3.4:8080"),
            ("FOO_BAR_PORT_8080_TCP", "tcp://1.2.3.4:8080"),
            ("FOO_BAR_PORT_8080_TCP_PROTO", "tcp"),
            ("FOO_BAR_PORT_8080_TCP_PORT", "8080"),
            ("FOO_BAR_PORT_8080_TCP_ADDR", "1.2.3.4"),
            ("ABC_123_SERVICE_HOST", "5.6.7.8"),
            ("ABC_123_SERVICE_PORT", "8081"),
            ("ABC_123_SERVICE_PORT_U_D_P", "8081"),
            ("ABC_123_SERVICE_PORT_T_C_P", "8081"),
            ("ABC_123_PORT", "udp://5.6.7.8:8081"),
            ("ABC_123_PORT_8081_UDP", "udp://5.6.7.8:8081"),
            ("ABC_123_PORT_8081_UDP_PROTO", "udp"),
            ("ABC_123_PORT_8081_UDP_PORT", "8081"),
            ("ABC_123_PORT_8081_UDP_ADDR", "5.6.7.8"),
            ("ABC_123_PORT_8081_TCP", "tcp://5.6.7.8:8081"),
            ("ABC_123_PORT_8081_TCP_PROTO", "tcp"),
            ("ABC_123_PORT_8081_TCP_PORT", "8081"),
            ("ABC_123_PORT_8081_TCP_ADDR", "5.6.7.8"),
            ("Q_U_U_X_SERVICE_HOST", "9.8.7.6"),
            ("Q_U_U_X_SERVICE_PORT", "8082"),
            ("Q_U_U_X_SERVICE_PORT_8083", "8083"),
            ("Q_U_U_X_PORT", "tcp://9.8.7.6:8082"),
            ("Q_U_U_X_PORT_8082_TCP", "tcp://9.8.7.6:8082"),
            ("Q_U_U_X_PORT_8082_TCP_PROTO", "tcp"),
            ("Q_U_U_X_PORT_8082_TCP_PORT", "8082"),
            ("Q_U_U_X_PORT_8082_TCP_ADDR", "9.8.7.6"),
            ("Q_U_U_X_PORT_8083_TCP", "tcp://9.8.7.6:8083"),
            ("Q_U_U_X_PORT_8083_TCP_PROTO", "tcp"),
            ("Q_U_U_X_PORT_8083_TCP_PORT", "8083"),
            ("Q_U_U_X_PORT_8083_TCP_ADDR", "9.8.7.6"),
        ];
        let got = service_vars(&services);
        let want: Vec<(String, String)> = expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_port_without_protocol_is_tcp_and_an_ipv6_address_goes_in_as_it_is() {
        let got = service_vars(&[service(
            "node-exporter",
            "fd00::1",
            serde_json::json!([{"name": "metrics-http", "port": 9100}]),
        )]);
        let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "NODE_EXPORTER_SERVICE_HOST",
                "NODE_EXPORTER_SERVICE_PORT",
                "NODE_EXPORTER_SERVICE_PORT_METRICS_HTTP",
                "NODE_EXPORTER_PORT",
                "NODE_EXPORTER_PORT_9100_TCP",
                "NODE_EXPORTER_PORT_9100_TCP_PROTO",
                "NODE_EXPORTER_PORT_9100_TCP_PORT",
                "NODE_EXPORTER_PORT_9100_TCP_ADDR",
            ]
        );
        assert_eq!(
            got[3].1, "tcp://fd00::1:9100",
            "as the kubelet: no brackets"
        );
    }

    #[test]
    fn a_service_without_ports_makes_nothing() {
        assert!(service_vars(&[service("x", "10.0.0.1", serde_json::json!([]))]).is_empty());
    }
}
