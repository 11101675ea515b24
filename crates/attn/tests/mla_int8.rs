//! Attention over an int8 MLA cache in integers (`mla::int8`) against a plain f64 softmax over
//! the cache's own rounded rows: what it adds to the cache's rounding is the query's and the
//! weights' rounding, and nothing else; on a pool, the same bits as alone.

mod exact;

use exact::{attend_f64, bits, rand, rel};
use k3_attn::mla::attend_cache;
use k3_attn::{KvCacheType, MlaCache};

/// An int8 row as the cache format defines it: `round(x / s)`, `s = max|x| / 127`, times `s`.
fn rounded(row: &[f32]) -> Vec<f64> {
    let s = row.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
    row.iter().map(|x| f64::from((x / s).round().clamp(-127.0, 127.0)) * f64::from(s)).collect()
}

/// Tolerance: the query rounds each value by up to half of its head's step (max / 254) and each
/// block's weights by up to max / 254; over scores of spread ~3 (a peaked softmax) the measured
/// relative error is 7.1e-3 (K3's widths) and 6.5e-3 (a small model's), 5.9e-3 of it the
/// query's (measured with the weighted sum in f32); 1e-2 still fails a weight whose row step is
/// dropped (measured 1.3e2), a lost block or a misread step (~1e-1).
#[test]
fn int8_attention_is_the_softmax_over_the_rounded_rows() {
    for (h, l, r, len) in [(8, 512, 64, 2 * 2048 + 45), (4, 64, 16, 1000)] {
        // Queries that spread the scores ~3 (a peaked softmax, as trained heads often are).
        let (qabs, qext) = (rand(h * l, 41, 5.0), rand(h * r, 42, 5.0));
        let (c, kext) = (rand(len * l, 43, 1.0), rand(len * r, 44, 1.0));
        let scale = 1.0 / ((l / 4 + r) as f32).sqrt();
        let mut cache = MlaCache::new(KvCacheType::Int8, l, r);
        for t in 0..len {
            cache.append(&c[t * l..(t + 1) * l], &kext[t * r..(t + 1) * r]).unwrap();
        }
        let rows = |x: &[f32], d: usize| x.chunks(d).map(rounded).collect::<Vec<_>>();
        let want = attend_f64(&qabs, &qext, &rows(&c, l), &rows(&kext, r), (l, r), scale);
        let run = |threads: usize, parallel: bool| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut lat = vec![0f32; h * l];
            pool.install(|| attend_cache(&qabs, &qext, &cache, len, scale, parallel, &mut lat)).unwrap();
            lat
        };
        let alone = run(1, false);
        let e = rel(&alone, &want);
        eprintln!("heads {h}, latent {l}: relative error {e:.2e}");
        assert!(e < 1e-2 && e > 1e-6, "heads {h}, latent {l}: relative error {e}");
        for threads in [2, 3, 8] {
            assert_eq!(bits(&run(threads, true)), bits(&alone), "{threads} threads");
        }
    }
}

/// A cache refuses a row of the wrong width, and attention queries, outputs or spans that do not
/// fit it, naming which.
#[test]
fn an_int8_cache_and_its_attention_refuse_what_does_not_fit() {
    let mut cache = MlaCache::new(KvCacheType::Int8, 8, 2);
    let err = cache.append(&[0.0; 7], &[0.0; 2]).unwrap_err().to_string();
    assert!(err.contains("latent") && err.contains('7') && err.contains('8'), "{err}");
    assert_eq!(cache.len(), 0);
    cache.append(&[0.5; 8], &[0.25; 2]).unwrap();
    // Attention refuses queries, outputs and spans that do not fit the cache.
    let mut lat = [0f32; 16];
    for (qabs, qext, len, what) in [
        (&[0.1f32; 15][..], &[0.1f32; 4][..], 1, "absorbed queries"),
        (&[0.1; 16], &[0.1; 3], 1, "shared-key queries"),
        (&[0.1; 16], &[0.1; 4], 2, "attended positions"),
        (&[0.1; 16], &[0.1; 4], 0, "attended positions"),
        (&[], &[], 1, "absorbed queries"),
    ] {
        let err = attend_cache(qabs, qext, &cache, len, 1.0, false, &mut lat).unwrap_err().to_string();
        assert!(err.contains(what), "{what}: {err}");
    }
    let err = attend_cache(&[0.1; 16], &[0.1; 4], &cache, 1, 1.0, false, &mut lat[..8]).unwrap_err().to_string();
    assert!(err.contains("output latents"), "{err}");
    attend_cache(&[0.1; 16], &[0.1; 4], &cache, 1, 1.0, false, &mut lat).unwrap();
    // One position: every head's output is that position's rounded latent (0.5 exactly).
    assert!(lat.iter().all(|v| (*v - 0.5).abs() < 1e-6), "{lat:?}");
}
