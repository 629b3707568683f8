//! What the supervisor says about the server: `GET /v1/stats`, the once-a-second sample
//! for the monitor, and `/metrics`. Workers report cumulative counters once a second;
//! those of a worker that exited are kept (`retired`) so totals never go backwards.

use std::collections::BTreeMap;

use hongbao_money::seam::{OpKind, ReplyCounts};
use hongbao_money::WorkerId;
use hongbao_proto::token::Refusal;
use hongbao_proto::ResultCode;
use hongbao_sys::usage;
use hongbao_telemetry::prom::Page;
use hongbao_telemetry::sample::{self, RoleSample, Sample};

use super::event_loop::Supervisor;
use super::procs::WorkerProc;
use crate::stats::{CoreView, Stats, Totals, WorkerCounters, WorkerStats, WorkerView};

impl Supervisor {
    /// Replies by operation and result: the money side's and presence's (chat).
    pub(super) fn replies(&self) -> ReplyCounts {
        let mut replies = self.money.snapshot().replies;
        replies.add(&self.presence.counters.chat);
        replies
    }

    fn live_stats(&self) -> impl Iterator<Item = (&WorkerId, &WorkerProc, &WorkerStats)> {
        self.workers
            .iter()
            .filter_map(|(w, p)| p.latest.as_ref().map(|s| (w, p, s)))
    }

    /// Worker index → (counters, CPU ms) since the server started, its exited
    /// processes' included.
    fn per_worker(&self) -> BTreeMap<WorkerId, (WorkerCounters, u64)> {
        let mut all: BTreeMap<WorkerId, (WorkerCounters, u64)> = self
            .report
            .retired
            .iter()
            .map(|(w, r)| (*w, (r.counters.clone(), r.cpu_ms)))
            .collect();
        for (w, _, latest) in self.live_stats() {
            let (counters, cpu_ms) = all.entry(*w).or_default();
            counters.add(&latest.counters);
            *cpu_ms += latest.cpu_ms;
        }
        all
    }

    /// Everything the workers counted, and their levels now.
    fn worker_totals(&self) -> Totals {
        let mut totals = Totals::default();
        for (counters, cpu_ms) in self.per_worker().values() {
            totals.counters.add(counters);
            totals.cpu_ms += cpu_ms;
        }
        for (_, _, latest) in self.live_stats() {
            totals.levels.add(&latest.levels);
        }
        totals
    }

    /// This server's report to the monitor for `second`: the workers as role `server`,
    /// the supervisor and core as role `core`.
    pub(super) fn sample(&mut self, second: u64) -> Sample {
        let totals = self.worker_totals();
        let processes = self.live_stats().count() as u32;
        let t = &totals.counters;
        let levels = sample::named(&[
            ("connections", totals.levels.connections),
            ("logged_in", totals.levels.logged_in),
            ("rss_bytes", totals.levels.rss_bytes),
        ]);
        let money = self.money.snapshot();
        let won = money.replies.get(OpKind::Shake, ResultCode::Won);
        let opened = money.replies.get(OpKind::Open, ResultCode::Opened);
        let errors = t.bad_frames + t.bad_requests + t.login_failures + t.not_logged_in;
        let server_counters = [
            ("shakes", t.shakes),
            ("won", won),
            ("nothing", t.shakes_nothing),
            ("overloaded", t.shakes_overloaded),
            ("opens", t.opens),
            ("opened", opened),
            ("sends", t.sends),
            ("errors", errors),
            ("broadcasts", self.next_broadcast - 1),
            ("broadcast_delivered", t.broadcast_delivered),
        ];
        let core_counters = [
            ("packets_released", money.packets_released),
            ("packets_won", won),
            ("send_packets", money.send_packets),
            ("shares_opened", opened),
        ];
        let (rss, cpu) = usage::self_usage();
        let latency = sample::sparse(&self.report.latency_pending);
        self.report.latency_pending.reset();
        // A gateway host of a cluster goes by its host name (the series' `server@gw1`).
        let instance = match self.cfg.cluster.host_name.as_str() {
            "" => format!("serve@{}:{}", sample::hostname(), std::process::id()),
            name => name.to_string(),
        };
        Sample {
            instance,
            host: sample::hostname(),
            unix_second: second,
            roles: vec![
                RoleSample {
                    role: "server".into(),
                    processes,
                    cpu_ms: totals.cpu_ms,
                    counters: sample::named(&server_counters),
                    levels,
                    latency_us: latency,
                },
                RoleSample {
                    role: "core".into(),
                    processes: 1,
                    cpu_ms: cpu,
                    counters: sample::named(&core_counters),
                    levels: sample::named(&[("rss_bytes", rss)]),
                    latency_us: Vec::new(),
                },
            ]
            .into_iter()
            .chain(sample::host_role())
            .collect(),
            net: sample::read_net(&self.report.net_interface),
        }
    }

    pub(super) fn stats(&self) -> Stats {
        let mut per_sec = WorkerCounters::default();
        let workers = self
            .live_stats()
            .map(|(w, proc_, latest)| {
                let rates = match &proc_.previous {
                    Some(previous) => {
                        let seconds = latest
                            .unix_second
                            .saturating_sub(previous.unix_second)
                            .max(1);
                        latest.counters.since(&previous.counters).per(seconds)
                    }
                    None => WorkerCounters::default(),
                };
                per_sec.add(&rates);
                WorkerView {
                    worker: *w,
                    pid: latest.pid,
                    restarts: proc_.restarts,
                    levels: latest.levels.clone(),
                    cpu_ms: latest.cpu_ms,
                    per_sec: rates,
                }
            })
            .collect();
        let totals = self.worker_totals();
        let (rss_bytes, cpu_ms) = usage::self_usage();
        let money = self.money.snapshot();
        Stats {
            unix_ms: self.time.unix().as_millis(),
            connections: totals.levels.connections,
            logged_in: totals.levels.logged_in,
            online_users: self.presence.online_users() as u64,
            per_sec,
            core_per_sec: self
                .report
                .reply_rates
                .iter()
                .map(|(op, r, v)| (format!("{}_{}", op.name(), r.name()), *v))
                .collect(),
            totals,
            workers,
            core: CoreView {
                ledger_seq: money.ledger_seq,
                ledger_committed_seq: money.committed_seq,
                rss_bytes,
                cpu_ms,
            },
        }
    }

    /// The live workers' token refusals, by why (`Refusal::ALL`'s order).
    fn token_refusals(&self) -> Vec<u64> {
        let mut refusals = vec![0u64; Refusal::ALL.len()];
        for (_, _, latest) in self.live_stats() {
            for (total, n) in refusals.iter_mut().zip(&latest.token_refusals) {
                *total += n;
            }
        }
        refusals
    }

    /// Once a second: the tokens refused since the last call, in one log line (a flood
    /// of bad tokens is one line a second, not one a login).
    pub(super) fn log_token_refusals(&mut self) {
        let now = self.token_refusals();
        let new: Vec<(Refusal, u64)> = Refusal::ALL
            .iter()
            .zip(
                now.iter().zip(
                    self.report
                        .refusals_logged
                        .iter()
                        .chain(std::iter::repeat(&0)),
                ),
            )
            .map(|(r, (now, then))| (*r, now.saturating_sub(*then)))
            .filter(|(_, n)| *n > 0)
            .collect();
        self.report.refusals_logged = now;
        if new.is_empty() {
            return;
        }
        let total: u64 = new.iter().map(|(_, n)| n).sum();
        let by_why = new
            .iter()
            .map(|(r, n)| format!("{} {n}", r.name()))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::info!(
            refused = total,
            by_why,
            "login and bearer tokens refused in the last second"
        );
    }

    pub(super) fn metrics(&self) -> String {
        let mut m = Page::default();
        // Per worker, so a straggler shows: counters since the server started (a
        // restarted worker's predecessors included), levels now.
        for (w, (counters, cpu_ms)) in self.per_worker() {
            let label = [("worker", w.to_string())];
            for (name, value) in counters.each() {
                let metric = format!("hongbao_worker_{name}_total");
                m.counter(
                    &metric,
                    &format!("{name} counted by each worker"),
                    &label,
                    value as f64,
                );
            }
            m.counter(
                "hongbao_worker_cpu_seconds_total",
                "CPU time per worker",
                &label,
                cpu_ms as f64 / 1000.0,
            );
        }
        for (w, proc_, latest) in self.live_stats() {
            let label = [("worker", w.to_string())];
            let levels = [
                (
                    "hongbao_worker_connections",
                    "Open client connections per worker",
                    latest.levels.connections,
                ),
                (
                    "hongbao_worker_logged_in",
                    "Logged-in connections per worker",
                    latest.levels.logged_in,
                ),
                (
                    "hongbao_worker_pool_packets",
                    "Shake packets in each worker's pool",
                    latest.levels.pool_packets,
                ),
                (
                    "hongbao_worker_shake_cap",
                    "Shakes a second each worker's shake cap admits; 0 when uncapped",
                    latest.levels.shake_cap,
                ),
                (
                    "hongbao_worker_resident_memory_bytes",
                    "Resident memory per worker",
                    latest.levels.rss_bytes,
                ),
                (
                    "hongbao_worker_tls_handshaking",
                    "TLS handshakes under way per worker (at most max_tls_handshakes)",
                    latest.levels.tls_handshaking,
                ),
                (
                    "hongbao_worker_tls_accept_queue",
                    "Connections each worker's TLS listeners queue at most (tls_accept_queue_secs)",
                    latest.levels.tls_accept_queue,
                ),
            ];
            for (name, help, value) in levels {
                m.gauge(name, help, &label, value as f64);
            }
            m.counter(
                "hongbao_worker_restarts_total",
                "Times a worker was restarted",
                &label,
                proc_.restarts as f64,
            );
        }
        for (op, result, v) in self.replies().nonzero() {
            let labels = [
                ("op", op.name().to_string()),
                ("result", result.name().to_string()),
            ];
            m.counter(
                "hongbao_core_replies_total",
                "Replies from the core by operation and result",
                &labels,
                v as f64,
            );
        }
        // Sessions: tokens refused (by why), requests over a user's limit (by what),
        // revocations.
        for (refusal, n) in Refusal::ALL.iter().zip(self.token_refusals()) {
            m.counter(
                "hongbao_token_refusals_total",
                "Login and bearer tokens refused by the live workers, by why",
                &[("reason", refusal.name().to_string())],
                n as f64,
            );
        }
        for (action, n) in &self.users.refused {
            m.counter(
                "hongbao_user_limited_total",
                "Requests refused rate-limited by the core, by what (shakes: the workers' rate_limited)",
                &[("action", action.to_string())],
                *n as f64,
            );
        }
        for ((status, reason), n) in self.admin_refusals.counts() {
            m.counter(
                "hongbao_admin_refusals_total",
                "Admin requests refused at the door, by status and reason",
                &[
                    ("status", status.to_string()),
                    ("reason", reason.to_string()),
                ],
                n as f64,
            );
        }
        m.counter(
            "hongbao_revoked_kicks_total",
            "Sessions kicked by a revocation",
            &[],
            self.presence.counters.kicks_revoked as f64,
        );
        m.counter(
            "hongbao_revoked_logins_total",
            "Logins refused by a revocation the worker had not heard of yet",
            &[],
            self.presence.counters.logins_revoked as f64,
        );
        m.histogram(
            "hongbao_shake_latency_seconds",
            "Shake latency in the workers: from reading the shake to writing its reply",
            &[],
            &self.report.latency_total,
        );
        if let Some(audit) = self.money.audit_now() {
            let money = [
                (
                    "hongbao_money_minted_cents",
                    "Money minted by campaigns",
                    audit.minted_cents,
                ),
                (
                    "hongbao_money_balances_cents",
                    "Money held in user balances",
                    audit.user_balances_cents,
                ),
                (
                    "hongbao_money_campaign_balances_cents",
                    "Money refunded to campaign system accounts",
                    audit.campaign_balances_cents,
                ),
                (
                    "hongbao_money_unopened_cents",
                    "Money in unopened shares",
                    audit.unopened_cents,
                ),
                (
                    "hongbao_money_unclaimed_cents",
                    "Money in unclaimed shake packets",
                    audit.unclaimed_cents,
                ),
            ];
            for (name, help, cents) in money {
                m.gauge(name, help, &[], cents as f64);
            }
            m.gauge(
                "hongbao_audit_ok",
                "1 when money is conserved",
                &[],
                if audit.ok { 1.0 } else { 0.0 },
            );
        }
        m.gauge(
            "hongbao_online_users",
            "Users logged in",
            &[],
            self.presence.online_users() as f64,
        );
        let money = self.money.snapshot();
        m.gauge(
            "hongbao_ledger_seq",
            "Newest ledger event",
            &[],
            money.ledger_seq as f64,
        );
        m.gauge(
            "hongbao_ledger_committed_seq",
            "Newest committed ledger event",
            &[],
            money.committed_seq as f64,
        );
        m.gauge(
            "hongbao_ledger_commits_failing",
            "1 while the ledger cannot commit (it is trying again; what needs it is refused)",
            &[],
            if self.money.commits_failing().is_some() {
                1.0
            } else {
                0.0
            },
        );
        if let Some(took) = self.money.commit_latency() {
            m.histogram(
                "hongbao_ledger_commit_seconds",
                "Time each ledger commit took, from its start until durable (tries again included)",
                &[],
                &took,
            );
        }
        // Cluster mode only: the embedded ledger has no standby to ask about.
        if let Some(sync) = self.money.standby_sync() {
            m.gauge(
                "hongbao_ledger_standby_sync",
                "1 while what the ledger acknowledges is on a synchronous standby too",
                &[],
                if sync { 1.0 } else { 0.0 },
            );
        }
        let (rss, cpu) = usage::self_usage();
        m.gauge(
            "hongbao_core_resident_memory_bytes",
            "Resident memory of the supervisor and core",
            &[],
            rss as f64,
        );
        m.counter(
            "hongbao_core_cpu_seconds_total",
            "CPU time of the supervisor and core",
            &[],
            cpu as f64 / 1000.0,
        );
        m.render()
    }
}
