//! `cargo xtask bench io`: the reader's throughput on expert-sized O_DIRECT reads next to a raw
//! io_uring O_DIRECT loop with the same read size and queue depth (the ceiling), interleaved,
//! medians of the repetitions.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use io_uring::{IoUring, opcode, types};
use k3_io::{BackendChoice, Priority, ReadRequest, Reader, ReaderOptions};
use serde_json::{Value, json};

use super::{median, time};

/// K3's expert record: 17,547,264 bytes of MXFP4 + the 64-byte header, padded to 4 KiB.
pub const K3_RECORD: usize = 17_551_360;

pub struct Options {
    pub file: Option<PathBuf>,
    pub file_bytes: u64,
    pub record: usize,
    pub queue_depth: usize,
    pub reads: usize,
    pub reps: usize,
    pub backend: BackendChoice,
}

/// Creates (once) a test file of non-zero bytes.
fn test_file(path: &Path, bytes: u64) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= bytes) {
        return Ok(());
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    eprintln!("writing a {:.1} GB test file at {} ...", bytes as f64 / 1e9, path.display());
    let mut f = std::fs::File::create(path)?;
    let chunk: Vec<u8> = (0..64u64 << 20).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// Record-aligned offsets in a scattered but repeatable order.
fn offsets(file_bytes: u64, record: usize, reads: usize, seed: u64) -> Vec<u64> {
    let records = (file_bytes / record as u64).max(1);
    let mut s = seed | 1;
    (0..reads)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % records) * record as u64
        })
        .collect()
}

/// The ceiling: a bare io_uring loop of O_DIRECT reads, `depth` in flight, into registered
/// buffers when the memlock limit allows (as the reader does), touched once up front.
struct Raw {
    file: std::fs::File,
    ring: IoUring,
    base: *mut u8,
    layout: Layout,
    record: usize,
    depth: usize,
    registered: bool,
}

impl Raw {
    fn new(path: &Path, record: usize, depth: usize) -> Result<Raw> {
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)?;
        let layout = Layout::from_size_align(record * depth, 4096)?;
        // SAFETY: non-zero size.
        let base = unsafe { alloc_zeroed(layout) };
        if base.is_null() {
            bail!("cannot allocate {} bytes", layout.size());
        }
        // SAFETY: the allocation is `layout.size()` bytes; touching every page now keeps page
        // faults out of the timed reads.
        unsafe { std::ptr::write_bytes(base, 1, layout.size()) };
        let ring = IoUring::new((depth as u32).next_power_of_two())?;
        let iov: Vec<libc::iovec> = (0..depth)
            .map(|i| libc::iovec { iov_base: base.wrapping_add(i * record).cast(), iov_len: record })
            .collect();
        // SAFETY: the iovecs describe the allocation, which outlives the ring (dropped first).
        let registered = unsafe { ring.submitter().register_buffers(&iov) }.is_ok();
        Ok(Raw { file, ring, base, layout, record, depth, registered })
    }

    fn read(&mut self, offs: &[u64]) -> f64 {
        let (record, depth) = (self.record, self.depth);
        let (mut next, mut done, mut inflight) = (0usize, 0usize, 0usize);
        let mut free: Vec<usize> = (0..depth).collect();
        time(|| {
            while done < offs.len() {
                while inflight < depth && next < offs.len() {
                    let slot = free.pop().expect("a free buffer per slot in flight");
                    // SAFETY: slot < depth keeps the pointer inside the allocation.
                    let ptr = unsafe { self.base.add(slot * record) };
                    let fd = types::Fd(self.file.as_raw_fd());
                    let e = if self.registered {
                        opcode::ReadFixed::new(fd, ptr, record as u32, slot as u16).offset(offs[next]).build()
                    } else {
                        opcode::Read::new(fd, ptr, record as u32).offset(offs[next]).build()
                    }
                    .user_data(slot as u64);
                    // SAFETY: the buffer is not touched until its completion is reaped below.
                    unsafe { self.ring.submission().push(&e).expect("queue sized to the depth") };
                    // Start each read at once (waiting to batch them delays the first ones).
                    self.ring.submit().expect("io_uring submit");
                    next += 1;
                    inflight += 1;
                }
                self.ring.submit_and_wait(1).expect("io_uring wait");
                for c in self.ring.completion() {
                    assert_eq!(c.result(), record as i32, "raw read failed or was short");
                    free.push(c.user_data() as usize);
                    inflight -= 1;
                    done += 1;
                }
            }
        })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; no read is in flight between calls.
        unsafe { dealloc(self.base, self.layout) };
    }
}

/// The ceiling from `fio` (an independent tool), when installed: random O_DIRECT reads of the same
/// size and depth through io_uring with registered buffers, over the same file; GB/s.
fn fio(path: &Path, record: usize, depth: usize, bytes: u64) -> Option<f64> {
    let out = std::process::Command::new("fio")
        .args([
            "--name=k3-ceiling",
            &format!("--filename={}", path.display()),
            "--direct=1",
            "--ioengine=io_uring",
            "--fixedbufs",
            "--rw=randread",
            &format!("--bs={record}"),
            &format!("--iodepth={depth}"),
            &format!("--io_size={bytes}"),
            "--output-format=terse",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // Terse format v3: field 7 is the read bandwidth in KiB/s.
    let text = String::from_utf8_lossy(&out.stdout);
    let kib: f64 = text.lines().next()?.split(';').nth(6)?.parse().ok()?;
    Some(kib * 1024.0 / 1e9)
}

/// The drive's ceiling alone, `o.reps` samples in GB/s (fio's, or the raw loop's without it): for
/// a benchmark that needs the bound but not the reader's own rates.
pub fn ceiling_samples(o: &Options) -> Result<Vec<f64>> {
    let path = o.file.clone().context("the ceiling is measured on a given file")?;
    let file_bytes = std::fs::metadata(&path).with_context(|| format!("{}", path.display()))?.len();
    let bytes = o.reads as u64 * o.record as u64;
    if fio(&path, o.record, o.queue_depth, o.record as u64 * 4).is_some() {
        return (0..o.reps)
            .map(|_| fio(&path, o.record, o.queue_depth, bytes).context("fio stopped working"))
            .collect();
    }
    eprintln!(
        "fio not found (apt-get install fio): the ceiling is this tool's own raw io_uring loop, which understates it"
    );
    let mut raw = Raw::new(&path, o.record, o.queue_depth)?;
    Ok((0..o.reps)
        .map(|rep| bytes as f64 / raw.read(&offsets(file_bytes, o.record, o.reads, 1 + rep as u64 * 7919)) / 1e9)
        .collect())
}

/// Seconds for the reader to read `offs`, `depth` at a time.
fn read_all(r: &mut Reader, f: k3_io::FileId, record: usize, offs: &[u64], depth: usize, verify: bool) -> f64 {
    let mut free: Vec<usize> = (0..depth).collect();
    time(|| {
        let (mut next, mut done) = (0, 0);
        while done < offs.len() {
            while next < offs.len() {
                let Some(slot) = free.pop() else { break };
                // With verification, each read carries a checksum to check (what is measured is
                // the cost of checking, so any value will do).
                let req = ReadRequest {
                    file: f,
                    offset: offs[next],
                    len: record,
                    slot,
                    xxh3: verify.then_some(0),
                    priority: Priority::Demand,
                    tag: next as u64,
                };
                r.submit(req).expect("valid request");
                next += 1;
            }
            let c = r.next_completion().expect("reads outstanding");
            match c.result {
                Ok(()) | Err(k3_io::IoError::Checksum { .. }) => {}
                Err(e) => panic!("{e}"),
            }
            free.push(c.slot);
            done += 1;
        }
    })
}

pub fn run(o: &Options, json_out: bool) -> Result<Value> {
    let path = o.file.clone().unwrap_or_else(|| PathBuf::from("bench-out/io-test.bin"));
    if o.file.is_none() {
        test_file(&path, o.file_bytes)?;
    }
    let file_bytes = std::fs::metadata(&path).with_context(|| format!("{}", path.display()))?.len();
    if file_bytes < o.record as u64 {
        bail!("{} is smaller than one record", path.display());
    }
    let mut raw = Raw::new(&path, o.record, o.queue_depth)?;
    let open = |verify| -> Result<(Reader, k3_io::FileId)> {
        let mut r = Reader::new(ReaderOptions {
            queue_depth: o.queue_depth,
            verify,
            backend: o.backend,
            ..ReaderOptions::new(o.record, o.queue_depth)
        })?;
        let f = r.open(&path)?;
        Ok((r, f))
    };
    let (mut plain_r, pf) = open(false)?;
    let (mut checked_r, cf) = open(true)?;
    let name = plain_r.backend().to_string();
    let raw_name = if raw.registered { "registered buffers" } else { "unregistered buffers" };
    let bytes = o.reads as f64 * o.record as f64;
    let (mut ceil, mut plain, mut checked) = (Vec::new(), Vec::new(), Vec::new());
    let use_fio = fio(&path, o.record, o.queue_depth, o.record as u64 * 4).is_some();
    if !use_fio {
        eprintln!(
            "fio not found (apt-get install fio): the reference is this tool's own raw io_uring loop, \
             which is not a ceiling (the reader can beat it)"
        );
    }
    let ceiling_source =
        if use_fio { "fio, io_uring, registered buffers".to_string() } else { format!("raw loop, {raw_name}") };
    // Each variant reads its own scattered records, and the order of the variants rotates from
    // one repetition to the next, so neither caching below the guest (a virtual disk's host page
    // cache) nor drift over time favours one of them.
    for rep in 0..o.reps {
        for v in 0..3 {
            let variant = (v + rep) % 3;
            let offs = offsets(file_bytes, o.record, o.reads, 1 + (rep * 3 + variant) as u64 * 7919);
            let secs = match variant {
                0 if use_fio => {
                    let g = fio(&path, o.record, o.queue_depth, bytes as u64).context("fio stopped working")?;
                    ceil.push(g);
                    continue;
                }
                0 => raw.read(&offs),
                1 => read_all(&mut plain_r, pf, o.record, &offs, o.queue_depth, false),
                _ => read_all(&mut checked_r, cf, o.record, &offs, o.queue_depth, true),
            };
            [&mut ceil, &mut plain, &mut checked][variant].push(bytes / secs / 1e9);
        }
    }
    if std::env::var_os("K3_BENCH_SAMPLES").is_some() {
        eprintln!("ceiling {ceil:.2?}\nreader {plain:.2?}\nchecked {checked:.2?}");
    }
    let (c, p, v) = (median(ceil), median(plain), median(checked));
    let report = json!({
        "file": path.display().to_string(), "file_bytes": file_bytes, "record_bytes": o.record,
        "queue_depth": o.queue_depth, "reads_per_rep": o.reads, "reps": o.reps, "backend": name,
        "ceiling_source": ceiling_source,
        "ceiling_gbps": c, "reader_gbps": p, "ratio": p / c,
        "reader_verified_gbps": v, "verified_ratio": v / c,
    });
    if !json_out {
        println!(
            "{} reads of {:.1} MB, queue depth {}, {} ({} reps, medians):",
            o.reads,
            o.record as f64 / 1e6,
            o.queue_depth,
            name,
            o.reps
        );
        let reference = if use_fio { "O_DIRECT ceiling (fio)" } else { "raw io_uring loop" };
        println!("  {reference:<30} {c:.3} GB/s  ({ceiling_source})");
        println!("  k3-io reader                   {p:.3} GB/s  ({:.1}% of the {reference})", p / c * 100.0);
        println!("  k3-io reader + xxh3 checks     {v:.3} GB/s  ({:.1}%)", v / c * 100.0);
    }
    Ok(report)
}
