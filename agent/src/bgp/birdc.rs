//! BIRD's control socket, spoken directly (what `birdc show protocols` does), so the agent
//! can say per session whether it is established without shipping `birdc`.
//!
//! The protocol is line text: each reply line starts with a 4-digit code and `-` (more
//! lines follow) or ` ` (the last line of the reply when the code is `0000`); a line that
//! starts with a space continues the previous code. Codes 8xxx/9xxx are errors. The parser
//! is pure and never panics (property-tested); the client reads at most
//! [`MAX_REPLY`] bytes and gives up after a timeout.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The longest reply the client reads (a few lines per protocol; a node has a handful).
pub const MAX_REPLY: usize = 64 * 1024;

/// One row of `show protocols`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Protocol {
    /// Protocol instance name (`peer_10_1_0_1`).
    pub name: String,
    /// Kind (`BGP`, `Kernel`, `BFD`...).
    pub proto: String,
    /// `up`, `down`, `start`...
    pub state: String,
    /// The rest: for BGP the session state (`Established`, `Active`, `Connect`...) and
    /// the last error.
    pub info: String,
}

impl Protocol {
    /// Whether this is a BGP session that is up.
    pub fn established(&self) -> bool {
        self.proto == "BGP" && self.state == "up" && self.info.starts_with("Established")
    }
}

/// Errors talking to BIRD.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BirdcError {
    /// Connecting, reading or writing the socket failed.
    #[error("BIRD control socket {path}: {source}")]
    Io {
        /// The socket.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// BIRD did not answer in time.
    #[error("BIRD control socket {0}: no answer")]
    Timeout(String),
    /// BIRD answered with an error code or something that is not its protocol.
    #[error("BIRD control socket {path}: {what}")]
    Reply {
        /// The socket.
        path: String,
        /// What was wrong.
        what: String,
    },
}

/// Splits a reply line into its code and text; `None` for a continuation line.
fn code_of(line: &str) -> Option<(u16, char, &str)> {
    let b = line.as_bytes();
    if b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && (b[4] == b'-' || b[4] == b' ') {
        let code = line[..4].parse().ok()?;
        return Some((code, b[4] as char, &line[5..]));
    }
    None
}

/// Parses the lines of a `show protocols` reply (the text after the greeting).
/// Errors name the offending line.
pub fn parse_protocols(reply: &str) -> Result<Vec<Protocol>, String> {
    let mut out = Vec::new();
    let mut code = 0u16;
    for line in reply.lines() {
        let text = match code_of(line) {
            Some((c, sep, text)) => {
                code = c;
                if c == 0 && sep == ' ' {
                    break;
                }
                if c >= 8000 {
                    return Err(format!("BIRD error {c}: {}", text.trim()));
                }
                text
            }
            None if line.starts_with(' ') => &line[1..],
            None if line.is_empty() => continue,
            None => return Err(format!("not BIRD's reply format: {line:?}")),
        };
        // 1002: a protocol row (2002 is the header).
        if code != 1002 {
            continue;
        }
        let mut words = text.split_whitespace();
        let (Some(name), Some(proto), Some(_table), Some(state)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return Err(format!("short protocol row: {line:?}"));
        };
        let _since = words.next();
        out.push(Protocol {
            name: name.into(),
            proto: proto.into(),
            state: state.into(),
            info: words.collect::<Vec<_>>().join(" "),
        });
    }
    Ok(out)
}

/// Asks the BIRD at `socket` for `show protocols`.
pub async fn show_protocols(socket: &Path, timeout: Duration) -> Result<Vec<Protocol>, BirdcError> {
    let path = socket.display().to_string();
    let io = |source| BirdcError::Io {
        path: path.clone(),
        source,
    };
    let exchange = async {
        let stream = tokio::net::UnixStream::connect(socket).await.map_err(io)?;
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::new(read).take(MAX_REPLY as u64);
        let mut greeting = String::new();
        reader.read_line(&mut greeting).await.map_err(io)?;
        if !greeting.starts_with("0001 ") {
            return Err(BirdcError::Reply {
                path: path.clone(),
                what: format!("unexpected greeting {:?}", greeting.trim_end()),
            });
        }
        write.write_all(b"show protocols\n").await.map_err(io)?;
        let mut reply = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.map_err(io)? == 0 {
                break;
            }
            let done = matches!(code_of(&line), Some((c, ' ', _)) if c == 0 || c >= 8000);
            reply.push_str(&line);
            if done {
                break;
            }
        }
        parse_protocols(&reply).map_err(|what| BirdcError::Reply {
            path: path.clone(),
            what,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| BirdcError::Timeout(socket.display().to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What BIRD 2.0.12 answered in a namespace (one session down, one up).
    const REPLY: &str = "2002-Name       Proto      Table      State  Since         Info\n\
1002-device1    Device     ---        up     15:45:51.842  \n \
keelson_table_v4 Kernel     kt4        up     15:45:51.842  \n \
peer_10_1_0_1 BGP        ---        down   15:45:52.017  Error: Invalid next hop\n \
peer_10_2_0_1 BGP        ---        up     15:45:53.017  Established   \n\
0000 \n";

    #[test]
    fn parses_what_bird_answers() {
        let p = parse_protocols(REPLY).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[1].name, "keelson_table_v4");
        assert_eq!(p[1].proto, "Kernel");
        assert_eq!(p[2].state, "down");
        assert_eq!(p[2].info, "Error: Invalid next hop");
        assert!(!p[2].established());
        assert!(p[3].established());
    }

    #[test]
    fn errors_are_errors() {
        let e = parse_protocols("9001 Syntax error\n").unwrap_err();
        assert!(e.contains("9001"), "{e}");
        assert!(parse_protocols("garbage\n").is_err());
        assert!(parse_protocols("1002-x\n").is_err());
        assert_eq!(parse_protocols("0000 \n").unwrap(), vec![]);
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = parse_protocols(&text);
        }

        #[test]
        fn never_panics_on_reply_shaped_lines(
            lines in proptest::collection::vec(("[0-9]{4}", "[- ]", "[ -~]{0,40}"), 0..20)
        ) {
            let text: String = lines.iter().map(|(c, s, t)| format!("{c}{s}{t}\n")).collect();
            let _ = parse_protocols(&text);
        }
    }
}
