//! Gives the shared library its SONAME (`libmooncake_weight_store.so.0`) on Linux.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmooncake_weight_store.so.0");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
