//! Sessions a thief cannot keep (issue 44), against the real binary: every token form an
//! attacker would try is refused on the wire and over HTTP; keys by `kid`, two live at
//! once and one removed by a reload; a session refreshed on its connection, one that
//! lapses kicked `expired`; a revocation that kicks at once and outlives a restart; a bot
//! over its per-user limits; the development secret and the demo log-in kept to loopback.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{pings, signal, wait_until, Serve, Server, IO_TIMEOUT};
use hongbao_proto::client::Client;
use hongbao_proto::token::{Alg, Claims, Minter};
use hongbao_proto::{KickReason, Message, ResultCode};
use serde_json::json;

const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/proto/testdata/keys");
const HS_SECRET: &str = "a login secret of the app server, 32+ bytes";

fn now() -> u64 {
    hongbao_sys::clock::unix_ms() / 1000
}

fn key_file(name: &str) -> PathBuf {
    Path::new(KEYS).join(name)
}

fn minter(kid: &str) -> Minter {
    match kid {
        "hs" | "hs-old" => Minter::hs256(kid, HS_SECRET.as_bytes()),
        "es" => Minter::new(
            "es",
            Alg::ES256,
            &std::fs::read(key_file("es256.pem")).unwrap(),
        )
        .unwrap(),
        "ed" => Minter::new(
            "ed",
            Alg::EdDSA,
            &std::fs::read(key_file("ed25519.pem")).unwrap(),
        )
        .unwrap(),
        other => panic!("no key {other}"),
    }
}

fn jwt(kid: &str, user: u64, ttl: u64) -> String {
    minter(kid).mint_for(user, now(), ttl)
}

/// A configuration with three login keys live (HS256, ES256 over a public key, EdDSA),
/// and `extra` TOML before them.
fn keys_config(dir: &Path, extra: &str, kids: &[&str]) -> PathBuf {
    let secret = dir.join("hs.secret");
    std::fs::write(&secret, HS_SECRET).unwrap();
    let mut toml = format!("{extra}\n");
    for kid in kids {
        let entry = match *kid {
            "hs" | "hs-old" => format!(
                "[[login_keys]]\nkid = \"{kid}\"\nalg = \"HS256\"\nsecret_file = \"{}\"\n",
                secret.display()
            ),
            "es" => format!(
                "[[login_keys]]\nkid = \"es\"\nalg = \"ES256\"\npublic_key_file = \"{}\"\n",
                key_file("es256.pub.pem").display()
            ),
            "ed" => format!(
                "[[login_keys]]\nkid = \"ed\"\nalg = \"EdDSA\"\npublic_key_file = \"{}\"\n",
                key_file("ed25519.pub.pem").display()
            ),
            other => panic!("no key {other}"),
        };
        toml.push_str(&entry);
    }
    let path = dir.join("serve.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

fn serve_with_keys(dir: &Path, extra: &str) -> Server {
    let config = keys_config(dir, extra, &["hs", "es", "ed"]);
    Serve::new()
        .args(["--config".to_string(), config.display().to_string()])
        .start()
}

fn connect(server: &Server) -> Client {
    let mut client = Client::connect(server.listen).unwrap();
    client.set_timeout(IO_TIMEOUT).unwrap();
    client
}

/// A login with `token` refused the way a login is refused: bad-token, then a kick
/// (`bad-token` from the worker; `revoked` from the core, when the revocation reached it
/// before the worker).
fn assert_refused(server: &Server, token: &[u8], what: &str) {
    let mut client = connect(server);
    let reply = client
        .request(&Message::Login {
            user_id: 0,
            token: token.to_vec(),
        })
        .unwrap();
    assert!(
        matches!(
            reply.message,
            Message::LoginReply {
                result: ResultCode::BadToken,
                ..
            }
        ),
        "{what}: {reply:?}"
    );
    let kick = client.recv().unwrap();
    assert!(
        matches!(
            kick.message,
            Message::Kick {
                reason: KickReason::BadToken | KickReason::Revoked,
                ..
            }
        ),
        "{what}: {kick:?}"
    );
}

fn b64(bytes: &[u8]) -> String {
    data_encoding::BASE64URL_NOPAD.encode(bytes)
}

/// A token put together by hand, HMAC-signed with `key`.
fn forged(header: &str, claims: &str, key: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let message = format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()));
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(message.as_bytes());
    format!("{message}.{}", b64(&mac.finalize().into_bytes()))
}

fn kick_of(client: &mut Client) -> KickReason {
    loop {
        match client.recv().unwrap().message {
            Message::Kick { reason, .. } => return reason,
            _ => continue,
        }
    }
}

#[test]
fn every_forged_token_is_refused_and_each_key_verifies_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with_keys(dir.path(), "");
    // Each algorithm, by its kid; two keys live at once is a rotation.
    for kid in ["hs", "es", "ed"] {
        let mut client = connect(&server);
        assert_eq!(
            client.login(&jwt(kid, 7, 600)).unwrap(),
            ResultCode::Ok,
            "{kid}"
        );
        assert!(pings(&mut client));
    }
    let exp = now() + 600;
    let es_public = std::fs::read(key_file("es256.pub.pem")).unwrap();
    let stale = Claims {
        exp: now() - 120,
        iat: Some(now() - 600),
        ..Claims::new(7, 0, 0)
    };
    let early = Claims {
        nbf: Some(now() + 600),
        ..Claims::new(7, now(), 1200)
    };
    let parts = |t: &str| t.split('.').map(str::to_string).collect::<Vec<_>>();
    let good = jwt("hs", 7, 600);
    let p = parts(&good);
    let mut flipped = p[2].clone().into_bytes();
    flipped[5] = if flipped[5] == b'A' { b'B' } else { b'A' };
    let refused: Vec<(&str, String)> = vec![
        ("expired", minter("hs").mint(&stale)),
        ("not yet valid", minter("hs").mint(&early)),
        (
            "an unknown kid",
            Minter::hs256("old", HS_SECRET.as_bytes()).mint_for(7, now(), 60),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(br#"{"alg":"none","kid":"hs"}"#),
                b64(format!(r#"{{"sub":"7","exp":{exp}}}"#).as_bytes())
            ),
        ),
        (
            "HS256 over the ES256 key's public bytes",
            forged(
                r#"{"alg":"HS256","kid":"es"}"#,
                &format!(r#"{{"sub":"7","exp":{exp}}}"#),
                &es_public,
            ),
        ),
        (
            "a tampered signature",
            format!("{}.{}.{}", p[0], p[1], String::from_utf8(flipped).unwrap()),
        ),
        (
            "another user's claims under this signature",
            format!("{}.{}.{}", p[0], parts(&jwt("hs", 8, 600))[1], p[2]),
        ),
        (
            "no exp",
            forged(
                r#"{"alg":"HS256","kid":"hs"}"#,
                r#"{"sub":"7"}"#,
                HS_SECRET.as_bytes(),
            ),
        ),
        ("sub 0", jwt("hs", 0, 600)),
        (
            "sub not a number",
            forged(
                r#"{"alg":"HS256","kid":"hs"}"#,
                &format!(r#"{{"sub":"seven","exp":{exp}}}"#),
                HS_SECRET.as_bytes(),
            ),
        ),
        (
            "sub a JSON number",
            forged(
                r#"{"alg":"HS256","kid":"hs"}"#,
                &format!(r#"{{"sub":7,"exp":{exp}}}"#),
                HS_SECRET.as_bytes(),
            ),
        ),
        (
            "the old HMAC token",
            hongbao_proto::token::hmac::token_hex(HS_SECRET.as_bytes(), 7),
        ),
        (
            "a day and more",
            minter("hs").mint_for(7, now(), 2 * 86_400),
        ),
    ];
    for (what, token) in &refused {
        assert_refused(&server, token.as_bytes(), what);
    }
    // A frame naming another user than the token's.
    let mut client = connect(&server);
    let reply = client
        .request(&Message::Login {
            user_id: 8,
            token: good.clone().into_bytes(),
        })
        .unwrap();
    assert!(matches!(
        reply.message,
        Message::LoginReply {
            result: ResultCode::BadToken,
            ..
        }
    ));
    // Each kind counted, by why (in the workers' next report, within a second).
    for reason in [
        "expired",
        "unknown-kid",
        "wrong-alg",
        "bad-signature",
        "no-exp",
        "bad-sub",
        "other-user",
    ] {
        let line = format!("hongbao_token_refusals_total{{reason=\"{reason}\"}}");
        wait_until(&line, Duration::from_secs(5), || {
            let metrics = server.admin.http("GET", "/metrics", None).1;
            let n: f64 = metrics
                .lines()
                .find(|l| l.starts_with(&line))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {line} in /metrics"));
            (n >= 1.0).then_some(())
        });
    }
}

#[test]
fn http_bearers_are_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let config = keys_config(dir.path(), "", &["hs", "es"]);
    let server = Serve::new()
        .http()
        .args(["--config".to_string(), config.display().to_string()])
        .start();
    let url = format!("http://{}/v1/me", server.http_addr());
    // The status, the WWW-Authenticate header and the body of GET /v1/me as `bearer`.
    let me = |bearer: &str| {
        let answer = match ureq::get(&url)
            .set("Authorization", &format!("Bearer {bearer}"))
            .call()
        {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("GET /v1/me: {e}"),
        };
        let status = answer.status();
        let challenge = answer.header("WWW-Authenticate").map(str::to_string);
        let body: serde_json::Value = answer.into_json().unwrap();
        (status, challenge, body)
    };
    let (status, _, body) = me(&jwt("es", 31, 600));
    assert_eq!(
        (status, &body["user"]),
        (200, &serde_json::json!(31)),
        "{body}"
    );
    for bearer in [
        jwt("ed", 31, 600), // a key this server does not have
        minter("hs").mint(&Claims {
            exp: now() - 100,
            ..Claims::new(31, now() - 200, 0)
        }),
        "31.0000".to_string(),
    ] {
        let (status, challenge, body) = me(&bearer);
        assert_eq!(status, 401, "{bearer}: {body}");
        assert_eq!(challenge.as_deref(), Some("Bearer"));
        assert_eq!(body["result"], "bad-token", "{body}");
    }
}

#[test]
fn a_session_is_refreshed_on_its_connection_or_kicked_when_its_token_ends() {
    let dir = tempfile::tempdir().unwrap();
    // Asked for a fresh token 30 s before its end, with no leeway: at once, for the
    // short tokens here.
    let server = serve_with_keys(
        dir.path(),
        "refresh_before_secs = 30\ntoken_leeway_secs = 0",
    );
    let mut kept = connect(&server);
    kept.on_refresh(|_| Some(jwt("es", 41, 600)));
    assert_eq!(kept.login(&jwt("hs", 41, 4)).unwrap(), ResultCode::Ok);
    let mut lapsed = connect(&server);
    assert_eq!(lapsed.login(&jwt("hs", 42, 4)).unwrap(), ResultCode::Ok);
    // Both are asked; one answers with a fresh token (the reply is its login-reply).
    let refresh = kept.next_push().unwrap();
    let Message::Refresh { expires_at_ms } = refresh.message else {
        panic!("not a refresh: {refresh:?}");
    };
    assert!(expires_at_ms / 1000 <= now() + 4, "{expires_at_ms}");
    assert!(matches!(
        lapsed.next_push().unwrap().message,
        Message::Refresh { .. }
    ));
    // Past the first token's end: the refreshed session goes on, the other is kicked.
    std::thread::sleep(Duration::from_secs(6));
    assert!(pings(&mut kept), "the refreshed session still answers");
    assert_eq!(kick_of(&mut lapsed), KickReason::Expired);
    assert!(pings(&mut kept));
    let stats = server.stats();
    assert!(stats["totals"]["refreshes"].as_u64() >= Some(1), "{stats}");
    assert!(
        stats["totals"]["kicks_expired"].as_u64() >= Some(1),
        "{stats}"
    );
    // A refresh with a refused token ends nothing (the session keeps its own); another
    // user's good token is refused too (a connection is one user's).
    let expired = minter("hs").mint(&Claims {
        exp: now() - 100,
        ..Claims::new(41, now() - 200, 0)
    });
    assert_eq!(kept.login(&expired).unwrap(), ResultCode::BadToken);
    assert_eq!(
        kept.login(&jwt("hs", 43, 600)).unwrap(),
        ResultCode::BadRequest
    );
    assert!(pings(&mut kept));
}

#[test]
fn a_revocation_kicks_at_once_and_outlives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let server = Serve::new().data_dir(data.path()).start();
    let mut alice = server.login(51);
    let old = common::token(&server.secret, 51);
    // Tokens are whole seconds: one issued in the second of the revocation counts as
    // before it.
    let (status, body) = server.admin.http("POST", "/v1/users/51/revoke", Some("{}"));
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["kicked"], 1, "{body}");
    assert_eq!(kick_of(&mut alice), KickReason::Revoked);
    // Its old token is refused; over HTTP too.
    assert_refused(&server, old.as_bytes(), "a revoked token");
    // A bad revocation starts nothing; a viewer may not revoke.
    assert_eq!(
        server
            .admin
            .http("POST", "/v1/users/0/revoke", Some("{}"))
            .0,
        400
    );
    assert_eq!(
        server
            .admin
            .http("POST", "/v1/users/x/revoke", Some("{}"))
            .0,
        400
    );
    let viewer = server
        .admin
        .with_key(&server.admin.make_key("looker", "viewer"));
    assert_eq!(
        viewer.http("POST", "/v1/users/52/revoke", Some("{}")).0,
        403
    );
    // On the record, naming the key.
    let log = server.get("/v1/admin-log");
    assert!(
        log["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == "/v1/users/51/revoke"
                && e["status"] == 200
                && e["key"] == "operator"),
        "{log}"
    );
    // A token issued after the revocation logs in.
    std::thread::sleep(Duration::from_millis(1100));
    let fresh = common::token(&server.secret, 51);
    let mut again = connect(&server);
    assert_eq!(again.login(&fresh).unwrap(), ResultCode::Ok);
    drop(again);
    // Across a restart on the same ledger: still refused.
    let secret = server.secret.clone();
    drop(server);
    let server = Serve::new().secret(&secret).data_dir(data.path()).start();
    assert_refused(&server, old.as_bytes(), "a revoked token after a restart");
    let mut again = connect(&server);
    assert_eq!(again.login(&fresh).unwrap(), ResultCode::Ok);
}

#[test]
fn a_removed_key_refuses_its_tokens_and_kicks_its_sessions_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let config = keys_config(dir.path(), "", &["hs-old", "es"]);
    let mut server = Serve::new()
        .args(["--config".to_string(), config.display().to_string()])
        .start();
    let mut on_old = connect(&server);
    assert_eq!(
        on_old.login(&jwt("hs-old", 61, 600)).unwrap(),
        ResultCode::Ok
    );
    let mut on_new = connect(&server);
    assert_eq!(on_new.login(&jwt("es", 62, 600)).unwrap(), ResultCode::Ok);
    // The old key goes; a new one comes: nobody else is logged out.
    keys_config(dir.path(), "", &["es", "ed"]);
    signal(server.pid(), "-HUP");
    assert_eq!(kick_of(&mut on_old), KickReason::Revoked);
    wait_until("the new key to verify", Duration::from_secs(10), || {
        let mut client = connect(&server);
        (client.login(&jwt("ed", 63, 600)).ok()? == ResultCode::Ok).then_some(())
    });
    assert!(pings(&mut on_new), "a session of a key kept stays");
    assert_refused(&server, jwt("hs-old", 61, 600).as_bytes(), "a removed key");
    // A configuration that does not load is refused whole: the running one stays.
    std::fs::write(&config, "[[login_keys]]\nkid = \"x\"\nalg = \"none\"\n").unwrap();
    signal(server.pid(), "-HUP");
    std::thread::sleep(Duration::from_millis(500));
    let mut client = connect(&server);
    assert_eq!(client.login(&jwt("ed", 64, 600)).unwrap(), ResultCode::Ok);
    assert!(
        server.process.log().contains("does not load"),
        "{}",
        server.process.log()
    );
    server.stop();
}

/// SIGHUP applies what it can (a login key, `[overload]`'s rate) and names, in the log,
/// the settings changed in the file that wait for the next start, instead of ignoring
/// them.
#[test]
fn a_reload_names_the_settings_it_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let config = keys_config(dir.path(), "max_queue_ms = 200\ndrain_secs = 5", &["hs"]);
    let mut server = Serve::new()
        .args(["--config".to_string(), config.display().to_string()])
        .start();
    // Shakes answered "overloaded" of a burst of 30, on a connection of user `user`.
    let overloaded = |server: &Server, user: u64| {
        let mut client = connect(server);
        assert_eq!(client.login(&jwt("hs", user, 600)).unwrap(), ResultCode::Ok);
        let ids: Vec<u32> = (0..30)
            .map(|_| client.send(&Message::Shake).unwrap())
            .collect();
        ids.iter()
            .filter(|_| {
                let frame = client.recv().unwrap();
                matches!(
                    frame.message,
                    Message::ShakeReply {
                        result: ResultCode::Overloaded,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(
        overloaded(&server, 64),
        0,
        "the default rate sheds none of 30"
    );
    keys_config(
        dir.path(),
        "max_queue_ms = 300\ndrain_secs = 7\n[ledger]\npacket_ttl_secs = 600\n[overload]\nmax_shake_qps = 2",
        &["hs", "ed"],
    );
    signal(server.pid(), "-HUP");
    wait_until("the new key to verify", Duration::from_secs(10), || {
        let mut client = connect(&server);
        (client.login(&jwt("ed", 65, 600)).ok()? == ResultCode::Ok).then_some(())
    });
    // [overload] is live: 2 a second for the server now.
    assert!(overloaded(&server, 66) > 0, "the reloaded rate sheds");
    let log = server.process.log();
    let said = log
        .lines()
        .find(|l| l.contains("a reload does not apply them"))
        .unwrap_or_else(|| panic!("no line names them:\n{log}"));
    assert!(said.contains("drain_secs, packet_ttl_secs"), "{said}");
    assert!(!said.contains("login_keys"), "{said}");
    assert!(!said.contains("max_queue_ms"), "{said}");
    server.stop();
}

#[test]
fn a_bot_over_its_limits_is_told_to_wait_and_nobody_else_is() {
    let server = Serve::new()
        .config("[user_limits]\nshake = { per_sec = 2.0, burst = 5 }\nsend = { per_sec = 1.0, burst = 2 }\n")
        .http()
        .start();
    let mut bot = server.login(71);
    let mut person = server.login(72);
    let mut limited = None;
    for _ in 0..8 {
        let reply = bot.shake().unwrap();
        if let Message::ShakeReply {
            result: ResultCode::RateLimited,
            retry_after_ms,
            ..
        } = reply
        {
            limited = Some(retry_after_ms);
            break;
        }
    }
    let wait = limited.expect("the bot's sixth shake in a second is refused");
    assert!((1..=500).contains(&wait), "{wait}");
    // Someone else shakes as before.
    assert!(matches!(
        person.shake().unwrap(),
        Message::ShakeReply {
            result: ResultCode::Nothing,
            ..
        }
    ));
    // Sends: two at once, then a wait; nothing moved (the bot has no money: refused for
    // its limit before its balance is looked at).
    for _ in 0..2 {
        let reply = bot.send_packet(1, 1, &[72]).unwrap();
        assert!(matches!(reply, Message::SendReply { .. }), "{reply:?}");
    }
    match bot.send_packet(1, 1, &[72]).unwrap() {
        Message::Error {
            result: ResultCode::RateLimited,
            retry_after_ms,
            text,
        } => {
            assert!((1..=1000).contains(&retry_after_ms), "{retry_after_ms}");
            assert!(text.contains("sends"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // Over HTTP (one keep-alive connection, as an app's is): 429 with Retry-After.
    let url = format!("http://{}/v1/shake", server.http_addr());
    let bearer = server.bearer(73);
    let agent = ureq::agent();
    let mut got_429 = false;
    for _ in 0..10 {
        match agent.post(&url).set("Authorization", &bearer).call() {
            Ok(r) => {
                r.into_string().unwrap();
            }
            Err(ureq::Error::Status(429, r)) => {
                assert_eq!(r.header("Retry-After"), Some("1"));
                let body: serde_json::Value = r.into_json().unwrap();
                assert_eq!(body["result"], "rate-limited", "{body}");
                got_429 = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(got_429, "an HTTP user over its shakes is told 429");
    let metrics = server.admin.http("GET", "/metrics", None).1;
    assert!(
        metrics.contains("hongbao_user_limited_total{action=\"send\"} 1"),
        "{metrics}"
    );
}

#[test]
fn logins_past_the_users_limit_leave_it_logged_out() {
    let server = Serve::new()
        .config("[user_limits]\nlogin = { per_sec = 0.1, burst = 2 }\n")
        .start();
    let token = common::token(&server.secret, 81);
    let _first = server.login(81);
    let _second = server.login(81);
    let mut third = connect(&server);
    match third
        .request(&Message::Login {
            user_id: 0,
            token: token.into_bytes(),
        })
        .unwrap()
        .message
    {
        Message::Error {
            result: ResultCode::RateLimited,
            retry_after_ms,
            ..
        } => assert!(retry_after_ms > 1000, "{retry_after_ms}"),
        other => panic!("{other:?}"),
    }
    // Not logged in: its requests are refused, the connection stays.
    match third.shake().unwrap() {
        Message::Error {
            result: ResultCode::NotLoggedIn,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert!(pings(&mut third));
}

#[test]
fn the_development_secret_and_the_demo_login_stay_on_loopback() {
    let exe = env!("CARGO_BIN_EXE_hongbao");
    let data = tempfile::tempdir().unwrap();
    let run = |args: &[&str], secret: Option<&str>| {
        let mut command = std::process::Command::new(exe);
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(data.path())
            .args(["--admin", "127.0.0.1:0", "--workers", "1"])
            .args(args)
            .env_remove("HONGBAO_SECRET");
        if let Some(secret) = secret {
            command.env("HONGBAO_SECRET", secret);
        }
        let out = command.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&["--listen", "0.0.0.0:0"], None);
    assert!(!ok && err.contains("development secret"), "{err}");
    let (ok, err) = run(
        &[
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "0.0.0.0:0",
            "--demo-login",
        ],
        Some("s3cret-of-this-test"),
    );
    assert!(!ok && err.contains("demo_login"), "{err}");
    // Nothing was started: no ledger was made.
    assert!(!data.path().join("ledger.sqlite").exists());
    // Without --demo-login there is no /token, even with the development secret.
    let server = Serve::new().dev_secret().http().start();
    let url = format!("http://{}/token?user=3", server.http_addr());
    match ureq::get(&url).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("{other:?}"),
    }
    let _ = json!({});
}

/// A version-1 `Login` frame, as the old clients (and the C floor's) write it.
fn v1_login(user: u64, token: &[u8]) -> Vec<u8> {
    let mut body = vec![1u8, 0x01, 0, 0, 0, 1];
    body.extend_from_slice(&user.to_be_bytes());
    body.push(token.len() as u8);
    body.extend_from_slice(token);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// The login reply's result to raw `frame`.
fn login_result(server: &Server, frame: &[u8]) -> ResultCode {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(server.listen).unwrap();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.write_all(frame).unwrap();
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).unwrap();
    let mut rest = vec![0u8; u32::from_be_bytes(head) as usize];
    stream.read_exact(&mut rest).unwrap();
    let whole = [&head[..], &rest].concat();
    match hongbao_proto::decode(&whole).unwrap().message {
        Message::LoginReply { result, .. } => result,
        other => panic!("not a login reply: {other:?}"),
    }
}

#[test]
fn the_old_hmac_token_logs_in_only_in_a_version_1_login_whatever_its_bytes() {
    use hongbao_proto::token::hmac;
    let secret = "the floor's shared secret, long enough for real";
    let server = Serve::new()
        .secret(secret)
        .config("hmac_login = true")
        .start();
    // A user whose raw HMAC holds a '.' (0x2E): the C floor's client sends exactly this.
    let user = (1..)
        .find(|&u| hmac::token(secret.as_bytes(), u).contains(&b'.'))
        .unwrap();
    let raw = hmac::token(secret.as_bytes(), user);
    assert_eq!(login_result(&server, &v1_login(user, &raw)), ResultCode::Ok);
    let hex = hmac::token_hex(secret.as_bytes(), 7);
    assert_eq!(
        login_result(&server, &v1_login(7, hex.as_bytes())),
        ResultCode::Ok
    );
    // The forged ones: another user's token, the same token in a version-2 login.
    assert_eq!(
        login_result(&server, &v1_login(8, hex.as_bytes())),
        ResultCode::BadToken
    );
    let mut client = connect(&server);
    let reply = client
        .request(&Message::Login {
            user_id: 7,
            token: hex.clone().into_bytes(),
        })
        .unwrap();
    assert!(
        matches!(
            reply.message,
            Message::LoginReply {
                result: ResultCode::BadToken,
                ..
            }
        ),
        "the HMAC token in a version-2 login: {reply:?}"
    );
    // Without hmac_login, a version-1 login is refused whatever it carries.
    let strict = Serve::new().secret(secret).start();
    assert_eq!(
        login_result(&strict, &v1_login(7, hex.as_bytes())),
        ResultCode::BadToken
    );
}
