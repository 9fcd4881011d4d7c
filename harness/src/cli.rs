//! The `attn-diff` command line: parsing only. Each subcommand's body is in
//! [`crate::commands`].

use crate::external::ExternalArgs;
use crate::pipeline::check::Shard;
use crate::pipeline::upstream;
use crate::render::Format;
use attn_reference::DType;
use attn_results::BackendRef;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

const EXIT_CODES: &str = "\
Exit status:
  0  every backend agreed with the oracle (or the command succeeded)
  1  a divergence (a wrong answer, a crash, a timeout), or a wrong benchmark row
  2  a usage or set-up error (a malformed file, an unknown backend or spec, an adapter that
     does not start)";

#[derive(Parser, Debug)]
#[command(
    name = "attn-diff",
    version,
    about = "Differential correctness harness for paged-attention backends",
    long_about = "Differential correctness harness for paged-attention backends: every backend \
                  runs against one trusted f64 reference over randomized cases and vLLM's own \
                  backend test specs; a divergence is shrunk to a minimal case and reported.",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone, Copy, Default)]
pub struct GlobalArgs {
    /// No progress display on stderr (it is shown only on a terminal anyway).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Show everything: every upstream row in a text summary, not only those that did not pass.
    #[arg(short, long, global = true)]
    pub verbose: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Property cases (and named upstream specs) through backends against the oracle.
    #[command(after_help = EXIT_CODES)]
    Check(CheckArgs),
    /// Run a saved case (a replay file, or a safetensors file from `export`) again.
    #[command(after_help = EXIT_CODES)]
    Replay(ReplayArgs),
    /// Write a case's tensors and the oracle's output to a safetensors file.
    #[command(after_help = EXIT_CODES)]
    Export(ExportArgs),
    /// Time one attention call per backend and upstream spec, side by side.
    #[command(after_help = EXIT_CODES)]
    Bench(BenchArgs),
    /// Backends with what each declines, declared adapters, and the named specs.
    #[command(after_help = EXIT_CODES)]
    List(ListArgs),
    /// Start an adapter, print what its handshake declares (name, protocol version,
    /// description, capabilities: its case space) and exit.
    #[command(after_help = EXIT_CODES)]
    Handshake(HandshakeArgs),
    /// Run a command (a vLLM server or script) with the engine recorder loaded in every vLLM
    /// process, writing its attention calls, values and all, to a folder that
    /// `check --recording` judges.
    #[command(after_help = EXIT_CODES)]
    Record(RecordArgs),
    /// Write a runnable adapter (numpy paged attention on the Python helper) and a README
    /// saying how to run it into a new directory.
    #[command(after_help = EXIT_CODES)]
    NewAdapter(NewAdapterArgs),
    /// Every mutant (deliberately wrong backend) through the property runner and through the
    /// upstream suite alone: what each catches.
    #[cfg(feature = "mutants")]
    #[command(after_help = EXIT_CODES)]
    Mutants(MutantsArgs),
    /// This build has no mutants: says how to build them.
    #[cfg(not(feature = "mutants"))]
    #[command(hide = true, after_help = EXIT_CODES)]
    Mutants(NoMutantsArgs),
}

/// Query heads and kv heads: `32,8` (or `32/8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub query: usize,
    pub kv: usize,
}

impl std::str::FromStr for Heads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (q, kv) = s
            .split_once([',', '/'])
            .ok_or_else(|| format!("`{s}` must be QUERY,KV heads, e.g. 32,8"))?;
        let num = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{x}` in `{s}` is not a number of heads"))
        };
        Ok(Heads {
            query: num(q)?,
            kv: num(kv)?,
        })
    }
}

impl std::fmt::Display for Heads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{}", self.query, self.kv)
    }
}

/// `--dtype`: its values listed in the help, parsed into a [`DType`].
fn dtype_parser() -> impl clap::builder::TypedValueParser<Value = DType> {
    PossibleValuesParser::new(DType::ALL.map(DType::name))
        .map(|s| s.parse::<DType>().expect("a listed dtype parses"))
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// The recording's folder (created; calls already there are kept).
    #[arg(long, value_name = "DIR")]
    pub out: std::path::PathBuf,
    /// Record only these layers (indices, comma-separated; default: every layer).
    #[arg(long, value_delimiter = ',', value_name = "I,...")]
    pub layers: Vec<usize>,
    /// Record every N-th call of a layer.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub every: usize,
    /// Record at most N calls per engine process.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub max_calls: usize,
    /// Leave out calls of more than N tokens.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub max_tokens: usize,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Comma-separated backend names (default: every registered backend); `external:NAME`
    /// runs an adapter declared in attn-diff.toml or with --external.
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub backend: Vec<BackendRef>,
    #[command(flatten)]
    pub external: ExternalArgs,
    /// Property cases to run (default: PROPTEST_CASES, else 500).
    #[arg(long, value_name = "N")]
    pub cases: Option<u32>,
    /// Serving traces to run after the property cases: one cache across many scheduled
    /// steps (blocks freed and reused, prefix hits, preemption, chunked prefill).
    #[arg(long, default_value_t = crate::pipeline::draw::trace::DEFAULT_TRACES, value_name = "N")]
    pub traces: u32,
    /// Invariance pairs to run after the traces (default: one per 10 property cases): a
    /// drawn case and its form under one relation (the request alone, the batch reversed,
    /// the prompt chunked, the blocks moved, the call repeated), compared bit for bit.
    /// `--cases 0 --traces 0 --pairs N` runs them alone.
    #[arg(long, value_name = "N")]
    pub pairs: Option<u32>,
    /// Judge these relations (comma-separated, or `all`) as if every backend declared them:
    /// their moved bits become variant failures, shrunk, with replay files (to reproduce a
    /// backend's drift, or to hold it to invariance it does not claim).
    #[arg(long, value_name = "RELATION,...", value_parser = parse_relations)]
    pub hold: Option<Relations>,
    /// Head sizes traces draw from (default: 1,2,4,8,13,16,32,64,80,128), to aim them at
    /// what a backend runs.
    #[arg(long, value_parser = crate::pipeline::draw::trace::parse_sizes, value_name = "D,...")]
    pub trace_head_sizes: Option<crate::pipeline::draw::trace::SizeList>,
    /// Block sizes traces draw from (default: 1,2,3,4,5,8,16,32).
    #[arg(long, value_parser = crate::pipeline::draw::trace::parse_sizes, value_name = "B,...")]
    pub trace_block_sizes: Option<crate::pipeline::draw::trace::SizeList>,
    /// Narrow the case space of every backend (repeatable): KEY=VALUES with the keys of an
    /// adapter's capabilities, e.g. `--only dtypes=f16 --only head_sizes=64,128 --only
    /// max_seqs=1`. Cases, traces and shrinking stay inside each backend's declared space
    /// narrowed by these. Keys: dtypes, head_sizes, head_size_multiple_of, block_sizes,
    /// block_size_multiple_of, kinds, features, max_seqs, max_query_len, max_seq_len,
    /// max_tokens, max_group, kv_cache_dtypes.
    #[arg(long = "only", value_parser = attn_reference::Space::parse_only, value_name = "KEY=VALUES")]
    pub only: Vec<attn_reference::Space>,
    /// Seed of the property cases: the same seed draws the same cases on any machine.
    #[arg(long, default_value_t = 1, value_name = "SEED")]
    pub seed: u64,
    /// Run only shard I of N (I/N, 0-based): N shards together run exactly one run's cases.
    #[arg(long, default_value = "0/1", value_name = "I/N")]
    pub shard: Shard,
    /// Also run this upstream spec (at every TP head config, in every upstream test that uses
    /// it). Repeatable; `attn-diff list` names the specs.
    #[arg(long = "spec", value_name = "SPEC")]
    pub specs: Vec<String>,
    /// Also run the whole upstream suite (every spec, TP config and test).
    #[arg(long)]
    pub upstream: bool,
    /// Skip the upstream suite (the small specs a check runs by default).
    #[arg(long, conflicts_with = "upstream")]
    pub no_upstream: bool,
    /// Judge a real engine's recorded attention calls (a folder `attn-diff record` wrote)
    /// instead of drawn cases: the engine's own outputs (`engine:CLASS`) and every selected
    /// backend on the same calls with the same values. No property cases, traces, pairs or
    /// upstream cases run beside them.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["cases", "pairs", "upstream", "specs"])]
    pub recording: Option<std::path::PathBuf>,
    /// Every backend must be reached by at least N cases and traces (declined ones do not
    /// count), else the run fails (exit 1). A backend reached by none always fails it.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub min_run: usize,
    /// Stop the run after N failures (of any backend); `-x` is 1.
    #[arg(long, value_name = "N")]
    pub max_failures: Option<usize>,
    /// Stop at the first failure (`--max-failures 1`).
    #[arg(short = 'x', long = "exitfirst", conflicts_with = "max_failures")]
    pub exit_first: bool,
    /// Report failures as found, without shrinking them.
    #[arg(long)]
    pub no_shrink: bool,
    /// Bound each shrink by S seconds instead of by its work (the default, which shrinks a
    /// failure to the same case on every machine and at every --jobs; a time limit does not).
    #[arg(long, value_name = "S", conflicts_with = "no_shrink")]
    pub shrink_time: Option<f64>,
    /// Send a backend no more cases after N identical failures in a row (the same error,
    /// crash, timeout or malformed reply).
    #[arg(long, default_value_t = crate::pipeline::check::DEFAULT_GIVE_UP_AFTER, value_name = "N")]
    pub give_up_after: usize,
    /// Cases and traces run at once (default: one per core). Each adapter runs as up to N
    /// processes. The summary is the same whatever N is.
    #[arg(short = 'j', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub jobs: Option<u32>,
    /// Run only property case I of the seed (as a report names it: `property case I`),
    /// without traces or upstream cases.
    #[arg(long, value_name = "I")]
    pub case_index: Option<usize>,
    /// No poisoned memory (NaN, infinities, huge values in unwritten slots and padding rows,
    /// one case and trace in four by default): to look past a known finding of that kind.
    #[arg(long)]
    pub no_poison: bool,
    /// How outputs are judged: `tolerance` (attn-diff's per-dtype tolerance, the default) or
    /// `ladder[:K[:RUNG]]`: an error at most K times (default 2) that of a precision-ladder
    /// rung (default `every-op`: eager attention in the case's dtype) against the exact
    /// result. Rungs: f32, positions, probabilities, scores, scaled-query, softmax-state,
    /// every-op. The upstream suite keeps vLLM's own tolerance either way.
    #[arg(long, value_name = "POLICY", default_value = "tolerance", value_parser = attn_reference::Judge::parse)]
    pub judge: attn_reference::Judge,
    /// Bigger batches and longer sequences.
    #[arg(long)]
    pub deep: bool,
    /// More of the long tier: one case in four (instead of one in 25) has a context of 4k to
    /// 128k keys, a decode batch of up to 256 sequences or a cache past 2^31 elements.
    #[arg(long)]
    pub long: bool,
    /// How to write the summary (`junit`: JUnit XML, one test case per backend and part).
    #[arg(long, value_enum, default_value_t = CheckFormat::Text)]
    pub format: CheckFormat,
    /// Where replay files and heat maps of failures go.
    #[arg(long, default_value = "target/attn-diff/failures", value_name = "DIR")]
    pub out: PathBuf,
}

/// How `check` writes its summary.
#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum CheckFormat {
    /// Aligned tables for a terminal.
    Text,
    /// A JSON document (with `schema_version`), for machines.
    Json,
    /// GitHub markdown, for pull requests.
    Markdown,
    /// JUnit XML, as CI systems read test results.
    Junit,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The case to run: a replay file (JSON: a case, or a trace, which runs every step on one
    /// cache) or a safetensors file written by `export`.
    pub file: PathBuf,
    /// How outputs are judged (as `check --judge`); a replay line of a run judged otherwise
    /// than by the default says which.
    #[arg(long, value_name = "POLICY", default_value = "tolerance", value_parser = attn_reference::Judge::parse)]
    pub judge: attn_reference::Judge,
    /// Comma-separated backends to run (default: every registered backend).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub backend: Vec<BackendRef>,
    #[command(flatten)]
    pub external: ExternalArgs,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// An upstream spec to build the case from (`attn-diff list` names them).
    #[arg(
        long,
        conflicts_with = "case",
        required_unless_present = "case",
        value_name = "SPEC"
    )]
    pub spec: Option<String>,
    /// A replay file (JSON case) to export instead.
    #[arg(long, value_name = "FILE")]
    pub case: Option<PathBuf>,
    /// Query heads and kv heads, e.g. 32,8.
    #[arg(long, default_value = "32,8", value_name = "Q,KV")]
    pub heads: Heads,
    /// Elements per head.
    #[arg(long, default_value_t = 128, value_name = "D")]
    pub head_size: usize,
    /// Compute dtype of the case.
    #[arg(long, default_value = "bf16", value_parser = dtype_parser())]
    pub dtype: DType,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16, value_name = "TOKENS")]
    pub block_size: usize,
    /// Sliding window of this many keys (default: none).
    #[arg(long, value_name = "KEYS")]
    pub window: Option<usize>,
    /// Seed of the case's inputs (default: the upstream test's).
    #[arg(long, default_value_t = upstream::UPSTREAM_SEED, value_name = "SEED")]
    pub seed: u64,
    /// The safetensors file to write (atomically).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Comma-separated backend names (default: every registered backend); `external:NAME`
    /// runs an adapter, timed by the kernel time it reports, interleaved with the others.
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub backend: Vec<BackendRef>,
    #[command(flatten)]
    pub external: ExternalArgs,
    /// Upstream spec to time (default: every decoder spec). Repeatable.
    #[arg(long = "spec", value_name = "SPEC")]
    pub specs: Vec<String>,
    /// Compute dtype.
    #[arg(long, default_value = "bf16", value_parser = dtype_parser())]
    pub dtype: DType,
    /// KV-cache variants, each timed beside the others: `auto` (the compute dtype),
    /// `fp8_e4m3`, `fp8_e5m2` (scales 1), e.g. `auto,fp8_e4m3`.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = ["auto", "fp8_e4m3", "fp8_e5m2"], value_name = "CACHE,...")]
    pub kv_cache: Vec<String>,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 32, value_name = "TOKENS")]
    pub block_size: usize,
    /// Query heads and kv heads, e.g. 32,8.
    #[arg(long, default_value = "32,8", value_name = "Q,KV")]
    pub heads: Heads,
    /// Elements per head.
    #[arg(long, default_value_t = 128, value_name = "D")]
    pub head_size: usize,
    /// DeepSeek-V3's absorbed MLA decode layer instead: one latent kv head of 576 whose
    /// first 512 dims are V, scale 192^-0.5; `--heads` gives the query heads (kv heads 1),
    /// `--head-size` is not used.
    #[arg(long)]
    pub mla: bool,
    /// Worker threads of every backend (default: the machine's cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Timed calls per backend and spec (after one warm-up call).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub reps: usize,
    /// Evict the CPU caches (256 MB written) before every timed call, as the other layers of
    /// a model do between two calls for one layer; without it, K/V that fits in the
    /// last-level cache is read from there.
    #[arg(long)]
    pub cold: bool,
    /// Backend the others are compared with (default: the first one).
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,
    /// How to write the table.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Also draw a bar chart of the times (PNG) at this path.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub external: ExternalArgs,
    /// How to write the list.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct HandshakeArgs {
    /// The adapter to start: `external:NAME` or NAME, declared with --external or in
    /// attn-diff.toml (default: the only one given with --external).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    #[command(flatten)]
    pub external: ExternalArgs,
    /// How to write what the adapter declared.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct NewAdapterArgs {
    /// The directory to write `adapter.py` and `README.md` into (made if missing; refused
    /// unless empty).
    pub dir: PathBuf,
    /// The adapter's name (default: the directory's name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
}

/// Whatever follows `mutants` in a build without them.
#[cfg(not(feature = "mutants"))]
#[derive(Args, Debug)]
pub struct NoMutantsArgs {
    /// Ignored: this build has no mutants.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub rest: Vec<String>,
}

#[cfg(feature = "mutants")]
#[derive(Args, Debug)]
pub struct MutantsArgs {
    /// Property cases per mutant (default: the check's default budget).
    #[arg(long, value_name = "N")]
    pub cases: Option<u32>,
    /// Seed of the property cases.
    #[arg(long, default_value_t = 1, value_name = "SEED")]
    pub seed: u64,
    /// Mutants checked at once (default: one per core); the table is the same whatever N is.
    #[arg(short = 'j', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub jobs: Option<u32>,
    /// Run the upstream suite at every TP head config (default: only 8/2, the cheapest;
    /// the others hold the same specs with more heads).
    #[arg(long)]
    pub upstream_all_heads: bool,
    /// How to write the table.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Where replay files of the mutants' shrunk cases go.
    #[arg(long, default_value = "target/attn-diff/mutants", value_name = "DIR")]
    pub out: PathBuf,
}

impl Cli {
    /// Whether this invocation will run a libtorch backend (and so wants libgomp's passive
    /// wait policy set before the library loads).
    pub fn runs_libtorch(&self) -> bool {
        let named = |names: &[BackendRef]| {
            names.is_empty()
                || names
                    .iter()
                    .any(|n| attn_backends::uses_libtorch(&n.to_string()))
        };
        match &self.command {
            Command::Check(a) => named(&a.backend),
            Command::Replay(a) => named(&a.backend),
            Command::Bench(a) => named(&a.backend),
            Command::Export(_)
            | Command::List(_)
            | Command::Handshake(_)
            | Command::NewAdapter(_)
            | Command::Record(_)
            | Command::Mutants(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn heads_parse_as_the_help_shows_them() {
        assert_eq!("32,8".parse(), Ok(Heads { query: 32, kv: 8 }));
        assert_eq!("9/3".parse(), Ok(Heads { query: 9, kv: 3 }));
        assert!("32".parse::<Heads>().is_err());
        assert!("a,8".parse::<Heads>().is_err());
        let cli = Cli::try_parse_from(["attn-diff", "bench", "--heads", "16,4"]).unwrap();
        let Command::Bench(b) = cli.command else {
            panic!("bench")
        };
        assert_eq!(b.heads, Heads { query: 16, kv: 4 });
    }

    #[test]
    fn every_option_of_every_subcommand_has_help() {
        let mut cmd = Cli::command();
        cmd.build();
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            for arg in sub.get_arguments() {
                assert!(
                    arg.get_help().is_some() || arg.get_id() == "help" || arg.get_id() == "version",
                    "`{} --{}` has no help text",
                    sub.get_name(),
                    arg.get_id()
                );
            }
            let help = sub.clone().render_long_help().to_string();
            assert!(help.contains("Exit status"), "{}: {help}", sub.get_name());
        }
    }

    #[test]
    fn enumerations_list_their_values() {
        let help = Cli::command()
            .find_subcommand_mut("bench")
            .unwrap()
            .render_help()
            .to_string();
        for value in ["bf16", "f16", "f32", "text", "json", "markdown"] {
            assert!(help.contains(value), "{value} missing from:\n{help}");
        }
    }
}

/// `--hold`'s relations (one value holding a comma-separated list).
#[derive(Clone, Debug)]
pub struct Relations(pub Vec<attn_reference::relation::Relation>);

fn parse_relations(text: &str) -> Result<Relations, String> {
    attn_reference::relation::Relation::parse_list(text).map(Relations)
}
