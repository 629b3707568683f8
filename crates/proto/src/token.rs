//! Login tokens: JWTs (RFC 7519), signed by the app server, verified by the gateway.
//!
//! A token names its user in `sub` (the user id as a decimal string) and its end in
//! `exp`, which is required; `nbf` and `iat` are honoured, `aud` is checked when the
//! server is given an audience. Keys are known by `kid`, several at once, so an app
//! server can sign with a private key the gateways never see (ES256, EdDSA: they hold
//! only the public key) and keys rotate with nobody logged out. The algorithm comes from
//! the key a token's `kid` names, never from the token (RFC 8725): `alg: none`, HS256
//! over a public key's bytes, an unknown `kid` are all refused. The crypto and the
//! JOSE parsing are the `jsonwebtoken` crate's (on aws-lc-rs); the times are checked
//! here, against a clock the caller passes in, so tests run on a clock they move.
//!
//! [`hmac`] keeps the old token, HMAC-SHA256(secret, user id), for the one client that
//! cannot mint a JWT: the shared C floor client, which speaks protocol version 1
//! (`docs/security.md` says when a server accepts it).

use std::collections::HashMap;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The secret `serve` and `load` use when none is given: for development only (`serve`
/// says so when it starts with it, and listens on loopback only).
pub const DEV_SECRET: &str = "hongbao-dev-secret";

/// The `kid` of the HS256 key a server makes of its secret when no `[[login_keys]]` are
/// configured.
pub const DEFAULT_KID: &str = "hongbao";

/// The algorithms a login key may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Alg {
    /// HMAC-SHA256 with a shared secret: whoever verifies can also sign.
    HS256,
    /// ECDSA over P-256 with SHA-256; the gateway holds the public key (PEM).
    ES256,
    /// Ed25519; the gateway holds the public key (PEM).
    EdDSA,
}

impl Alg {
    fn jose(self) -> Algorithm {
        match self {
            Alg::HS256 => Algorithm::HS256,
            Alg::ES256 => Algorithm::ES256,
            Alg::EdDSA => Algorithm::EdDSA,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::HS256 => "HS256",
            Alg::ES256 => "ES256",
            Alg::EdDSA => "EdDSA",
        }
    }
}

impl std::str::FromStr for Alg {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Alg, KeyError> {
        match s {
            "HS256" => Ok(Alg::HS256),
            "ES256" => Ok(Alg::ES256),
            "EdDSA" => Ok(Alg::EdDSA),
            _ => Err(KeyError::UnknownAlg(s.to_string())),
        }
    }
}

/// A key that cannot be used to verify or to sign: which, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("alg must be HS256, ES256 or EdDSA, not {0:?}")]
    UnknownAlg(String),
    #[error("login key {0:?} is configured twice")]
    Twice(String),
    #[error("login key {0:?}: the HS256 secret is empty")]
    EmptySecret(String),
    #[error(
        "login key {0:?}: an HS256 secret that is a PEM file: a public key must be \
         configured as ES256 or EdDSA (public_key_file), never as an HMAC secret"
    )]
    PemAsSecret(String),
    /// The material does not read as a key of its algorithm (jsonwebtoken's words).
    #[error("login key {kid:?} ({alg}): not a usable key: {why}")]
    NotAKey {
        kid: String,
        alg: &'static str,
        why: String,
    },
    #[error("signing key {kid:?} ({alg}): {why}")]
    NotASigningKey {
        kid: String,
        alg: &'static str,
        why: String,
    },
}

/// One verification key as configured: its `kid`, its algorithm, and its material
/// (the HS256 secret's bytes, or a public key's PEM). Plain data, so the supervisor can
/// hand the set to its workers.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySpec {
    pub kid: String,
    pub alg: Alg,
    pub material: Vec<u8>,
}

impl std::fmt::Debug for KeySpec {
    /// Never the material: an HS256 secret must not reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySpec")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// What a token must satisfy beyond its signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
    pub leeway_secs: u64,
    /// When set, `aud` must be present and name it.
    pub audience: Option<String>,
    /// The longest a token may live: `exp - iat` (or, with no `iat`, `exp - now`).
    /// Bounds how long a revocation must be remembered.
    pub max_lifetime_secs: u64,
}

impl Rules {
    /// How long a revocation matters: past the longest a token lives (and the leeways on
    /// both ends), every token it refuses has expired.
    pub fn revocation_horizon_secs(&self) -> u64 {
        self.max_lifetime_secs + 2 * self.leeway_secs
    }
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            leeway_secs: 30,
            audience: None,
            max_lifetime_secs: 24 * 3600,
        }
    }
}

/// Why a token is refused; `name` is its label in logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Not three base64url parts of JSON, or a header naming no algorithm we know
    /// (`none` included).
    Malformed,
    /// The header names no `kid`.
    NoKid,
    /// The `kid` is not one of the configured keys.
    UnknownKid,
    /// The header's `alg` is not its key's.
    WrongAlg,
    /// The signature does not verify.
    BadSignature,
    /// No `exp`.
    NoExpiry,
    /// `exp` has passed.
    Expired,
    /// `nbf` (or `iat`) is still to come.
    NotYetValid,
    /// Lives longer than `max_lifetime_secs`.
    TooLong,
    /// `sub` is missing, not a decimal user id, or 0.
    BadSubject,
    /// `aud` does not name the configured audience.
    WrongAudience,
    /// The frame's user id is not the token's `sub`.
    OtherUser,
    /// Its user's tokens issued before a revocation are refused.
    Revoked,
    /// An HMAC token where they are not accepted, or one that does not match.
    BadHmac,
}

impl Refusal {
    pub const ALL: [Refusal; 14] = [
        Refusal::Malformed,
        Refusal::NoKid,
        Refusal::UnknownKid,
        Refusal::WrongAlg,
        Refusal::BadSignature,
        Refusal::NoExpiry,
        Refusal::Expired,
        Refusal::NotYetValid,
        Refusal::TooLong,
        Refusal::BadSubject,
        Refusal::WrongAudience,
        Refusal::OtherUser,
        Refusal::Revoked,
        Refusal::BadHmac,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::NoKid => "no-kid",
            Refusal::UnknownKid => "unknown-kid",
            Refusal::WrongAlg => "wrong-alg",
            Refusal::BadSignature => "bad-signature",
            Refusal::NoExpiry => "no-exp",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not-yet-valid",
            Refusal::TooLong => "lifetime-too-long",
            Refusal::BadSubject => "bad-sub",
            Refusal::WrongAudience => "wrong-aud",
            Refusal::OtherUser => "other-user",
            Refusal::Revoked => "revoked",
            Refusal::BadHmac => "bad-hmac",
        }
    }

    /// Its place in `ALL`, for counters indexed by refusal.
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).expect("in ALL")
    }
}

/// A token that verified: whose it is, when it ends, when it was issued, and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified<'a> {
    pub user: u64,
    /// `exp`, seconds since the Unix epoch.
    pub expires: u64,
    /// `iat`, seconds since the Unix epoch; 0 when the token has none (so any revocation
    /// of its user refuses it).
    pub issued: u64,
    pub kid: &'a str,
}

struct Key {
    alg: Alg,
    decoding: DecodingKey,
    validation: Validation,
}

/// The configured keys, ready to verify with.
pub struct Verifier {
    keys: HashMap<String, Key>,
    rules: Rules,
}

/// The claims we read; the rest are ignored. Times may be any JSON number (RFC 7519's
/// NumericDate allows fractions).
#[derive(Deserialize)]
struct Wire {
    sub: Option<serde_json::Value>,
    exp: Option<serde_json::Number>,
    nbf: Option<serde_json::Number>,
    iat: Option<serde_json::Number>,
    aud: Option<serde_json::Value>,
}

/// A NumericDate as whole seconds; `None` for a negative or non-finite one.
fn seconds(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })
}

impl Verifier {
    /// Keys from their specs; an error names the key that cannot be used.
    pub fn new(specs: &[KeySpec], rules: Rules) -> Result<Verifier, KeyError> {
        let mut keys = HashMap::new();
        for spec in specs {
            let decoding = decoding_key(spec)?;
            let mut validation = Validation::new(spec.alg.jose());
            // The times and the audience are checked in `verify`, on the caller's clock.
            validation.required_spec_claims.clear();
            validation.validate_exp = false;
            validation.validate_nbf = false;
            validation.validate_aud = false;
            validation.leeway = 0;
            let key = Key {
                alg: spec.alg,
                decoding,
                validation,
            };
            if keys.insert(spec.kid.clone(), key).is_some() {
                return Err(KeyError::Twice(spec.kid.clone()));
            }
        }
        Ok(Verifier { keys, rules })
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Whether a key with this `kid` is configured.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.contains_key(kid)
    }

    /// The configured `kid`s, sorted.
    pub fn kids(&self) -> Vec<&str> {
        let mut kids: Vec<&str> = self.keys.keys().map(String::as_str).collect();
        kids.sort_unstable();
        kids
    }

    /// Checks `token` at `now` (seconds since the Unix epoch).
    pub fn verify(&self, token: &[u8], now: u64) -> Result<Verified<'_>, Refusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed)?;
        let kid = header.kid.as_deref().ok_or(Refusal::NoKid)?;
        let (kid, key) = self.keys.get_key_value(kid).ok_or(Refusal::UnknownKid)?;
        if header.alg != key.alg.jose() {
            return Err(Refusal::WrongAlg);
        }
        let data = jsonwebtoken::decode::<Wire>(token, &key.decoding, &key.validation).map_err(
            |e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::InvalidSignature => Refusal::BadSignature,
                jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => Refusal::WrongAlg,
                _ => Refusal::Malformed,
            },
        )?;
        let claims = data.claims;
        let rules = &self.rules;
        let leeway = rules.leeway_secs;
        let expires = claims.exp.as_ref().ok_or(Refusal::NoExpiry)?;
        let expires = seconds(expires).ok_or(Refusal::Malformed)?;
        if now >= expires.saturating_add(leeway) {
            return Err(Refusal::Expired);
        }
        if let Some(nbf) = &claims.nbf {
            if seconds(nbf).ok_or(Refusal::Malformed)? > now.saturating_add(leeway) {
                return Err(Refusal::NotYetValid);
            }
        }
        let issued = match &claims.iat {
            Some(iat) => {
                let iat = seconds(iat).ok_or(Refusal::Malformed)?;
                if iat > now.saturating_add(leeway) {
                    return Err(Refusal::NotYetValid);
                }
                iat
            }
            None => 0,
        };
        let born = if claims.iat.is_some() { issued } else { now };
        if expires.saturating_sub(born) > rules.max_lifetime_secs {
            return Err(Refusal::TooLong);
        }
        let user = match &claims.sub {
            Some(serde_json::Value::String(s)) if is_decimal(s) => s.parse::<u64>().ok(),
            _ => None,
        }
        .filter(|&u| u > 0)
        .ok_or(Refusal::BadSubject)?;
        if let Some(audience) = &rules.audience {
            let named = match &claims.aud {
                Some(serde_json::Value::String(a)) => a == audience,
                Some(serde_json::Value::Array(all)) => all.iter().any(|a| a == audience),
                _ => false,
            };
            if !named {
                return Err(Refusal::WrongAudience);
            }
        }
        Ok(Verified {
            user,
            expires,
            issued,
            kid,
        })
    }
}

/// A user id as `sub` writes it: decimal digits, no sign, no leading zero.
fn is_decimal(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0')
}

fn decoding_key(spec: &KeySpec) -> Result<DecodingKey, KeyError> {
    let what = |e: jsonwebtoken::errors::Error| KeyError::NotAKey {
        kid: spec.kid.clone(),
        alg: spec.alg.name(),
        why: e.to_string(),
    };
    match spec.alg {
        Alg::HS256 => {
            if spec.material.is_empty() {
                return Err(KeyError::EmptySecret(spec.kid.clone()));
            }
            if spec.material.starts_with(b"-----BEGIN") {
                return Err(KeyError::PemAsSecret(spec.kid.clone()));
            }
            Ok(DecodingKey::from_secret(&spec.material))
        }
        Alg::ES256 => DecodingKey::from_ec_pem(&spec.material).map_err(what),
        Alg::EdDSA => DecodingKey::from_ed_pem(&spec.material).map_err(what),
    }
}

/// What a minted token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
}

impl Claims {
    /// A token for `user`, issued `now`, living `ttl_secs`.
    pub fn new(user: u64, now: u64, ttl_secs: u64) -> Claims {
        Claims {
            sub: user.to_string(),
            exp: now + ttl_secs,
            iat: Some(now),
            nbf: None,
            aud: None,
        }
    }
}

/// A signing key: what an app server (or the load lab, or the demo login) mints with.
pub struct Minter {
    header: Header,
    key: EncodingKey,
}

impl Minter {
    /// An HS256 key `kid` over `secret`.
    pub fn hs256(kid: &str, secret: &[u8]) -> Minter {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(kid.to_string());
        Minter {
            header,
            key: EncodingKey::from_secret(secret),
        }
    }

    /// A key `kid` of `alg` from its private key's PEM (PKCS#8 for ES256 and EdDSA), or
    /// for HS256 the secret's bytes.
    pub fn new(kid: &str, alg: Alg, material: &[u8]) -> Result<Minter, KeyError> {
        let key = match alg {
            Alg::HS256 => return Ok(Minter::hs256(kid, material)),
            Alg::ES256 => EncodingKey::from_ec_pem(material),
            Alg::EdDSA => EncodingKey::from_ed_pem(material),
        }
        .map_err(|e| KeyError::NotASigningKey {
            kid: kid.to_string(),
            alg: alg.name(),
            why: e.to_string(),
        })?;
        let mut header = Header::new(alg.jose());
        header.kid = Some(kid.to_string());
        Ok(Minter { header, key })
    }

    /// The compact form of a token saying `claims`.
    pub fn mint(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&self.header, claims, &self.key)
            .expect("claims serialise and the key signs")
    }

    /// A token for `user`, issued `now`, living `ttl_secs`.
    pub fn mint_for(&self, user: u64, now: u64, ttl_secs: u64) -> String {
        self.mint(&Claims::new(user, now, ttl_secs))
    }
}

/// The old login token: HMAC-SHA256(secret, user id as decimal ASCII), 32 raw bytes or
/// their 64-character hex form. Only the shared C floor client still sends it.
pub mod hmac {
    use ::hmac::{Hmac, Mac};
    use sha2::Sha256;

    type HmacSha256 = Hmac<Sha256>;

    /// Bytes in a raw token.
    pub const TOKEN_LEN: usize = 32;

    fn mac(secret: &[u8], user_id: u64) -> HmacSha256 {
        // HMAC takes keys of any length, so this cannot fail.
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
        mac.update(user_id.to_string().as_bytes());
        mac
    }

    /// The 32-byte token for `user_id`.
    pub fn token(secret: &[u8], user_id: u64) -> [u8; 32] {
        mac(secret, user_id).finalize().into_bytes().into()
    }

    /// The token as 64 lowercase hex characters.
    pub fn token_hex(secret: &[u8], user_id: u64) -> String {
        hex::encode(token(secret, user_id))
    }

    /// Whether `token` is the right one for `user_id`: either the 32 raw bytes or their
    /// hex form (either case). The comparison is constant-time in the token's contents.
    pub fn verify(secret: &[u8], user_id: u64, token: &[u8]) -> bool {
        let mut raw = [0u8; TOKEN_LEN];
        let raw: &[u8] = match token.len() {
            TOKEN_LEN => token,
            n if n == 2 * TOKEN_LEN => {
                if hex::decode_to_slice(token, &mut raw).is_err() {
                    return false;
                }
                &raw
            }
            _ => return false,
        };
        mac(secret, user_id).verify_slice(raw).is_ok()
    }
}

#[cfg(test)]
mod tests;
