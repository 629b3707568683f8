//! Every token form an attacker would try, on a clock the test sets.

use super::*;
use ::hmac::{Hmac, Mac};
use data_encoding::BASE64URL_NOPAD;

const ES_PRIVATE: &[u8] = include_bytes!("../../testdata/keys/es256.pem");
const ES_PUBLIC: &[u8] = include_bytes!("../../testdata/keys/es256.pub.pem");
const OTHER_ES_PRIVATE: &[u8] = include_bytes!("../../testdata/keys/other-es256.pem");
const ED_PRIVATE: &[u8] = include_bytes!("../../testdata/keys/ed25519.pem");
const ED_PUBLIC: &[u8] = include_bytes!("../../testdata/keys/ed25519.pub.pem");

const NOW: u64 = 1_800_000_000;

fn spec(kid: &str, alg: Alg, material: &[u8]) -> KeySpec {
    KeySpec {
        kid: kid.into(),
        alg,
        material: material.to_vec(),
    }
}

/// Three keys live at once: an HMAC one, an ES256 and an EdDSA public key.
fn verifier(rules: Rules) -> Verifier {
    Verifier::new(
        &[
            spec("hs", Alg::HS256, b"a secret of thirty-two bytes....."),
            spec("es", Alg::ES256, ES_PUBLIC),
            spec("ed", Alg::EdDSA, ED_PUBLIC),
        ],
        rules,
    )
    .unwrap()
}

fn hs() -> Minter {
    Minter::hs256("hs", b"a secret of thirty-two bytes.....")
}

fn b64(bytes: &[u8]) -> String {
    BASE64URL_NOPAD.encode(bytes)
}

/// A token put together by hand: any header, any payload, HMAC-signed with `key`.
fn forged(header: &str, payload: &str, key: &[u8]) -> String {
    let message = format!("{}.{}", b64(header.as_bytes()), b64(payload.as_bytes()));
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(message.as_bytes());
    format!("{message}.{}", b64(&mac.finalize().into_bytes()))
}

fn check(token: &str) -> Result<u64, Refusal> {
    verifier(Rules::default())
        .verify(token.as_bytes(), NOW)
        .map(|v| v.user)
}

#[test]
fn each_algorithm_verifies_by_its_kid() {
    let v = verifier(Rules::default());
    let es = Minter::new("es", Alg::ES256, ES_PRIVATE).unwrap();
    let ed = Minter::new("ed", Alg::EdDSA, ED_PRIVATE).unwrap();
    for (minter, kid) in [(hs(), "hs"), (es, "es"), (ed, "ed")] {
        let token = minter.mint_for(42, NOW - 10, 600);
        let got = v.verify(token.as_bytes(), NOW).unwrap();
        assert_eq!(
            got,
            Verified {
                user: 42,
                expires: NOW + 590,
                issued: NOW - 10,
                kid,
            }
        );
    }
    assert_eq!(v.kids(), ["ed", "es", "hs"]);
}

#[test]
fn times_are_checked_with_the_leeway() {
    let rules = Rules {
        leeway_secs: 5,
        ..Rules::default()
    };
    let v = verifier(rules);
    let at = |claims: &Claims, now| v.verify(hs().mint(claims).as_bytes(), now).map(|v| v.user);
    let claims = Claims::new(7, NOW, 60);
    assert_eq!(at(&claims, NOW + 64), Ok(7), "inside the leeway");
    assert_eq!(at(&claims, NOW + 65), Err(Refusal::Expired));
    assert_eq!(
        at(&claims, NOW - 5),
        Ok(7),
        "issued a little ahead of our clock"
    );
    assert_eq!(at(&claims, NOW - 6), Err(Refusal::NotYetValid), "iat ahead");
    let later = Claims {
        nbf: Some(NOW + 30),
        ..claims.clone()
    };
    assert_eq!(at(&later, NOW), Err(Refusal::NotYetValid));
    assert_eq!(at(&later, NOW + 25), Ok(7));
    // Past the longest lifetime: refused, so revocations need be kept no longer.
    let long = Claims::new(7, NOW, 24 * 3600 + 1);
    assert_eq!(at(&long, NOW), Err(Refusal::TooLong));
    let no_iat = Claims {
        iat: None,
        ..Claims::new(7, NOW, 24 * 3600 + 1)
    };
    assert_eq!(at(&no_iat, NOW), Err(Refusal::TooLong), "counted from now");
    let no_iat = Claims {
        iat: None,
        ..Claims::new(7, NOW, 60)
    };
    let token = hs().mint(&no_iat);
    assert_eq!(v.verify(token.as_bytes(), NOW).unwrap().issued, 0);
}

#[test]
fn a_missing_exp_or_a_bad_sub_is_refused() {
    let key = b"a secret of thirty-two bytes.....";
    let header = r#"{"alg":"HS256","typ":"JWT","kid":"hs"}"#;
    let exp = NOW + 60;
    assert_eq!(
        check(&forged(header, r#"{"sub":"5"}"#, key)),
        Err(Refusal::NoExpiry)
    );
    assert_eq!(
        check(&forged(
            header,
            &format!(r#"{{"sub":"5","exp":{exp}.5}}"#),
            key
        )),
        Ok(5),
        "a NumericDate may have a fraction"
    );
    assert_eq!(
        check(&forged(header, r#"{"sub":"5","exp":"soon"}"#, key)),
        Err(Refusal::Malformed)
    );
    for sub in [
        r#""0""#, r#""abc""#, "5", r#""-5""#, r#""05""#, r#""""#, "null",
    ] {
        let payload = format!(r#"{{"sub":{sub},"exp":{exp}}}"#);
        assert_eq!(
            check(&forged(header, &payload, key)),
            Err(Refusal::BadSubject),
            "{sub}"
        );
    }
    let payload = format!(r#"{{"exp":{exp}}}"#);
    assert_eq!(
        check(&forged(header, &payload, key)),
        Err(Refusal::BadSubject)
    );
    let payload = format!(r#"{{"sub":"18446744073709551616","exp":{exp}}}"#);
    assert_eq!(
        check(&forged(header, &payload, key)),
        Err(Refusal::BadSubject)
    );
}

#[test]
fn the_algorithm_comes_from_the_key_never_the_token() {
    let exp = NOW + 60;
    let payload = format!(r#"{{"sub":"1","exp":{exp}}}"#);
    // alg none, with and without a signature.
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","kid":"hs"}"#),
        b64(payload.as_bytes())
    );
    assert_eq!(check(&none), Err(Refusal::Malformed));
    // HS256 signed with the ES256 key's public bytes, under that key's kid: the classic
    // confusion. The es key verifies ES256 only.
    let confused = forged(r#"{"alg":"HS256","kid":"es"}"#, &payload, ES_PUBLIC);
    assert_eq!(check(&confused), Err(Refusal::WrongAlg));
    // ES256 claimed for the HMAC key's kid.
    let es = Minter::new("hs", Alg::ES256, ES_PRIVATE).unwrap();
    assert_eq!(check(&es.mint_for(1, NOW, 60)), Err(Refusal::WrongAlg));
    // An unknown kid, and none at all.
    let unknown = Minter::hs256("old", b"a secret of thirty-two bytes.....");
    assert_eq!(
        check(&unknown.mint_for(1, NOW, 60)),
        Err(Refusal::UnknownKid)
    );
    let no_kid = forged(
        r#"{"alg":"HS256"}"#,
        &payload,
        b"a secret of thirty-two bytes.....",
    );
    assert_eq!(check(&no_kid), Err(Refusal::NoKid));
    // The right kid signed by someone else's key.
    let thief = Minter::new("es", Alg::ES256, OTHER_ES_PRIVATE).unwrap();
    assert_eq!(
        check(&thief.mint_for(1, NOW, 60)),
        Err(Refusal::BadSignature)
    );
    let thief = Minter::hs256("hs", b"a guessed secret");
    assert_eq!(
        check(&thief.mint_for(1, NOW, 60)),
        Err(Refusal::BadSignature)
    );
}

#[test]
fn a_tampered_token_is_refused() {
    let token = hs().mint_for(42, NOW, 60);
    let parts: Vec<&str> = token.split('.').collect();
    // Another user's claims under the first one's signature.
    let other = b64(Claims::new(43, NOW, 60).sub.as_bytes());
    let swapped = hs().mint_for(43, NOW, 60);
    let swapped_payload = swapped.split('.').nth(1).unwrap();
    let spliced = format!("{}.{}.{}", parts[0], swapped_payload, parts[2]);
    assert_eq!(check(&spliced), Err(Refusal::BadSignature));
    let mut sig = parts[2].as_bytes().to_vec();
    sig[3] = if sig[3] == b'A' { b'B' } else { b'A' };
    let flipped = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        String::from_utf8(sig).unwrap()
    );
    assert_eq!(check(&flipped), Err(Refusal::BadSignature));
    for junk in ["", "a.b", "a.b.c.d", "...", &other, "eyJ.eyJ.xx", "\u{0}"] {
        assert!(check(junk).is_err(), "{junk:?}");
    }
    assert_eq!(check(&token), Ok(42));
}

#[test]
fn the_audience_is_checked_when_configured() {
    let v = verifier(Rules {
        audience: Some("hongbao".into()),
        ..Rules::default()
    });
    let with = |aud: Option<&str>| {
        let claims = Claims {
            aud: aud.map(str::to_string),
            ..Claims::new(9, NOW, 60)
        };
        v.verify(hs().mint(&claims).as_bytes(), NOW).map(|v| v.user)
    };
    assert_eq!(with(Some("hongbao")), Ok(9));
    assert_eq!(with(Some("other-app")), Err(Refusal::WrongAudience));
    assert_eq!(with(None), Err(Refusal::WrongAudience));
    let key = b"a secret of thirty-two bytes.....";
    let header = r#"{"alg":"HS256","kid":"hs"}"#;
    let list = format!(r#"{{"sub":"9","exp":{},"aud":["x","hongbao"]}}"#, NOW + 60);
    assert_eq!(
        v.verify(forged(header, &list, key).as_bytes(), NOW)
            .map(|v| v.user),
        Ok(9)
    );
    // Not configured: an aud in the token is no reason to refuse it.
    assert_eq!(
        verifier(Rules::default())
            .verify(
                hs().mint(&Claims {
                    aud: Some("x".into()),
                    ..Claims::new(9, NOW, 60)
                })
                .as_bytes(),
                NOW
            )
            .map(|v| v.user),
        Ok(9)
    );
}

#[test]
fn unusable_keys_are_refused_when_configured() {
    let one = |s: KeySpec| Verifier::new(&[s], Rules::default()).map(|_| ());
    assert!(one(spec("k", Alg::HS256, b"")).is_err());
    let pem = one(spec("k", Alg::HS256, ES_PUBLIC))
        .unwrap_err()
        .to_string();
    assert!(pem.contains("PEM"), "{pem}");
    assert!(one(spec("k", Alg::ES256, b"not a pem")).is_err());
    assert!(
        one(spec("k", Alg::ES256, ED_PUBLIC)).is_err(),
        "an Ed25519 key as ES256"
    );
    assert!(
        one(spec("k", Alg::EdDSA, ES_PUBLIC)).is_err(),
        "a P-256 key as EdDSA"
    );
    let twice = Verifier::new(
        &[spec("k", Alg::HS256, b"x"), spec("k", Alg::HS256, b"y")],
        Rules::default(),
    );
    assert!(twice.is_err());
    assert!(format!("{:?}", spec("k", Alg::HS256, b"hush"))
        .find("hush")
        .is_none());
    assert_eq!("EdDSA".parse(), Ok(Alg::EdDSA));
    assert!("none".parse::<Alg>().is_err());
    assert!("RS256".parse::<Alg>().is_err());
}

#[test]
fn refusals_have_distinct_names() {
    let mut names: Vec<&str> = Refusal::ALL.iter().map(|r| r.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), Refusal::ALL.len());
    for (i, r) in Refusal::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
    }
}

mod legacy_hmac {
    use super::super::hmac::*;

    // Computed independently with Python:
    //   hmac.new(b"secret", b"42", hashlib.sha256).hexdigest()
    const SECRET_42: &str = "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70";
    //   hmac.new(b"", b"0", hashlib.sha256).hexdigest()
    const EMPTY_0: &str = "9979e4c3ee19965f9ecc6dca6b3954b10c18c1bfa105c512cc3ae58be85db71c";
    //   hmac.new(b"k", b"18446744073709551615", hashlib.sha256).hexdigest()
    const K_MAX: &str = "ce4b782bd2451af0e0ba523cabb2b5b585eaa7c4f1afc53d89cb4ac4db192ea9";

    #[test]
    fn known_vectors() {
        assert_eq!(token_hex(b"secret", 42), SECRET_42);
        assert_eq!(token_hex(b"", 0), EMPTY_0);
        assert_eq!(token_hex(b"k", u64::MAX), K_MAX);
        assert_eq!(hex::encode(token(b"secret", 42)), SECRET_42);
    }

    #[test]
    fn verify_accepts_raw_and_hex_and_nothing_else() {
        let raw = token(b"secret", 42);
        assert!(verify(b"secret", 42, &raw));
        assert!(verify(b"secret", 42, SECRET_42.as_bytes()));
        assert!(verify(b"secret", 42, SECRET_42.to_uppercase().as_bytes()));
        assert!(!verify(b"secret", 43, &raw));
        assert!(!verify(b"other", 42, &raw));
        assert!(!verify(b"secret", 42, &raw[..31]));
        assert!(!verify(b"secret", 42, b""));
        let mut flipped = raw;
        flipped[31] ^= 1;
        assert!(!verify(b"secret", 42, &flipped));
        let mut bad_hex = SECRET_42.as_bytes().to_vec();
        bad_hex[0] = b'g';
        assert!(!verify(b"secret", 42, &bad_hex));
        assert!(!verify(b"secret", 42, EMPTY_0.as_bytes()));
    }
}
