//! The one build script of every package whose binaries, tests or benches link libtorch
//! (through tch): it gives them an rpath to `$LIBTORCH/lib`, so they run without
//! LD_LIBRARY_PATH (torch-sys links libtorch but sets no rpath). An rpath on a binary that
//! links no libtorch is inert, so the script does not ask which ones do.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Some(dir) = std::env::var_os("LIBTORCH") {
        let dir = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.into());
        println!(
            "cargo:rustc-link-arg=-Wl,-rpath,{}",
            dir.join("lib").display()
        );
    }
}
