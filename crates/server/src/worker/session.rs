//! Who a connection is, and until when: login tokens checked (JWTs by `kid`, the old HMAC
//! token where it is allowed), revocations, and each session's end.
//!
//! A session ends when its token does. Its end is kept on the connection and filed in
//! the timers (`timers.rs`), never found by a walk: the connection is visited
//! `refresh_before_secs` before its end and asked for a fresh token (a `refresh` push),
//! then at its end, when it is kicked `expired` unless a login on the same connection
//! moved the end meanwhile. A million sessions cost a timer entry each, visited twice a
//! token's life. What the token says is checked here; what the connection does with it
//! (`handler.rs`: the supervisor's route, the reply) is not.

use std::collections::HashMap;

use hongbao_money::UserId;
use hongbao_proto::token::{hmac, KeySpec, Minter, Refusal, Verifier};
use hongbao_sys::clock::UnixTime;

use crate::error::Result;
use crate::link::LoginSetup;

/// The `kid` of a connection that logged in with the old HMAC token.
const HMAC_KID: &str = "(hmac)";

/// A token that checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Checked {
    pub user: UserId,
    /// When the session ends: the token's `exp` plus the leeway it is accepted within,
    /// in Unix seconds.
    pub ends: u64,
    /// The token's `iat` (0 for none), for the supervisor's revocation check.
    pub issued: u64,
    /// The key it was signed with, as an index into `Sessions::kids`.
    pub kid: u16,
}

/// The keys, the revocations and the rules a worker checks logins with.
pub(super) struct Sessions {
    verifier: Verifier,
    setup: LoginSetup,
    /// Every `kid` a session here logged in with, in the order first seen: a connection
    /// keeps its key as an index (two bytes, not a string).
    kids: Vec<String>,
    /// Tokens of these users issued before (Unix seconds) are refused.
    revoked: HashMap<UserId, u64>,
}

impl Sessions {
    pub(super) fn new(setup: LoginSetup) -> Result<Sessions> {
        let verifier = Verifier::new(&setup.keys, setup.rules.clone())?;
        let revoked = setup
            .revoked
            .iter()
            .filter_map(|&(user, at)| Some((UserId::new(user)?, at)))
            .collect();
        Ok(Sessions {
            verifier,
            setup,
            kids: vec![HMAC_KID.to_string()],
            revoked,
        })
    }

    /// The keys and rules change (a reload): the `kid` indices of the sessions whose key
    /// is gone, and the old HMAC sessions' if those are no longer allowed. Revocations
    /// learnt meanwhile are kept.
    pub(super) fn reload(&mut self, setup: LoginSetup) -> Result<Vec<u16>> {
        let verifier = Verifier::new(&setup.keys, setup.rules.clone())?;
        for &(user, at) in &setup.revoked {
            if let Some(user) = UserId::new(user) {
                self.note_revoked(user, at);
            }
        }
        self.verifier = verifier;
        self.setup = setup;
        let gone = self
            .kids
            .iter()
            .enumerate()
            .filter(|(i, kid)| {
                if *i == 0 {
                    self.setup.hmac_secret.is_none()
                } else {
                    !self.verifier.has_kid(kid)
                }
            })
            .map(|(i, _)| i as u16)
            .collect();
        Ok(gone)
    }

    /// How long before its end a session is asked for a fresh token.
    pub(super) fn refresh_before_secs(&self) -> u32 {
        self.setup.refresh_before_secs
    }

    /// Checks a login's token at `now`: `claimed` is the user the frame names (0: whoever
    /// the token names). A `legacy` (version-1) login carries the old HMAC token, of any
    /// bytes, and is taken only where those are allowed; a version-2 login is a JWT.
    pub(super) fn check(
        &mut self,
        claimed: u64,
        token: &[u8],
        legacy: bool,
        now: UnixTime,
    ) -> Result<Checked, Refusal> {
        let secs = now.second();
        let checked = if legacy {
            self.check_hmac(claimed, token, secs)?
        } else {
            let v = self.verifier.verify(token, secs)?;
            let kid = intern(&mut self.kids, v.kid);
            Checked {
                user: UserId::new(v.user).ok_or(Refusal::BadSubject)?,
                ends: v.expires + self.setup.rules.leeway_secs,
                issued: v.issued,
                kid,
            }
        };
        if claimed != 0 && claimed != checked.user.get() {
            return Err(Refusal::OtherUser);
        }
        if self.is_revoked(checked.user, checked.issued) {
            return Err(Refusal::Revoked);
        }
        Ok(checked)
    }

    /// An HTTP request's bearer token: the user it acts for. Always a JWT: the old token
    /// names no user by itself.
    pub(super) fn bearer(&mut self, token: &[u8], now: UnixTime) -> Result<UserId, Refusal> {
        self.check(0, token, false, now).map(|c| c.user)
    }

    fn check_hmac(&mut self, user: u64, token: &[u8], now: u64) -> Result<Checked, Refusal> {
        let secret = self
            .setup
            .hmac_secret
            .as_deref()
            .ok_or(Refusal::Malformed)?;
        let user = UserId::new(user).ok_or(Refusal::BadSubject)?;
        if !hmac::verify(secret, user.get(), token) {
            return Err(Refusal::BadHmac);
        }
        Ok(Checked {
            user,
            ends: now + self.setup.rules.max_lifetime_secs,
            issued: 0,
            kid: 0,
        })
    }

    /// Whether a token of `user` issued at `issued` is refused by a revocation.
    pub(super) fn is_revoked(&self, user: UserId, issued: u64) -> bool {
        self.revoked.get(&user).is_some_and(|&at| issued < at)
    }

    /// Tokens of `user` issued before `at` (Unix seconds) are refused from now on.
    pub(super) fn note_revoked(&mut self, user: UserId, at: u64) {
        let entry = self.revoked.entry(user).or_insert(at);
        *entry = (*entry).max(at);
    }

    /// Forgets revocations no token can outlive any more (their every token has
    /// expired): the map holds a day's revocations, not the server's whole life.
    pub(super) fn forget_old_revocations(&mut self, now: UnixTime) {
        let horizon = self.setup.rules.revocation_horizon_secs();
        let now = now.second();
        self.revoked
            .retain(|_, at| at.saturating_add(horizon) > now);
    }

    /// A demo token for `user`, when demo logins are on.
    pub(super) fn demo_token(&self, user: u64, now: UnixTime) -> Option<String> {
        let key: &KeySpec = self.setup.demo_key.as_ref()?;
        let minter = Minter::new(&key.kid, key.alg, &key.material).ok()?;
        let now = now.second();
        // As long as the server allows, so the page need not come back often.
        Some(minter.mint_for(user, now, self.setup.rules.max_lifetime_secs.min(3600)))
    }
}

/// `kid`'s index in `kids`, added if new: bounded by the kids configured over the
/// worker's life.
fn intern(kids: &mut Vec<String>, kid: &str) -> u16 {
    match kids.iter().position(|k| k == kid) {
        Some(i) => i as u16,
        None => {
            kids.push(kid.to_string());
            (kids.len() - 1) as u16
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_proto::token::{Alg, Rules};

    const NOW: u64 = 1_800_000_000;

    fn setup(kids: &[&str]) -> LoginSetup {
        LoginSetup {
            keys: kids
                .iter()
                .map(|kid| KeySpec {
                    kid: kid.to_string(),
                    alg: Alg::HS256,
                    material: format!("secret of {kid}").into_bytes(),
                })
                .collect(),
            rules: Rules::default(),
            refresh_before_secs: 60,
            hmac_secret: None,
            demo_key: None,
            revoked: Vec::new(),
        }
    }

    fn token(kid: &str, user: u64, iat: u64) -> String {
        Minter::hs256(kid, format!("secret of {kid}").as_bytes()).mint_for(user, iat, 600)
    }

    fn at(secs: u64) -> UnixTime {
        UnixTime::from_millis(secs * 1000)
    }

    #[test]
    fn a_login_names_its_user_its_end_and_its_key() {
        let mut s = Sessions::new(setup(&["a", "b"])).unwrap();
        let got = s
            .check(0, token("b", 7, NOW).as_bytes(), false, at(NOW))
            .unwrap();
        assert_eq!(got.user.get(), 7);
        assert_eq!(got.ends, NOW + 600 + 30, "exp plus the leeway");
        assert_eq!(got.issued, NOW);
        assert_eq!(s.kids[got.kid as usize], "b");
        assert_eq!(
            s.check(7, token("a", 7, NOW).as_bytes(), false, at(NOW))
                .unwrap()
                .user
                .get(),
            7
        );
        assert_eq!(
            s.check(8, token("a", 7, NOW).as_bytes(), false, at(NOW)),
            Err(Refusal::OtherUser)
        );
        assert_eq!(
            s.bearer(token("a", 7, NOW).as_bytes(), at(NOW))
                .unwrap()
                .get(),
            7
        );
    }

    #[test]
    fn a_revocation_refuses_the_tokens_issued_before_it() {
        let mut s = Sessions::new(setup(&["a"])).unwrap();
        s.note_revoked(UserId::new(7).unwrap(), NOW + 10);
        let old = token("a", 7, NOW + 9);
        assert_eq!(
            s.check(0, old.as_bytes(), false, at(NOW + 20)),
            Err(Refusal::Revoked)
        );
        assert_eq!(
            s.bearer(old.as_bytes(), at(NOW + 20)),
            Err(Refusal::Revoked)
        );
        let new = token("a", 7, NOW + 10);
        assert!(s.check(0, new.as_bytes(), false, at(NOW + 20)).is_ok());
        assert!(s
            .check(0, token("a", 8, NOW).as_bytes(), false, at(NOW + 20))
            .is_ok());
        // Kept while a token issued before it could live; then forgotten.
        s.forget_old_revocations(at(NOW + 10 + 24 * 3600));
        assert!(s.is_revoked(UserId::new(7).unwrap(), NOW));
        s.forget_old_revocations(at(NOW + 10 + 24 * 3600 + 60));
        assert!(!s.is_revoked(UserId::new(7).unwrap(), NOW));
    }

    #[test]
    fn a_reload_names_the_keys_gone() {
        let mut s = Sessions::new(setup(&["a", "b"])).unwrap();
        let a = s
            .check(0, token("a", 1, NOW).as_bytes(), false, at(NOW))
            .unwrap()
            .kid;
        let b = s
            .check(0, token("b", 2, NOW).as_bytes(), false, at(NOW))
            .unwrap()
            .kid;
        let gone = s.reload(setup(&["b", "c"])).unwrap();
        assert!(gone.contains(&a) && !gone.contains(&b), "{gone:?}");
        assert!(gone.contains(&0), "no HMAC logins allowed");
        assert_eq!(
            s.check(0, token("a", 1, NOW).as_bytes(), false, at(NOW)),
            Err(Refusal::UnknownKid)
        );
        assert!(s
            .check(0, token("c", 1, NOW).as_bytes(), false, at(NOW))
            .is_ok());
        assert!(s
            .reload(LoginSetup {
                keys: vec![],
                ..setup(&[])
            })
            .is_ok());
    }

    #[test]
    fn the_old_token_only_in_a_version_1_login_where_allowed_and_never_as_a_bearer() {
        let old = hmac::token_hex(b"s", 5);
        let mut s = Sessions::new(setup(&["a"])).unwrap();
        assert_eq!(
            s.check(5, old.as_bytes(), true, at(NOW)),
            Err(Refusal::Malformed),
            "not allowed here"
        );
        let mut s = Sessions::new(LoginSetup {
            hmac_secret: Some(b"s".to_vec()),
            ..setup(&["a"])
        })
        .unwrap();
        let got = s.check(5, old.as_bytes(), true, at(NOW)).unwrap();
        assert_eq!((got.user.get(), got.kid, got.issued), (5, 0, 0));
        assert_eq!(got.ends, NOW + 24 * 3600, "lives as long as a token may");
        assert_eq!(
            s.check(6, old.as_bytes(), true, at(NOW)),
            Err(Refusal::BadHmac)
        );
        assert_eq!(
            s.check(0, old.as_bytes(), true, at(NOW)),
            Err(Refusal::BadSubject)
        );
        // A version-2 login is a JWT, whatever the server allows of version 1.
        assert_eq!(
            s.check(5, old.as_bytes(), false, at(NOW)),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            s.check(5, token("a", 5, NOW).as_bytes(), true, at(NOW)),
            Err(Refusal::BadHmac),
            "a JWT is no version-1 token"
        );
        assert_eq!(s.bearer(old.as_bytes(), at(NOW)), Err(Refusal::Malformed));
        // The raw form, whatever its bytes: a user whose HMAC holds a '.' logs in too.
        let user = (1..)
            .find(|&u| hmac::token(b"s", u).contains(&b'.'))
            .unwrap();
        let raw = hmac::token(b"s", user);
        assert_eq!(s.check(user, &raw, true, at(NOW)).unwrap().user.get(), user);
        // Any revocation of its user refuses it: it says nothing of when it was made.
        s.note_revoked(UserId::new(5).unwrap(), 1);
        assert_eq!(
            s.check(5, old.as_bytes(), true, at(NOW)),
            Err(Refusal::Revoked)
        );
    }
}
