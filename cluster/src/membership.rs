//! The cluster membership key (docs/members.md, "Authenticated membership"): 32 random
//! bytes, base64 on one line in `tls/membership.key`, that sign every member record with
//! HMAC-SHA256. `keelson build` generates it beside the CA key; nodes get it only inside the
//! full configs the Ignition server hands to the machine network. `cluster.json` names the
//! signing key by its ID (`members.keyId`), so an agent can tell a missing or wrong key file
//! from a cluster that has none.

use base64::Engine as _;
use sha2::Digest as _;

/// Bytes in a key.
pub const KEY_LEN: usize = 32;

/// A key file that is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// Not base64.
    #[error("expected {KEY_LEN} bytes in base64 on one line: {0}")]
    Encoding(String),
    /// The wrong length.
    #[error("expected {KEY_LEN} bytes, got {0}")]
    Length(usize),
}

/// Reads a key file's text.
pub fn parse_key(text: &str) -> Result<Vec<u8>, KeyError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| KeyError::Encoding(e.to_string()))?;
    if bytes.len() != KEY_LEN {
        return Err(KeyError::Length(bytes.len()));
    }
    Ok(bytes)
}

/// The text of a key file for `key`.
pub fn key_text(key: &[u8]) -> String {
    format!(
        "{}\n",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// A key's ID: the first 16 hex digits of its SHA-256. Names the key in `cluster.json` and
/// in every record it signs; says nothing about the key.
pub fn key_id(key: &[u8]) -> String {
    hex::encode(&sha2::Sha256::digest(key)[..8])
}

/// Whether `s` looks like a key ID.
pub fn valid_key_id(s: &str) -> bool {
    s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A new random key, as key file text.
pub fn generate() -> Result<String, KeyError> {
    let mut key = [0u8; KEY_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| KeyError::Encoding("the system random source failed".into()))?;
    Ok(key_text(&key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_parse_and_id() {
        let text = generate().unwrap();
        let key = parse_key(&text).unwrap();
        assert_eq!(key.len(), KEY_LEN);
        assert_eq!(key_text(&key), text);
        let id = key_id(&key);
        assert!(valid_key_id(&id), "{id}");
        assert_ne!(parse_key(&generate().unwrap()).unwrap(), key);
        assert_eq!(parse_key("AAAA"), Err(KeyError::Length(3)));
        assert!(matches!(
            parse_key("not base64!"),
            Err(KeyError::Encoding(_))
        ));
        assert!(!valid_key_id("ABCDEF0123456789"));
    }
}
