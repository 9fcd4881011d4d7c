//! The import graph of a crate's source: every `use` and every path in its code, resolved to
//! the file its module lives in. Test modules (after `#[cfg(test)]`) and comments are left
//! out: they sit on top of everything and import what they test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each file (relative to the crate's `src`, `/`-separated) and the files it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// A source file: the module path it defines and its code.
struct Source {
    file: String,
    module: Vec<String>,
    code: String,
}

/// Every `.rs` file under `dir`, in path order.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a source folder")
        .map(|e| e.expect("an entry").path())
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for path in entries {
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

fn read_sources(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    for path in rust_files(root) {
        let file = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        // The binary's root is a crate of its own.
        if file == "main.rs" {
            continue;
        }
        let mut module: Vec<String> = file
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).expect("readable source");
        let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
        let code: Vec<&str> = before_tests
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect();
        out.push(Source {
            file,
            module,
            code: code.join("\n"),
        });
    }
    out
}

/// The paths a use tree names: `a::{b, c::{d, self}}` is `a::b`, `a::c::d` and `a::c`.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![segments(&tree)];
    };
    let prefix = segments(&tree[..open]);
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    let bytes: Vec<char> = inner.chars().collect();
    let mut parts = Vec::new();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(bytes[start..i].iter().collect::<String>());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(bytes[start..].iter().collect::<String>());
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        for tail in expand(&part) {
            let mut path = prefix.clone();
            path.extend(tail.into_iter().filter(|s| s != "self"));
            out.push(path);
        }
    }
    out
}

/// `a::b::c` as its segments; a glob keeps the path before it.
fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .filter(|s| !s.is_empty() && *s != "*")
        .map(String::from)
        .collect()
}

/// The use statements of `code` (their trees, renamings cut to the path) and the code
/// without them.
fn split_uses(code: &str) -> (Vec<String>, String) {
    let mut uses = Vec::new();
    let mut rest = String::new();
    let mut remaining = code;
    loop {
        let found = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .filter_map(|kw| {
                remaining
                    .match_indices(kw)
                    .find(|(i, _)| {
                        // A statement: only whitespace before it on its line.
                        let line = remaining[..*i].rsplit('\n').next().unwrap_or("");
                        line.trim().is_empty()
                    })
                    .map(|(i, _)| (i, kw.len()))
            })
            .min();
        let Some((at, len)) = found else {
            rest.push_str(remaining);
            break;
        };
        rest.push_str(&remaining[..at]);
        let after = &remaining[at + len..];
        let end = after.find(';').unwrap_or(after.len());
        // Renamings: keep only the path before ` as `.
        let tree = after[..end]
            .split(',')
            .map(|p| match p.find(" as ") {
                Some(i) => {
                    let closing: String = p[i..].chars().filter(|&c| c == '}').collect();
                    format!("{}{closing}", &p[..i])
                }
                None => p.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",");
        uses.push(tree);
        remaining = &after[(end + 1).min(after.len())..];
    }
    (uses, rest)
}

/// The paths of `code` outside use statements that start at `crate`, `super`, `self` or one
/// of `children`.
fn inline_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.contains("::"))
        .map(segments)
        .filter(|s| {
            s.len() > 1
                && (["crate", "super", "self"].contains(&s[0].as_str()) || children.contains(&s[0]))
        })
        .collect()
}

/// The modules `code` declares (`mod x;`, `pub mod x;`).
fn children(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub ")
                .or_else(|| l.strip_prefix("pub(crate) "))
                .unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';').map(String::from)
        })
        .collect()
}

/// The import graph of the crate whose source root is `root`.
pub fn import_graph(root: &Path) -> Graph {
    let sources = read_sources(root);
    let modules: BTreeMap<Vec<String>, String> = sources
        .iter()
        .map(|s| (s.module.clone(), s.file.clone()))
        .collect();
    let mut graph = Graph::new();
    for s in &sources {
        let kids = children(&s.code);
        let (uses, rest) = split_uses(&s.code);
        let mut paths: Vec<Vec<String>> = uses.iter().flat_map(|t| expand(t)).collect();
        paths.extend(inline_paths(&rest, &kids));
        let targets = graph.entry(s.file.clone()).or_default();
        for path in paths {
            let Some(absolute) = resolve(&path, &s.module, &kids) else {
                continue;
            };
            // The longest prefix that is a module: the file the path lands in.
            let landed = (0..=absolute.len())
                .rev()
                .find_map(|n| modules.get(&absolute[..n]));
            if let Some(file) = landed {
                // The crate root only declares modules; a path through it is no import.
                if *file != s.file && !absolute.is_empty() && modules.get(&Vec::new()) != Some(file)
                {
                    targets.insert(file.clone());
                }
            }
        }
    }
    graph
}

/// `path` (as written in module `module`, which declares `children`) from the crate root;
/// `None` for a path into another crate.
fn resolve(path: &[String], module: &[String], children: &BTreeSet<String>) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut base: Vec<String> = module.to_vec();
    let mut rest = path;
    match first.as_str() {
        "crate" => {
            base.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        name if children.contains(name) => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every set of files that import each other (strongly connected, more than one file), each
/// sorted, in order.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive: the graph is a few hundred files.
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(st: &mut State<'g>, v: &'g str) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        st.on_stack.insert(v);
        let targets = st.graph.get(v).into_iter().flatten();
        for w in targets {
            let w = w.as_str();
            if !st.index.contains_key(w) {
                visit(st, w);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if st.on_stack.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut component = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                st.out.push(component);
            }
        }
    }
    let mut st = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.out.sort();
    st.out
}
