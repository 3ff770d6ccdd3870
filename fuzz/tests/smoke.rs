//! The stable smoke run of the fuzz targets (no libFuzzer needed):
//!
//! ```text
//! cd fuzz && cargo test --release --no-default-features
//! ```
//!
//! Writes the seed corpora to `fuzz/corpus/<target>/` (what `cargo fuzz run` starts
//! from), then runs every target on every seed and on `MWS_FUZZ_SMOKE_ITERS`
//! (default 20000) deterministic mutations per target.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn seeds_and_mutations_keep_every_property() {
    let seeds = mws_fuzz::seeds(&root().join("../tests/fixtures/conformance"));
    let iters: usize = std::env::var("MWS_FUZZ_SMOKE_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(20000);
    for target in mws_fuzz::TARGETS {
        let mine: Vec<&Vec<u8>> = seeds.iter().filter(|(t, _, _)| *t == target).map(|(_, _, b)| b).collect();
        assert!(!mine.is_empty(), "no seeds for {target}");
        let dir = root().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (t, name, bytes) in &seeds {
            if *t == target {
                std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
            }
        }
        let t0 = std::time::Instant::now();
        for s in &mine {
            mws_fuzz::run(target, s);
        }
        let mut rng = mws_fuzz::Rng::new(0x5eed ^ target.len() as u64);
        let mut pool: Vec<Vec<u8>> = mine.iter().map(|s| s.to_vec()).collect();
        for i in 0..iters {
            let a = &pool[i % pool.len()];
            let b = &pool[(i * 7 + 3) % pool.len()];
            let m = mws_fuzz::mutate(a, b, &mut rng);
            mws_fuzz::run(target, &m);
            if i % 16 == 0 && pool.len() < 256 {
                pool.push(m); // mutate mutations too
            }
        }
        println!("{target}: {} seeds + {iters} mutations in {:.2} s", mine.len(), t0.elapsed().as_secs_f64());
    }
}
