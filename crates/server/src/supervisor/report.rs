//! What the supervisor says about the server: `GET /v1/stats`, the once-a-second sample
//! for the monitor, and `/metrics`. Workers report cumulative counters once a second;
//! those of a worker that exited are kept (`retired`) so totals never go backwards.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use hongbao_money::seam::{OpKind, ReplyCounts};
use hongbao_money::WorkerId;
use hongbao_proto::ResultCode;
use hongbao_sys::usage;
use hongbao_telemetry::prom::Page;
use hongbao_telemetry::sample::{self, RoleSample, Sample};
use serde_json::{json, Map, Value};

use super::workers::WorkerProc;
use super::{now_ms, Supervisor};
use crate::link::WorkerStats;
use crate::metrics;

pub(super) struct Report {
    /// Counters of workers that have exited, so totals never go backwards.
    retired: Map<String, Value>,
    previous_replies: ReplyCounts,
    /// Replies in the last whole second.
    reply_rates: Vec<(OpKind, ResultCode, u64)>,
    /// Workers' shake latency not yet reported to the monitor, and since the start.
    latency_pending: Histogram<u64>,
    latency_total: Histogram<u64>,
    net_interface: String,
}

impl Report {
    pub(super) fn new(net_interface: String) -> Report {
        Report {
            retired: Map::new(),
            previous_replies: ReplyCounts::default(),
            reply_rates: Vec::new(),
            latency_pending: sample::new_histogram(),
            latency_total: sample::new_histogram(),
            net_interface,
        }
    }

    pub(super) fn worker_latency(&mut self, sparse: &[(u64, u64)]) {
        sample::merge_sparse(&mut self.latency_pending, sparse);
        sample::merge_sparse(&mut self.latency_total, sparse);
    }

    pub(super) fn retire(&mut self, last: &WorkerStats) {
        metrics::retire(&mut self.retired, last);
    }

    /// Once a second: the replies of the second just ended.
    pub(super) fn roll_rates(&mut self, now: &ReplyCounts) {
        self.reply_rates = now
            .nonzero()
            .map(|(op, result, n)| (op, result, n - self.previous_replies.get(op, result)))
            .collect();
        self.previous_replies = now.clone();
    }
}

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

    fn worker_totals(&self) -> Map<String, Value> {
        let mut totals = self.report.retired.clone();
        for (_, _, latest) in self.live_stats() {
            metrics::add_counters(&mut totals, latest);
        }
        totals
    }

    /// This server's report to the monitor for `second`: the workers as role `server`,
    /// the supervisor and core as role `core`.
    pub(super) fn sample(&mut self, second: u64) -> Sample {
        let totals = self.worker_totals();
        let processes = self.live_stats().count() as u32;
        let total = |k: &str| totals.get(k).and_then(Value::as_u64).unwrap_or(0);
        let levels = ["connections", "logged_in", "rss_bytes"]
            .into_iter()
            .map(|level| (level.to_string(), total(level)))
            .collect();
        let money = self.money.snapshot();
        let won = money.replies.get(OpKind::Shake, ResultCode::Won);
        let opened = money.replies.get(OpKind::Open, ResultCode::Opened);
        let errors = [
            "bad_frames",
            "bad_requests",
            "login_failures",
            "not_logged_in",
        ]
        .iter()
        .map(|k| total(k))
        .sum::<u64>();
        let server_counters = [
            ("shakes", total("shakes")),
            ("won", won),
            ("nothing", total("shakes_nothing")),
            ("overloaded", total("shakes_overloaded")),
            ("opens", total("opens")),
            ("opened", opened),
            ("sends", total("sends")),
            ("errors", errors),
            ("broadcasts", self.next_broadcast - 1),
            ("broadcast_delivered", total("broadcast_delivered")),
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
        Sample {
            instance: format!("serve@{}:{}", sample::hostname(), std::process::id()),
            host: sample::hostname(),
            unix_second: second,
            roles: vec![
                RoleSample {
                    role: "server".into(),
                    processes,
                    cpu_ms: total("cpu_ms"),
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

    pub(super) fn stats(&self) -> Value {
        let mut workers = Vec::new();
        let totals = self.worker_totals();
        let mut rates = Map::new();
        for (w, proc_, latest) in self.live_stats() {
            let worker_rates = metrics::rates(latest, proc_.previous.as_ref());
            for (k, v) in &worker_rates {
                let sum =
                    rates.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
                rates.insert(k.clone(), sum.into());
            }
            workers.push(json!({
                "worker": w,
                "pid": latest.pid,
                "restarts": proc_.restarts,
                "connections": latest.connections,
                "logged_in": latest.logged_in,
                "pool_packets": latest.pool_packets,
                "rss_bytes": latest.rss_bytes,
                "cpu_ms": latest.cpu_ms,
                "per_sec": worker_rates,
            }));
        }
        let core_rates: BTreeMap<String, u64> = self
            .report
            .reply_rates
            .iter()
            .map(|(op, r, v)| (format!("{}_{}", op.name(), r.name()), *v))
            .collect();
        let (rss, cpu) = usage::self_usage();
        let money = self.money.snapshot();
        json!({
            "unix_ms": now_ms(),
            "connections": totals.get("connections").cloned().unwrap_or(0.into()),
            "logged_in": totals.get("logged_in").cloned().unwrap_or(0.into()),
            "online_users": self.presence.online_users(),
            "per_sec": rates,
            "core_per_sec": core_rates,
            "totals": totals,
            "workers": workers,
            "core": {
                "ledger_seq": money.ledger_seq,
                "ledger_committed_seq": money.committed_seq,
                "rss_bytes": rss,
                "cpu_ms": cpu,
            },
        })
    }

    pub(super) fn metrics(&self) -> String {
        let mut m = Page::default();
        metrics::worker_totals(&mut m, &self.worker_totals());
        for (w, proc_, latest) in self.live_stats() {
            let label = [("worker", w.to_string())];
            m.gauge(
                "hongbao_worker_connections",
                "Open client connections per worker",
                &label,
                latest.connections as f64,
            );
            m.counter(
                "hongbao_worker_restarts_total",
                "Times a worker was restarted",
                &label,
                proc_.restarts as f64,
            );
            m.gauge(
                "hongbao_worker_resident_memory_bytes",
                "Resident memory per worker",
                &label,
                latest.rss_bytes as f64,
            );
            m.counter(
                "hongbao_worker_cpu_seconds_total",
                "CPU time per worker",
                &label,
                latest.cpu_ms as f64 / 1000.0,
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
