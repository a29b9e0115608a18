//! The Layout section of docs/architecture.md names every source file and folder, so it stays
//! the map of the tree.

use std::path::Path;

/// The `## Layout` section of docs/architecture.md.
fn layout_section() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md"))
        .expect("docs/architecture.md");
    let start = doc.find("## Layout").expect("a Layout section");
    let rest = &doc[start + 2..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
}

/// Every `.rs` file and folder under `dir`, as paths relative to `root`; unit-test modules and
/// template data left out.
fn sources(dir: &Path, root: &Path, found: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("readable").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        let relative = path.strip_prefix(root).expect("under src").to_string_lossy().into_owned();
        let name = path.file_name().expect("named").to_string_lossy().into_owned();
        if name == "tests" || name == "tests.rs" || name == "templates" {
            continue;
        }
        if path.is_dir() {
            // A module's folder beside its file (`convert/` by `convert.rs`) is named by the file.
            if !path.with_extension("rs").exists() {
                found.push(format!("{relative}/"));
            }
            sources(&path, root, found);
        } else if name.ends_with(".rs") {
            found.push(relative);
        }
    }
}

#[test]
fn the_architecture_layout_names_every_source_file_and_folder() {
    let layout = layout_section();
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut found = Vec::new();
    sources(root, root, &mut found);
    found.sort();
    found.dedup();
    assert!(found.len() > 40, "{found:?}");
    // A file is named by its own name (`worker.rs`) or, for a folder's `mod.rs`, by the folder.
    let missing: Vec<&String> = found
        .iter()
        .filter(|path| {
            let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or(path);
            let named = |text: &str| layout.contains(&format!("`{text}")) || layout.contains(&format!("/{text}`"));
            if path.ends_with('/') {
                !named(&format!("{name}/")) && !named(&format!("src/{path}"))
            } else if name == "mod.rs" || name == "lib.rs" {
                false
            } else {
                !named(name) && !named(&format!("src/{path}"))
            }
        })
        .collect();
    assert!(missing.is_empty(), "not in the Layout section of docs/architecture.md: {missing:?}");
}
