//! `[tokens]`: how logins are checked — the keys tokens are signed with (`[[login_keys]]`,
//! or the secret), the rules beyond the signature, the old HMAC token, the demo login —
//! and where secrets are read from.

use std::path::{Path, PathBuf};

use hongbao_proto::token::{Alg, KeySpec, Rules, DEFAULT_KID};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use hongbao_proto::token::DEV_SECRET;

/// `[tokens]`: How logins are checked: the keys tokens are signed with, the rules beyond the
/// signature, the old HMAC token, the demo login.
/// A reload applies it.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Tokens {
    /// With no `login_keys`, login tokens are JWTs signed HS256 with this secret (kid
    /// `hongbao`). Taken, first found, from `--secret` (development only: it warns),
    /// `HONGBAO_SECRET`, `secret_file`, this.
    pub secret: String,
    /// A file holding `secret` ("" for none).
    pub secret_file: PathBuf,
    /// The keys login tokens are verified with, by `kid` (`[[login_keys]]`); none: the
    /// secret, as HS256 key `hongbao`.
    pub login_keys: Vec<LoginKeyConfig>,
    /// Clock skew allowed on a token's `exp`, `nbf` and `iat`.
    pub token_leeway_secs: u64,
    /// When set, a token's `aud` must name it.
    pub token_audience: String,
    /// The longest a token may live (`exp - iat`); longer ones are refused.
    pub max_token_lifetime_secs: u64,
    /// A session is asked for a fresh token this long before its own expires.
    pub refresh_before_secs: u32,
    /// Accept the old login token, HMAC-SHA256(secret, user id), in a protocol-version-1
    /// login (the shared C floor client's); such a session lasts `max_token_lifetime_secs`.
    pub hmac_login: bool,
    /// Answer `GET /token?user=N` on the WebSocket and HTTP addresses so the browser page
    /// can log in as anyone: a demo, only when asked for, only on loopback addresses.
    pub demo_login: bool,
}

impl Default for Tokens {
    fn default() -> Self {
        Tokens {
            secret: DEV_SECRET.into(),
            secret_file: PathBuf::new(),
            login_keys: Vec::new(),
            token_leeway_secs: Rules::default().leeway_secs,
            token_audience: String::new(),
            max_token_lifetime_secs: Rules::default().max_lifetime_secs,
            refresh_before_secs: 60,
            hmac_login: false,
            demo_login: false,
        }
    }
}

impl Tokens {
    /// The login keys, read from their files: `login_keys`, or with none the secret as
    /// HS256 key `hongbao`. Each is checked usable (a verifier is made of them).
    pub fn login_specs(&self) -> Result<Vec<KeySpec>> {
        let specs = if self.login_keys.is_empty() {
            vec![KeySpec {
                kid: DEFAULT_KID.into(),
                alg: Alg::HS256,
                material: self.secret.as_bytes().to_vec(),
            }]
        } else {
            self.login_keys
                .iter()
                .map(LoginKeyConfig::spec)
                .collect::<Result<_>>()?
        };
        hongbao_proto::token::Verifier::new(&specs, self.token_rules())?;
        Ok(specs)
    }
    /// What a token must satisfy beyond its signature.
    pub fn token_rules(&self) -> Rules {
        Rules {
            leeway_secs: self.token_leeway_secs,
            audience: (!self.token_audience.is_empty()).then(|| self.token_audience.clone()),
            max_lifetime_secs: self.max_token_lifetime_secs,
        }
    }
    /// Whether the built-in development secret signs anything here: the login key made
    /// of it, or the old HMAC tokens.
    pub fn dev_secret_in_use(&self) -> bool {
        self.secret == DEV_SECRET && (self.login_keys.is_empty() || self.hmac_login)
    }
    /// How long a revocation matters (`Rules::revocation_horizon_secs`).
    pub fn revocation_horizon(&self) -> u64 {
        self.token_rules().revocation_horizon_secs()
    }
}

/// One `[[login_keys]]` entry: a key login tokens may be signed with, by `kid`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoginKeyConfig {
    pub kid: String,
    /// `HS256`, `ES256` or `EdDSA`: the only algorithm this key verifies.
    pub alg: String,
    /// HS256: a file holding the secret (its first line).
    #[serde(default)]
    pub secret_file: PathBuf,
    /// ES256 and EdDSA: a file holding the public key (PEM, SubjectPublicKeyInfo).
    #[serde(default)]
    pub public_key_file: PathBuf,
}

impl LoginKeyConfig {
    /// The key as the verifier takes it, read from its file.
    pub fn spec(&self) -> Result<KeySpec> {
        let alg: Alg = self
            .alg
            .parse()
            .map_err(|e| Error::config(format!("login key {:?}: {e}", self.kid)))?;
        if self.kid.is_empty() {
            return Err(Error::config("a login key with no kid".to_string()));
        }
        let (file, wrong) = match alg {
            Alg::HS256 => (&self.secret_file, &self.public_key_file),
            Alg::ES256 | Alg::EdDSA => (&self.public_key_file, &self.secret_file),
        };
        let wanted = if alg == Alg::HS256 {
            "secret_file"
        } else {
            "public_key_file"
        };
        if file.as_os_str().is_empty() || !wrong.as_os_str().is_empty() {
            return Err(Error::config(format!(
                "login key {:?} ({}) takes {wanted} and nothing else",
                self.kid,
                alg.name()
            )));
        }
        let material = match alg {
            Alg::HS256 => crate::access::read_secret_file(file).map(String::into_bytes),
            Alg::ES256 | Alg::EdDSA => std::fs::read(file),
        }
        .map_err(|e| {
            Error::config(format!(
                "login key {:?}: reading {}: {e}",
                self.kid,
                file.display()
            ))
        })?;
        let spec = KeySpec {
            kid: self.kid.clone(),
            alg,
            material,
        };
        // A file read but holding no usable key is named too (a reload that finds one
        // keeps the running keys, and the operator must know which file to mend).
        hongbao_proto::token::Verifier::new(std::slice::from_ref(&spec), Default::default())
            .map_err(|e| Error::config(format!("{}: {e}", file.display())))?;
        Ok(spec)
    }
}

/// A secret from the environment variable `env`, else from `file` (its first line,
/// trimmed), else none. The variable wins, so a deployment can override a file.
pub fn secret_from(env: &str, file: Option<&Path>) -> Result<Option<String>> {
    if let Some(value) = std::env::var_os(env) {
        let value = value
            .into_string()
            .map_err(|_| Error::config(format!("{env} is not UTF-8")))?;
        return Ok(Some(value));
    }
    match file {
        Some(path) => crate::access::read_secret_file(path)
            .map(Some)
            .map_err(|e| Error::config(format!("reading {}: {e}", path.display()))),
        None => Ok(None),
    }
}
