//! The header file: a fixed prologue, the JSON manifest, the binary expert index and the embedded
//! files, under one checksum. See `docs/FORMAT.md` §2 for the byte layout.

use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

use crate::error::{FormatError, Place, Result};
use crate::index::{INDEX_ENTRY_LEN, IndexEntry, validate_index};
use crate::manifest::Manifest;

pub const MAGIC: [u8; 8] = *b"K3WASTE\0";
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 0;
/// Bytes of the fixed prologue; the manifest starts here.
pub const PROLOGUE_LEN: usize = 128;
/// Offset of the header checksum inside the prologue.
const CHECKSUM_AT: usize = 120;

/// A parsed and validated header.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: (u16, u16),
    pub manifest: Manifest,
    pub index: Vec<IndexEntry>,
    /// The blob section; `manifest.blobs` give offsets into it.
    pub blobs: Vec<u8>,
}

/// xxh3-64 of the header with its checksum field read as zero.
fn header_checksum(bytes: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(&bytes[..CHECKSUM_AT]);
    h.update(&[0u8; 8]);
    h.update(&bytes[CHECKSUM_AT + 8..]);
    h.digest()
}

/// Recomputes and stores the checksum of a header of at least `PROLOGUE_LEN` bytes (for tools
/// and tests that patch headers on purpose).
pub fn seal(bytes: &mut [u8]) {
    let sum = header_checksum(bytes);
    bytes[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    /// Serializes a header. Sections follow the prologue in order manifest, index, blobs, each
    /// starting on an 8-byte boundary.
    pub fn encode(manifest: &Manifest, index: &[IndexEntry], blobs: &[u8]) -> Vec<u8> {
        let json = serde_json::to_vec_pretty(manifest).expect("a manifest always serializes");
        let pad8 = |n: usize| n.next_multiple_of(8);
        let manifest_off = PROLOGUE_LEN;
        let index_off = pad8(manifest_off + json.len());
        let blobs_off = pad8(index_off + index.len() * INDEX_ENTRY_LEN);
        let mut out = Vec::with_capacity(blobs_off + blobs.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
        out.extend_from_slice(&VERSION_MINOR.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        for v in [manifest_off, json.len(), index_off, index.len() * INDEX_ENTRY_LEN, blobs_off, blobs.len()] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        out.resize(PROLOGUE_LEN, 0);
        out.extend_from_slice(&json);
        out.resize(index_off, 0);
        for e in index {
            e.encode(&mut out);
        }
        out.resize(blobs_off, 0);
        out.extend_from_slice(blobs);
        seal(&mut out);
        out
    }

    /// Parses and validates a header read from `path`. Never panics, whatever the bytes.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Header> {
        let p = || path.to_path_buf();
        if bytes.len() < PROLOGUE_LEN || bytes[..8] != MAGIC {
            return Err(FormatError::BadMagic {
                path: p(),
                found: bytes[..bytes.len().min(8)].to_vec(),
                expected: MAGIC.to_vec(),
            });
        }
        // The version comes before the checksum: a newer major version may checksum differently.
        let (major, minor) = (u16_at(bytes, 8), u16_at(bytes, 10));
        if major != VERSION_MAJOR {
            return Err(FormatError::UnsupportedVersion { path: p(), major, minor, supported: VERSION_MAJOR });
        }
        let (stored, computed) = (u64_at(bytes, CHECKSUM_AT), header_checksum(bytes));
        if stored != computed {
            return Err(FormatError::HeaderChecksum { path: p(), stored, computed });
        }
        let len = bytes.len() as u64;
        let section = |at: usize, what: &'static str| -> Result<&[u8]> {
            let (off, n) = (u64_at(bytes, at), u64_at(bytes, at + 8));
            match off.checked_add(n) {
                Some(end) if off >= PROLOGUE_LEN as u64 && end <= len => Ok(&bytes[off as usize..end as usize]),
                _ => Err(FormatError::OutOfBounds {
                    path: p(),
                    place: Place::Header,
                    what,
                    offset: off,
                    end: off.saturating_add(n),
                    limit: len,
                }),
            }
        };
        let json = section(16, "the header (manifest section)")?;
        let index_bytes = section(32, "the header (index section)")?;
        let blobs = section(48, "the header (blob section)")?;

        let manifest: Manifest =
            serde_json::from_slice(json).map_err(|e| FormatError::Manifest { path: p(), reason: e.to_string() })?;
        manifest.validate(path)?;
        if index_bytes.len() % INDEX_ENTRY_LEN != 0 {
            return Err(FormatError::Manifest {
                path: p(),
                reason: format!("index section of {} bytes is not a whole number of entries", index_bytes.len()),
            });
        }
        let index: Vec<IndexEntry> = index_bytes
            .chunks_exact(INDEX_ENTRY_LEN)
            .map(|c| IndexEntry::decode(c.try_into().expect("chunks_exact yields whole entries")))
            .collect();
        validate_index(path, &manifest, &index)?;
        for b in &manifest.blobs {
            if b.offset.checked_add(b.len).is_none_or(|e| e > blobs.len() as u64) {
                return Err(FormatError::OutOfBounds {
                    path: p(),
                    place: Place::Blob(b.name.clone()),
                    what: "the blob section",
                    offset: b.offset,
                    end: b.offset.saturating_add(b.len),
                    limit: blobs.len() as u64,
                });
            }
        }
        Ok(Header { version: (major, minor), manifest, index, blobs: blobs.to_vec() })
    }

    /// An embedded file's bytes, by name.
    pub fn blob(&self, name: &str) -> Option<&[u8]> {
        let b = self.manifest.blobs.iter().find(|b| b.name == name)?;
        Some(&self.blobs[b.offset as usize..(b.offset + b.len) as usize])
    }
}
