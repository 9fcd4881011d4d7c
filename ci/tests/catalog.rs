//! The backend names the bot accepts are the ones the default build registers.

#[test]
fn catalog_matches_the_registry() {
    let registered: Vec<String> = attn_backends::backend_names()
        .into_iter()
        .filter(|n| !attn_ci::catalog::is_mutant(n))
        .collect();
    assert_eq!(registered, attn_ci::catalog::BACKENDS);
}
