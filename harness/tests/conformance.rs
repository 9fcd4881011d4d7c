//! The conformance suite: the topics every backend must get right, written once and run for
//! every registered backend and for the numpy external adapter, judged by the harness's own
//! runner and `Tolerance` (the only tolerance there is).
//!
//! Each topic is a handful of cases built from a [`CaseRecipe`]. A case is first fitted to the
//! backend (a dtype and head size it accepts), so a backend that only computes in fp16 still
//! meets every topic; a topic the backend declines as a whole must be declined for the topic's
//! own feature, never for another reason, and never silently.
//!
//! Backend-specific tests (SIMD levels and scheduler settings of `cpu`, the device constraints
//! and query chunking of the Spyre backends) stay beside their backend in `backends/tests/`.

use attn_backends::external::{AdapterSpec, ExternalBackend};
use attn_backends::{backend_by_name, Backend};
use attn_harness::pipeline::recipe::{CaseRecipe, LatentRecipe, Share, TableOrder, Values};
use attn_harness::pipeline::runner::{evaluate, Outcome};
use attn_reference::{
    reference_output, AttentionKind, Case, DType, Feature, Fp8Format, Fp8KvCache,
};
use attn_reference::{Aspect, Dimension};
use attn_results::compare::Tolerance;
use std::path::PathBuf;
use std::sync::Arc;

/// Two kv heads of two queries each, three sequences (decode, prefill, chunked prefill) over
/// a permuted table with blocks of 4.
fn base() -> CaseRecipe {
    CaseRecipe {
        num_kv_heads: 2,
        group: 2,
        head_size: 16,
        block_size: 4,
        dtype: DType::F32,
        kind: AttentionKind::Decoder,
        seqs: vec![(6, 1), (0, 7), (9, 3)],
        table: TableOrder::Permuted(7),
        values: Values::Normal { seed: 3, std: 1.0 },
        ..CaseRecipe::plain()
    }
}

fn with(edit: impl FnOnce(&mut CaseRecipe)) -> CaseRecipe {
    let mut r = base();
    edit(&mut r);
    r
}

/// The recipe in a dtype and head size `backend` accepts, if any: the recipe's own first.
fn fit(backend: &dyn Backend, recipe: &CaseRecipe) -> CaseRecipe {
    let dtypes = [recipe.dtype, DType::Bf16, DType::F16, DType::F32];
    let sizes = [recipe.head_size, 64, 128];
    for d in sizes {
        for dt in dtypes {
            let mut r = recipe.clone();
            r.head_size = d;
            r.dtype = dt;
            if attn_backends::declines(backend, &r.config()).is_ok() {
                return r;
            }
        }
    }
    recipe.clone()
}

/// Run `recipes` on `backend`: no case may diverge; declined cases must name `feature` (the
/// topic's own) and are reported; a topic with no `feature` must run every case.
fn topic(backend: &dyn Backend, feature: Option<Aspect>, recipes: Vec<CaseRecipe>) {
    let mut ran = 0;
    for (i, recipe) in recipes.iter().enumerate() {
        let case = fit(backend, recipe).build();
        let (outcome, _) = judge(backend, &case, Tolerance::for_case(&case));
        match outcome {
            Outcome::Pass(_) => ran += 1,
            Outcome::Unsupported(u) => {
                // The topic's feature, or another optional one the case uses beside it.
                let beside = feature.is_some()
                    && u.feature
                        .feature()
                        .is_some_and(|f| f.used_by(&case.config) || f.used_by_batch(&case.batch));
                assert!(
                    Some(u.feature) == feature || beside,
                    "{}: case {i} declined for another reason than the topic's: {u}",
                    backend.name()
                );
                println!("{}: case {i}: unsupported: {u}", backend.name());
            }
            Outcome::Diverged(d) => panic!(
                "{} diverged on case {i} ({}): {} {}",
                backend.name(),
                case.shape_summary(),
                d.kind,
                d.message
            ),
        }
    }
    if feature.is_none() {
        assert_eq!(ran, recipes.len(), "{}", backend.name());
    }
    println!("{}: {ran} of {} cases ran", backend.name(), recipes.len());
}

fn judge(backend: &dyn Backend, case: &Case, tol: Tolerance) -> (Outcome, std::time::Duration) {
    let expected = reference_output(case);
    evaluate(backend, case, &expected, tol)
}

/// Every topic, by name, as the macro instantiates them.
mod topics {
    use super::*;

    pub fn gqa_ratios(b: &dyn Backend) {
        let packings = [(4, 1), (2, 2), (1, 8), (3, 3), (4, 3), (1, 6), (1, 1)];
        let recipes = packings
            .iter()
            .map(|&(kv, g)| {
                with(|r| {
                    r.num_kv_heads = kv;
                    r.group = g;
                })
            })
            .collect();
        topic(b, Some(Dimension::HeadLayout.into()), recipes);
    }

    pub fn every_dtype(b: &dyn Backend) {
        let recipes = DType::ALL
            .iter()
            .map(|&dt| with(|r| r.dtype = dt))
            .collect();
        topic(b, Some(Dimension::Dtype.into()), recipes);
    }

    pub fn encoder_only(b: &dyn Backend) {
        let recipes = vec![
            with(|r| {
                r.kind = AttentionKind::EncoderOnly;
                r.seqs = vec![(0, 5), (0, 1), (0, 11)];
            }),
            with(|r| {
                r.kind = AttentionKind::EncoderOnly;
                r.seqs = vec![(0, 9)];
                r.window = Some(3);
            }),
        ];
        topic(b, Some(Feature::EncoderOnly.into()), recipes);
    }

    pub fn padding_and_stale_blocks(b: &dyn Backend) {
        let recipes = vec![
            with(|r| r.padding_tokens = 3),
            with(|r| r.spare_blocks = 4),
            with(|r| {
                r.padding_tokens = 1;
                r.spare_blocks = 2;
                r.seqs = vec![(0, 1)];
            }),
        ];
        topic(b, None, recipes);
    }

    pub fn table_orders(b: &dyn Backend) {
        let orders = [
            TableOrder::Sequential,
            TableOrder::Reversed,
            TableOrder::Interleaved,
            TableOrder::Permuted(11),
        ];
        let recipes = orders.iter().map(|&t| with(|r| r.table = t)).collect();
        topic(b, None, recipes);
    }

    pub fn block_sizes(b: &dyn Backend) {
        let recipes = [1, 2, 3, 16, 32]
            .iter()
            .map(|&bs| with(|r| r.block_size = bs))
            .collect();
        topic(b, Some(Dimension::BlockSize.into()), recipes);
    }

    pub fn shared_prefix_blocks(b: &dyn Backend) {
        let recipes = vec![with(|r| {
            r.seqs = vec![(8, 1), (8, 3), (8, 2)];
            r.share = Some(Share {
                group: 3,
                blocks: 2,
            });
        })];
        topic(b, None, recipes);
    }

    pub fn sliding_windows(b: &dyn Backend) {
        // Both conventions, windows of one key, inside the sequence and past it.
        let recipes = [1, 2, 5, 40]
            .iter()
            .flat_map(|&w| {
                [
                    with(|r| r.window = Some(w)),
                    with(|r| {
                        r.window = Some(w);
                        r.kind = AttentionKind::EncoderOnly;
                        r.seqs = vec![(0, 7), (0, 3)];
                    }),
                ]
            })
            .collect::<Vec<_>>();
        let window_only: Vec<_> = recipes
            .iter()
            .filter(|r| r.kind == AttentionKind::Decoder)
            .cloned()
            .collect();
        topic(b, Some(Feature::SlidingWindow.into()), window_only);
        let encoder: Vec<_> = recipes
            .into_iter()
            .filter(|r| r.kind == AttentionKind::EncoderOnly)
            .collect();
        if attn_backends::declines(b, &fit(b, &encoder[0]).config()).is_ok() {
            topic(b, None, encoder);
        }
    }

    pub fn local_chunks(b: &dyn Backend) {
        // Chunks of one key, a chunk inside a block and across blocks (4), past the sequence;
        // decodes and prefills crossing a chunk start; with a window as well.
        let recipes = [1, 3, 4, 5, 40]
            .iter()
            .map(|&n| with(|r| r.chunk = Some(n)))
            .chain([
                with(|r| {
                    r.chunk = Some(3);
                    r.window = Some(2);
                }),
                with(|r| {
                    r.chunk = Some(8);
                    r.seqs = vec![(15, 1), (7, 9), (0, 17)];
                    r.alibi = true;
                }),
            ])
            .collect();
        topic(b, Some(Feature::ChunkedLocalAttention.into()), recipes);
    }

    pub fn chunk_lookback(b: &dyn Backend) {
        // One and two chunks back, inside a block and across blocks, back past the first
        // chunk; decodes and prefills crossing a chunk start; with a window as well.
        let recipes = [(1, 3), (3, 1), (4, 2), (5, 1), (2, 9)]
            .iter()
            .map(|&(chunk, back)| {
                with(|r| {
                    r.chunk = Some(chunk);
                    r.lookback = Some(back);
                })
            })
            .chain([
                with(|r| {
                    r.chunk = Some(3);
                    r.lookback = Some(1);
                    r.window = Some(5);
                }),
                with(|r| {
                    r.chunk = Some(4);
                    r.lookback = Some(1);
                    r.seqs = vec![(15, 1), (7, 9), (0, 17)];
                    r.alibi = true;
                }),
            ])
            .collect();
        topic(b, Some(Feature::ChunkLookback.into()), recipes);
    }

    pub fn non_causal(b: &dyn Backend) {
        // Every request non-causal, one of three, with a window (both ways), with ALiBi
        // (positive offsets for later keys), with local chunks, beside padded requests.
        let mixed = vec![(15, 1), (7, 9), (0, 17)];
        let recipes = vec![
            with(|r| r.non_causal = Some(u64::MAX)),
            with(|r| {
                r.seqs = mixed.clone();
                r.non_causal = Some(0b010);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.non_causal = Some(0b101);
                r.window = Some(3);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.non_causal = Some(0b110);
                r.alibi = true;
                r.sinks = true;
            }),
            with(|r| {
                r.non_causal = Some(u64::MAX);
                r.chunk = Some(4);
            }),
        ];
        topic(b, Some(Feature::NonCausal.into()), recipes);
    }

    pub fn prefix_lm(b: &dyn Backend) {
        use attn_harness::pipeline::recipe::RangesRecipe;
        // Ranges at the start, the middle and the end, one token long, across the context
        // and the step, on some requests; with windows shorter and longer than a range,
        // clamped (Gemma 4) or not; beside non-causal requests and local chunks.
        let ranges = |spans: &[(u16, u16)], seqs: u64, clamp: bool| {
            Some(RangesRecipe {
                spans: spans.to_vec(),
                seqs,
                clamp,
            })
        };
        let mixed = vec![(15, 1), (7, 9), (0, 17), (30, 5)];
        let recipes = vec![
            with(|r| r.prefix_lm = ranges(&[(0, 300), (500, 500), (700, 1000)], u64::MAX, false)),
            with(|r| {
                r.seqs = mixed.clone();
                r.prefix_lm = ranges(&[(100, 450), (600, 990)], 0b1011, false);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.prefix_lm = ranges(&[(200, 800)], u64::MAX, false);
                r.window = Some(3);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.prefix_lm = ranges(&[(200, 800)], u64::MAX, true);
                r.window = Some(3);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.prefix_lm = ranges(&[(0, 100), (300, 400)], 0b0110, true);
                r.window = Some(40);
                r.alibi = true;
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.prefix_lm = ranges(&[(250, 750)], u64::MAX, false);
                r.non_causal = Some(0b0100);
                r.chunk = Some(4);
            }),
        ];
        topic(b, Some(Feature::PrefixLm.into()), recipes);
    }

    pub fn rswa(b: &dyn Backend) {
        use attn_harness::pipeline::recipe::RswaRecipe;
        // Prefixes none, some and all of a sequence; windows of one key and more than the
        // sequence; beside non-causal requests, local chunks and sinks.
        let mixed = vec![(15, 1), (7, 9), (0, 17), (30, 5)];
        let rswa = |window, prefix| Some(RswaRecipe { window, prefix });
        let recipes = vec![
            with(|r| r.rswa = rswa(1, 300)),
            with(|r| {
                r.seqs = mixed.clone();
                r.rswa = rswa(4, 0);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.rswa = rswa(3, 500);
                r.sinks = true;
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.rswa = rswa(64, 1000);
            }),
            with(|r| {
                r.seqs = mixed.clone();
                r.rswa = rswa(2, 400);
                r.non_causal = Some(0b0010);
                r.chunk = Some(8);
            }),
        ];
        topic(b, Some(Feature::Rswa.into()), recipes);
    }

    pub fn soft_cap(b: &dyn Backend) {
        let recipes = [1.0, 5.0, 30.0]
            .iter()
            .map(|&c| {
                with(|r| {
                    r.soft_cap = Some(c);
                    r.values = Values::Normal { seed: 5, std: 3.0 };
                })
            })
            .collect();
        topic(b, Some(Feature::LogitsSoftCap.into()), recipes);
    }

    pub fn alibi(b: &dyn Backend) {
        topic(
            b,
            Some(Feature::Alibi.into()),
            vec![with(|r| r.alibi = true)],
        );
    }

    pub fn sinks(b: &dyn Backend) {
        topic(
            b,
            Some(Feature::Sinks.into()),
            vec![with(|r| r.sinks = true)],
        );
    }

    /// Both FP8 formats, in bf16 and f32: scales that saturate E4M3 (2^-8: every |x| past
    /// 1.75), that put values among the subnormal codes (4), and a k/v pair that differ (so
    /// swapping them shows).
    pub fn fp8_kv_cache(b: &dyn Backend) {
        let scales = [(0.5, 0.25), (0.00390625, 1.0), (4.0, 0.1875)];
        let recipes = Fp8Format::ALL
            .into_iter()
            .flat_map(|f| {
                scales.into_iter().flat_map(move |(k, v)| {
                    [DType::Bf16, DType::F32].map(|dtype| {
                        with(|r| {
                            r.kv_cache = Some(Fp8KvCache::new(f, k, v));
                            r.dtype = dtype;
                        })
                    })
                })
            })
            .collect();
        topic(b, Some(Feature::Fp8KvCache.into()), recipes);
    }

    /// An FP8 query: each cache format, scales that saturate a normal query (1/256: past
    /// 1.75), are not a power of two (0.1875) or widen it (4), in bf16 and f32, with a
    /// prefill and grouped heads. Only on a backend with an FP8 cache (one without declines
    /// the cache first).
    pub fn fp8_query(b: &dyn Backend) {
        let recipes: Vec<CaseRecipe> = Fp8Format::ALL
            .into_iter()
            .flat_map(|f| {
                [0.00390625, 0.1875, 4.0].into_iter().flat_map(move |q| {
                    [DType::Bf16, DType::F32].map(|dtype| {
                        with(|r| {
                            r.kv_cache = Some(Fp8KvCache {
                                q_scale: Some(q),
                                ..Fp8KvCache::new(f, 0.5, 0.25)
                            });
                            r.dtype = dtype;
                            r.group = 2;
                            r.seqs = vec![(9, 1), (3, 6)];
                            r.values = Values::Normal { seed: 3, std: 2.0 };
                        })
                    })
                })
            })
            .filter(|r| {
                !attn_backends::declines(b, &fit(b, r).config())
                    .is_err_and(|u| u.feature == Feature::Fp8KvCache)
            })
            .collect();
        topic(b, Some(Feature::Fp8Query.into()), recipes);
    }

    /// Decoder queries over an encoder's cache: decode, fewer and more decoder tokens than
    /// encoder keys, a one-key encoder, with a soft-cap and sinks, and in an FP8 cache.
    pub fn cross_attention(b: &dyn Backend) {
        let cross = |seqs: Vec<(usize, usize)>| {
            with(move |r| {
                r.kind = AttentionKind::EncoderDecoder;
                r.seqs = seqs;
            })
        };
        let mut recipes = vec![
            cross(vec![(6, 1), (0, 7), (9, 3)]),
            cross(vec![(1, 1), (2, 9), (13, 13)]),
            cross(vec![(40, 1); 4]),
        ];
        let mut features = cross(vec![(7, 2), (3, 5)]);
        features.soft_cap = Some(5.0);
        features.sinks = true;
        let mut fp8 = cross(vec![(7, 2), (3, 5)]);
        fp8.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 0.5, 0.25));
        recipes.push(features);
        // In an FP8 cache only for a backend that has one (else it is declined for that).
        if !attn_backends::declines(b, &fit(b, &fp8).config())
            .is_err_and(|u| u.feature == Feature::Fp8KvCache)
        {
            recipes.push(fp8);
        }
        topic(b, Some(Feature::CrossAttention.into()), recipes);
    }

    /// Multi-head latent attention: DeepSeek-V3's latent (576, V its first 512, scale
    /// 192^-0.5) under 128 heads and a tensor-parallel 16 past 576 keys, with speculative
    /// queries; small latents (V one dim narrower, or a single dim) with a chunked query and a
    /// shared prefix; an FP8 latent where the backend has an FP8 cache.
    pub fn mla(b: &dyn Backend) {
        let latent = |heads: usize, head_size: usize, rope: usize, seqs: Vec<(usize, usize)>| {
            with(move |r| {
                r.num_kv_heads = 1;
                r.group = heads;
                r.head_size = head_size;
                r.block_size = 16;
                r.dtype = DType::Bf16;
                r.seqs = seqs;
                r.mla = Some(LatentRecipe {
                    rope,
                    scale: 192f32.powf(-0.5),
                });
            })
        };
        let mut recipes = vec![
            latent(128, 576, 64, vec![(600, 1), (40, 1)]),
            latent(16, 576, 64, vec![(577, 1), (1150, 3), (5, 2)]),
            latent(4, 9, 1, vec![(30, 12), (0, 5)]),
            latent(3, 2, 1, vec![(17, 1)]),
        ];
        recipes[2].share = Some(Share {
            group: 2,
            blocks: 1,
        });
        let mut fp8 = latent(8, 40, 8, vec![(50, 2)]);
        fp8.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 0.0625, 0.0625));
        if !attn_backends::declines(b, &fp8.config())
            .is_err_and(|u| u.feature == Feature::Fp8KvCache)
        {
            recipes.push(fp8);
        }
        topic(b, Some(Feature::Mla.into()), recipes);
    }

    /// Padded requests (vLLM pads a batch's request count for CUDA graphs): one to three
    /// requests of no query and no keys after the real ones, in decode, prefill and a mix.
    pub fn padded_requests(b: &dyn Backend) {
        let recipes = [
            (vec![(6, 1), (9, 1)], 1),
            (vec![(0, 7), (9, 3)], 2),
            (vec![(6, 1), (0, 7), (9, 3)], 3),
        ]
        .into_iter()
        .map(|(seqs, padded)| {
            with(move |r| {
                r.seqs = seqs;
                r.padded_requests = padded;
            })
        })
        .collect();
        topic(b, Some(Feature::PaddedRequests.into()), recipes);
    }

    pub fn large_logits(b: &dyn Backend) {
        let recipe = with(|r| r.values = Values::Normal { seed: 9, std: 6.0 });
        topic(b, None, vec![recipe]);
    }

    /// vLLM's small specs at their head configs, judged by attn-diff's tolerance (tighter than
    /// upstream's 1e-2); a backend may decline one (the device's fp16-only rule), but what it
    /// runs must pass.
    pub fn upstream_small_specs(b: &dyn Backend) {
        let mut ran = 0;
        for uc in attn_harness::pipeline::upstream::small_suite() {
            let case = uc.build();
            match judge(b, &case, Tolerance::for_case(&case)).0 {
                Outcome::Pass(_) => ran += 1,
                Outcome::Unsupported(u) => println!("{}: {}: {u}", b.name(), uc.label()),
                Outcome::Diverged(d) => {
                    panic!("{} on {}: {} {}", b.name(), uc.label(), d.kind, d.message)
                }
            }
        }
        println!("{}: {ran} upstream cases ran", b.name());
    }
}

/// Every topic, listed once: `every_topic!(m)` calls macro `m` with their names, for the
/// table the settings sweeps walk and for each backend's tests.
macro_rules! every_topic {
    ($m:ident) => {
        $m!(
            gqa_ratios,
            every_dtype,
            encoder_only,
            padding_and_stale_blocks,
            table_orders,
            block_sizes,
            shared_prefix_blocks,
            sliding_windows,
            local_chunks,
            chunk_lookback,
            non_causal,
            prefix_lm,
            rswa,
            soft_cap,
            alibi,
            sinks,
            fp8_kv_cache,
            fp8_query,
            cross_attention,
            mla,
            padded_requests,
            large_logits,
            upstream_small_specs
        );
    };
}

/// A topic: every case of it run on one backend.
type Topic = fn(&dyn Backend);

macro_rules! topic_table {
    ($($topic:ident),*) => {
        /// Every topic, for the settings sweeps below.
        const ALL_TOPICS: &[(&str, Topic)] = &[$((stringify!($topic), topics::$topic)),*];
    };
}
every_topic!(topic_table);

/// Every topic on every setting of `cpu`: each SIMD level this machine has, split-KV always
/// (narrow tiles, far prefetch) and never (wide tiles, pair-dot scores), on 2 threads, and
/// one single-threaded run that takes the no-pool path.
#[test]
fn every_cpu_setting_meets_every_topic() {
    use attn_backends::cpu::{CpuBackend, CpuSettings, KvTiles, SimdChoice, SimdLevel, SplitKv};
    let mut settings = vec![CpuSettings {
        threads: 1,
        ..CpuSettings::default()
    }];
    for level in SimdLevel::available() {
        for (split_kv, kv_tiles) in [
            (SplitKv::Always, KvTiles::Streaming),
            (SplitKv::Never, KvTiles::Resident),
        ] {
            settings.push(CpuSettings {
                threads: 2,
                simd: SimdChoice::Force(level),
                split_kv,
                kv_tiles,
            });
        }
    }
    for s in settings {
        let backend = CpuBackend::new(s.clone()).expect("an available level");
        for (name, topic) in ALL_TOPICS {
            println!("{s:?}: {name}");
            topic(&backend);
        }
    }
}

/// Every topic on the Spyre backends with tiny budgets: one page per native chunk and one
/// sequence per SDPA group, so the online softmax merges many chunks and groups split.
#[cfg(feature = "spyre")]
#[test]
fn chunked_spyre_meets_every_topic() {
    use attn_backends::spyre::{Budgets, Spyre};
    let tiny = Budgets {
        chunk_bytes: 1,
        group_kv_bytes: 1,
    };
    for v in [Spyre::native(), Spyre::sdpa(), Spyre::device()] {
        let backend = v.with_budgets(tiny);
        for (name, topic) in ALL_TOPICS {
            println!("{} (chunked): {name}", backend.name());
            topic(&backend);
        }
    }
}

fn registered(name: &str) -> Arc<dyn Backend> {
    backend_by_name(name).unwrap_or_else(|e| panic!("{e}"))
}

/// The numpy reference adapter, in the Python that `cargo xtask setup` provisioned.
fn numpy_adapter() -> Arc<dyn Backend> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = attn_harness::external::adapter_python(&repo);
    let script = repo.join("adapters/python/numpy_reference.py");
    let spec = AdapterSpec::new("numpy-ref", vec![python, script.display().to_string()]);
    Arc::new(
        ExternalBackend::start(spec).expect(
            "the numpy adapter starts (it needs numpy and safetensors: `cargo xtask setup`)",
        ),
    )
}

/// One module per backend, one test per topic.
macro_rules! conformance {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            fn backend() -> Arc<dyn Backend> {
                $backend
            }
            every_topic!(topic_tests);
        }
    };
}

/// One test per topic, on the `backend()` of the module it expands in.
macro_rules! topic_tests {
    ($($topic:ident),*) => {
        $(
            #[test]
            fn $topic() {
                topics::$topic(backend().as_ref());
            }
        )*
    };
}

conformance!(cpu, registered("cpu"));
#[cfg(feature = "spyre")]
conformance!(spyre_native, registered("spyre-native"));
#[cfg(feature = "spyre")]
conformance!(spyre_sdpa, registered("spyre-sdpa"));
#[cfg(feature = "spyre")]
conformance!(spyre_device, registered("spyre-device"));
conformance!(numpy_adapter, numpy_adapter());

/// Every registered backend has its module above: a new backend cannot join the registry
/// without joining the suite.
#[test]
fn every_registered_backend_is_in_the_suite() {
    let covered = ["cpu", "spyre-native", "spyre-sdpa", "spyre-device"];
    for name in attn_backends::backend_names() {
        assert!(
            covered.contains(&name.as_str()),
            "`{name}` is registered but has no conformance!(…) line in harness/tests/conformance.rs"
        );
    }
}

/// The suite bites: a backend that gets one topic wrong fails that topic.
#[test]
#[should_panic(expected = "diverged")]
fn a_wrong_window_fails_the_window_topic() {
    struct WindowOffByOne(Arc<dyn Backend>);
    impl Backend for WindowOffByOne {
        fn name(&self) -> &str {
            "window-off-by-one"
        }
        fn supports(
            &self,
            c: &attn_reference::AttentionConfig,
        ) -> Result<(), attn_backends::Unsupported> {
            self.0.supports(c)
        }
        fn optional_features(&self) -> Vec<Feature> {
            self.0.optional_features()
        }
        fn cache_layout(&self) -> attn_backends::CacheLayout {
            self.0.cache_layout()
        }
        fn new_cache(
            &self,
            c: &attn_reference::AttentionConfig,
            n: usize,
        ) -> Result<attn_backends::KvCache, attn_backends::BackendError> {
            self.0.new_cache(c, n)
        }
        fn write_kv(
            &self,
            c: &attn_reference::AttentionConfig,
            cache: &mut attn_backends::KvCache,
            w: &attn_backends::KvWrite<'_>,
        ) -> Result<(), attn_backends::BackendError> {
            self.0.write_kv(c, cache, w)
        }
        fn forward(
            &self,
            c: &attn_reference::AttentionConfig,
            cache: &attn_backends::KvCache,
            step: &attn_backends::StepInputs<'_>,
        ) -> Result<Vec<f32>, attn_backends::BackendError> {
            let mut wider = c.clone();
            wider.sliding_window = c.sliding_window.map(|w| w + 1);
            self.0.forward(&wider, cache, step)
        }
    }
    topics::sliding_windows(&WindowOffByOne(registered("cpu")));
}
