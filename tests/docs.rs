//! The docs held to what happens: each test reads a sample or a list from a doc and
//! compares it with the code's default or the binary's own output, so that a doc that
//! drifts from the code fails here. (summary.json's fields and the series' columns are
//! held to docs/bench.md and docs/monitoring.md by their own tests.)

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Serve;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `hongbao ARGS`, which must succeed: (stdout, stderr).
fn hongbao(args: &[&str], dir: &Path) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args(args)
        .current_dir(dir)
        .env_remove("HONGBAO_SECRET")
        .output()
        .unwrap_or_else(|e| panic!("hongbao {args:?}: {e}"));
    let said = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (stdout, stderr) = (said(&out.stdout), said(&out.stderr));
    assert!(
        out.status.success(),
        "hongbao {args:?} exited with {}\n{stdout}{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// The text under a heading (the heading line exactly), to the next heading of its level
/// or above.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?}"))
        + heading.len()
        + 2;
    let rest = &doc[start..];
    let mut fenced = false;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        fenced ^= line.starts_with("```");
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !fenced && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            return &rest[..at];
        }
        at += line.len();
    }
    rest
}

/// The lines of the first fenced block in `text`.
fn first_block(text: &str) -> Vec<&str> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with("```"));
    lines.next().expect("a fenced block");
    lines.take_while(|l| !l.starts_with("```")).collect()
}

/// A line with every number (digits, with a fraction) as `N`: its shape, which a sample
/// line shares with today's output whatever was measured.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars
                .peek()
                .is_some_and(|&d| d.is_ascii_digit() || d == '.')
            {
                chars.next();
            }
            out.push('N');
        } else {
            out.push(c);
        }
    }
    out
}

/// The long options a subcommand's `--help` lists (but `--help`).
fn flags(subcommand: &str) -> BTreeSet<String> {
    let named = |args: &[&str]| -> BTreeSet<String> {
        let (help, _) = hongbao(args, &repo());
        help.lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| format!("--{}", l.split([' ', ',', '<']).next().unwrap()))
            .filter(|f| f != "--help" && f != "--version")
            .collect()
    };
    // The global flags (`--log-format`) are documented once, not in every synopsis.
    let global = named(&["--help"]);
    named(&[subcommand, "--help"])
        .difference(&global)
        .cloned()
        .collect()
}

/// The README's sample of `hongbao bench`'s output is today's, line for line in shape, and
/// no second's progress line is printed twice (it was, when a phase's send campaign began
/// in the second its shake campaign ended).
#[test]
fn the_readme_bench_sample_is_what_the_bench_prints() {
    let readme = read("README.md");
    let sample: Vec<&str> = first_block(
        readme
            .split_once("It prints a progress line per")
            .expect("the README's bench sample")
            .1,
    );
    assert!(sample.len() >= 5, "{sample:?}");
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, stderr) = hongbao(
        &[
            "bench",
            "--connections",
            "200",
            "--workers",
            "1",
            "--procs",
            "1",
            "--phase-qps",
            "500,1000",
            "--shake-packets",
            "20",
            "--send-packets",
            "10",
            "--out",
            "bench-out",
        ],
        tmp.path(),
    );
    let printed: BTreeSet<String> = stdout.lines().map(shape).collect();
    for line in &sample {
        assert!(
            printed.contains(&shape(line)),
            "the README's line\n{line}\nis not one the bench prints today:\n{stdout}{stderr}"
        );
    }
    let seconds: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("t="))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert!(!seconds.is_empty(), "no progress lines:\n{stdout}");
    let once: BTreeSet<&&str> = seconds.iter().collect();
    assert_eq!(
        once.len(),
        seconds.len(),
        "a second's progress line printed twice:\n{stdout}"
    );
}

/// docs/bench.md's `ledger-bench` sample: the lines it prints today, with serve's commit
/// interval and ledger-bench's own defaults.
#[test]
fn the_ledger_bench_sample_is_what_it_prints_with_the_defaults() {
    let bench_md = read("docs/bench.md");
    let doc = section(&bench_md, "## hongbao ledger-bench");
    let sample = first_block(doc.split_once("prints one result line").unwrap().1);
    let [started, result] = sample[..] else {
        panic!("two sample lines: {sample:?}")
    };
    let fields = |line: &str| -> Vec<(String, String)> {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        words
            .chunks(2)
            .map(|kv| (kv[0].to_string(), kv[1].to_string()))
            .collect()
    };
    let documented = fields(result);
    let value = |name: &str| -> String {
        let found = documented.iter().find(|(k, _)| k == name);
        found
            .unwrap_or_else(|| panic!("no {name} in {result}"))
            .1
            .clone()
    };
    let serve = hongbao_server::ServeConfig::default();
    assert_eq!(
        value("interval_ms"),
        serve.ledger.commit_interval_ms.to_string(),
        "the sample's interval is not serve's default"
    );
    let (help, _) = hongbao(&["ledger-bench", "--help"], &repo());
    for (flag, name) in [("--rate", "rate"), ("--secs", "secs")] {
        let default = help
            .split(flag)
            .nth(1)
            .and_then(|h| h.split("[default: ").nth(1))
            .and_then(|h| h.split(']').next())
            .unwrap_or_else(|| panic!("{flag}'s default in:\n{help}"));
        assert_eq!(
            value(name),
            default,
            "the sample's {name} is not the default"
        );
    }
    // Today's lines, in shape and field by field.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ledger");
    let (stdout, stderr) = hongbao(
        &[
            "ledger-bench",
            "--secs",
            "1",
            "--dir",
            dir.to_str().unwrap(),
        ],
        tmp.path(),
    );
    let line = stdout.trim_end();
    let names = |f: Vec<(String, String)>| f.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(names(fields(line)), names(documented.clone()), "{line}");
    assert!(
        stderr
            .lines()
            .any(|l| shape(l).split(" in ").next() == shape(started).split(" in ").next()),
        "the start line is not documented as it is:\n{stderr}\nagainst {started}"
    );
}

/// docs/bench.md's synopses (and docs/agents.md's) name every option `--help` lists.
#[test]
fn the_bench_md_synopses_name_every_option() {
    let (bench_md, agents_md) = (read("docs/bench.md"), read("docs/agents.md"));
    for (subcommand, doc, heading) in [
        ("load", &bench_md, "## hongbao load"),
        ("bench", &bench_md, "## hongbao bench"),
        ("ledger-bench", &bench_md, "## hongbao ledger-bench"),
        ("load-agent", &agents_md, "## hongbao load-agent"),
    ] {
        let synopsis = first_block(section(doc, heading)).join("\n");
        for flag in flags(subcommand) {
            let named = synopsis.match_indices(&flag).any(|(at, _)| {
                !synopsis[at + flag.len()..]
                    .starts_with(|c: char| c == '-' || c.is_ascii_alphanumeric())
            });
            assert!(named, "the {subcommand} synopsis lacks {flag}");
        }
    }
}

/// docs/bench.md's list of what the load's `GET /stats` answers is the progress record's
/// fields.
#[test]
fn the_load_stats_fields_are_the_documented_ones() {
    let progress = hongbao_load::coordinator::progress(
        &hongbao_load::coordinator::Row::default(),
        &hongbao_load::report::Counters::default(),
        1,
    );
    let value = serde_json::to_value(&progress).unwrap();
    let fields: BTreeSet<String> = value.as_object().unwrap().keys().cloned().collect();
    let bench_md = read("docs/bench.md");
    let listed = bench_md
        .split_once("`GET /stats` returns the progress")
        .and_then(|(_, rest)| rest.split_once("(`"))
        .and_then(|(_, rest)| rest.split_once("`)"))
        .expect("docs/bench.md's list of GET /stats fields")
        .0;
    let documented: BTreeSet<String> = listed
        .split(',')
        .map(|f| f.trim().split('{').next().unwrap().to_string())
        .collect();
    assert_eq!(documented, fields, "docs/bench.md's GET /stats fields");
}

/// docs/admin-api.md's metrics tables name every metric `/metrics` exposes, and its
/// `demo_login` row names every address that answers `/token`.
#[test]
fn admin_api_md_names_every_metric_and_where_token_answers() {
    let serve = Serve::new()
        .dev_secret()
        .demo_login()
        .ws()
        .http()
        .workers(1)
        .start();
    let admin = &serve.admin;
    let doc = read("docs/admin-api.md");
    let metrics = section(&doc, "## Metrics");

    let (status, text) = admin.http("GET", "/metrics", None);
    assert_eq!(status, 200, "{text}");
    let names: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert!(names.len() > 10, "{text}");
    for name in names {
        // The worker counters are listed as `…_<counter>_total` after the first in full.
        let short = name
            .strip_prefix("hongbao_worker")
            .filter(|rest| rest.ends_with("_total"))
            .map(|rest| format!("`…{rest}`"));
        assert!(
            metrics.contains(&format!("`{name}`"))
                || metrics.contains(&format!("`{name}{{"))
                || short.is_some_and(|s| metrics.contains(&s)),
            "docs/admin-api.md's metrics do not name {name}"
        );
    }

    let demo_login = doc
        .lines()
        .find(|l| l.starts_with("| `demo_login`"))
        .expect("the demo_login row");
    let agent = ureq::AgentBuilder::new().build();
    let token_status = |addr: &str| match agent.get(&format!("http://{addr}/token?user=1")).call() {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(status, _)) => status,
        Err(e) => panic!("GET /token at {addr}: {e}"),
    };
    let (ws, http) = (serve.ws_addr().to_string(), serve.http_addr().to_string());
    for (name, addr, address) in [("ws", ws, "WebSocket"), ("http", http, "HTTP API")] {
        assert_eq!(token_status(&addr), 200, "/token at {name}=");
        assert!(
            demo_login.contains(&format!("{address} address")),
            "/token answers on the {address} address; the demo_login row: {demo_login}"
        );
    }
    assert_eq!(token_status(&admin.addr.to_string()), 404);
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading's anchor in a Markdown file (repeats numbered as GitHub does).
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in doc.lines() {
        fenced ^= line.starts_with("```");
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if fenced || hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[hashes..]);
        let mut name = base.clone();
        let mut n = 0;
        while seen.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        seen.insert(name);
    }
    seen
}

/// Every relative link of the README and the docs reaches a file, and an anchor in it
/// (BENCHMARKS.md's table points into the diary by anchor).
#[test]
fn links_in_the_readme_and_the_docs_resolve() {
    let mut docs = vec![repo().join("README.md")];
    for dir in ["docs", "docs/benchmarks"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    let mut checked = 0;
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (at, _) in text.match_indices("](") {
            let link = &text[at + 2..];
            let Some(link) = link.split(')').next() else {
                continue;
            };
            if link.contains("://") || link.contains(' ') || link.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((link, ""));
            let target = match file {
                "" => doc.clone(),
                file => doc.parent().unwrap().join(file),
            };
            assert!(target.exists(), "{}: {link}: no such file", doc.display());
            if !fragment.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let there = anchors(&std::fs::read_to_string(&target).unwrap());
                assert!(
                    there.contains(fragment),
                    "{}: {link}: no such heading in {}",
                    doc.display(),
                    target.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked} links");
}

/// Every field `serve`'s configuration file takes, as the loader itself lists them when it
/// refuses an unknown one.
fn config_fields() -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "wrokers = \"4\"\n").unwrap();
    let flags = hongbao_server::config::ServeFlags {
        config: Some(path),
        ..Default::default()
    };
    let refused = hongbao_server::config::ServeConfig::load(&flags)
        .err()
        .expect("an unknown field is refused")
        .to_string();
    let listed = refused
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("the refusal lists the fields: {refused}"))
        .1;
    let fields: Vec<String> = listed
        .split(',')
        .map(|f| f.trim().trim_matches('`').to_string())
        .filter(|f| !f.is_empty())
        .collect();
    assert!(fields.len() > 40, "{refused}");
    fields
}

/// admin-api.md's configuration table has a row for every field the file takes (the
/// table once lacked twelve).
#[test]
fn the_configuration_table_names_every_field_the_file_takes() {
    let doc = read("docs/admin-api.md");
    let table = section(&doc, "## Configuring `hongbao serve`");
    let rows: BTreeSet<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name))
        .collect();
    for field in config_fields() {
        // A field's older name, still read, is named in its new name's row.
        let older = table.contains(&format!("older name `{field}`"));
        assert!(
            rows.contains(field.as_str()) || older,
            "docs/admin-api.md's configuration table has no row for `{field}`"
        );
    }
}

/// Every `toml` example of the configuration in the docs loads with the real loader (the
/// one in admin-api.md once put fields under `[user_limits]`, which `serve` refused).
#[test]
fn the_configuration_examples_in_the_docs_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut loaded = 0;
    for doc in [
        "docs/admin-api.md",
        "docs/security.md",
        "docs/deploy.md",
        "README.md",
    ] {
        let text = read(doc);
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "```toml" {
                continue;
            }
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            let block = block.join("\n");
            // A capacity plan or an agent's file is not serve's.
            if block.contains("[[stages]]") || block.contains("[stage") {
                continue;
            }
            let path = dir.path().join(format!("example-{loaded}.toml"));
            std::fs::write(&path, &block).unwrap();
            let flags = hongbao_server::config::ServeFlags {
                config: Some(path),
                ..Default::default()
            };
            if let Err(e) = hongbao_server::config::ServeConfig::load(&flags) {
                panic!("{doc}: the example does not load: {e}\n{block}");
            }
            loaded += 1;
        }
    }
    assert!(loaded >= 1, "no configuration example found");
}

/// Every worker counter `/v1/stats` totals has a row in admin-api.md's counter table and
/// a name in its metrics table (six were once missing from both).
#[test]
fn every_worker_counter_is_in_the_counter_tables() {
    let serve = Serve::new().workers(1).start();
    let workers = serve.workers_reported();
    let per_sec = workers[0]["per_sec"].as_object().unwrap().clone();
    let doc = read("docs/admin-api.md");
    let stats = section(&doc, "### GET /v1/stats");
    let metrics = section(&doc, "## Metrics");
    assert!(per_sec.len() > 30, "{per_sec:?}");
    for counter in per_sec.keys() {
        let in_table = stats.lines().any(|l| {
            l.starts_with("| `")
                && l.split('|')
                    .nth(1)
                    .is_some_and(|c| c.contains(&format!("`{counter}`")))
        });
        assert!(
            in_table,
            "the /v1/stats counter table has no row for `{counter}`"
        );
        assert!(
            metrics.contains(&format!("`…_{counter}_total`"))
                || metrics.contains(&format!("`hongbao_worker_{counter}_total`")),
            "the metrics table does not name hongbao_worker_{counter}_total"
        );
    }
}

/// The browser page's 🧧, 摇一摇 and 拆 show as boxes on a fresh Debian machine without
/// CJK and emoji fonts: the README's set-up names them, and on a machine set up by it
/// (CI: `.ci/run`) fontconfig finds a font for each.
#[test]
fn the_readme_set_up_brings_the_fonts_the_page_is_drawn_in() {
    let readme = read("README.md");
    for package in ["fonts-noto-cjk", "fonts-noto-color-emoji"] {
        assert!(
            readme.contains(package),
            "the README's set-up names {package}"
        );
        assert!(
            read(".ci/run").contains(package),
            ".ci/run installs {package}"
        );
    }
    let Ok(out) = Command::new("fc-list").arg("--version").output() else {
        assert!(
            std::env::var_os("HONGBAO_REQUIRE_DEPLOY_TOOLS").is_none(),
            "fc-list (fontconfig, with chromium) is missing"
        );
        return;
    };
    assert!(out.status.success());
    for (what, codepoint) in [("🧧", "1f9e7"), ("摇", "6447"), ("拆", "62c6")] {
        let out = Command::new("fc-list")
            .args([&format!(":charset={codepoint}"), "family"])
            .output()
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
            "no font draws {what}"
        );
    }
}

/// What the README's commands make inside a checkout — a ledger and its admin key, a
/// throwaway CA's private key, a bench's and a monitor's output — git never offers to
/// commit.
#[test]
fn what_the_readme_makes_in_a_checkout_is_ignored() {
    for made in [
        "hongbao-data/admin.key",
        "hongbao-data/ledger.sqlite",
        "hongbao-tls/key.pem",
        "bench-out/summary.json",
        "monitor-out/report.html",
        "hongbao-load.key",
        "hongbao-monitor.key",
    ] {
        let out = Command::new("git")
            .args(["check-ignore", "-q", "--no-index", made])
            .current_dir(repo())
            .status()
            .expect("git");
        assert!(out.success(), "{made} is not in .gitignore");
    }
}

/// Help that says what each thing is: every argument described, defaults shown, and the
/// engines' CA of `serve` not named like the server's CA of `load`.
#[test]
fn the_help_describes_every_argument_and_names_its_default() {
    let (remove, _) = hongbao(&["admin-key", "remove", "--help"], &repo());
    let name_line = remove
        .lines()
        .find(|l| l.trim_start().starts_with("<NAME>"))
        .unwrap_or_else(|| panic!("{remove}"));
    assert!(
        name_line.trim().len() > "<NAME>".len(),
        "NAME undescribed: {remove}"
    );
    let (serve, _) = hongbao(&["serve", "--help"], &repo());
    for flag in ["--max-shake-qps", "--packet-ttl-secs"] {
        let at = serve
            .find(flag)
            .unwrap_or_else(|| panic!("{flag}: {serve}"));
        let rest = &serve[at..];
        let entry = &rest[..rest[2..].find("\n  -").map_or(rest.len(), |n| n + 2)];
        assert!(
            entry.contains("[default: "),
            "{flag} names no default: {entry}"
        );
    }
    assert!(serve.contains("--engines-ca"), "{serve}");
    assert!(
        !serve.contains("--tls-ca"),
        "serve's --tls-ca is load's name: {serve}"
    );
    // Keys are listed with dates a person reads.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    hongbao(
        &[
            "admin-key",
            "add",
            "ops",
            "--role",
            "viewer",
            "--data-dir",
            data,
        ],
        &repo(),
    );
    let (list, _) = hongbao(&["admin-key", "list", "--data-dir", data], &repo());
    assert!(list.contains(" UTC by cli"), "{list}");
}

/// Every JSON answer http-api.md shows is exactly what the API's types write
/// (`hongbao_proto::api`, which the gateway writes through and the load reads through):
/// the same fields, the same spelling, keys sorted.
#[test]
fn the_http_api_examples_are_the_types_answers() {
    use hongbao_proto::api;
    use serde::de::DeserializeOwned;
    use serde::Serialize;
    fn same<T: DeserializeOwned + Serialize>(heading: &str, example: &str) {
        let read: T = serde_json::from_str(example)
            .unwrap_or_else(|e| panic!("{heading}: {example} does not read: {e}"));
        assert_eq!(api::to_body(&read), example, "{heading}");
    }
    let doc = read("docs/http-api.md");
    let mut checked = 0;
    for heading in [
        "### GET /v1/ping",
        "### POST /v1/shake",
        "### POST /v1/packets",
        "### POST /v1/packets/{id}/open",
        "### GET /v1/me",
        "### GET /v1/notices",
        "### POST /v1/chat",
        "### A refusal",
    ] {
        let text = section(&doc, heading);
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "```json" {
                continue;
            }
            let example = lines.next().expect("an example").trim();
            match heading {
                "### GET /v1/ping" => same::<api::Pong>(heading, example),
                "### POST /v1/shake" | "### POST /v1/packets/{id}/open" => {
                    same::<api::Taken>(heading, example)
                }
                "### POST /v1/packets" => same::<api::Sent>(heading, example),
                "### GET /v1/me" => same::<api::Me>(heading, example),
                "### GET /v1/notices" => same::<api::Notices>(heading, example),
                "### POST /v1/chat" => same::<api::Done>(heading, example),
                _ => same::<api::Refused>(heading, example),
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} examples");
}
