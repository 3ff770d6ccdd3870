//! The README's Rust quick start (`examples/quickstart.rs`, the same text as the README
//! block, checked by `scripts/check_doc_examples.py`) runs under `cargo test`.

#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

#[test]
fn readme_rust_quick_start_runs() {
    quickstart::main().expect("the README's Rust quick start");
}
