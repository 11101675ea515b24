//! An interrupted write resumes to exactly the bytes of an uninterrupted one; nothing a user owns
//! is overwritten.

mod common;

use std::path::Path;

use common::{Plan, build, plan, write, writer};
use k3_format::{JOURNAL_FILE, Model, ModelWriter, Opened, TRUNK_FILE};

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

fn reference(p: &Plan) -> (tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let d = tempfile::tempdir().unwrap();
    build(d.path(), p);
    let f = files(d.path());
    (d, f)
}

fn items(p: &Plan) -> usize {
    p.tensors.len() + p.experts.len()
}

#[test]
fn resumed_at_every_point_gives_identical_bytes() {
    let p = plan(3, 2, 4096, 21);
    let (_r, want) = reference(&p);
    for stop in 0..items(&p) {
        let d = tempfile::tempdir().unwrap();
        assert!(write(writer(d.path(), &p.spec), &p, Some(stop)).is_none());
        let w = writer(d.path(), &p.spec);
        assert_eq!(w.resumed_items(), stop);
        write(w, &p, None).unwrap();
        assert_eq!(files(d.path()), want, "stopped after {stop} items");
    }
}

#[test]
fn unjournaled_data_is_cut_and_rewritten() {
    let p = plan(3, 1, 4096, 22);
    let (_r, want) = reference(&p);
    let d = tempfile::tempdir().unwrap();
    let mut w = writer(d.path(), &p.spec);
    w.set_sync_every(u64::MAX);
    for (name, enc, shape, parts) in &p.tensors[..3] {
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        w.write_tensor(name, enc.clone(), shape, &refs).unwrap();
    }
    drop(w); // killed before the journal learned of these tensors
    assert!(std::fs::metadata(d.path().join(TRUNK_FILE)).unwrap().len() > 0);
    let w = writer(d.path(), &p.spec);
    assert_eq!(w.resumed_items(), 0);
    write(w, &p, None).unwrap();
    assert_eq!(files(d.path()), want);
}

#[test]
fn torn_journal_line_and_damaged_record_are_dropped() {
    let p = plan(3, 1, 4096, 23);
    let (_r, want) = reference(&p);
    let d = tempfile::tempdir().unwrap();
    let stop = p.tensors.len() + 4;
    write(writer(d.path(), &p.spec), &p, Some(stop));
    // Damage the last journaled record, then leave a half-written journal line behind it.
    let m_shard = d.path().join(k3_format::shard_file_name(0));
    let mut bytes = std::fs::read(&m_shard).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0xff;
    std::fs::write(&m_shard, bytes).unwrap();
    let mut j = std::fs::OpenOptions::new().append(true).open(d.path().join(JOURNAL_FILE)).unwrap();
    std::io::Write::write_all(&mut j, b"{\"t\":\"expert\",\"layer\":2,\"exp").unwrap();
    let w = writer(d.path(), &p.spec);
    assert_eq!(w.resumed_items(), stop - 1);
    write(w, &p, None).unwrap();
    assert_eq!(files(d.path()), want);
    assert!(Model::open(d.path()).unwrap().verify(&mut |_| {}).is_empty());
}

#[test]
fn a_finished_model_is_reported_complete_and_left_alone() {
    let p = plan(2, 1, 4096, 24);
    let (r, want) = reference(&p);
    assert!(matches!(ModelWriter::open(r.path(), p.spec.clone()).unwrap(), Opened::Complete));
    let mut other = p.spec.clone();
    other.provenance = serde_json::json!({"source": "something else"});
    let msg = ModelWriter::open(r.path(), other).unwrap_err().to_string();
    assert!(msg.contains("refusing to overwrite"), "{msg}");
    assert_eq!(files(r.path()), want);
}

#[test]
fn a_directory_with_other_files_is_refused_untouched() {
    let p = plan(2, 1, 4096, 25);
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("notes.txt"), b"mine").unwrap();
    let msg = ModelWriter::open(d.path(), p.spec.clone()).unwrap_err().to_string();
    assert!(msg.contains("notes.txt") && msg.contains("refusing"), "{msg}");
    assert_eq!(files(d.path()), vec![("notes.txt".to_string(), b"mine".to_vec())]);
}

#[test]
fn resuming_with_other_options_is_refused() {
    let p = plan(2, 1, 4096, 26);
    let d = tempfile::tempdir().unwrap();
    write(writer(d.path(), &p.spec), &p, Some(3));
    let before = files(d.path());
    let mut other = p.spec.clone();
    other.encodings.insert("experts".into(), "vq3".into());
    let msg = ModelWriter::open(d.path(), other).unwrap_err().to_string();
    assert!(msg.contains("encodings") && msg.contains("other settings"), "{msg}");
    assert_eq!(files(d.path()), before);
}

#[test]
fn writer_refuses_out_of_order_and_incomplete_models() {
    let p = plan(3, 1, 4096, 27);
    let d = tempfile::tempdir().unwrap();
    let mut w = writer(d.path(), &p.spec);
    let (_, _, layout, parts) = &p.experts[1];
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let msg = w.write_expert(1, 1, *layout, &refs).unwrap_err().to_string();
    assert!(msg.contains("out of order"), "{msg}");
    let msg = w.write_expert(1, 0, *layout, &refs[..1]).unwrap_err().to_string();
    assert!(msg.contains("parts"), "{msg}");
    let msg = w.finish(&[]).unwrap_err().to_string();
    assert!(msg.contains("layer 1, expert 0"), "{msg}");
}
