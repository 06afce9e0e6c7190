//! `data:` URLs (RFC 2397) as Ignition writes file contents: `data:[<mediatype>][;base64],<data>`
//! with the data percent-encoded unless base64.
//!
//! Decoded by the `data-url` crate (servo's rust-url project), which implements the WHATWG
//! Fetch standard's data URL processor, the algorithm browsers share for RFC 2397:
//! - a `%` not followed by two hex digits is kept literally (`%+f` stays the three bytes
//!   `%+f`; the hand-written decoder this replaces read it as the byte 0x0f);
//! - `;base64` counts only as the last parameter of the media type, as RFC 2397's grammar
//!   has it, and the base64 is "forgiving": ASCII whitespace is ignored, padding optional;
//! - tabs and newlines inside the URL are ignored, as a URL parser does.
//!
//! One rule is ours: a `#` in the data is refused rather than cut off as a URL fragment, so a
//! config whose writer forgot to escape it fails with a clear error instead of writing a
//! truncated file.

/// Errors decoding a data URL.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataUrlError {
    /// Not `data:...`.
    #[error("expected a data: URL (data:[<mediatype>][;base64],<data>)")]
    NotDataUrl,
    /// No comma between the media type and the data.
    #[error(
        "data: URL without the comma before the data (expected data:[<mediatype>][;base64],<data>)"
    )]
    NoComma,
    /// A `#` in the data.
    #[error(
        "data: URL has a '#' at byte {0}: write it %23 in the data (a URL fragment is not data)"
    )]
    Fragment(usize),
    /// Bad base64.
    #[error("invalid base64 in data: URL: {0}")]
    Base64(String),
}

/// A decoded data URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataUrl {
    /// The media type with its parameters, `text/plain;charset=US-ASCII` when the URL
    /// names none (RFC 2397 §2).
    pub media_type: String,
    /// The decoded data.
    pub data: Vec<u8>,
}

/// Decodes a data URL to its media type and bytes.
pub fn parse(url: &str) -> Result<DataUrl, DataUrlError> {
    let parsed = data_url::DataUrl::process(url).map_err(|e| match e {
        data_url::DataUrlError::NotADataUrl => DataUrlError::NotDataUrl,
        data_url::DataUrlError::NoComma => DataUrlError::NoComma,
    })?;
    let (data, fragment) = parsed
        .decode_to_vec()
        .map_err(|e| DataUrlError::Base64(e.to_string()))?;
    if fragment.is_some() {
        // The processor only reports a fragment after the comma, so the first '#' is it.
        return Err(DataUrlError::Fragment(url.find('#').unwrap_or(0)));
    }
    Ok(DataUrl {
        media_type: parsed.mime_type().to_string(),
        data,
    })
}

/// Decodes a data URL to its bytes.
pub fn decode(url: &str) -> Result<Vec<u8>, DataUrlError> {
    parse(url).map(|d| d.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    #[test]
    fn rfc2397_examples() {
        // RFC 2397 §4.
        assert_eq!(decode("data:,A%20brief%20note").unwrap(), b"A brief note");
        let greek = parse("data:text/plain;charset=iso-8859-7,%be%fg%be").unwrap();
        assert_eq!(
            greek.data, b"\xbe%fg\xbe",
            "an invalid escape is kept as written"
        );
        assert_eq!(greek.media_type, "text/plain;charset=iso-8859-7");
        let gif = parse("data:image/gif;base64,R0lGODdhMAAwAPAAAAAAAP///ywAAAAAMAAw").unwrap();
        assert_eq!(gif.media_type, "image/gif");
        assert!(gif.data.starts_with(b"GIF87a0\x000\x00"));
    }

    #[test]
    fn percent_escapes() {
        assert_eq!(decode("data:,hello%20world").unwrap(), b"hello world");
        assert_eq!(decode("data:,master%0A").unwrap(), b"master\n");
        assert_eq!(decode("data:,%ff%FE%00").unwrap(), b"\xff\xfe\x00");
        // Not two hex digits: kept literally (u8::from_str_radix read `+f` as 15).
        assert_eq!(decode("data:,%+f").unwrap(), b"%+f");
        assert_eq!(decode("data:,%-1x").unwrap(), b"%-1x");
        assert_eq!(decode("data:,%4").unwrap(), b"%4");
        assert_eq!(decode("data:,100%").unwrap(), b"100%");
        assert_eq!(decode("data:,").unwrap(), b"");
        // A URL parser drops tabs and newlines; escaped ones are data.
        assert_eq!(decode("data:,a\nb%0Ac").unwrap(), b"ab\nc");
    }

    #[test]
    fn base64() {
        assert_eq!(decode("data:;base64,aGk=").unwrap(), b"hi");
        // Base64 data may itself be percent-encoded, spaced out, or unpadded.
        assert_eq!(decode("data:;base64,aGk%3D").unwrap(), b"hi");
        assert_eq!(decode("data:;base64,a G k =").unwrap(), b"hi");
        assert_eq!(decode("data:;base64,aGk").unwrap(), b"hi");
        assert_eq!(decode("data:;BASE64,aGk=").unwrap(), b"hi");
        assert_eq!(
            decode("data:text/plain;charset=utf-8;base64,aGk%3D").unwrap(),
            b"hi"
        );
        let err = decode("data:;base64,@@").unwrap_err();
        assert!(matches!(err, DataUrlError::Base64(_)), "{err:?}");
        assert!(
            err.to_string().contains("symbol with codepoint 64"),
            "{err}"
        );
        let err = decode("data:;base64,aGk=x").unwrap_err();
        assert!(err.to_string().starts_with("invalid base64"), "{err}");
    }

    #[test]
    fn media_type() {
        let d = parse("data:,x").unwrap();
        assert_eq!(d.media_type, "text/plain;charset=US-ASCII");
        let d = parse("data:;charset=utf-8,x").unwrap();
        assert_eq!(d.media_type, "text/plain;charset=utf-8");
        let d = parse("data:application/json,%7B%7D").unwrap();
        assert_eq!(
            (d.media_type.as_str(), d.data.as_slice()),
            ("application/json", &b"{}"[..])
        );
        // `;base64` must be the last parameter (RFC 2397 grammar): here it is not.
        let d = parse("data:text/plain;base64;charset=utf-8,aGk=").unwrap();
        assert_eq!(d.data, b"aGk=");
        // An unparsable media type falls back to the default, the data still decodes.
        let d = parse("data:not a type,x").unwrap();
        assert_eq!(
            (d.media_type.as_str(), d.data.as_slice()),
            ("text/plain;charset=US-ASCII", &b"x"[..])
        );
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert_eq!(decode("http://x"), Err(DataUrlError::NotDataUrl));
        assert_eq!(decode("dat:,x"), Err(DataUrlError::NotDataUrl));
        assert_eq!(decode("data:text/plain"), Err(DataUrlError::NoComma));
        assert_eq!(decode("data:text/plain#,x"), Err(DataUrlError::NoComma));
        assert_eq!(decode("data:,a#b"), Err(DataUrlError::Fragment(7)));
        assert_eq!(
            decode("data:;base64,aGk=#"),
            Err(DataUrlError::Fragment(17))
        );
        assert!(
            DataUrlError::Fragment(8).to_string().contains("%23"),
            "the fix is named"
        );
        assert!(DataUrlError::NoComma.to_string().contains("comma"));
    }

    /// RFC 3986 percent-encoding of every byte but unreserved ones, as `keelson` renders
    /// file contents.
    fn percent_encode(data: &[u8]) -> String {
        data.iter()
            .map(|&b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn base64_round_trip(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let url = format!("data:;base64,{}", base64::engine::general_purpose::STANDARD.encode(&bytes));
            proptest::prop_assert_eq!(decode(&url).unwrap(), bytes);
        }

        #[test]
        fn percent_round_trip(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let url = format!("data:,{}", percent_encode(&bytes));
            proptest::prop_assert_eq!(decode(&url).unwrap(), bytes);
        }

        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = decode(&format!("data:{text}"));
        }
    }
}
