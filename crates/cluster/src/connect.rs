//! Connecting to the PostgreSQL ledger. A URL may name several hosts, libpq's way
//! (`postgres://USER@H1:P1,H2:P2/DB?target_session_attrs=read-write`): a primary and its
//! standby, the primary being either after a failover. Every host is dialled at once and
//! the first to answer as the URL asks (read-write) is used. Each attempt is bounded as a
//! whole: tokio-postgres bounds only the TCP connect, and a frozen host's kernel accepts
//! that and then nothing answers. A connection is probed while idle (TCP keepalives) and
//! given up when what it sent goes unacknowledged (a user timeout), so one to a host cut
//! off ends in seconds rather than the kernel's quarter of an hour.

use std::time::Duration;

use hongbao_money::Error;
use tokio_postgres::{Client, NoTls};

use crate::pg::pg_error;
use crate::{redact, PgTarget};

/// How long one host may take to become a connection: TCP, TLS, login, the read-write
/// check.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a host of several that refused is asked again, within one attempt.
const REDIAL: Duration = Duration::from_millis(250);
/// Unacknowledged data for this long ends a connection (TCP_USER_TIMEOUT), unless the
/// URL sets `tcp_user_timeout`.
const USER_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle connection is probed after this long, unless the URL sets `keepalives_idle`.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);

/// A connection to the first of the URL's hosts that answers as asked. With several
/// hosts, one that is unavailable (a standby, read-only until it is promoted; a host
/// whose server is starting) is asked again every [`REDIAL`] until the attempt's bound: a
/// frozen host would otherwise hold the whole attempt for the bound while the standby
/// is promoted meanwhile.
pub(crate) async fn pg_connect(target: &PgTarget) -> Result<Client, Error> {
    let (url, tls) = tls_mode(&target.url);
    let urls = one_url_per_host(&url);
    let several = urls.len() > 1;
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    let attempts = urls.into_iter().map(|url| {
        Box::pin(async move {
            loop {
                match tokio::time::timeout_at(deadline, connect_one(target, &url, tls)).await {
                    Ok(Err(e))
                        if several
                            && e.kind() == hongbao_money::ErrorKind::Unavailable
                            && tokio::time::Instant::now() + REDIAL < deadline =>
                    {
                        tokio::time::sleep(REDIAL).await
                    }
                    Ok(connected) => return connected,
                    Err(_) => {
                        return Err(Error::unavailable(
                            "PostgreSQL, connecting",
                            format!(
                                "{} did not answer within {} s",
                                redact(&url),
                                CONNECT_TIMEOUT.as_secs()
                            ),
                        ))
                    }
                }
            }
        })
    });
    futures_util::future::select_ok(attempts)
        .await
        .map(|(client, _others)| client)
}

async fn connect_one(target: &PgTarget, url: &str, tls: bool) -> Result<Client, Error> {
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| Error::refused(format!("the PostgreSQL URL {}: {e}", redact(url))))?;
    if let Some(password) = &target.password {
        config.password(password);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(USER_TIMEOUT);
    }
    if !url.contains("keepalives_idle=") {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    let client = if tls {
        let ca = target.ca.as_deref().ok_or_else(|| {
            Error::refused(
                "PostgreSQL over TLS needs the CA to trust it by (engines_ca)".to_string(),
            )
        })?;
        let tls_config = hongbao_proto::tls::client_config(ca, &[])
            .map_err(|e| Error::refused(e.to_string()))?;
        config.ssl_mode(tokio_postgres::config::SslMode::Require);
        let connector = tokio_postgres_rustls::MakeRustlsConnect::new((*tls_config).clone());
        let (client, connection) = config
            .connect(connector)
            .await
            .map_err(|e| pg_error("connecting over TLS", e))?;
        tokio::spawn(run(connection));
        client
    } else {
        let (client, connection) = config
            .connect(NoTls)
            .await
            .map_err(|e| pg_error("connecting", e))?;
        tokio::spawn(run(connection));
        client
    };
    Ok(client)
}

/// A connection's own task: it carries the client's messages until the connection ends.
async fn run<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = connection.await {
        tracing::warn!("PostgreSQL connection ended: {e}");
    }
}

/// A URL naming several hosts (`scheme://[USER@]H1[:P1],H2[:P2]/…`) as one URL per host,
/// in order; any other URL (one host, or libpq's `key=value` form) as itself.
fn one_url_per_host(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_string()];
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    if !hosts.contains(',') {
        return vec![url.to_string()];
    }
    hosts
        .split(',')
        .map(|host| format!("{scheme}://{user}{host}{tail}"))
        .collect()
}

/// The URL without its `sslmode` when that asks for TLS (tokio-postgres reads
/// `disable`, `prefer` and `require` only), and whether it does. Here every mode that
/// asks for TLS is `verify-full`: rustls checks the chain to the CA and the host name.
fn tls_mode(url: &str) -> (String, bool) {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => return (url.to_string(), false),
    };
    let mut tls = false;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("sslmode=") {
            Some("require" | "verify-ca" | "verify-full") => {
                tls = true;
                false
            }
            _ => true,
        })
        .collect();
    let url = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (url, tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sslmode_asking_for_tls_is_taken_out_and_verified_fully() {
        let url = "postgres://hongbao@10.0.0.1:5432/hongbao";
        assert_eq!(tls_mode(url), (url.to_string(), false));
        assert_eq!(
            tls_mode(&format!("{url}?sslmode=verify-full")),
            (url.to_string(), true)
        );
        assert_eq!(
            tls_mode(&format!("{url}?connect_timeout=3&sslmode=require")),
            (format!("{url}?connect_timeout=3"), true)
        );
        assert_eq!(
            tls_mode(&format!("{url}?sslmode=disable")),
            (format!("{url}?sslmode=disable"), false)
        );
    }

    #[test]
    fn a_url_naming_several_hosts_becomes_one_url_per_host() {
        let url = "postgres://hongbao@10.0.0.1:5432,10.0.0.2:5433/hongbao?target_session_attrs=read-write";
        assert_eq!(
            one_url_per_host(url),
            [
                "postgres://hongbao@10.0.0.1:5432/hongbao?target_session_attrs=read-write",
                "postgres://hongbao@10.0.0.2:5433/hongbao?target_session_attrs=read-write",
            ]
        );
        assert_eq!(
            one_url_per_host("postgresql://a,b"),
            ["postgresql://a", "postgresql://b"]
        );
        for one in [
            "postgres://u:p@w@10.0.0.1/db",
            "host=10.0.0.1,10.0.0.2 user=u",
            "postgres://10.0.0.1:5432/db?options=a,b",
        ] {
            assert_eq!(one_url_per_host(one), [one]);
        }
    }

    /// A host that accepts TCP and then says nothing (a frozen primary's kernel) is an
    /// error within the attempt's bound, naming the host, rather than a wait without end.
    /// (Another host answering meanwhile is the failover test's, tests/failover.rs.)
    #[tokio::test]
    async fn a_silent_host_is_given_up_within_the_bound() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        let target = PgTarget {
            url: format!("postgres://u@127.0.0.1:{silent_port}/db"),
            ..PgTarget::default()
        };
        let started = std::time::Instant::now();
        let err = pg_connect(&target).await.unwrap_err();
        assert!(
            err.to_string().contains("did not answer"),
            "{err}: the silent host is named"
        );
        assert!(started.elapsed() < CONNECT_TIMEOUT * 2);
        drop(silent);
    }

    /// A primary frozen and its standby promoted a moment later, as a multi-host URL sees
    /// them: the first host accepts TCP and says nothing; the second refuses at first
    /// (nothing listens: the standby not yet taking writes) and then answers (a real
    /// PostgreSQL behind a relay started a second later). The connection is made to the
    /// second within the one attempt, without waiting out the silent host.
    #[tokio::test]
    async fn a_host_that_refuses_is_asked_again_while_another_is_silent() {
        let Some(pg) = crate::testpg::TestPg::start() else {
            return;
        };
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let late = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let late_port = late.local_addr().unwrap().port();
        drop(late);
        let pg_port = pg.port;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            let listener = std::net::TcpListener::bind(("127.0.0.1", late_port)).unwrap();
            for client in listener.incoming().flatten() {
                let server = std::net::TcpStream::connect(("127.0.0.1", pg_port)).unwrap();
                let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || std::io::copy(&mut s2, &mut c2));
                let (mut c, mut s) = (client, server);
                std::thread::spawn(move || std::io::copy(&mut c, &mut s));
            }
        });
        let target = PgTarget {
            url: format!(
                "postgres://postgres@127.0.0.1:{},127.0.0.1:{late_port}/postgres?sslmode=disable",
                silent.local_addr().unwrap().port()
            ),
            ..PgTarget::default()
        };
        let started = std::time::Instant::now();
        let client = pg_connect(&target)
            .await
            .expect("the second host, once it answers");
        let took = started.elapsed();
        let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
        assert!(
            took < CONNECT_TIMEOUT,
            "made in {took:?}, not after the silent host's bound"
        );
    }
}
