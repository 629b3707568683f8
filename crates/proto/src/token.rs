//! The login token: HMAC-SHA256(server secret, user id written as decimal ASCII).
//!
//! Whoever holds the secret (the server, the load lab, an operator's tool) can mint a
//! token for any user; the server checks the one in `Login` with [`verify`]. On the wire
//! the token is the 32 raw bytes; the 64-character hex form is accepted as well, so that
//! tools which pass tokens around as text can send them unchanged.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Bytes in a raw token.
pub const TOKEN_LEN: usize = 32;

/// The secret `serve` and `load` use when none is given: for development only (`serve`
/// says so when it starts with it, and hands out demo tokens).
pub const DEV_SECRET: &str = "hongbao-dev-secret";

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

/// Whether `token` is the right one for `user_id`: either the 32 raw bytes or their hex
/// form (either case). The comparison is constant-time in the token's contents.
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn verify_accepts_raw_and_hex() {
        let raw = token(b"secret", 42);
        assert!(verify(b"secret", 42, &raw));
        assert!(verify(b"secret", 42, SECRET_42.as_bytes()));
        assert!(verify(b"secret", 42, SECRET_42.to_uppercase().as_bytes()));
    }

    #[test]
    fn verify_rejects() {
        let raw = token(b"secret", 42);
        assert!(!verify(b"secret", 43, &raw));
        assert!(!verify(b"other", 42, &raw));
        assert!(!verify(b"secret", 42, &raw[..31]));
        assert!(!verify(b"secret", 42, b""));
        let mut flipped = raw;
        flipped[31] ^= 1;
        assert!(!verify(b"secret", 42, &flipped));
        // Right length, not hex.
        let mut bad_hex = SECRET_42.as_bytes().to_vec();
        bad_hex[0] = b'g';
        assert!(!verify(b"secret", 42, &bad_hex));
        // The hex of a wrong token.
        assert!(!verify(b"secret", 42, EMPTY_0.as_bytes()));
        // Hex with something appended.
        let mut long = SECRET_42.as_bytes().to_vec();
        long.push(b'0');
        assert!(!verify(b"secret", 42, &long));
    }
}
