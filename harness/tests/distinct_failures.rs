//! A backend with several independent bugs: one run reports each as its own class, shrunk,
//! with how many cases fell in it and which, in every output format.

mod support;

use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::runner::DivergenceKind;
use attn_harness::render::check::{render_json, render_markdown, render_text, Detail};
use std::sync::Arc;
use support::{Naive, Plant};

#[test]
fn three_bugs_are_three_classes_each_shrunk() {
    let bad = Naive::with(
        "naive-three-bugs",
        Plant {
            window_off_by_one: true,
            padding_into_last_slot: true,
            fails_on_block_size: Some(16),
            ..Plant::default()
        },
    );
    let run = run_check(CheckOptions {
        traces: 0,
        ..CheckOptions::new(
            vec![Arc::new(bad)],
            300,
            std::env::temp_dir().join("attn-diff-three-bugs"),
        )
    });
    let b = &run.summary.backends[0];
    for f in &b.failures {
        println!("{}", f.text);
    }
    let classes: Vec<_> = b
        .failures
        .iter()
        .map(|f| f.class.clone().unwrap())
        .collect();
    // Every failing case is in exactly one class.
    let counted: usize = classes.iter().map(|c| c.count()).sum();
    assert_eq!(counted, b.property.failed, "{classes:#?}");
    let mut all: Vec<usize> = classes.iter().flat_map(|c| c.cases.clone()).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), counted, "a case counted in two classes");

    let error = b
        .failures
        .iter()
        .find(|f| f.kind == DivergenceKind::Error)
        .expect("the block-size error is a class");
    assert!(error.message.contains("block size 16"), "{}", error.text);
    assert_eq!(error.size.sequences, 1, "{}", error.text);
    let window = b
        .failures
        .iter()
        .find(|f| f.hint.as_deref().is_some_and(|h| h.contains("window")))
        .expect("the window off-by-one is a class");
    assert_eq!(window.kind, DivergenceKind::Mismatch);
    let padding = b
        .failures
        .iter()
        .find(|f| f.hint.as_deref().is_some_and(|h| h.contains("padding")))
        .expect("the padding slot written is a class");
    assert!(padding.size.sequences <= 2, "{}", padding.text);
    // Each bug once, give or take a case whose shrunk form fits another pattern.
    assert!(
        (3..=4).contains(&b.failures.len()),
        "{} classes: {classes:#?}",
        b.failures.len()
    );

    let text = render_text(&run.summary, Detail::Summary);
    let md = render_markdown(&run.summary);
    let json = render_json(&run.summary);
    let junit = attn_harness::render::junit::render(&run.summary, &[]);
    for c in &classes {
        let line = attn_harness::failure::report::class_line(c);
        assert!(text.contains(line.trim_end()), "text lacks {line}");
        assert!(md.contains(&c.signature), "markdown lacks {}", c.signature);
        assert!(
            junit.contains(&attn_harness::render::junit::escape(&c.signature)),
            "junit lacks {}",
            c.signature
        );
    }
    assert_eq!(
        junit.matches("<failure message").count(),
        classes.len(),
        "one failing test per class: {junit}"
    );
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    let listed = parsed["backends"][0]["failures"].as_array().unwrap();
    assert_eq!(listed.len(), classes.len());
    for (f, c) in listed.iter().zip(&classes) {
        assert_eq!(f["class"]["cases"].as_array().unwrap().len(), c.cases.len());
    }
    assert!(text.contains(&format!("distinct failures: {}", classes.len())));
}

#[test]
fn a_stopped_run_says_how_many_cases_ran() {
    let bad = Naive::with(
        "naive-block-size-error",
        Plant {
            fails_on_block_size: Some(16),
            ..Plant::default()
        },
    );
    let run = run_check(CheckOptions {
        traces: 0,
        max_failures: Some(1),
        ..CheckOptions::new(
            vec![Arc::new(bad)],
            300,
            std::env::temp_dir().join("attn-diff-stopped"),
        )
    });
    let b = &run.summary.backends[0];
    assert!(run.summary.stopped.is_some());
    assert!(b.property.sent < 300, "{}", b.property.sent);
    let text = render_text(&run.summary, Detail::Summary);
    let last = text.lines().last().unwrap();
    assert!(
        last.contains(&format!("{} of 300 property case(s)", b.property.sent)),
        "{last}"
    );
}

/// Five causes of the kinds a real backend has, each one class named by its cause: two
/// Python exceptions (their tracebacks begin alike), a float16-score softmax (a precision
/// cause, whatever rows and heads it falls on), a poisoned slot read through a weight of 0,
/// and q·k overflowing float16 before the scale.
#[test]
fn five_causes_are_five_classes_each_named() {
    let bad = Naive::with(
        "naive-five-causes",
        Plant {
            raises_on_padding_write: true,
            raises_from_block_size: Some(64),
            scores_in_f16: true,
            whole_block_tail: true,
            ..Plant::default()
        },
    );
    let run = run_check(CheckOptions {
        traces: 0,
        ..CheckOptions::new(
            vec![Arc::new(bad)],
            CheckOptions::default_cases(),
            std::env::temp_dir().join("attn-diff-five-causes"),
        )
    });
    let b = &run.summary.backends[0];
    let named: Vec<(String, String)> = b
        .failures
        .iter()
        .map(|f| {
            let class = f.class.as_ref().expect("a class").signature.clone();
            let hint = f.hint.clone().unwrap_or_else(|| f.message.clone());
            (class, hint)
        })
        .collect();
    let causes: [(&str, &str); 5] = [
        ("IndexError: index_copy_()", "IndexError"),
        ("RuntimeError: The size of tensor a", "RuntimeError"),
        ("arithmetic: scores in the dtype", "q.k scores in f16"),
        ("poisoned unwritten slots", "unwritten"),
        ("q.k overflows", "past f16's largest value"),
    ];
    for (class, hint) in causes {
        let found = named.iter().filter(|(c, _)| c.contains(class)).count();
        assert_eq!(found, 1, "{class}: {found} classes of {named:#?}");
        let (_, h) = named.iter().find(|(c, _)| c.contains(class)).unwrap();
        assert!(h.contains(hint), "{class}: the hint does not name it: {h}");
    }
    assert_eq!(named.len(), 5, "{named:#?}");
}

#[test]
fn upstream_specs_failing_alike_are_one_class_that_names_them_all() {
    // The scale squared fails every spec of the small suite the same way.
    let backend = attn_backends::backend_by_name("mutant:scale-applied-twice").unwrap();
    let upstream = attn_harness::pipeline::upstream::small_suite();
    let run = run_check(CheckOptions {
        traces: 0,
        pairs: 0,
        upstream: upstream.clone(),
        recorded: Vec::new(),
        ..CheckOptions::new(
            vec![backend],
            0,
            std::env::temp_dir().join("attn-diff-upstream-classes"),
        )
    });
    let b = &run.summary.backends[0];
    assert!(b.upstream.failed >= 3, "{:?}", b.upstream);
    // Every failed spec is counted in exactly one class.
    let counted: usize = b
        .failures
        .iter()
        .map(|f| f.class.as_ref().map_or(0, |c| c.upstream.len()))
        .sum();
    assert_eq!(counted, b.upstream.failed);
    // Fewer classes than failed specs: a class holds several, the reported one first and
    // the others named in its `also` and its text.
    assert!(b.failures.len() < b.upstream.failed, "{}", b.failures.len());
    let widest = b
        .failures
        .iter()
        .max_by_key(|f| f.class.as_ref().map_or(0, |c| c.upstream.len()))
        .unwrap();
    let members = widest.class.as_ref().unwrap().upstream.len();
    assert!(members >= 2);
    assert_eq!(widest.also.len(), members - 1);
    assert!(
        widest.text.contains("more upstream case(s)"),
        "{}",
        widest.text
    );
    let labels: Vec<String> = upstream.iter().map(|u| u.label()).collect();
    assert!(
        widest.also.iter().all(|a| labels.contains(a)),
        "{:?}",
        widest.also
    );
}
