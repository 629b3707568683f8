//! The errors a user meets first, with the real binary: each one message that says what
//! to do, no backtrace whatever the environment says, and exit codes a script can trust
//! (docs/bench.md: 1 failed, 2 usage, 3 a load that reached too few of its users).

mod common;

use std::process::{Command, Output};

use common::{free_port, Serve};

fn hongbao(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hongbao"));
    command.args(args).env_remove("HONGBAO_SECRET");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("running hongbao")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A load of `users` at `server` for a moment, with `extra` flags.
fn load(server: &str, users: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "load",
        "--server",
        server,
        "--users",
        users,
        "--qps",
        "10",
        "--duration",
        "3",
        "--procs",
        "1",
    ];
    args.extend(extra);
    hongbao(&args, env)
}

#[test]
fn a_load_that_reaches_no_one_fails_saying_why() {
    // Nothing listens there.
    let down = format!("127.0.0.1:{}", free_port());
    let out = load(&down, "50", &[], &[]);
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("reached no one") && said.contains("nothing listens"),
        "{said}"
    );

    // The wrong login key: every token refused.
    let server = Serve::new().workers(1).start();
    let at = server.listen.to_string();
    let out = load(
        &at,
        "50",
        &[],
        &[("HONGBAO_SECRET", "not the server's secret")],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("--secret"), "{said}");

    // The right key: done, exit 0.
    let out = load(&at, "50", &[], &[("HONGBAO_SECRET", &server.secret)]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_plain_load_on_a_tls_port_is_told_to_give_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = hongbao_http::tls::DevCerts::make(&["127.0.0.1"]).unwrap();
    let files = certs.write(dir.path()).unwrap();
    let server = Serve::new().workers(1).tls(&files).start();
    let out = load(
        &server.listen.to_string(),
        "20",
        &[],
        &[("HONGBAO_SECRET", &server.secret)],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("--tls-ca"), "{said}");
}

#[test]
fn cli_errors_are_one_message_without_a_backtrace() {
    // A developer's machine often sets RUST_BACKTRACE: the CLI's own errors ignore it.
    let out = hongbao(
        &["ledger", "verify", "/nonexistent/ledger"],
        &[("RUST_BACKTRACE", "1")],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.starts_with("hongbao: "), "{said}");
    assert!(
        !said.contains("Stack backtrace") && !said.contains("Caused by"),
        "{said}"
    );
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    // A usage error is clap's: exit code 2.
    let out = hongbao(&["serve", "--no-such-flag"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A cause the message already names is not said twice (the port another server holds:
/// "…in use by process N…", once).
#[test]
fn an_error_names_each_cause_once() {
    let server = Serve::new().workers(1).start();
    let out = hongbao(
        &[
            "serve",
            "--listen",
            &server.listen.to_string(),
            "--admin",
            "127.0.0.1:0",
            "--data-dir",
            tempfile::tempdir().unwrap().path().to_str().unwrap(),
        ],
        &[],
    );
    let said = stderr(&out);
    assert!(!out.status.success(), "{said}");
    assert_eq!(said.matches("is in use").count(), 1, "{said}");
}
