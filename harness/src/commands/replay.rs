//! `attn-diff replay FILE`: one saved case through backends again.

use super::{load_case, select_backends_with};
use crate::cli::ReplayArgs;
use crate::replay::replay_case;
use crate::runner::Outcome;

pub fn run(args: ReplayArgs) -> anyhow::Result<bool> {
    let case = load_case(&args.file)?;
    let backends = select_backends_with(&args.backend, &args.external)?;
    let mut ok = true;
    for r in replay_case(&case, &args.file.display().to_string(), &backends) {
        match (&r.outcome, &r.report) {
            (Outcome::Pass(c), _) => println!(
                "{}: pass (max abs {:.2e}, max rel {:.2e})",
                r.backend, c.max_abs_err, c.max_rel_err
            ),
            (Outcome::Unsupported(why), _) => println!("{}: unsupported ({why})", r.backend),
            (Outcome::Diverged(_), Some(rep)) => {
                ok = false;
                println!("{}", rep.text);
            }
            (Outcome::Diverged(d), None) => {
                ok = false;
                println!("{}: {} ({})", r.backend, d.kind, d.message);
            }
        }
    }
    Ok(ok)
}
