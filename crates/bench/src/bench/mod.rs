//! `hongbao bench`: the seed experiment on one machine. Starts a server and a load, runs
//! the phases (connect everyone; then for each QPS step a shake campaign and a send
//! campaign under that load), audits the money after every phase and at the end, stops
//! everything it started, and writes `summary.json` and `series.csv` (docs/bench.md).
//!
//! The audit holds three witnesses against each other: the campaigns' own counts, the
//! clients' counts of what they were told, and the ledger's balances user by user.
//!
//! With `--broadcast-every S` it also broadcasts every S seconds of each steady phase and
//! checks that every connection the server handed a broadcast to received it, timing the
//! deliveries (`broadcast.rs`; `broadcasts.json`).
//!
//! - `options`: what the bench is asked to do, its presets and faults;
//! - `admin`: requests to the server's admin API, with its key;
//! - `agents`: the load on agents (their plan, their summary) and a target's CA;
//! - `inject`: the faults done to the server, and their heals;
//! - `disk`: the small tmpfs for the ledger that `disk-full` fills;
//! - `chaos`: `--chaos`, faults at random moments, and what each cost;
//! - `server`: the bench's server, a local one or a lab; `local`: the local `hongbao serve`
//!   child, started again after `supervisor-kill`; `broadcaster`: broadcasts in phases;
//! - `summary`: `summary.json` as typed structs, and each phase's audit;
//! - `ledger`: the audit's third witness, the ledger's balances user by user;
//! - `history`: the per-operation check of what each client was told against the ledger.

mod admin;
mod agents;
mod broadcaster;
pub mod chaos;
mod disk;
mod history;
mod inject;
mod injected;
mod ledger;
mod local;
mod options;
mod primary;
mod rolling;
pub(crate) mod server;
pub mod summary;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hongbao_sys::clock::unix_ms;

use anyhow::Context;
use hongbao_money::rules::{SendCampaignRequest, ShakeCampaignRequest};
use hongbao_money::seam::Balances;
use hongbao_money::{Audit, CampaignStatus};
use hongbao_monitor::Monitor;

use broadcaster::{wait_deliveries, Broadcaster};
use hongbao_load::broadcast;
use hongbao_load::client::DEFAULT_OVERLOAD_BACKOFF_SECS;
use hongbao_load::coordinator::{Load, LoadOptions, Row};
use hongbao_load::transport::Transport;
pub use options::{
    AgentsChoice, BenchOptions, ChaosOptions, Fault, Preset, RedisAim, Target,
    DEFAULT_BENCH_BROADCAST_YIELD_MS, DEFAULT_BENCH_MAX_QUEUE_MS, DEFAULT_SERVER_NICE,
    DISK_FULL_HOLD, SECRET, WORKER_STALL,
};
use server::{Server, ServerSample};
pub use summary::Summary;
use summary::{
    AuditSummary, ConnectionsSummary, Discrepancy, EngineSummary, FaultSecond, FaultSummary,
    LoadSummary, NetworkSummary, OptionsSummary, Phase, Resources, SendAudit, ShakeAudit,
};

/// Runs the bench; returns the summary (also written to `out/summary.json`). The caller
/// exits non-zero when `summary.audit.ok` is false.
pub fn run(opts: BenchOptions) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let data_dir = opts.out.join("data");
    if data_dir.exists() {
        disk::SmallDisk::clear_stale(&data_dir);
        std::fs::remove_dir_all(&data_dir).context("clearing the previous bench's ledger")?;
    }
    // `disk-full` fills a tmpfs of the ledger's own; unmounted when the bench ends, also
    // on an error (dropped after the server, which is declared after it).
    let small_disk = if opts.hosts == 0 && opts.faults().any(|f| f.needs_small_disk()) {
        let disk = disk::SmallDisk::mount(&data_dir, disk::bytes_for(&opts))?;
        say(&format!(
            "bench: disk-full: the ledger is on a {} MiB tmpfs of its own",
            disk.bytes >> 20
        ));
        Some(disk)
    } else {
        None
    };
    let monitor = Monitor::start(opts.monitor_listen, Some(&opts.out), "hongbao bench")?;
    say(&format!(
        "bench: dashboard at http://{}/ ; series in {}",
        monitor.addr(),
        opts.out.join("series.csv").display()
    ));
    monitor.mark("start");
    say(&if let Some(t) = &opts.target {
        format!(
            "bench: loading the running deployment: clients to {}, admin API at {}",
            t.clients, t.admin
        )
    } else if opts.hosts > 0 {
        format!(
            "bench: bringing up a lab of {} gateway hosts (workers {}) in cluster mode, nginx in front; its files in {}",
            opts.hosts,
            opts.workers,
            opts.out.join("lab").display()
        )
    } else {
        format!(
            "bench: starting hongbao serve (workers {}), ledger in {}",
            opts.workers,
            data_dir.display()
        )
    });
    let server = Server::start(&opts, &data_dir, monitor.addr(), monitor.key())?;
    std::thread::sleep(Duration::from_millis(1500));
    let server_baseline = server.sample()?;

    // Once-a-second server samples, for the series and the server-side QPS.
    let samples: Arc<Mutex<Vec<ServerSample>>> = Arc::default();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (samples, sampling, admins, key) = (
            samples.clone(),
            sampling.clone(),
            server.admins.clone(),
            server.key.clone(),
        );
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                if let Some(s) = server::sample_all(&admins, &key) {
                    samples.lock().unwrap().push(s);
                }
                let ms = unix_ms() % 1000;
                // Sample in the middle of each second, away from the workers' report instants.
                std::thread::sleep(Duration::from_millis(((1500 - ms) % 1000).max(10)));
            }
        })
    };

    let agents = agents::plan(&opts, &server)?;
    if let Some(plan) = &agents {
        say(&format!(
            "bench: waiting for {} agents at {} (key {}, CA {}){}",
            plan.count,
            plan.listen,
            plan.dir.join(hongbao_load::agent::link::KEY_FILE).display(),
            plan.dir.join(hongbao_load::agent::link::CA_FILE).display(),
            if plan.spawn {
                "; starting them here"
            } else {
                ""
            }
        ));
    }
    // Against a running deployment: its balances before, so the check is of this run's.
    // ...and what its ledger held, so the history check judges this run's operations.
    let history_scope = match &opts.target {
        Some(_) => Some(history::Scope::before(&server)?),
        None => None,
    };
    let balances_before: Option<Balances> = match &opts.target {
        Some(_) => Some(server.get("/v1/balances")?),
        None => None,
    };
    let load = Load::start(LoadOptions {
        server: match opts.transport {
            Transport::Tcp => server.listen,
            Transport::Ws => server.ws.context("the server has no WebSocket listener")?,
            Transport::Http => server.http.context("the server has no HTTP listener")?,
        },
        transport: opts.transport,
        users: opts.connections,
        first_user: 1,
        qps: 0,
        procs: opts.procs,
        source_ips: None,
        connect_rate: opts.connect_rate,
        connect_storm: opts.connect_storm,
        connect_timeout_ms: hongbao_load::client::DEFAULT_CONNECT_TIMEOUT_MS,
        secret: opts
            .target
            .as_ref()
            .map_or(SECRET.to_string(), |t| t.secret.clone()),
        signer: Default::default(),
        tls_ca: opts.client_ca()?,
        connect_at_epoch: true,
        monitor: Some(monitor.addr().to_string()),
        monitor_key: Some(monitor.key().to_string()),
        monitor_key_file: None,
        overload_backoff_secs: DEFAULT_OVERLOAD_BACKOFF_SECS,
        http_connection: opts.http_connection,
        notice_poll_secs: opts.notice_poll_secs,
        hosts: server.load_hosts.clone(),
        request: None,
        agents,
    })?;
    monitor.mark_at(load.epoch_ms(), "connect");
    say(&format!(
        "bench: {} load client processes; connecting {} users",
        load.procs(),
        opts.connections
    ));
    std::thread::sleep(Duration::from_millis(
        load.epoch_ms()
            .saturating_sub(unix_ms())
            .saturating_sub(300),
    ));
    let load_baseline: u64 = load
        .pids()
        .iter()
        .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).0)
        .sum();

    // Phase 1: connect everyone.
    let connect_timeout = Duration::from_secs(60 + opts.connections / 1000);
    let connected = load.wait_logged_in(connect_timeout);
    let connect_seconds = unix_ms().saturating_sub(load.epoch_ms()) as f64 / 1000.0;
    if !connected {
        say(&format!(
            "bench: only {} of {} logged in after {connect_seconds:.1} s",
            load.logged_in(),
            opts.connections
        ));
    } else {
        say(&format!(
            "bench: {} connected and logged in after {connect_seconds:.1} s",
            opts.connections
        ));
    }
    let mut summaries = Vec::new();
    // Each phase's shake campaign: a deployment's own campaigns beside the run's are told
    // apart by it (`--target`).
    let mut shake_campaigns = Vec::new();
    let mut discrepancies: Vec<Discrepancy> = Vec::new();
    // With --hosts: the engines' counters from here (the phases) to the end.
    let engines_before = server.engine_counters();
    let totals_before = load.totals();
    let mut shake_total = ShakeAudit::default();
    let mut send_total = SendAudit::default();
    let mut broadcaster = Broadcaster::new(opts.broadcast_every_secs);

    let mut fault_thread = None;
    let mut fault_second = 0;
    // With --chaos: its thread from the first phase's start, stopped after the last.
    let faulty = opts.fault.is_some() || opts.chaos.is_some();
    let chaos_stop = Arc::new(AtomicBool::new(false));
    let mut chaos_thread = None;
    // The phase under way, for chaos to mark again once a fault is healed.
    let current_phase = Arc::new(Mutex::new(String::new()));
    let mut last_phase_end = 0;
    // The fault's phase: its rate and its last second.
    let mut fault_phase = (0, 0);
    for (n, &qps) in opts.phase_qps.iter().enumerate() {
        let name = format!("qps-{qps}");
        let from = load.set_qps(qps)?;
        monitor.mark_at(load.epoch_ms() + from * 1000, &name);
        *current_phase.lock().unwrap() = name.clone();
        say(&format!(
            "bench: phase {} at {qps} QPS from second {from}",
            n + 2
        ));
        wait_until_second(&load, from + 1);
        broadcaster.start_phase(&name);
        if let (0, Some(chaos)) = (n, &opts.chaos) {
            let (injector, stop) = (server.injector(), chaos_stop.clone());
            // Each fault marked on the series as it starts, and the phase again once
            // it is healed.
            let (marker, phase) = (monitor.marker(), current_phase.clone());
            let mark = move |at: u64, fault: Option<options::Fault>| match fault {
                Some(f) => {
                    marker.mark_at(at, &format!("{}{}", hongbao_report::CHAOS_PHASE, f.name()))
                }
                None => marker.mark_at(at, &phase.lock().unwrap()),
            };
            chaos_thread = Some(chaos::start(injector, chaos.clone(), stop, say, mark));
        }
        if let (0, Some(fault)) = (n, opts.fault) {
            let after = Duration::from_secs_f64(opts.fault_at_secs.max(0.0));
            fault_thread = server.inject_later(fault, after);
            fault_second = from + 1 + after.as_secs();
            monitor.mark_at(
                load.epoch_ms() + (from + 1) * 1000 + after.as_millis() as u64,
                fault.name(),
            );
        }
        let before = load.totals();
        let shake = ShakeCampaignRequest {
            packets: opts.shake_packets,
            rate_per_sec: opts.campaign_rate,
            amount_min: 100,
            amount_max: 10_000,
        };
        // The newest progress line printed: the send campaign's wait goes on from it.
        let mut printed = 0;
        let shake = start_campaign(&server, "shake", &shake)?;
        let shake = wait_campaign(&server, &load, &mut broadcaster, &shake, &mut printed)?;
        let send = SendCampaignRequest {
            packets: opts.send_packets,
            rate_per_sec: opts.campaign_rate,
            recipients: opts.recipients,
            user_min: 1,
            user_max: opts.connections,
            amount_min: 100 * opts.recipients as u64,
            amount_max: 20_000,
        };
        let send = start_campaign(&server, "send", &send)?;
        let mut send = wait_campaign(&server, &load, &mut broadcaster, &send, &mut printed)?;
        if !summary::campaign_done(&send) && chaos_thread.is_some() {
            // Faults every second or two can keep a recipient away longer than the wait
            // (each loss starts its back-off again): the faults end here, and its last
            // shares are waited for as in any run, once the clients can come back.
            chaos_stop.store(true, Ordering::SeqCst);
            say(&format!(
                "bench: chaos: no more faults while campaign {} waits for its last shares",
                send.id
            ));
            send = wait_campaign(&server, &load, &mut broadcaster, &send, &mut printed)?;
        }
        // Let the clients' reports catch up with what the server has said.
        let settle = Instant::now() + Duration::from_secs(5);
        while Instant::now() < settle {
            let t = load.totals();
            if t.won - before.won >= shake.won as u64
                && t.opened - before.opened >= send.shares_opened
            {
                break;
            }
            broadcaster.sleep(Duration::from_millis(100), &server, &load)?;
        }
        broadcaster.sleep(Duration::from_millis(1100), &server, &load)?;
        broadcaster.end_phase();
        let after = load.totals();
        let end_second = load.current_second().saturating_sub(1);
        let rows: Vec<Row> = load
            .rows()
            .into_iter()
            .filter(|r| r.second >= from && r.second <= end_second)
            .collect();
        let (start_ms, end_ms) = (
            load.epoch_ms() + from * 1000,
            load.epoch_ms() + (end_second + 1) * 1000,
        );
        let server_rates = samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.unix_ms >= start_ms + 1000 && s.unix_ms < end_ms)
            .map(|s| s.shakes_per_sec as f64)
            .collect();
        let phase = Phase {
            name: &name,
            qps,
            start_second: from,
            end_second,
            rows: &rows,
            server_rates,
            shake: &shake,
            send: &send,
            before: &before,
            after: &after,
            campaign_rate: opts.campaign_rate,
            // A lost agent's users were told things nobody heard: judged as after a fault.
            fault: faulty || load.lost() > 0,
            others_campaigns: opts.target.is_some(),
        };
        shake_campaigns.push(shake.id);
        last_phase_end = end_second;
        if n == 0 {
            fault_phase = (qps, end_second);
        }
        let summary = phase.summary(&mut discrepancies);
        let audit: Audit = server.get("/v1/audit")?;
        if !audit.ok {
            discrepancies.push(Discrepancy::new("conservation", Some(&name), 0, 0));
        }
        let verdict = match (summary.audit_ok && audit.ok, opts.target.is_some()) {
            (false, _) => "FAILED",
            // Its wins as the clients saw them: at the end, by campaign.
            (true, true) => "ok so far",
            (true, false) => "ok",
        };
        say(&format!(
            "bench: {name}: client median {:.0}/s server median {:.0}/s p50 {:.2} ms p99 {:.2} ms (load's send lag p99 {:.2} ms) overloaded {} errors {} audit {verdict}",
            summary.client_qps_median, summary.server_qps_median, summary.latency_ms.p50, summary.latency_ms.p99,
            summary.send_lag_ms.p99, summary.overloaded, summary.errors
        ));
        shake_total.add(&summary.shake);
        send_total.add(&summary.send);
        summaries.push(summary);
    }

    // Every connection should get every broadcast: give the last ones time to arrive.
    let sent = broadcaster.sent;
    if !sent.is_empty() && !wait_deliveries(&load, &sent) {
        say("bench: some broadcasts were not delivered to every connection in time");
    }
    let drops_after = {
        let t = load.totals();
        t.disconnects + t.connect_failures()
    };
    chaos_stop.store(true, Ordering::SeqCst);
    let chaos_done = chaos_thread.take().map(|handle| {
        let done = handle.join().unwrap_or_default();
        load.wait_logged_in(Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(2100));
        done
    });

    let fault_done = fault_thread.take().map(|handle| {
        let what = handle
            .join()
            .unwrap_or_else(|_| "the fault thread panicked".to_string());
        // Users dropped near a phase's end come back after it: wait for them (a while),
        // then a second more, so the rows show when they did.
        load.wait_logged_in(Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(2100));
        what
    });
    let rows = load.rows();
    let chaos = opts.chaos.as_ref().zip(chaos_done).map(|(options, done)| {
        let c = chaos::summarize(options, &done, &rows, load.epoch_ms(), last_phase_end, opts.connections);
        for f in &c.faults {
            let whole = f
                .whole_after_secs
                .map_or("never whole again in its window".to_string(), |s| format!("whole again {s} s after its start"));
            say(&format!(
                "bench: chaos: {} at second {}: {} connections dropped, {} s under 90% of the rate, {} error answers; {whole}",
                f.kind, f.start_second, f.dropped, f.reduced_secs, f.error_replies
            ));
        }
        c
    });
    let fault = fault_done.map(|what| {
        let seconds: Vec<FaultSecond> = rows
            .iter()
            .map(|r| FaultSecond {
                second: r.second,
                logged_in: r.logged_in,
                disconnects: r.counters.disconnects,
                logins: r.counters.logins,
                served: r.counters.won + r.counters.nothing,
                overloaded: r.counters.overloaded,
                backed_off: r.counters.backed_off,
                refused: r.counters.failed_refused,
                error_replies: r.counters.error_replies,
            })
            .collect();
        let mut f = FaultSummary::from_rows(what, fault_second, opts.connections, &seconds)
            .with_served(fault_phase, &seconds);
        if opts.fault == Some(options::Fault::Upgrade) {
            f.upgrade = server.last_upgrade();
            f.rolled = server.rolled();
        }
        let back = match f.reconnected_secs {
            Some(0) => "no client was dropped".to_string(),
            Some(s) => format!(
                "{} connections dropped, every user logged in again within {s} s (as few as {} of {} at a second's end)",
                f.dropped, f.logged_in_min, opts.connections
            ),
            None => format!("{} connections dropped; some users never logged in again", f.dropped),
        };
        say(&format!(
            "bench: fault: {} (second {}); {back}; served under 90% of the rate in {} s ({} shakes short), {} overloaded, {} firings backed off, {} connection attempts refused, {} error answers",
            f.what, f.at_second, f.reduced_secs, f.shakes_short, f.overloaded, f.backed_off, f.refused_connects, f.error_replies
        ));
        f
    });
    let peak_connections = rows.iter().map(|r| r.logged_in).max().unwrap_or(0);
    let load_pids = load.pids();
    let load_procs = load.procs();
    let load_peak_rss = load_peak_rss(&rows, &load_pids);
    let quiet_from = load.set_qps(0)?;
    if opts.target.is_some() {
        // The deployment's own campaigns go on releasing: a shake fired in the last second
        // may still win one of theirs. Its answer comes before the stop (or the ledger
        // would hold a win no client heard of).
        wait_until_second(&load, quiet_from);
        std::thread::sleep(Duration::from_millis(1000));
    }
    monitor.mark("stop");
    let finished = load.stop()?;
    if opts.target.is_some() {
        // The run's wins, by its campaigns: the deployment's own are not the run's.
        summary::judge_target_wins(
            &mut summaries,
            &shake_campaigns,
            &finished.history,
            &mut discrepancies,
        );
        shake_total = ShakeAudit::default();
        for s in &summaries {
            shake_total.add(&s.shake);
        }
    }
    let (agent_list, (refused, refusals)) = (load.agents(), load.agent_refusals());
    let deliveries = load.broadcasts();
    drop(load);
    let broadcast_entries = broadcast::entries(&sent, &deliveries);
    let broadcast_summary = broadcast::summary(&sent, &deliveries);
    // Written before the monitor finishes, so its last report draws the curves.
    std::fs::write(
        opts.out.join("broadcasts.json"),
        serde_json::to_string_pretty(&broadcast_entries)?,
    )?;
    for (s, e) in sent.iter().zip(&broadcast_entries) {
        if !broadcast::delivery_ok(s, e.delivered, drops_after) {
            discrepancies.push(Discrepancy::new(
                "broadcast_delivery",
                Some(&s.phase),
                s.connections,
                e.delivered,
            ));
        }
    }
    if !sent.is_empty() {
        let b = &broadcast_summary;
        say(&format!(
            "bench: {} broadcasts to {} connections: {} delivered; slowest complete in {:.1} ms; delivery p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
            b.sent, b.connections, b.delivered, b.complete_ms, b.latency_ms.p50, b.latency_ms.p99, b.latency_ms.max
        ));
    }
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    let final_audit: Audit = server.get("/v1/audit")?;
    // Witness three: every balance the ledger holds, read through the server.
    let balances: Balances = server.get("/v1/balances")?;
    let scope = history_scope.map(|mut scope| {
        scope.campaigns = shake_campaigns.clone();
        scope
    });
    let history = history::check(
        &server,
        &finished.history,
        scope.as_ref(),
        &mut discrepancies,
        say,
    )?;
    let samples = samples.lock().unwrap().clone();
    let engines = match (&engines_before, server.engine_counters()) {
        (Some(before), Some(after)) => {
            let d = after.since(before);
            Some(EngineSummary {
                redis_calls: d.redis_calls,
                pg_commits: d.pg_commits,
                pg_rows_inserted: d.pg_rows_inserted,
                pg_rows_updated: d.pg_rows_updated,
                shake_replies: finished.totals.shake_replies - totals_before.shake_replies,
                wins: finished.totals.won - totals_before.won,
                opens: finished.totals.opens_sent - totals_before.opens_sent,
                packets_sent: send_total.packets,
            })
        }
        _ => None,
    };
    // The handshakes of a TLS run, the server's counters over the run (a fresh server).
    let tls = match &opts.tls_dir {
        Some(_) => {
            let stats: serde_json::Value = server.get("/v1/stats")?;
            let n = |name: &str| stats["totals"][name].as_u64().unwrap_or(0);
            let t = &finished.totals;
            Some(summary::TlsSummary {
                handshakes_full: n("tls_handshakes"),
                handshakes_resumed: n("tls_resumed"),
                refused: n("tls_refused"),
                timed_out: n("tls_handshake_timeouts"),
                abandoned: n("tls_abandoned"),
                in_progress_max: samples.iter().map(|s| s.tls_handshaking).max().unwrap_or(0),
                accept_paused: n("accept_paused"),
                client_handshake_failures: t.failed_handshake,
                client_timeouts: t.failed_timeout,
            })
        }
        None => None,
    };
    server.stop()?;
    if let Some(disk) = small_disk {
        if let Err(e) = disk.unmount_keeping() {
            say(&format!("bench: keeping the ledger from its tmpfs: {e:#}"));
        }
    }
    // Both sent their last second on the way out: the series is complete.
    monitor.finish()?;

    // The ledger, user by user, against what each user's client was told.
    let balances = match &balances_before {
        Some(before) => ledger::since(&balances, before),
        None => balances,
    };
    let (balances, users_incomplete) = ledger::without_lost(balances, &finished.lost);
    let agents_summary = opts.agents.as_ref().map(|a| {
        agents::summarize(
            a,
            agent_list,
            &finished.lost,
            users_incomplete,
            refused,
            refusals,
        )
    });
    if let Some(a) = &agents_summary {
        say(&a.line());
    }
    let lost_any = !finished.lost.is_empty();
    let ledger::Checked {
        users_checked,
        unacknowledged_cents,
    } = ledger::check(
        &balances,
        &finished.users,
        faulty || lost_any,
        &mut discrepancies,
    );
    if !final_audit.ok {
        discrepancies.push(Discrepancy::new("conservation", None, 0, 0));
    }

    let server_peak = samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let server_cpu = samples
        .last()
        .map_or(0, |s| s.cpu_ms)
        .saturating_sub(server_baseline.cpu_ms);
    let per_conn = |peak: u64, base: u64| {
        peak.saturating_sub(base)
            .checked_div(peak_connections)
            .unwrap_or(0)
    };
    let audit_ok = discrepancies.is_empty() && summaries.iter().all(|s| s.audit_ok);
    let summary = Summary {
        preset_connections: opts.connections,
        connections: ConnectionsSummary {
            target: opts.connections,
            peak: peak_connections,
            connect_seconds,
            all_connected: connected,
        },
        phases: summaries,
        shake: shake_total,
        send: send_total,
        broadcast: broadcast_summary,
        audit: AuditSummary {
            ok: audit_ok,
            discrepancies,
            users_checked,
            unacknowledged_cents,
            server: final_audit,
        },
        resources: Resources {
            server_rss_bytes: server_peak,
            server_rss_baseline_bytes: server_baseline.rss_bytes,
            server_rss_per_connection_bytes: per_conn(server_peak, server_baseline.rss_bytes),
            server_cpu_seconds: server_cpu as f64 / 1000.0,
            load_rss_bytes: load_peak_rss,
            load_rss_baseline_bytes: load_baseline,
            load_rss_per_connection_bytes: per_conn(load_peak_rss, load_baseline),
            load_cpu_seconds: finished.cpu_ms as f64 / 1000.0,
        },
        agents: agents_summary,
        target: opts
            .target
            .as_ref()
            .map(|t| format!("clients {} admin {}", t.clients, t.admin)),
        load: LoadSummary {
            procs: load_procs as u64,
            totals: finished.totals,
            coordinator: finished.coordinator.clone(),
        },
        options: OptionsSummary {
            workers: opts.workers.clone(),
            phase_qps: opts.phase_qps.clone(),
            shake_packets: opts.shake_packets,
            send_packets: opts.send_packets,
            campaign_rate: opts.campaign_rate,
            recipients: opts.recipients,
            max_shake_qps: opts.max_shake_qps,
            connect_rate: opts.connect_rate,
            transport: opts.transport.to_string(),
            http_connection: opts.http_connection.to_string(),
            broadcast_every: opts.broadcast_every_secs,
            max_queue_ms: opts.max_queue_ms,
            broadcast_yield_ms: opts.broadcast_yield_ms,
            server_nice: opts.server_nice,
            hosts: opts.hosts,
            fault: opts.fault.map_or(String::new(), |f| f.name().to_string()),
        },
        network: NetworkSummary {
            own_namespace: opts.netns,
            ehash_buckets: hongbao_sys::doctor::ehash_buckets(),
        },
        engines,
        fault,
        chaos,
        history,
        tls,
    };
    std::fs::write(
        opts.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    let charts = hongbao_report::write_report(&opts.out).context("writing the report")?;
    say(&format!(
        "bench: report {} ({} charts)",
        opts.out.join("report.html").display(),
        charts.len()
    ));
    say(&format!(
        "bench: audit {}; summary in {}",
        if audit_ok { "ok" } else { "FAILED" },
        opts.out.join("summary.json").display()
    ));
    Ok(summary)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn wait_until_second(load: &Load, second: u64) {
    while load.current_second() < second {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_campaign(
    server: &Server,
    kind: &str,
    request: &impl serde::Serialize,
) -> anyhow::Result<CampaignStatus> {
    server
        .post(&format!("/v1/campaigns/{kind}"), request)
        .with_context(|| format!("starting a {kind} campaign"))
}

/// Polls a campaign until it has run its course, printing the load's progress line each
/// second; `printed` is the second of the newest line printed, so that a second is
/// printed once however many campaigns wait through it.
fn wait_campaign(
    server: &Server,
    load: &Load,
    broadcaster: &mut Broadcaster,
    started: &CampaignStatus,
    printed: &mut u64,
) -> anyhow::Result<CampaignStatus> {
    let rate = started.rate_per_sec.max(1);
    let deadline = Instant::now() + Duration::from_secs(30 + (started.packets / rate) as u64 * 2);
    loop {
        let c: CampaignStatus = server.get(&format!("/v1/campaigns/{}", started.id))?;
        if summary::campaign_done(&c) {
            return Ok(c);
        }
        if Instant::now() > deadline {
            say(&format!(
                "bench: campaign {} did not finish in time: {c:?}",
                c.id
            ));
            return Ok(c);
        }
        if let Some(p) = load.progress() {
            if p.second != *printed {
                *printed = p.second;
                say(&format!("  {}", p.line()));
            }
        }
        broadcaster.sleep(Duration::from_millis(100), server, load)?;
    }
}

fn load_peak_rss(rows: &[Row], pids: &[u32]) -> u64 {
    let from_rows = rows.iter().map(|r| r.rss_bytes).max().unwrap_or(0);
    let now: u64 = pids
        .iter()
        .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).0)
        .sum();
    from_rows.max(now)
}
