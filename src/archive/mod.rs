//! The archive `prune --archive FILE` writes and `replay --from FILE`
//! reads: JSON Lines, one object per pruned row, every column of the
//! table under its name in its JSON form (timestamps as RFC 3339 with an
//! offset, as PostgreSQL prints them), except the payload, whose key says
//! its type so that a replay sends the very bytes the relay sent:
//!
//! - `payload`: a jsonb payload, as its JSON value (jq reads it);
//! - `payload_json`: a json payload, its text exactly as stored (json
//!   keeps whitespace and key order, which a value would lose);
//! - `payload_text`: a text payload, as a string;
//! - `payload_base64`: a bytea payload, base64 (standard alphabet, padded).
//!
//! `FILE.gz` is gzip, `FILE.zst` zstd, anything else plain; `-` is stdout
//! (plain). Each batch prune deletes is one gzip member or zstd frame of
//! its own, synced before the batch's delete commits: a file cut short by
//! a crash still holds every row that was deleted, readable by zcat and
//! zstdcat, and its unfinished last member holds only rows still in the
//! table.
//!
//! `writer` creates and appends (prune), `reader` decompresses and splits
//! the lines, `record` turns a line back into the event the relay sent.

pub mod reader;
pub(crate) mod record;
pub(crate) mod writer;

use std::path::Path;

/// How an archive's bytes are compressed, by its name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    Plain,
    Gzip,
    Zstd,
}

impl Compression {
    pub(crate) fn of(path: &Path) -> Compression {
        match path.extension().and_then(|extension| extension.to_str()) {
            Some("gz") => Compression::Gzip,
            Some("zst") => Compression::Zstd,
            _ => Compression::Plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_chooses_the_compression() {
        assert_eq!(Compression::of(Path::new("a.jsonl.gz")), Compression::Gzip);
        assert_eq!(Compression::of(Path::new("a.zst")), Compression::Zstd);
        assert_eq!(Compression::of(Path::new("a.jsonl")), Compression::Plain);
        assert_eq!(Compression::of(Path::new("gz")), Compression::Plain);
    }
}
