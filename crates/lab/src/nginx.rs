//! `hongbao nginx-conf`: an nginx configuration that puts nginx in front of one or more
//! gateways — the HTTP API with upstream keep-alive, WebSocket with the upgrade passed
//! through and a read timeout beyond any ping interval, and the binary protocol through
//! the stream module — plus, for benchmarks, a static `200` to hold the API against.
//!
//! On the HTTP API's door nginx answers some requests itself before any gateway sees them
//! (a malformed head, a body over the limit, no gateway up). There it holds the gateway's
//! limits and answers in the gateway's form, JSON with `result` and `error`
//! ([`OWN_ANSWERS`]), instead of its HTML pages; docs/nginx.md says what still differs.
//!
//! Plain text generation: `render` turns a `Plan` into the file; a test runs Debian's
//! nginx with it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use hongbao_proto::http::MAX_HEAD_LEN;
use hongbao_proto::ResultCode;
use serde::Serialize;

use hongbao_server::config::ServeConfig;

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
    /// TLS termination on every address but the static one: the certificate chain and
    /// key (PEM), with session resumption (a shared cache and tickets).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The binary protocol's client address goes to the gateways in a PROXY protocol
    /// header (they must name nginx in `trusted_proxies`). HTTP and WebSocket always pass
    /// it in `X-Real-IP`, which gateways believe only from a trusted proxy.
    pub proxy_protocol: bool,
    /// The addresses nginx's connections to the gateways leave from, spread evenly by
    /// connection (`proxy_bind` over `split_clients`): one source address holds about
    /// 64,000 ports to a gateway's address, and past ~32,000 clients through one nginx it
    /// ran out. Empty: the kernel's choice (one address).
    pub upstream_sources: Vec<std::net::IpAddr>,
}

/// The sources nginx spreads its upstream connections over when every gateway is on
/// loopback and none are given: eight addresses of their own (the load's clients use
/// 127.0.100.1 onward), about 500,000 connections to one gateway address.
pub fn loopback_upstream_sources() -> Vec<std::net::IpAddr> {
    (1..=8)
        .map(|i| std::net::IpAddr::from([127, 0, 200, i]))
        .collect()
}

/// `split_clients` of the upstream sources, as `$hongbao_upstream_source`: each
/// connection (`$connection`, its serial number) goes out from one, evenly.
fn upstream_sources(out: &mut String, sources: &[std::net::IpAddr]) {
    if sources.is_empty() {
        return;
    }
    let named: Vec<String> = sources.iter().map(|s| format!("\"{s}\"")).collect();
    out.push_str(concat!(
        "    # Upstream connections spread over these sources by connection: one address\n",
        "    # holds ~64,000 ports to a gateway. The gateways trust them as the proxy's:\n",
    ));
    let _ = writeln!(out, "    #   trusted_proxies = [{}]", named.join(", "));
    out.push_str("    split_clients \"${connection}\" $hongbao_upstream_source {\n");
    let share = 10_000 / sources.len() as u32; // hundredths of a percent
    for (i, source) in sources.iter().enumerate() {
        if i + 1 == sources.len() {
            let _ = writeln!(out, "        * {source};");
        } else {
            let _ = writeln!(out, "        {}.{:02}% {source};", share / 100, share % 100);
        }
    }
    out.push_str(
        "    }
",
    );
}

/// `proxy_bind` to the spread sources, when there are any.
fn bind_sources(out: &mut String, sources: &[std::net::IpAddr], indent: &str) {
    if !sources.is_empty() {
        let _ = writeln!(out, "{indent}proxy_bind $hongbao_upstream_source;");
    }
}

/// nginx's TLS settings for a server block, as `name` (its session cache's).
fn ssl(out: &mut String, tls: &Option<(PathBuf, PathBuf)>, name: &str) {
    let Some((cert, key)) = tls else {
        return;
    };
    let _ = write!(
        out,
        "        ssl_certificate {};
        ssl_certificate_key {};
        ssl_protocols TLSv1.2 TLSv1.3;
        # Resumption: a cache shared by nginx's workers, and tickets.
        ssl_session_cache shared:hongbao_{name}:10m;
        ssl_session_timeout 1h;
        ssl_session_tickets on;
",
        cert.display(),
        key.display()
    );
}

/// A `listen` directive's flags: `ssl` when nginx terminates TLS.
fn listen_flags(tls: &Option<(PathBuf, PathBuf)>) -> &'static str {
    if tls.is_some() {
        " ssl"
    } else {
        ""
    }
}

/// The gateway's largest request body (`MAX_BODY` in `worker/http.rs`).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long past the gateway's deadline for a whole request nginx waits on a body that
/// has stopped coming. nginx passes bodies on as they arrive, so the gateway's deadline
/// (whole seconds from the request's first byte) runs on them too, and the gateway answers
/// 408; nginx's own timeout would close the connection without a word.
const BODY_STALL_GRACE_SECS: u32 = 2;

/// Where nginx's own answers live, an internal location each. A URI, not a named
/// location: a request whose request line did not parse has no URI, and nginx will not
/// send it to a named location ("empty URI in redirect to named location").
const ANSWER_PATH: &str = "/.nginx-answer/";

/// An answer nginx gives itself, in the gateway's form, where it would send an HTML page.
#[derive(Debug, Clone, Copy)]
pub struct OwnAnswer {
    /// nginx's statuses for the cases it answers this way.
    pub nginx_statuses: &'static [u16],
    /// The status the client gets.
    pub status: u16,
    /// `bad-request` for a refused request, `unavailable` for "try again later".
    pub result: ResultCode,
    /// What was wrong: the gateway's words where the gateway refuses the case the same
    /// way.
    pub error: &'static str,
}

/// A request nginx cannot read; also its answer to HTTP/0.9. 505 is a request line with a
/// version other than HTTP/1.x, malformed (400) to the gateway too.
const MALFORMED: OwnAnswer = OwnAnswer {
    nginx_statuses: &[400, 505],
    status: 400,
    result: ResultCode::BadRequest,
    error: "malformed request: refused by nginx in front of the gateway",
};

/// Every status nginx answers with itself on the HTTP door, but 408: nginx never answers
/// a timeout, it closes the connection.
pub const OWN_ANSWERS: &[OwnAnswer] = &[
    MALFORMED,
    OwnAnswer {
        // Only nginx's own answer paths: every other path goes to a gateway.
        nginx_statuses: &[404],
        status: 404,
        result: ResultCode::BadRequest,
        error: "no such endpoint",
    },
    OwnAnswer {
        nginx_statuses: &[405],
        status: 405,
        result: ResultCode::BadRequest,
        error: "TRACE and CONNECT are not allowed",
    },
    OwnAnswer {
        nginx_statuses: &[413],
        status: 413,
        result: ResultCode::BadRequest,
        error: "request body over 65536 bytes",
    },
    OwnAnswer {
        // 494 is nginx's own code for a header line or a head too large (it would send
        // 400), 414 for a request line; the gateway answers both 431.
        nginx_statuses: &[414, 494],
        status: 431,
        result: ResultCode::BadRequest,
        error: "request head over 8192 bytes",
    },
    OwnAnswer {
        nginx_statuses: &[500],
        status: 500,
        result: ResultCode::Unavailable,
        error: "nginx failed while passing the request on",
    },
    OwnAnswer {
        nginx_statuses: &[501],
        status: 501,
        result: ResultCode::BadRequest,
        error: "only the chunked transfer coding is understood",
    },
    OwnAnswer {
        nginx_statuses: &[502],
        status: 502,
        result: ResultCode::Unavailable,
        error: "no gateway answered",
    },
    OwnAnswer {
        nginx_statuses: &[504],
        status: 504,
        result: ResultCode::Unavailable,
        error: "the gateway did not answer in time",
    },
];

/// The body of an error answer, as the gateway writes it.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    result: &'a str,
}

impl OwnAnswer {
    /// The JSON body, as it goes between the single quotes of nginx's `return`.
    pub fn body(&self) -> String {
        let body = ErrorBody {
            error: self.error,
            result: self.result.name(),
        };
        serde_json::to_string(&body).expect("two strings make JSON")
    }

    fn location(&self) -> String {
        format!("{ANSWER_PATH}{}", self.status)
    }
}

/// The HTTP API's server block: the gateway's limits, nginx's own answers in the gateway's
/// form, and the proxy to the gateways with upstream keep-alive.
fn http_server(
    out: &mut String,
    listen: SocketAddr,
    tls: &Option<(PathBuf, PathBuf)>,
    sources: &[std::net::IpAddr],
) {
    let header_secs = ServeConfig::default().admission.login_timeout_secs;
    let body_secs = header_secs + BODY_STALL_GRACE_SECS;
    let (body_k, head_k) = (MAX_BODY_BYTES / 1024, MAX_HEAD_LEN / 1024);
    let head_max_k = head_k + 1;
    let _ = write!(
        out,
        "    server {{
        listen {listen}{} reuseport;
        # The gateway's limits (docs/http-api.md): nginx refuses first what the gateway
        # would refuse, and answers in its form (docs/nginx.md).
        client_max_body_size {body_k}k;
        # Bodies go on to the gateway as they arrive, from one buffer in memory: never
        # through a temp file (which nginx's workers may not be allowed to write).
        proxy_request_buffering off;
        client_body_buffer_size {body_k}k;
        # Answers too: a slow reader is waited for, not spooled to disk.
        proxy_max_temp_file_size 0;
        # A head of {MAX_HEAD_LEN} bytes always fits (a first buffer of 1 KiB, then one of
        # {head_k} KiB for the line under way and the rest); one over {head_max_k} KiB never does.
        client_header_buffer_size 1k;
        large_client_header_buffers 1 {head_k}k;
        client_header_timeout {header_secs}s;
        # After the gateway's 408 for a request not whole in {header_secs} s.
        client_body_timeout {body_secs}s;
",
        listen_flags(tls)
    );
    ssl(out, tls, "http");
    for answer in OWN_ANSWERS {
        let statuses: Vec<String> = answer.nginx_statuses.iter().map(u16::to_string).collect();
        let _ = writeln!(
            out,
            "        error_page {} ={} {};",
            statuses.join(" "),
            answer.status,
            answer.location()
        );
    }
    // The HTTP/0.9 check sits in the location, not the server: a request whose request
    // line did not parse has no protocol either, and on its way to its error page the
    // server's rewrites would catch it too.
    let _ = write!(
        out,
        "        location / {{
            proxy_pass http://hongbao_http;
{}            proxy_http_version 1.1;
            # Upstream keep-alive: the connection is nginx's, not the client's.
            proxy_set_header Connection \"\";
            proxy_set_header Host $host;
            # Who the client is, for the gateway's limits per source (believed only
            # from an address in its trusted_proxies).
            proxy_set_header X-Real-IP $remote_addr;
            # HTTP/0.9 (a request line without a version) is malformed to the gateway;
            # nginx answers it without a head, as HTTP/0.9 has none.
            if ($server_protocol = \"\") {{
                return {} '{}';
            }}
        }}
",
        if sources.is_empty() {
            ""
        } else {
            "            proxy_bind $hongbao_upstream_source;\n"
        },
        MALFORMED.status,
        MALFORMED.body()
    );
    for answer in OWN_ANSWERS {
        let _ = write!(
            out,
            "        location = {} {{
            internal;
            default_type application/json;
            return {} '{}';
        }}
",
            answer.location(),
            answer.status,
            answer.body()
        );
    }
    out.push_str("    }\n");
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
        if plan.http.is_some() || plan.ws.is_some() {
            upstream_sources(&mut out, &plan.upstream_sources);
        }
        if let Some((listen, servers)) = &plan.http {
            upstream(&mut out, "hongbao_http", servers, Some(plan.keepalive));
            http_server(&mut out, *listen, &plan.tls, &plan.upstream_sources);
        }
        if let Some((listen, servers)) = &plan.ws {
            upstream(&mut out, "hongbao_ws", servers, None);
            out.push_str("    map $http_upgrade $connection_upgrade {\n        default upgrade;\n        '' close;\n    }\n");
            let _ = writeln!(
                out,
                "    server {{\n        listen {listen}{} reuseport;",
                listen_flags(&plan.tls)
            );
            ssl(&mut out, &plan.tls, "ws");
            out.push_str("        location / {\n");
            bind_sources(&mut out, &plan.upstream_sources, "            ");
            out.push_str("            proxy_pass http://hongbao_ws;\n            proxy_http_version 1.1;\n            proxy_set_header Upgrade $http_upgrade;\n            proxy_set_header Connection $connection_upgrade;\n            proxy_set_header Host $host;\n            proxy_set_header X-Real-IP $remote_addr;\n            # Long beyond any ping interval: a quiet WebSocket is not a dead one.\n            proxy_read_timeout 3600s;\n            proxy_send_timeout 3600s;\n        }\n    }\n");
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
        upstream_sources(&mut out, &plan.upstream_sources);
        upstream(&mut out, "hongbao_tcp", servers, None);
        let _ = writeln!(
            out,
            "    server {{\n        listen {listen}{} reuseport;",
            listen_flags(&plan.tls)
        );
        ssl(&mut out, &plan.tls, "tcp");
        if plan.proxy_protocol {
            out.push_str("        # The client's address, first on each connection to a gateway.\n        proxy_protocol on;\n");
        }
        bind_sources(&mut out, &plan.upstream_sources, "        ");
        out.push_str("        proxy_pass hongbao_tcp;\n        proxy_timeout 3600s;\n    }\n}\n");
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
            tls: None,
            proxy_protocol: false,
            upstream_sources: loopback_upstream_sources(),
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
            "client_max_body_size 64k;",
            "proxy_request_buffering off;",
            "large_client_header_buffers 1 8k;",
            "client_header_timeout 10s;",
            "client_body_timeout 12s;",
            "error_page 414 494 =431 /.nginx-answer/431;",
            "location = /.nginx-answer/431 {",
            "split_clients \"${connection}\" $hongbao_upstream_source {",
            "12.50% 127.0.200.1;",
            "* 127.0.200.8;",
            "proxy_bind $hongbao_upstream_source;",
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

    #[test]
    fn tls_and_the_clients_address_are_written_when_asked() {
        let plan = Plan {
            http: Some((a("127.0.0.1:8443"), vec![a("127.0.0.1:7003")])),
            ws: Some((a("127.0.0.1:8444"), vec![a("127.0.0.1:7002")])),
            tcp: Some((a("127.0.0.1:8445"), vec![a("127.0.0.1:7000")])),
            static_200: Some(a("127.0.0.1:8090")),
            keepalive: 8,
            worker_processes: "1".into(),
            prefix: "/tmp/ngx".into(),
            stream_module: None,
            user: None,
            tls: Some(("/etc/hb/cert.pem".into(), "/etc/hb/key.pem".into())),
            proxy_protocol: true,
            upstream_sources: Vec::new(),
        };
        let conf = render(&plan);
        for needle in [
            "listen 127.0.0.1:8443 ssl reuseport;",
            "listen 127.0.0.1:8444 ssl reuseport;",
            "listen 127.0.0.1:8445 ssl reuseport;",
            "listen 127.0.0.1:8090 reuseport;",
            "ssl_certificate /etc/hb/cert.pem;",
            "ssl_certificate_key /etc/hb/key.pem;",
            "ssl_session_cache shared:hongbao_tcp:10m;",
            "ssl_session_tickets on;",
            "proxy_protocol on;",
            "proxy_set_header X-Real-IP $remote_addr;",
        ] {
            assert!(conf.contains(needle), "{needle} missing from\n{conf}");
        }
        assert_eq!(
            conf.matches("ssl_certificate ").count(),
            3,
            "not the static one"
        );
        assert_eq!(conf.matches('{').count(), conf.matches('}').count());
    }

    #[test]
    fn own_answers_are_the_gateways_form_and_fit_in_nginx_quotes() {
        let mut seen = Vec::new();
        for answer in OWN_ANSWERS {
            let body = answer.body();
            let json: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(json["result"], answer.result.name());
            assert_eq!(json["error"], answer.error);
            // Inside nginx's single quotes, ' ends the text, \ escapes and $ names a
            // variable.
            assert!(!body.contains(['\'', '\\', '$']), "{body}");
            for status in answer.nginx_statuses {
                assert!(!seen.contains(status), "{status} answered twice");
                seen.push(*status);
            }
        }
        let said = |status: u16| {
            OWN_ANSWERS
                .iter()
                .find(|a| a.status == status)
                .unwrap()
                .error
        };
        assert!(said(413).contains(&MAX_BODY_BYTES.to_string()));
        assert!(said(431).contains(&MAX_HEAD_LEN.to_string()));
    }
}
