//! `data:` URLs (RFC 2397) as Ignition writes file contents: `data:[<mediatype>][;base64],<data>`
//! with the data percent-encoded unless base64.

use base64::Engine;

/// Errors decoding a data URL.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataUrlError {
    /// Not `data:...,...`.
    #[error("expected a data: URL with a comma before the data")]
    NotDataUrl,
    /// Bad base64.
    #[error("invalid base64 in data: URL: {0}")]
    Base64(String),
    /// Bad percent escape.
    #[error("invalid percent-encoding in data: URL at byte {0}")]
    Percent(usize),
}

/// Decodes a data URL to its bytes.
pub fn decode(url: &str) -> Result<Vec<u8>, DataUrlError> {
    let rest = url.strip_prefix("data:").ok_or(DataUrlError::NotDataUrl)?;
    let (meta, data) = rest.split_once(',').ok_or(DataUrlError::NotDataUrl)?;
    if meta.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        // Base64 data may itself be percent-encoded in a URL.
        let cleaned = percent_decode(data.as_bytes())?;
        base64::engine::general_purpose::STANDARD
            .decode(
                cleaned
                    .iter()
                    .filter(|b| !b.is_ascii_whitespace())
                    .copied()
                    .collect::<Vec<_>>(),
            )
            .map_err(|e| DataUrlError::Base64(e.to_string()))
    } else {
        percent_decode(data.as_bytes())
    }
}

fn percent_decode(input: &[u8]) -> Result<Vec<u8>, DataUrlError> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' {
            let hex = input.get(i + 1..i + 3).ok_or(DataUrlError::Percent(i))?;
            let text = std::str::from_utf8(hex).map_err(|_| DataUrlError::Percent(i))?;
            out.push(u8::from_str_radix(text, 16).map_err(|_| DataUrlError::Percent(i))?);
            i += 3;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(decode("data:,hello%20world").unwrap(), b"hello world");
        assert_eq!(decode("data:;base64,aGk=").unwrap(), b"hi");
        assert_eq!(
            decode("data:text/plain;charset=utf-8;base64,aGk%3D").unwrap(),
            b"hi"
        );
        assert_eq!(decode("data:,").unwrap(), b"");
        assert_eq!(decode("http://x"), Err(DataUrlError::NotDataUrl));
        assert_eq!(decode("data:,%4"), Err(DataUrlError::Percent(0)));
        assert!(matches!(
            decode("data:;base64,@@"),
            Err(DataUrlError::Base64(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn base64_round_trip(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let url = format!("data:;base64,{}", base64::engine::general_purpose::STANDARD.encode(&bytes));
            proptest::prop_assert_eq!(decode(&url).unwrap(), bytes);
        }

        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = decode(&format!("data:{text}"));
        }
    }
}
