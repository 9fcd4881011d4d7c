//! Gives this package's test binaries (which link the harness and libtorch for the contract
//! tests) an rpath to libtorch, as `backends/` and `harness/` do; the `attn-bot` binary links
//! no libtorch and gets none.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Some(dir) = std::env::var_os("LIBTORCH") {
        let dir = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.into());
        println!(
            "cargo:rustc-link-arg-tests=-Wl,-rpath,{}",
            dir.join("lib").display()
        );
    }
}
