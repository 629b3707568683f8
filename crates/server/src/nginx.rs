//! `hongbao nginx-conf`: an nginx configuration that puts nginx in front of one or more
//! gateways — the HTTP API with upstream keep-alive, WebSocket with the upgrade passed
//! through and a read timeout beyond any ping interval, and the binary protocol through
//! the stream module — plus, for benchmarks, a static `200` to hold the API against.
//!
//! Plain text generation: `render` turns a `Plan` into the file; a test runs Debian's
//! nginx with it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Where Debian's `libnginx-mod-stream` puts the stream module.
pub const DEBIAN_STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// What to put in front of what.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// nginx's HTTP API address, and the gateways' `--http-listen` addresses behind it.
    pub http: Option<(SocketAddr, Vec<SocketAddr>)>,
    /// nginx's WebSocket address, and the gateways' `--ws-listen` (or `--http-listen`).
    pub ws: Option<(SocketAddr, Vec<SocketAddr>)>,
    /// nginx's binary-protocol address (stream module), and the gateways' `--listen`.
    pub tcp: Option<(SocketAddr, Vec<SocketAddr>)>,
    /// An address where nginx answers every request `200` itself (a baseline).
    pub static_200: Option<SocketAddr>,
    /// Idle keep-alive connections each nginx worker keeps to the HTTP upstream.
    pub keepalive: u32,
    /// `worker_processes`: a number, or "auto".
    pub worker_processes: String,
    /// Where nginx keeps its pid file, logs and temp files.
    pub prefix: PathBuf,
    /// The stream module to load (`load_module`), when the TCP proxy is asked for and
    /// nginx has it as a dynamic module.
    pub stream_module: Option<PathBuf>,
    /// `user` for the workers when nginx starts as root.
    pub user: Option<String>,
}

fn upstream(out: &mut String, name: &str, servers: &[SocketAddr], keepalive: Option<u32>) {
    let _ = writeln!(out, "    upstream {name} {{");
    for s in servers {
        let _ = writeln!(out, "        server {s};");
    }
    if let Some(n) = keepalive {
        let _ = writeln!(out, "        keepalive {n};");
        let _ = writeln!(out, "        keepalive_requests 1000000;");
    }
    let _ = writeln!(out, "    }}");
}

/// The configuration file for `plan`.
pub fn render(plan: &Plan) -> String {
    let prefix = plan.prefix.display();
    let mut out = String::from(
        "# Written by `hongbao nginx-conf` (docs/http-api.md, \"Through a proxy\").\n",
    );
    if let (Some(_), Some(module)) = (&plan.tcp, &plan.stream_module) {
        let _ = writeln!(out, "load_module {};", module.display());
    }
    if let Some(user) = &plan.user {
        let _ = writeln!(out, "user {user};");
    }
    let _ = writeln!(out, "worker_processes {};", plan.worker_processes);
    // Each worker holds a client and an upstream socket per connection, and
    // `worker_connections` counts both: 19,000 of the 20,000 files a process may have on
    // these machines (the rest for listeners and logs) carry 9,500 clients per worker.
    let _ = writeln!(out, "worker_rlimit_nofile 20000;");
    let _ = writeln!(out, "pid {prefix}/nginx.pid;");
    let _ = writeln!(out, "error_log {prefix}/error.log warn;");
    let _ = writeln!(
        out,
        "events {{\n    worker_connections 19000;\n    multi_accept on;\n}}"
    );
    if plan.http.is_some() || plan.ws.is_some() || plan.static_200.is_some() {
        out.push_str("http {\n    access_log off;\n");
        for temp in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            let _ = writeln!(out, "    {temp}_temp_path {prefix}/{temp}_temp;");
        }
        out.push_str("    keepalive_requests 1000000;\n    keepalive_timeout 75s;\n");
        if let Some((listen, servers)) = &plan.http {
            upstream(&mut out, "hongbao_http", servers, Some(plan.keepalive));
            let _ = writeln!(
                out,
                "    server {{\n        listen {listen} reuseport;\n        location / {{\n            proxy_pass http://hongbao_http;\n            proxy_http_version 1.1;\n            # Upstream keep-alive: the connection is nginx's, not the client's.\n            proxy_set_header Connection \"\";\n            proxy_set_header Host $host;\n        }}\n    }}"
            );
        }
        if let Some((listen, servers)) = &plan.ws {
            upstream(&mut out, "hongbao_ws", servers, None);
            out.push_str("    map $http_upgrade $connection_upgrade {\n        default upgrade;\n        '' close;\n    }\n");
            let _ = writeln!(
                out,
                "    server {{\n        listen {listen} reuseport;\n        location / {{\n            proxy_pass http://hongbao_ws;\n            proxy_http_version 1.1;\n            proxy_set_header Upgrade $http_upgrade;\n            proxy_set_header Connection $connection_upgrade;\n            proxy_set_header Host $host;\n            # Long beyond any ping interval: a quiet WebSocket is not a dead one.\n            proxy_read_timeout 3600s;\n            proxy_send_timeout 3600s;\n        }}\n    }}"
            );
        }
        if let Some(listen) = &plan.static_200 {
            let _ = writeln!(
                out,
                "    server {{\n        listen {listen} reuseport;\n        location / {{\n            default_type application/json;\n            return 200 '{{\"result\":\"ok\"}}';\n        }}\n    }}"
            );
        }
        out.push_str("}\n");
    }
    if let Some((listen, servers)) = &plan.tcp {
        out.push_str("stream {\n");
        upstream(&mut out, "hongbao_tcp", servers, None);
        let _ = writeln!(
            out,
            "    server {{\n        listen {listen} reuseport;\n        proxy_pass hongbao_tcp;\n        proxy_timeout 3600s;\n    }}\n}}"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_part_is_written_when_asked() {
        let plan = Plan {
            http: Some((
                a("127.0.0.1:8080"),
                vec![a("127.0.0.1:7003"), a("127.0.0.1:7013")],
            )),
            ws: Some((a("127.0.0.1:8082"), vec![a("127.0.0.1:7002")])),
            tcp: Some((a("127.0.0.1:8000"), vec![a("127.0.0.1:7000")])),
            static_200: Some(a("127.0.0.1:8090")),
            keepalive: 64,
            worker_processes: "2".into(),
            prefix: "/tmp/ngx".into(),
            stream_module: Some(DEBIAN_STREAM_MODULE.into()),
            user: None,
        };
        let conf = render(&plan);
        for needle in [
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;",
            "server 127.0.0.1:7013;",
            "keepalive 64;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "proxy_set_header Upgrade $http_upgrade;",
            "proxy_read_timeout 3600s;",
            "stream {",
            "listen 127.0.0.1:8000 reuseport;",
            "return 200",
            "pid /tmp/ngx/nginx.pid;",
        ] {
            assert!(conf.contains(needle), "{needle} missing from\n{conf}");
        }
        // Balanced braces.
        assert_eq!(conf.matches('{').count(), conf.matches('}').count());
        let only_http = render(&Plan {
            tcp: None,
            ws: None,
            static_200: None,
            ..plan
        });
        assert!(!only_http.contains("stream {") && !only_http.contains("load_module"));
    }
}
