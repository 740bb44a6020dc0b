//! The layer rules of ARCHITECTURE.md, read off the `crate::` paths of
//! src/: a module imports from the layers below it, never from one above.
//! An exception would be listed here with its reason, to be removed; a
//! new import from above fails this test until it is fixed or listed.

use std::path::Path;

/// The layer of a `crate::` path (or of a file's own module), top first;
/// None for the crate root.
fn layer(path: &str) -> Option<u8> {
    // The leaves of report/ that every layer writes with: the one stderr
    // writer and the run's counters.
    if path.starts_with("report::stderr") || path.starts_with("report::totals") {
        return Some(6);
    }
    Some(match path.split("::").next()? {
        "main" | "commands" | "relay" => 1,
        "report" => 2,
        "plan" | "config" | "cli" | "environment" => 3,
        "broker" | "sql" | "archive" => 4,
        "connect" | "guard" => 5,
        "exit" => 6,
        _ => return None,
    })
}

/// (file, imported path prefix): imports against the rules, each listed
/// with its reason until it is removed (ARCHITECTURE.md, Layers). None
/// now: a new one fails the test until it is fixed or listed here.
const EXCEPTIONS: [(&str, &str); 0] = [];

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under src/: `relay/many.rs` is `relay::many`.
fn module_of(relative: &str) -> String {
    relative
        .trim_end_matches(".rs")
        .trim_end_matches("/mod")
        .replace('/', "::")
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut broken = Vec::new();
    for file in all {
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let own = module_of(&relative);
        let Some(own_layer) = layer(&own) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        // Unit tests may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (at, _) in code.match_indices("crate::") {
            let path: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let same_top = path.split("::").next() == own.split("::").next();
            let Some(imported) = layer(&path) else {
                continue;
            };
            if same_top || imported >= own_layer {
                continue;
            }
            let known = EXCEPTIONS
                .iter()
                .any(|(exception, prefix)| relative == *exception && path.starts_with(prefix));
            if !known {
                broken.push(format!("src/{relative} imports crate::{path}"));
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(
        broken.is_empty(),
        "imports from a higher layer (see ARCHITECTURE.md, Layers):\n{}",
        broken.join("\n")
    );
}
