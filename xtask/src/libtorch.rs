//! Assembles a CPU-only libtorch for tch from PyPI wheels (the only registry reachable, and
//! the host tch's own download feature uses is not).
//!
//! The `torch` wheel is a CUDA build, but its CPU library stands alone once it finds
//! `libcudart`/`libcupti` (two small wheels). Its `libtorch.so` would pull in the huge CUDA
//! library, so it is replaced by an empty stand-in that depends on the CPU libraries; tch
//! links `-ltorch` and gets everything it needs through it.
//!
//! The result is cached outside the repo and installed atomically: everything is built in a
//! temporary directory next to the cache entry and renamed into place only when verified, so
//! an interrupted run leaves nothing half-made. `.libtorch` in the repo is a symlink to it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const VERSION: &str = "2.13.0";

/// Pinned wheels with their sha256, so a download is verified before use.
const WHEELS: &[(&str, &str)] = &[
    (
        "torch==2.13.0",
        "60fcdcb2f3876e21146cb4524ef06397d727ca9ad5f020818547e25075fe3cb7",
    ),
    (
        "nvidia-cuda-runtime==13.0.96",
        "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    ),
    (
        "nvidia-cuda-cupti==13.0.85",
        "4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8",
    ),
];

/// Files taken from the wheels into `lib/` (besides `torch/include/`).
const LIBS: &[&str] = &[
    "torch/lib/libtorch_cpu.so",
    "torch/lib/libc10.so",
    "torch/lib/libgomp.so.1",
    "nvidia/cu13/lib/libcudart.so.13",
    "nvidia/cu13/lib/libcupti.so.13",
];

pub fn repo_root() -> PathBuf {
    // xtask lives in <root>/xtask.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

/// Where set-up keeps what it downloads and builds (libtorch, the Python environment).
pub fn cache_root() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("ATTN_DIFF_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("attn-diff"));
    }
    let home = std::env::var_os("HOME")
        .ok_or("neither ATTN_DIFF_CACHE, XDG_CACHE_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache").join("attn-diff"))
}

/// A complete install has the marker, the headers and every library.
fn is_complete(dir: &Path) -> bool {
    fs::read_to_string(dir.join("build-version")).is_ok_and(|v| v.trim() == VERSION)
        && dir
            .join("include/torch/csrc/api/include/torch/torch.h")
            .is_file()
        && dir.join("lib/libtorch.so").is_file()
        && LIBS.iter().all(|l| {
            dir.join("lib")
                .join(Path::new(l).file_name().unwrap())
                .is_file()
        })
}

/// Run `cmd`; `what` names it in the error.
pub fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: cannot start {:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

fn require_tools() -> Result<(), String> {
    let ok = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok("python3", &["--version"]) {
        return Err("python3 is required to download libtorch from PyPI; install it (Debian: apt-get install python3)".into());
    }
    if !ok("python3", &["-m", "pip", "--version"]) {
        return Err("pip is required to download libtorch from PyPI; install it (Debian: apt-get install python3-pip)".into());
    }
    if !ok("cc", &["--version"]) {
        return Err("a C compiler (`cc`) is required to build the libtorch stand-in; install it (Debian: apt-get install gcc)".into());
    }
    if !(cfg!(target_os = "linux") && cfg!(target_arch = "x86_64")) {
        return Err("automatic libtorch set-up supports linux x86_64 only; elsewhere point LIBTORCH at a libtorch 2.13.0".into());
    }
    Ok(())
}

/// Download the pinned wheels into `wheels` (reused between runs), verifying hashes.
fn download(wheels: &Path, work: &Path) -> Result<(), String> {
    fs::create_dir_all(wheels).map_err(|e| format!("cannot create {}: {e}", wheels.display()))?;
    let req = work.join("requirements.txt");
    let text: String = WHEELS
        .iter()
        .map(|(spec, sha)| format!("{spec} --hash=sha256:{sha}\n"))
        .collect();
    fs::write(&req, text).map_err(|e| format!("cannot write {}: {e}", req.display()))?;
    eprintln!(
        "xtask: downloading libtorch {VERSION} wheels from PyPI (about 540 MB, reused afterwards)"
    );
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
            ])
            .args([
                // The torch wheel is manylinux_2_28, the CUDA runtime ones older tags.
                "--platform",
                "manylinux_2_28_x86_64",
                "--platform",
                "manylinux_2_25_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                "--disable-pip-version-check",
                "--quiet",
                "-d",
            ])
            .arg(wheels)
            .arg("-r")
            .arg(&req),
        "pip download of the torch wheels (is PyPI reachable?)",
    )
}

const EXTRACT_PY: &str = r#"
import sys, zipfile, os, shutil
out, libs = sys.argv[1], sys.argv[2].split(",")
os.makedirs(os.path.join(out, "lib"), exist_ok=True)
found = set()
for whl in sys.argv[3:]:
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.startswith("torch/include/") and not name.endswith("/"):
                dest = os.path.join(out, "include", name[len("torch/include/"):])
            elif name in libs:
                dest = os.path.join(out, "lib", os.path.basename(name))
                found.add(name)
            else:
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
missing = [l for l in libs if l not in found]
if missing:
    sys.exit("missing from the wheels: " + ", ".join(missing))
"#;

/// The sha256 of each file, by Python's hashlib (python3 is required here anyway).
fn sha256s(files: &[PathBuf]) -> Result<Vec<String>, String> {
    const PY: &str = "import hashlib, sys\nfor p in sys.argv[1:]:\n    h = hashlib.sha256()\n    with open(p, 'rb') as f:\n        for b in iter(lambda: f.read(1 << 20), b''):\n            h.update(b)\n    print(h.hexdigest())\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(PY)
        .args(files)
        .output()
        .map_err(|e| format!("cannot run python3 to hash the wheels: {e}"))?;
    if !out.status.success() {
        return Err("hashing the wheels failed".into());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// Every wheel about to be unpacked must be one of the pinned ones, by sha256: the wheels
/// folder may come from a CI cache that another run could have written, and pip checks hashes
/// only of what it downloads itself. A wheel that does not match is removed.
fn verify_wheels(files: &[PathBuf]) -> Result<(), String> {
    let sums = sha256s(files)?;
    let mut bad = Vec::new();
    for (file, sum) in files.iter().zip(&sums) {
        if !WHEELS.iter().any(|(_, pinned)| pinned == sum) {
            let _ = fs::remove_file(file);
            bad.push(file.display().to_string());
        }
    }
    if sums.len() != files.len() || !bad.is_empty() {
        return Err(format!(
            "wheel(s) not matching the pinned sha256, removed: {} (run `cargo xtask setup` again to download them)",
            bad.join(", ")
        ));
    }
    if files.len() != WHEELS.len() {
        return Err(format!(
            "expected {} wheels, found {}",
            WHEELS.len(),
            files.len()
        ));
    }
    Ok(())
}

fn assemble(wheels: &Path, tmp: &Path) -> Result<(), String> {
    let mut files: Vec<PathBuf> = fs::read_dir(wheels)
        .map_err(|e| format!("cannot list {}: {e}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            n.ends_with(".whl")
                && (n.starts_with("torch-2.13.0-")
                    || n.starts_with("nvidia_cuda_runtime-13.0.96-")
                    || n.starts_with("nvidia_cuda_cupti-13.0.85-"))
        })
        .collect();
    files.sort();
    verify_wheels(&files)?;
    eprintln!("xtask: extracting headers and CPU libraries");
    run(
        Command::new("python3")
            .arg("-c")
            .arg(EXTRACT_PY)
            .arg(tmp)
            .arg(LIBS.join(","))
            .args(&files),
        "extracting the wheels",
    )?;
    // The stand-in libtorch.so: no code, just a dependency on the CPU libraries.
    let lib = tmp.join("lib");
    let empty = tmp.join("standin.c");
    fs::write(
        &empty,
        "/* libtorch.so stand-in: depends on libtorch_cpu and libc10 only */\n",
    )
    .map_err(|e| e.to_string())?;
    run(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(lib.join("libtorch.so"))
            .arg(&empty)
            .arg(format!("-L{}", lib.display()))
            .args([
                "-Wl,--no-as-needed",
                "-ltorch_cpu",
                "-lc10",
                "-Wl,-rpath,$ORIGIN",
            ]),
        "building the libtorch.so stand-in",
    )?;
    fs::remove_file(&empty).map_err(|e| e.to_string())?;
    fs::write(tmp.join("build-version"), format!("{VERSION}\n")).map_err(|e| e.to_string())?;
    // Verify the libraries resolve all their dependencies from this directory.
    let out = Command::new("ldd").arg(lib.join("libtorch.so")).output();
    if let Ok(out) = out {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(line) = text.lines().find(|l| l.contains("not found")) {
            return Err(format!(
                "assembled libtorch is missing a library: {}",
                line.trim()
            ));
        }
    }
    if !is_complete(tmp) {
        return Err("assembled libtorch is incomplete".into());
    }
    Ok(())
}

/// Point `<repo>/<name>` at `target` (replacing an old link atomically).
pub fn link(target: &Path, name: &str) -> Result<(), String> {
    let root = repo_root();
    let link = root.join(name);
    let tmp = root.join(format!("{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .map_err(|e| format!("cannot create symlink {}: {e}", tmp.display()))?;
    fs::rename(&tmp, &link).map_err(|e| format!("cannot replace {}: {e}", link.display()))
}

/// Make the cache entry `dest` with `build`, which fills an empty temporary directory beside
/// it; the directory is renamed into place only when `build` succeeded (replacing a stale or
/// half-made entry), and removed otherwise, so an interrupted run leaves nothing half-made.
pub fn install_entry(
    dest: &Path,
    build: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    let root = dest.parent().ok_or("a cache entry has a parent folder")?;
    fs::create_dir_all(root).map_err(|e| format!("cannot create cache {}: {e}", root.display()))?;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = root.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let result = build(&tmp).and_then(|_| {
        if dest.exists() {
            fs::remove_dir_all(dest)
                .map_err(|e| format!("cannot remove stale {}: {e}", dest.display()))?;
        }
        fs::rename(&tmp, dest).map_err(|e| format!("cannot move into {}: {e}", dest.display()))
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// Ensure libtorch is assembled and linked; returns its directory.
pub fn setup() -> Result<PathBuf, String> {
    let root = cache_root()?;
    let dest = root.join(format!("libtorch-{VERSION}"));
    if !is_complete(&dest) {
        require_tools()?;
        install_entry(&dest, |tmp| {
            fs::create_dir_all(tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
            download(&root.join("wheels"), tmp)?;
            assemble(&root.join("wheels"), tmp)?;
            let _ = fs::remove_file(tmp.join("requirements.txt"));
            Ok(())
        })?;
        eprintln!("xtask: libtorch {VERSION} ready in {}", dest.display());
    }
    link(&dest, ".libtorch")?;
    Ok(dest)
}
