//! How many login tokens one core checks a second: HS256, ES256 and EdDSA JWTs through
//! `token::Verifier` (what the gateway runs per login and per HTTP bearer), and the old
//! HMAC token for comparison. docs/BENCHMARKS.md has the figures.
//!
//!   cargo run --release -p hongbao-proto --example token_rates [SECONDS_EACH]

use std::time::{Duration, Instant};

use hongbao_proto::token::{hmac, Alg, KeySpec, Minter, Rules, Verifier};

const ES_PRIVATE: &[u8] = include_bytes!("../testdata/keys/es256.pem");
const ES_PUBLIC: &[u8] = include_bytes!("../testdata/keys/es256.pub.pem");
const ED_PRIVATE: &[u8] = include_bytes!("../testdata/keys/ed25519.pem");
const ED_PUBLIC: &[u8] = include_bytes!("../testdata/keys/ed25519.pub.pem");
const SECRET: &[u8] = b"a login secret of the app server, 32+ bytes";

/// Calls `f` for `secs` seconds: calls a second.
fn rate(secs: f64, mut f: impl FnMut(u64) -> bool) -> f64 {
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < until {
        for _ in 0..64 {
            assert!(f(n), "a token that should verify did not");
            n += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let now = hongbao_sys_now();
    let verifier = Verifier::new(
        &[
            KeySpec {
                kid: "hs".into(),
                alg: Alg::HS256,
                material: SECRET.to_vec(),
            },
            KeySpec {
                kid: "es".into(),
                alg: Alg::ES256,
                material: ES_PUBLIC.to_vec(),
            },
            KeySpec {
                kid: "ed".into(),
                alg: Alg::EdDSA,
                material: ED_PUBLIC.to_vec(),
            },
        ],
        Rules::default(),
    )
    .expect("the keys");
    // A thousand users' tokens each, so nothing is one token over and over.
    let minters = [
        ("HS256", Minter::hs256("hs", SECRET)),
        ("ES256", Minter::new("es", Alg::ES256, ES_PRIVATE).unwrap()),
        ("EdDSA", Minter::new("ed", Alg::EdDSA, ED_PRIVATE).unwrap()),
    ];
    for (name, minter) in &minters {
        let tokens: Vec<String> = (1..=1000).map(|u| minter.mint_for(u, now, 3600)).collect();
        let verifies = rate(secs, |i| {
            verifier
                .verify(tokens[(i % 1000) as usize].as_bytes(), now)
                .is_ok()
        });
        let mints = rate(secs.min(1.0), |i| {
            !minter.mint_for(i + 1, now, 3600).is_empty()
        });
        println!("{name}: verify {verifies:.0}/s, mint {mints:.0}/s on one core");
    }
    // The signature checks alone, with aws-lc-rs and nothing of JWT around them: what a
    // core does here, to hold the figures above against.
    {
        use aws_lc_rs::signature::{self, KeyPair};
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let msg = b"eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiI0MiJ9";
        let der = hongbao_pem_der(ES_PRIVATE);
        let es =
            signature::EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der)
                .unwrap();
        let sig = es.sign(&rng, msg).unwrap();
        let public = signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            es.public_key().as_ref().to_vec(),
        );
        let raw = rate(secs, |_| public.verify(msg, sig.as_ref()).is_ok());
        println!("ES256 signature alone (aws-lc-rs): verify {raw:.0}/s on one core");
        let der = hongbao_pem_der(ED_PRIVATE);
        let ed = signature::Ed25519KeyPair::from_pkcs8(&der).unwrap();
        let sig = ed.sign(msg);
        let public = signature::UnparsedPublicKey::new(
            &signature::ED25519,
            ed.public_key().as_ref().to_vec(),
        );
        let raw = rate(secs, |_| public.verify(msg, sig.as_ref()).is_ok());
        println!("EdDSA signature alone (aws-lc-rs): verify {raw:.0}/s on one core");
    }
    let old: Vec<[u8; 32]> = (1..=1000).map(|u| hmac::token(SECRET, u)).collect();
    let verifies = rate(secs, |i| {
        hmac::verify(SECRET, i % 1000 + 1, &old[(i % 1000) as usize])
    });
    println!("HMAC (the old token): verify {verifies:.0}/s on one core");
}

/// The DER inside a PEM file (base64 between its two lines of dashes).
fn hongbao_pem_der(pem: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(pem).unwrap();
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    data_encoding::BASE64.decode(body.as_bytes()).unwrap()
}

fn hongbao_sys_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
