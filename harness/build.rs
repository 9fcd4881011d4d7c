//! Gives this package's test and bench binaries an rpath to libtorch, so they run without
//! LD_LIBRARY_PATH (torch-sys links libtorch but sets no rpath).
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_SPYRE").is_none() {
        return;
    }
    if let Some(dir) = std::env::var_os("LIBTORCH") {
        let dir = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.into());
        println!(
            "cargo:rustc-link-arg=-Wl,-rpath,{}",
            dir.join("lib").display()
        );
    }
}
