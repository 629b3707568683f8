//! SIGHUP: the configuration file and the key files read again; the sections that can
//! change live (`config::SECTIONS`: tokens, tls, limits, overload) applied and sent to
//! every worker in a new welcome, and every other setting the file changed named, to
//! wait for the next start.

use hongbao_proto::token::Alg;

use super::event_loop::Supervisor;
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::link::{self, LoginSetup, ToWorker};

/// How workers check logins under `cfg`: its keys (read from their files), rules, the
/// old HMAC secret when allowed, the demo key when on. Revocations are added as each
/// welcome is sent (`Supervisor::welcome`).
pub(super) fn login_setup(cfg: &ServeConfig) -> Result<LoginSetup> {
    let keys = cfg.tokens.login_specs()?;
    let demo_key = if cfg.tokens.demo_login {
        let key = keys.iter().find(|k| k.alg == Alg::HS256).cloned();
        if key.is_none() {
            return Err(Error::config(
                "demo_login mints tokens, which takes an HS256 login key".to_string(),
            ));
        }
        key
    } else {
        None
    };
    Ok(LoginSetup {
        keys,
        rules: cfg.tokens.token_rules(),
        refresh_before_secs: cfg.tokens.refresh_before_secs,
        hmac_secret: cfg
            .tokens
            .hmac_login
            .then(|| cfg.tokens.secret.as_bytes().to_vec()),
        demo_key,
        revoked: Vec::new(),
    })
}

impl Supervisor {
    /// SIGHUP: the configuration file and the key files are read again, and the login
    /// setup (keys, rules) goes to every worker in a new welcome. Sessions whose key is
    /// gone are kicked there. A configuration that does not load, or would expose the
    /// development secret, is refused whole: the running one stays.
    pub(super) fn reload_config(&mut self) {
        let Some(flags) = self.cfg.flags.clone() else {
            tracing::warn!("SIGHUP: this server was not started from flags; nothing to reload");
            return;
        };
        let loaded = ServeConfig::load(&flags).and_then(|cfg| {
            cfg.check_exposure()?;
            let login = login_setup(&cfg)?;
            let tls = cfg.tls.tls_pem()?;
            if tls.is_some() != self.worker_cfg.tls.is_some() {
                return Err(Error::config(
                    "TLS cannot be turned on or off by a reload: restart".to_string(),
                ));
            }
            Ok((cfg, login, tls))
        });
        let (cfg, login, tls) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the configuration does not load; the running one stays");
                return;
            }
        };
        let waiting = self.cfg.changed_for_next_start(&cfg);
        if !waiting.is_empty() {
            tracing::warn!(
                settings = waiting.join(", "),
                "SIGHUP: changed, but a reload does not apply them: they take effect at the next start"
            );
        }
        let kids: Vec<&str> = login.keys.iter().map(|k| k.kid.as_str()).collect();
        tracing::info!(?kids, "SIGHUP: login keys reloaded");
        self.worker_cfg.login = login;
        if let (Some(pem), Some(admin)) = (&tls, &self.admin_tls) {
            match hongbao_http::tls::server_config(
                &pem.cert,
                &pem.key,
                &[hongbao_http::tls::ALPN_HTTP],
            ) {
                Ok(config) => admin.set(config),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: the admin address kept its certificate")
                }
            }
            tracing::info!("SIGHUP: TLS certificate reloaded");
        }
        // The ticket key stays: sessions resume across a new certificate.
        let keep = self.worker_cfg.tls.as_ref().map(|t| t.ticket_key);
        self.worker_cfg.tls = tls.map(|mut t| {
            t.ticket_key = keep.unwrap_or(t.ticket_key);
            t
        });
        // [limits]
        self.worker_cfg.idle_timeout_secs = cfg.limits.idle_timeout_secs;
        self.worker_cfg.shake_limit = cfg.limits.user_limits.shake;
        self.users.set_limits(cfg.limits.user_limits.clone());
        // [overload]: each worker's share of the rate, the queue it sheds past, the
        // broadcasts' pace; the workers read them a shake (a broadcast) at a time.
        let workers = self.workers_wanted.max(1) as u32;
        self.worker_cfg.max_shakes_per_sec = cfg.overload.max_shake_qps.div_ceil(workers);
        self.worker_cfg.max_queue_ms = cfg.overload.max_queue_ms;
        self.worker_cfg.broadcast_yield_ms = cfg.overload.broadcast_yield_ms;
        // The live sections as the file has them now; the others wait for the next start.
        self.cfg.tokens = cfg.tokens;
        self.cfg.tls = cfg.tls;
        self.cfg.limits = cfg.limits;
        self.cfg.overload = cfg.overload;
        let welcome = ToWorker::Welcome(Box::new(self.welcome()));
        for &key in self.worker_links.values() {
            link::encode(&welcome, &mut self.links[key].outbuf);
        }
    }
}
