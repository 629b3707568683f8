//! The deployment as it will be run (docs/deploy.md): the probes on the admin door,
//! systemd told when `serve` is ready, the image built from this very binary and run with
//! podman until a shake is answered from the container, the Kubernetes manifests checked
//! offline against the API's schemas, the systemd units verified by systemd.
//!
//! A test whose tool is missing or cannot work on this machine says so on stderr (past
//! the test harness's capture: `SKIPPED deploy::…: why`) and returns — never a pass that
//! claims to have run. CI installs the tools (`.ci/run`) and sets
//! `HONGBAO_REQUIRE_DEPLOY_TOOLS=1`, which turns a missing tool into a failure; a machine
//! whose podman is installed but cannot run containers still skips, saying why.

use std::io::Write;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hongbao_proto::{Message, ResultCode};
use std::os::linux::net::SocketAddrExt;

mod common;
use common::{field, login, signal, wait_until, Admin, Hongbao, Serve, SECRET, STOP_TIMEOUT};

/// The repository's root (deploy/ is under it).
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Says on the real stderr (the harness captures `eprintln!`, and a skip must be seen)
/// that `test` did not run and why.
fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED deploy::{test}: {why}");
}

/// `name` on the PATH, or where `HONGBAO_REQUIRE_DEPLOY_TOOLS` says it must be: `None`
/// (the caller skips) or, when tools are required, a failure.
fn tool(name: &str, test: &str, install: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var_os("HONGBAO_REQUIRE_DEPLOY_TOOLS").is_some_and(|v| v == "1") {
            panic!("{name} is required here (HONGBAO_REQUIRE_DEPLOY_TOOLS=1) and is not installed: {install}");
        }
        skipped(test, &format!("{name} is not installed ({install})"));
    }
    found
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `command` to its end: its output, which must show success.
fn succeeds(what: &str, command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

// --- the probes and systemd ---------------------------------------------------------

/// `GET /healthz` and `/readyz` of a real server: no key, the browser checks, nothing in
/// the admin log but the refusals; a worker killed leaves it ready (the other serves).
#[test]
fn the_probes_need_no_key_and_a_worker_restarting_leaves_it_ready() {
    let server = Serve::new().start();
    let probe = server.admin.without_key();
    assert_eq!(probe.http("GET", "/healthz", None), (200, "ok\n".into()));
    assert_eq!(probe.http("GET", "/readyz", None), (200, "ready\n".into()));
    let (status, _, headers) = probe.http_full("GET", "/readyz", None, &[]);
    assert_eq!(status, 200);
    assert!(headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("cache-control") && v == "no-store"));

    // The browser checks stand: a rebound name, another site's page.
    let rebound = probe.http_full("GET", "/readyz", None, &[("Host", "evil.example")]);
    assert_eq!(rebound.0, 403, "{}", rebound.1);
    let page = [("Origin", "https://evil.example")];
    assert_eq!(probe.http_full("GET", "/healthz", None, &page).0, 403);
    // GET only; the rest of the door is as locked as before.
    assert_eq!(probe.http("POST", "/healthz", Some("{}")).0, 405);
    assert_eq!(probe.http("GET", "/v1/stats", None).0, 401);
    let log = server.get("/v1/admin-log");
    for entry in log["entries"].as_array().unwrap() {
        let path = entry["path"].as_str().unwrap();
        if path.starts_with("/healthz") || path.starts_with("/readyz") {
            assert_eq!(
                entry["status"], 403,
                "a probe answered is not recorded: {entry}"
            );
        }
    }

    let killed = server.worker_pids()[0];
    signal(killed, "-KILL");
    let mut answers = std::collections::BTreeSet::new();
    wait_until(
        "the killed worker to be replaced",
        Duration::from_secs(20),
        || {
            let (status, body) = probe.http("GET", "/readyz", None);
            answers.insert((status, body));
            let pids = server.worker_pids();
            (!pids.contains(&killed)).then_some(())
        },
    );
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "one worker of two stayed up, so the server stayed ready: {answers:?}"
    );
    wait_until("every worker up again", Duration::from_secs(10), || {
        (probe.http("GET", "/readyz", None) == (200, "ready\n".into())).then_some(())
    });
}

/// Datagrams on `socket` until `until` is one of them (or 30 s pass): all of them.
fn datagrams_until(socket: &UnixDatagram, until: &str) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.iter().any(|m: &String| m.lines().any(|l| l == until)) {
        let n = socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("waiting for {until} (got {got:?}): {e}"));
        got.push(text(&buf[..n]));
    }
    got
}

/// `serve` under `NOTIFY_SOCKET` (an abstract name, as systemd gives inside containers):
/// READY=1 comes once its listener takes connections — a client connects and logs in the
/// moment it arrives — then STOPPING=1 when it stops; its workers never see the socket.
#[test]
fn systemd_is_told_ready_when_the_listener_serves_and_stopping_at_the_end() {
    let name = format!(
        "hongbao-test-notify-{}-{}",
        std::process::id(),
        hongbao_sys::clock::unix_us()
    );
    let socket = UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(&name).unwrap()).unwrap();
    let listening = socket.try_clone().unwrap();
    // What READY=1 said, and a login made the moment it arrived.
    let at_ready = std::thread::spawn(move || {
        let told = datagrams_until(&listening, "READY=1");
        let ready = told.last().unwrap().clone();
        let status = ready
            .lines()
            .find_map(|l| l.strip_prefix("STATUS="))
            .unwrap_or_else(|| panic!("READY=1 without a STATUS: {ready:?}"))
            .to_string();
        let listen = field(&status, "listen").parse().unwrap();
        let mut client = login(listen, 7, SECRET);
        let pong = client.request(&Message::Ping { client_time_us: 1 });
        (told, status, pong.map(|f| f.message))
    });
    let mut server = Serve::new()
        .env("NOTIFY_SOCKET", &format!("@{name}"))
        .start();
    let (told, status, pong) = at_ready.join().expect("the client at READY=1");
    assert_eq!(told.len(), 1, "READY=1 is the first thing said: {told:?}");
    assert_eq!(told[0], format!("READY=1\nSTATUS={status}"));
    assert_eq!(
        status,
        format!("serving: listen={} workers 2 of 2 up", server.listen)
    );
    assert!(matches!(pong, Ok(Message::Pong { .. })), "{pong:?}");

    for worker in server.worker_pids() {
        let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
        assert!(
            !environ
                .split(|&b| b == 0)
                .any(|kv| kv.starts_with(b"NOTIFY_SOCKET=")),
            "worker {worker} was given NOTIFY_SOCKET"
        );
    }

    server.stop();
    let told = datagrams_until(&socket, "STOPPING=1");
    assert_eq!(
        told.last().unwrap().as_str(),
        "STOPPING=1\nSTATUS=stopping",
        "{told:?}"
    );
    assert!(
        !told.iter().any(|m| m.contains("READY=1")),
        "READY=1 once only: {told:?}"
    );
}

/// An upgrade under systemd (SIGUSR2, `NotifyAccess=all`): the process it starts tells
/// the manager it is the main one now (`MAINPID=`) and ready, before the old one exits,
/// so the service is never seen without its main process.
#[test]
fn an_upgrade_tells_systemd_the_new_main_pid_before_the_old_one_goes() {
    let name = format!(
        "hongbao-test-notify-up-{}-{}",
        std::process::id(),
        hongbao_sys::clock::unix_us()
    );
    let socket = UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(&name).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut old = Serve::new()
        .workers(1)
        .data_dir(dir.path())
        .config("drain_secs = 1\n")
        .env("NOTIFY_SOCKET", &format!("@{name}"))
        .start();
    datagrams_until(&socket, "READY=1");
    signal(old.pid(), "-USR2");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut told: Vec<String> = Vec::new();
    let mut buf = [0u8; 4096];
    while !told.iter().any(|m| m.starts_with("MAINPID=")) {
        let n = socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("waiting for MAINPID= (got {told:?}): {e}"));
        told.push(text(&buf[..n]));
    }
    let new_pid: u32 = told
        .iter()
        .find_map(|m| m.strip_prefix("MAINPID="))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{told:?}"));
    assert_ne!(new_pid, old.pid(), "{told:?}");
    // Said while the old one still ran: it exits only after its drain.
    let old_exit = wait_until("the old server to go", Duration::from_secs(30), || {
        old.process.child.try_wait().unwrap()
    });
    assert!(old_exit.success());
    let lock = std::fs::read_to_string(dir.path().join("hongbao.lock")).unwrap();
    assert!(lock.contains(&format!("(pid {new_pid},")), "{lock}");
    signal(new_pid, "-INT");
    wait_until("the new server to stop", Duration::from_secs(20), || {
        let stat = std::fs::read_to_string(format!("/proc/{new_pid}/stat")).unwrap_or_default();
        (stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z')))
        .then_some(())
    });
}

// --- the image ------------------------------------------------------------------------

/// What a test made with podman, removed when it ends however it ends.
struct PodmanLeftovers {
    global: Vec<String>,
    containers: Vec<String>,
    image: String,
}

impl Drop for PodmanLeftovers {
    fn drop(&mut self) {
        for name in &self.containers {
            let _ = Command::new("podman")
                .args(&self.global)
                .args(["rm", "--force", "--time", "0", name])
                .output();
        }
        let _ = Command::new("podman")
            .args(["rmi", "--force", &self.image])
            .output();
    }
}

/// A limit from /proc/self/limits ("Max open files", "Max processes"): its hard value.
fn hard_limit(name: &str) -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in /proc/self/limits"));
    let hard = line[name.len()..].split_whitespace().nth(1).unwrap();
    hard.parse().unwrap_or(u64::MAX)
}

/// The paths `ldd` names for `binary`: its libraries and the loader.
fn linked_libraries(binary: &Path) -> Vec<String> {
    let out = succeeds("ldd", Command::new("ldd").arg(binary));
    text(&out.stdout)
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => Some(path.to_string()),
                [path, ..] if path.starts_with('/') => Some(path.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// The image built by deploy/image/build.sh from this test's own binary: exactly the
/// binary, what it links, the passwd and group files; run with podman as `serve` on the
/// host's network with a host directory as its data directory, as the user of the image
/// (not root); a campaign started through the admin API with the key the server wrote
/// there, a login and a shake won from the container; `podman stop` stops it cleanly.
#[test]
fn a_shake_is_answered_from_the_image_under_podman() {
    const TEST: &str = "a_shake_is_answered_from_the_image_under_podman";
    if tool(
        "podman",
        TEST,
        "apt-get install podman buildah; .ci/run does",
    )
    .is_none()
    {
        return;
    }
    let started = Instant::now();
    let exe = Path::new(env!("CARGO_BIN_EXE_hongbao"));
    let tag = format!("localhost/hongbao-test:deploy-{}", std::process::id());
    let mut leftovers = PodmanLeftovers {
        global: Vec::new(),
        containers: Vec::new(),
        image: tag.clone(),
    };
    let built = succeeds(
        "deploy/image/build.sh",
        Command::new(repo().join("deploy/image/build.sh"))
            .arg(exe)
            .arg(&tag)
            .env("BUILDER", "podman"),
    );
    let build_took = started.elapsed();
    let _ = writeln!(std::io::stderr(), "{}", text(&built.stdout).trim());

    // Which OCI runtime runs containers here: podman's default, else runc (crun refuses
    // a host whose cgroup v2 hierarchy has controllers beside v1's, as on some VMs).
    // Limits at most this process's own: a container without CAP_SYS_RESOURCE cannot
    // raise them, and podman's defaults for root are higher.
    let ulimits = [
        "--ulimit".to_string(),
        format!("nofile={0}:{0}", hard_limit("Max open files").min(1 << 20)),
        "--ulimit".to_string(),
        format!("nproc={0}:{0}", hard_limit("Max processes").min(4096)),
    ];
    let mut refusals = Vec::new();
    let info = succeeds(
        "podman info",
        Command::new("podman").args(["info", "--format", "{{.Host.OCIRuntime.Name}}"]),
    );
    let default = text(&info.stdout).trim().to_string();
    let runtimes: Vec<Vec<String>> = std::iter::once(Vec::new())
        .chain(
            ["runc", "crun"]
                .iter()
                .filter(|r| **r != default && tool_quiet(r))
                .map(|r| vec!["--runtime".to_string(), r.to_string()]),
        )
        .collect();
    let global = runtimes.into_iter().find(|global| {
        let out = Command::new("podman")
            .args(global)
            .args(["run", "--rm", "--network", "host"])
            .args(&ulimits)
            .arg(&tag)
            .arg("--version")
            .output()
            .expect("running podman");
        match out.status.code() {
            Some(0) => {
                assert!(text(&out.stdout).starts_with("hongbao "), "{out:?}");
                true
            }
            // podman's own failure or the runtime's (125, 126): this machine, not the image.
            Some(125 | 126) => {
                let runtime = global.get(1).unwrap_or(&default);
                refusals.push(format!("{runtime}: {}", text(&out.stderr).trim()));
                false
            }
            _ => panic!(
                "the image does not run its binary: {}\n{}",
                out.status,
                text(&out.stderr)
            ),
        }
    });
    let Some(global) = global else {
        skipped(
            TEST,
            &format!(
                "podman cannot run containers on this machine: {}",
                refusals.join("; ")
            ),
        );
        return;
    };
    leftovers.global = global.clone();
    let podman = || {
        let mut command = Command::new("podman");
        command.args(&global);
        command
    };

    // Exactly the binary, what it links, who it runs as.
    let look = format!("hongbao-test-look-{}", std::process::id());
    leftovers.containers.push(look.clone());
    succeeds(
        "podman create",
        podman().args(["create", "--name", &look, &tag]),
    );
    let export = succeeds(
        "podman export | tar -t",
        Command::new("sh").arg("-c").arg(format!(
            "podman {} export {look} | tar -t",
            global.join(" ")
        )),
    );
    let mut files: Vec<String> = text(&export.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .filter(|l| !l.is_empty() && !l.ends_with('/'))
        .collect();
    files.sort();
    let mut expected: Vec<String> = linked_libraries(exe)
        .iter()
        .map(|p| p.trim_start_matches('/').to_string())
        .chain(["etc/group", "etc/passwd", "usr/local/bin/hongbao"].map(String::from))
        .collect();
    expected.sort();
    // The runtime may leave its own mount points (an empty /etc/hosts, /run/.containerenv).
    files.retain(|f| expected.contains(f) || !is_runtime_mount_point(f));
    assert_eq!(files, expected, "the image holds exactly these files");
    let user = succeeds(
        "podman image inspect",
        podman().args(["image", "inspect", "--format", "{{.Config.User}}", &tag]),
    );
    assert_eq!(text(&user.stdout).trim(), "10001:10001");

    // serve from the image, its ledger in a host directory the image's user may write.
    let data = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(data.path(), Some(10001), Some(10001))
        .or_else(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777))
        })
        .unwrap();
    let name = format!("hongbao-test-serve-{}", std::process::id());
    leftovers.containers.push(name.clone());
    let mut command = podman();
    command
        .args(["run", "--rm", "--name", &name, "--network", "host"])
        .args(&ulimits)
        .arg("--volume")
        .arg(format!("{}:/data", data.path().display()))
        // The secret from podman's environment, never on a command line.
        .args(["--env", "HONGBAO_SECRET"])
        .env("HONGBAO_SECRET", SECRET)
        .arg(&tag)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--workers", "2", "--data-dir", "/data"]);
    let mut serve = Hongbao::start("serve (in podman)", command);
    let ready = serve.ready_line("hongbao serve ready: ");
    let listen = field(&ready, "listen").parse().unwrap();
    let admin_addr = field(&ready, "admin").parse().unwrap();

    let pid = succeeds(
        "podman inspect",
        podman().args(["inspect", "--format", "{{.State.Pid}}", &name]),
    );
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", text(&pid.stdout).trim())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uid.split_whitespace().nth(1),
        Some("10001"),
        "serve runs as the image's user: {uid}"
    );

    let probe = Admin::new(admin_addr, None);
    assert_eq!(probe.http("GET", "/readyz", None), (200, "ready\n".into()));
    let key = std::fs::read_to_string(data.path().join("admin.key")).expect("the first key");
    let admin = probe.with_key(key.trim());
    admin.shake_campaign(10, 1000, 1, 100);
    let mut client = login(listen, 1, SECRET);
    let won = wait_until(
        "a shake won from the container",
        Duration::from_secs(15),
        || match client.shake().expect("shake") {
            Message::ShakeReply {
                result: ResultCode::Won,
                amount_cents,
                ..
            } => Some(amount_cents),
            Message::ShakeReply { .. } => {
                std::thread::sleep(Duration::from_millis(100));
                None
            }
            other => panic!("expected a shake reply, got {other:?}"),
        },
    );
    assert_eq!(admin.balance(1), won);
    admin.audit();

    // podman stop: SIGTERM (the image's STOPSIGNAL), a clean exit.
    succeeds(
        "podman stop",
        podman().args(["stop", "--time", "30", &name]),
    );
    let exit = serve.wait_exit(STOP_TIMEOUT);
    assert!(exit.success(), "serve in podman exited with {exit}");
    assert!(data.path().join("ledger.sqlite").exists());
    let _ = writeln!(
        std::io::stderr(),
        "deploy: image built in {:.1} s, the whole test {:.1} s (runtime {})",
        build_took.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        global.get(1).unwrap_or(&default)
    );
}

/// Whether `name` is on the PATH (no message: for optional tools).
fn tool_quiet(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}

/// Files a runtime makes in a created container for its mounts: none of the image's.
fn is_runtime_mount_point(file: &str) -> bool {
    matches!(
        file,
        "etc/hosts" | "etc/hostname" | "etc/resolv.conf" | "run/.containerenv"
    ) || file.starts_with("dev/")
        || file.starts_with("proc/")
        || file.starts_with("sys/")
}

// --- the Kubernetes manifests ---------------------------------------------------------

/// The oldest Kubernetes the manifests are written for (Pod `preStop.sleep` is on by
/// default from 1.30) and the newest the validator knows.
const KUBERNETES_VERSIONS: [Option<&str>; 2] = [Some("1.30.0"), None];

/// The validator: on the PATH, in `KUBERNETES_VALIDATE`, or the virtual environment
/// `.ci/run` makes (target/venv-k8s).
fn kubernetes_validate(test: &str) -> Option<PathBuf> {
    let venv = repo().join("target/venv-k8s/bin/kubernetes-validate");
    if let Some(path) = std::env::var_os("KUBERNETES_VALIDATE").filter(|p| !p.is_empty()) {
        return Some(path.into());
    }
    if venv.is_file() {
        return Some(venv);
    }
    tool(
        "kubernetes-validate",
        test,
        "python3 -m venv target/venv-k8s && target/venv-k8s/bin/pip install kubernetes-validate; .ci/run does",
    )
}

/// Every manifest under deploy/k8s: the YAML files but the kustomizations.
fn manifests() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&repo().join("deploy/k8s"), &mut found);
    found.sort();
    found
}

/// `kubernetes-validate --strict` over `files` for `version` (None: its newest): its
/// output and whether it passed.
fn validate(tool: &Path, version: Option<&str>, files: &[PathBuf]) -> (bool, String) {
    let mut command = Command::new(tool);
    command.args(["--strict", "--quiet"]);
    if let Some(version) = version {
        command.args(["--kubernetes-version", version]);
    }
    let out = command
        .args(files)
        .output()
        .expect("running kubernetes-validate");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    (out.status.success() && !said.contains("ERROR"), said)
}

/// Every manifest passes the API's schemas, strictly (a field the API does not have is
/// an error, as `kubectl apply` would refuse it), for the oldest and newest Kubernetes.
#[test]
fn every_kubernetes_manifest_validates_offline_and_strictly() {
    let Some(tool) =
        kubernetes_validate("every_kubernetes_manifest_validates_offline_and_strictly")
    else {
        return;
    };
    let files = manifests();
    assert!(files.len() >= 7, "{files:?}");
    for version in KUBERNETES_VERSIONS {
        let (passed, said) = validate(&tool, version, &files);
        assert!(passed, "Kubernetes {version:?}:\n{said}");
    }
}

/// The validator refuses what is wrong, so the test above can fail: a gateway manifest
/// with a misspelt field, and one with a number where a string belongs.
#[test]
fn a_broken_manifest_is_refused() {
    let Some(tool) = kubernetes_validate("a_broken_manifest_is_refused") else {
        return;
    };
    let good = std::fs::read_to_string(repo().join("deploy/k8s/gateway.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let breaks = [
        (
            "imagePullPolicy: IfNotPresent",
            "imagePullPolcy: IfNotPresent",
        ),
        ("replicas: 2", "replicas: two"),
        ("periodSeconds: 2", "periodSeconds: [2]"),
    ];
    for (i, (from, to)) in breaks.iter().enumerate() {
        assert!(good.contains(from), "{from}");
        let broken = dir.path().join(format!("broken-{i}.yaml"));
        std::fs::write(&broken, good.replacen(from, to, 1)).unwrap();
        let (passed, said) = validate(&tool, None, &[broken]);
        assert!(!passed, "{to:?} passed:\n{said}");
        assert!(said.contains("did not validate"), "{said}");
    }
}

/// Each kustomization names exactly the manifests beside it (no file left out of
/// `kubectl apply -k`, none named that is not there), and every Pod template runs the
/// image by the name the kustomizations rewrite.
#[test]
fn the_kustomizations_name_every_manifest_beside_them() {
    for dir in ["deploy/k8s", "deploy/k8s/load"] {
        let dir = repo().join(dir);
        let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        let mut listed: Vec<String> = kustomization
            .lines()
            .skip_while(|l| !l.starts_with("resources:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.trim().strip_prefix("- ").map(str::to_string))
            .collect();
        listed.sort();
        let mut beside: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
            .collect();
        beside.sort();
        assert_eq!(listed, beside, "{}", dir.display());
        assert!(
            kustomization.contains("  - name: hongbao\n"),
            "{kustomization}"
        );
    }
    for manifest in manifests() {
        let yaml = std::fs::read_to_string(&manifest).unwrap();
        for line in yaml
            .lines()
            .filter(|l| l.trim_start().starts_with("image:"))
        {
            assert_eq!(line.trim(), "image: hongbao", "{}", manifest.display());
        }
    }
}

/// The number after `key` (`key = N` in the gateways' serve.toml, `key: N` in a
/// manifest), the first time it is set in `text`.
fn setting(text: &str, key: &str) -> u64 {
    text.lines()
        .map(str::trim)
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.trim_start();
            let value = rest.strip_prefix('=').or_else(|| rest.strip_prefix(':'))?;
            value.trim().trim_matches('"').parse().ok()
        })
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

/// The gateways' grace period holds their drain: a rolling update SIGTERMs a pod after
/// its `preStop` pause, serve lets its connections go over `drain_secs` and stops up to
/// 3 s after, and the kubelet's SIGKILL at the end of the grace must come later still.
/// And the drain is long enough for the others to take its clients: the connections a
/// gateway holds over the TLS logins a second the others make (docs/admin-api.md).
#[test]
fn the_gateways_grace_period_holds_their_drain() {
    /// TLS logins a second the gateways left take from one drained (docs/admin-api.md,
    /// "100,000 TLS clients at ~5,000 a second").
    const ADMITTED_PER_SEC: u64 = 5_000;
    let config = std::fs::read_to_string(repo().join("deploy/k8s/gateway-config.yaml")).unwrap();
    let gateway = std::fs::read_to_string(repo().join("deploy/k8s/gateway.yaml")).unwrap();
    let drain = setting(&config, "drain_secs");
    let connections = setting(&config, "connections");
    let grace = setting(&gateway, "terminationGracePeriodSeconds");
    let pause = setting(&gateway, "seconds");
    assert!(gateway.contains("preStop:\n              sleep:\n                seconds:"));
    assert!(
        drain * ADMITTED_PER_SEC >= connections,
        "{connections} connections over {drain} s: more than {ADMITTED_PER_SEC} a second"
    );
    assert!(
        pause + drain + 3 < grace,
        "preStop {pause} s + drain {drain} s + 3 s is not under the grace {grace} s"
    );
    // The next pod goes only once the last has been ready a while, and one at a time.
    assert!(setting(&gateway, "minReadySeconds") > 0);
    assert!(gateway.contains("updateStrategy:\n    type: RollingUpdate"));
}

// --- the systemd units ----------------------------------------------------------------

/// The units copied to a directory of their own, running the binary at `exe`.
fn units_in(dir: &Path, exe: &Path) -> Vec<PathBuf> {
    ["hongbao.service", "hongbao-load-agent@.service"]
        .iter()
        .map(|unit| {
            let text = std::fs::read_to_string(repo().join("deploy/systemd").join(unit)).unwrap();
            assert!(text.contains("ExecStart=/usr/local/bin/hongbao "), "{unit}");
            let copy = dir.join(unit);
            let here = text.replace("/usr/local/bin/hongbao", exe.to_str().unwrap());
            std::fs::write(&copy, here).unwrap();
            copy
        })
        .collect()
}

/// `systemd-analyze verify UNITS`: whether systemd had nothing to say of them (it warns
/// of an unknown key or a bad value and goes on, so its words count, not only its status).
fn verify(tool: &Path, units: &[PathBuf]) -> (bool, String) {
    let out = Command::new(tool)
        .args(["verify", "--man=no"])
        .args(units)
        .output()
        .expect("running systemd-analyze");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    let about_ours = said.lines().any(|line| {
        units.iter().any(|u| {
            let name = u.file_name().unwrap().to_string_lossy();
            line.contains(&*name) || line.contains(&*u.to_string_lossy())
        })
    });
    (out.status.success() && !about_ours, said)
}

/// hongbao.service and hongbao-load-agent@.service as systemd reads them: no unknown
/// key, no bad value, every command there.
#[test]
fn the_systemd_units_verify() {
    let Some(tool) = tool(
        "systemd-analyze",
        "the_systemd_units_verify",
        "apt-get install systemd",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let units = units_in(dir.path(), Path::new(env!("CARGO_BIN_EXE_hongbao")));
    let (passed, said) = verify(&tool, &units);
    assert!(passed, "systemd-analyze verify:\n{said}");
    let service = std::fs::read_to_string(&units[0]).unwrap();
    assert!(service.contains("\nType=notify\n"), "{service}");
}

/// The check above can fail: a misspelt key, a bad value, a missing binary.
#[test]
fn a_broken_unit_is_caught() {
    let Some(tool) = tool(
        "systemd-analyze",
        "a_broken_unit_is_caught",
        "apt-get install systemd",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let units = units_in(dir.path(), Path::new(env!("CARGO_BIN_EXE_hongbao")));
    let good = std::fs::read_to_string(&units[0]).unwrap();
    let exe = format!("ExecStart={}", env!("CARGO_BIN_EXE_hongbao"));
    for (from, to) in [
        ("ProtectSystem=strict", "ProtectSytem=strict"),
        ("Type=notify", "Type=notifyy"),
        (exe.as_str(), "ExecStart=/nonexistent/hongbao"),
    ] {
        assert!(good.contains(from), "{from}");
        std::fs::write(&units[0], good.replacen(from, to, 1)).unwrap();
        let (passed, said) = verify(&tool, &units[..1]);
        assert!(!passed, "{to:?} passed:\n{said}");
    }
}
