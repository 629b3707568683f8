//! SIGHUP: the configuration file and the key files read again; what can change live
//! (`config::RELOADED`) applied, the login setup sent to every worker in a new welcome,
//! and every other setting the file changed named, to wait for the next start.

use hongbao_proto::token::Alg;

use super::Supervisor;
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::link::{self, LoginSetup, ToWorker};

/// How workers check logins under `cfg`: its keys (read from their files), rules, the
/// old HMAC secret when allowed, the demo key when on. Revocations are added as each
/// welcome is sent (`Supervisor::welcome`).
pub(super) fn login_setup(cfg: &ServeConfig) -> Result<LoginSetup> {
    let keys = cfg.login_specs()?;
    let demo_key = if cfg.demo_login {
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
        rules: cfg.token_rules(),
        refresh_before_secs: cfg.refresh_before_secs,
        hmac_secret: cfg.hmac_login.then(|| cfg.secret.as_bytes().to_vec()),
        demo_key,
        revoked: Vec::new(),
    })
}

/// How long a revocation matters: past the longest a token lives (and the leeways on
/// both ends), every token it refuses has expired.
pub(super) fn revocation_horizon(cfg: &ServeConfig) -> u64 {
    cfg.max_token_lifetime_secs + 2 * cfg.token_leeway_secs
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
            let tls = cfg.tls_pem()?;
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
        self.worker_cfg.idle_timeout_secs = cfg.idle_timeout_secs;
        self.worker_cfg.shake_limit = cfg.user_limits.shake;
        self.users.set_limits(cfg.user_limits.clone());
        self.cfg.login_keys = cfg.login_keys;
        self.cfg.token_leeway_secs = cfg.token_leeway_secs;
        self.cfg.max_token_lifetime_secs = cfg.max_token_lifetime_secs;
        let welcome = ToWorker::Welcome(Box::new(self.welcome()));
        for &key in self.worker_links.values() {
            link::encode(&welcome, &mut self.links[key].outbuf);
        }
    }
}
