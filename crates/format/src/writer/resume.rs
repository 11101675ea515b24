//! Resuming an interrupted write: the journaled items whose bytes still check out are kept, the
//! files cut back to them.

use std::fs::OpenOptions as FsOpen;
use std::path::PathBuf;

use super::data_file::DataFile;
use super::{JOURNAL_VERSION, JournalLine, ModelWriter, WriterSpec, writer_err};
use crate::error::{FormatError, Result};
use crate::index::{IndexEntry, check_in_place};
use crate::lock::DirLock;
use crate::output::write_atomic;
use crate::{JOURNAL_FILE, TRUNK_FILE};

impl ModelWriter {
    pub(super) fn resume(dir: PathBuf, spec: WriterSpec, lock: DirLock) -> Result<Self> {
        let journal_path = dir.join(JOURNAL_FILE);
        let text = std::fs::read(&journal_path).map_err(|e| FormatError::io(&journal_path, e))?;
        // A line without its newline was torn by the interruption: it never counted.
        let complete = &text[..text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)];
        let mut lines = complete.split(|&b| b == b'\n').filter(|l| !l.is_empty());
        let bad_journal = |why: String| {
            writer_err(&dir, format!("{JOURNAL_FILE} is unreadable ({why}); remove the directory to start over"))
        };
        let first = lines.next().ok_or_else(|| bad_journal("empty".into()))?;
        match serde_json::from_slice(first).map_err(|e| bad_journal(e.to_string()))? {
            JournalLine::Spec { journal_version: JOURNAL_VERSION, spec: started } => {
                if started != spec {
                    // A spec that cannot be written as JSON (a directory named in bytes that are
                    // not UTF-8) is told apart without the field-by-field list.
                    let differ = match (serde_json::to_value(&started), serde_json::to_value(&spec)) {
                        (Ok(a), Ok(b)) => crate::spec_diff::what_the_user_changed(&a, &b),
                        _ => vec!["the settings differ".to_string()],
                    };
                    return Err(writer_err(
                        &dir,
                        format!(
                            "holds an interrupted conversion started with other settings ({}); to resume it, \
                             run the command again with the settings it was started with; to start over with \
                             these, remove the directory first",
                            differ.join("; ")
                        ),
                    ));
                }
            }
            _ => return Err(bad_journal("first line is not a supported spec".into())),
        }
        let trunk = DataFile::open(dir.join(TRUNK_FILE), false)?;
        let mut shards = Vec::new();
        for i in 0..usize::from(spec.shards) {
            shards.push(DataFile::open(Self::shard_path(&dir, &spec, i), false)?);
        }
        let journal = FsOpen::new().append(true).open(&journal_path).map_err(|e| FormatError::io(&journal_path, e))?;
        let mut w = Self::assemble(dir, spec, trunk, shards, journal, lock);

        // Keep the longest prefix of journaled items whose bytes still check out.
        let mut kept = vec![first.to_vec()];
        let mut trunk_end = 0u64;
        let mut shard_ends = vec![0u64; w.shards.len()];
        for line in lines {
            let Ok(item) = serde_json::from_slice::<JournalLine>(line) else { break };
            if !w.keeps(&item)? {
                break;
            }
            match item {
                JournalLine::Tensor(t) => {
                    trunk_end = trunk_end.max(t.offset + t.len);
                    w.tensor_names.insert(t.tensor.name.clone());
                    w.tensors.push(t);
                }
                JournalLine::Expert { shard, offset, length, phase: None, .. } => {
                    let end = &mut shard_ends[usize::from(shard)];
                    *end = (*end).max(offset + length);
                }
                // Read in place: nothing of ours to cut back.
                // A second spec is never kept (`keeps`): the prefix ends before it.
                JournalLine::Expert { phase: Some(_), .. } | JournalLine::Spec { .. } => {}
            }
            kept.push(line.to_vec());
        }
        w.resumed_items = kept.len() - 1;
        w.trunk.cut_to(trunk_end)?;
        for (s, end) in w.shards.iter_mut().zip(shard_ends) {
            s.cut_to(end)?;
        }
        w.trunk.sync()?;
        for s in &mut w.shards {
            s.sync()?;
        }
        // Rewrite the journal with exactly the kept lines, atomically.
        let mut body = kept.join(&b'\n');
        body.push(b'\n');
        write_atomic(&journal_path, &body)?;
        w.journal = FsOpen::new().append(true).open(&journal_path).map_err(|e| FormatError::io(&journal_path, e))?;
        Ok(w)
    }

    /// Whether a journaled item still checks out (its bytes hashed again, or a record read in
    /// place checked against its layout and checkpoint file); a kept record joins the index.
    fn keeps(&mut self, item: &JournalLine) -> Result<bool> {
        let w = self;
        Ok(match item {
            JournalLine::Tensor(t) => {
                t.offset.checked_add(t.len).is_some_and(|e| e <= w.trunk.len)
                    && !w.tensor_names.contains(&t.tensor.name)
                    && w.trunk.hash_range(t.offset, t.len)? == t.xxh3.0
            }
            &JournalLine::Expert { layer, expert, shard, layout, offset, length, xxh3, phase: None } => {
                let s = usize::from(shard);
                let ok = s < w.shards.len()
                    && w.expected_next_expert() == Some((layer, expert))
                    && offset.checked_add(length).is_some_and(|e| e <= w.shards[s].len)
                    && w.shards[s].hash_range(offset, length)? == xxh3.0;
                if ok {
                    let (phase, xxh3) = (None, xxh3.0);
                    w.index.push(IndexEntry { layer, expert, shard, layout, offset, length, xxh3, phase });
                }
                ok
            }
            // The checkpoint's bytes are not ours to re-read: the spec holds its files' identity.
            &JournalLine::Expert { layer, expert, shard, layout, offset, length, xxh3, phase: Some(phase) } => {
                let (phase, xxh3) = (Some(phase), xxh3.0);
                let e = IndexEntry { layer, expert, shard, layout, offset, length, xxh3, phase };
                let file = usize::from(shard).checked_sub(w.shards.len()).and_then(|f| w.spec.checkpoint_files.get(f));
                let l = w.spec.expert_layouts.get(usize::from(layout));
                let ok = w.expected_next_expert() == Some((layer, expert))
                    && matches!((file, l), (Some(f), Some(l)) if check_in_place(&w.dir, &e, f, l).is_ok());
                if ok {
                    w.index.push(e);
                }
                ok
            }
            JournalLine::Spec { .. } => false,
        })
    }
}
