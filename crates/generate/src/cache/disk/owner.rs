//! The names of a store's files, keyed: a file is named by a keyed hash (SipHash-2-4 under a
//! 128-bit key made at random once per directory, kept in it 0600) of its scope and of its
//! tokens. The scope is the server's hash of an API key, fast and unsalted: written as it is, a
//! file name would let whoever sees it (a listing, a log line) test guesses of the key offline,
//! and the tokens' hash guesses of a conversation. Under a secret key a name tells nothing
//! without the key file, and whoever can read the key file can read the states themselves.
//! SipHash is a keyed pseudo-random function made for short inputs: a slow hash is not needed
//! when the salt is secret. The key is the directory's, so names (and the files' owners) are
//! the same after a restart, and the CLI and a server sharing a directory name alike.

use std::hash::Hasher;
use std::io::Read;
use std::path::Path;

use k3_io::whole::{is_mine, open_regular};

use super::files::{KEY_FILE, write_private};

const KEY_BYTES: usize = 16;

/// A directory's naming key.
#[derive(Clone, Copy)]
pub struct NameKey([u64; 2]);

impl std::fmt::Debug for NameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NameKey(..)")
    }
}

impl NameKey {
    /// `dir`'s key, made (random, 0600) if it has none. A key file that is not a regular file
    /// of this user's of 16 bytes is an error saying so: it is not replaced, since the names
    /// of the files already there depend on it.
    pub fn of_dir(dir: &Path) -> Result<NameKey, String> {
        let path = dir.join(KEY_FILE);
        let read = |path: &Path| -> Result<[u8; KEY_BYTES], String> {
            let (mut file, meta) = open_regular(path).map_err(|e| e.to_string())?;
            if !is_mine(&meta) || meta.len() != KEY_BYTES as u64 {
                return Err(format!("{}: not a {KEY_BYTES}-byte file of this user's; remove it", path.display()));
            }
            let mut key = [0u8; KEY_BYTES];
            file.read_exact(&mut key).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(key)
        };
        let key = match std::fs::symlink_metadata(&path) {
            Ok(_) => read(&path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; KEY_BYTES];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| f.read_exact(&mut key))
                    .map_err(|e| format!("/dev/urandom: {e}"))?;
                write_private(&path, &key, true).map_err(|e| format!("{}: {e}", path.display()))?;
                // Another process may have made one first: what is there now is the key.
                read(&path)?
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let half = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        Ok(NameKey([half(&key[..8]), half(&key[8..])]))
    }

    /// The keyed hash of `bytes`.
    pub fn hash(&self, bytes: &[u8]) -> u64 {
        #[allow(deprecated)] // std's SipHash-2-4, pinned by the reference vector in the tests
        let mut h = std::hash::SipHasher::new_with_keys(self.0[0], self.0[1]);
        h.write(bytes);
        h.finish()
    }

    /// The name part standing for `scope`.
    pub fn owner(&self, scope: u64) -> u64 {
        self.hash(&scope.to_le_bytes())
    }

    /// The name part standing for the token ids `ids`.
    pub fn tokens(&self, ids: &[u32]) -> u64 {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        self.hash(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SipHash-2-4's reference vectors (the paper's appendix and vectors.h): key 00..0f, messages
    /// of 0 and 15 bytes 00, 01, ...
    #[test]
    fn the_hash_is_siphash_2_4() {
        let key = NameKey([0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908]);
        assert_eq!(key.hash(&[]), 0x726f_db47_dd0e_0e31);
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(key.hash(&msg), 0xa129_ca61_49be_45e5);
    }
}
