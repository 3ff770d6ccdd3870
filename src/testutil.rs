//! Helpers shared by the unit tests.

/// Every conformance fixture (`tests/fixtures/conformance/<sub>`, `""` for the top
/// folder): its file name and decoded JSON, in file-name order. Panics on an
/// unreadable folder or file.
pub(crate) fn conformance_fixtures(sub: &str) -> Vec<(String, serde_json::Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance").join(sub);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let json = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, json)
        })
        .collect()
}
