//! The backend names the bot accepts are the ones the default build registers.

#[test]
fn catalog_matches_the_registry() {
    let registered: Vec<String> = attn_backends::all_backends()
        .iter()
        .filter(|b| b.role() == attn_results::BackendRole::Builtin)
        .map(|b| b.name().to_string())
        .collect();
    assert_eq!(registered, attn_ci::catalog::BACKENDS);
}
