//! `attn-bot`: the pull-request bot's steps, as the workflows and `cargo xtask bot` run them.

use attn_ci::allowlist::AllowList;
use attn_ci::cli::{parse_args, Command, GateArgs, USAGE};
use attn_ci::reply::ReplyContext;
use attn_ci::run::{self, Gate, PlanInput, Report, RunError};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args, std::env::var("BOT_COMMENT").ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attn-bot: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match execute(command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("attn-bot: {e}");
            ExitCode::from(2)
        }
    }
}

fn execute(command: Command) -> Result<u8, RunError> {
    match command {
        Command::Plan {
            out,
            comment,
            gate,
            pr,
            sha,
            comment_id,
            github_output,
        } => {
            let gate = match gate {
                GateArgs::Local => Gate::Local,
                GateArgs::Comment {
                    allowlist,
                    author,
                    association,
                } => {
                    let text =
                        std::fs::read_to_string(&allowlist).map_err(|source| RunError::Read {
                            path: allowlist.clone(),
                            source,
                        })?;
                    Gate::Comment {
                        allowlist: AllowList::parse(&text)?,
                        author,
                        association,
                    }
                }
            };
            let file = run::plan(
                PlanInput {
                    comment,
                    gate,
                    pr,
                    sha,
                    comment_id,
                },
                &out,
            )?;
            let outputs = run::github_outputs(&file);
            eprint!("{outputs}");
            if let Some(path) = github_output {
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(outputs.as_bytes()))
                    .map_err(|source| RunError::Write { path, source })?;
            }
            Ok(0)
        }
        Command::Shard {
            request,
            index,
            shards,
        } => {
            let file = run::load_request(&request)?;
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let root = std::env::current_dir().map_err(|source| RunError::Read {
                path: ".".into(),
                source,
            })?;
            match run::shard(&file, index, &shards, &cargo, &root) {
                Ok(true) => Ok(0),
                Ok(false) => Ok(1),
                // The error is in shard-I/error.txt for the report; say it here too.
                Err(e @ RunError::Shard { .. }) => {
                    eprintln!("attn-bot: {e}");
                    Ok(3)
                }
                Err(e) => Err(e),
            }
        }
        Command::Report {
            request,
            shards,
            out,
            replay_artifact,
            run_url,
        } => {
            let file = run::load_request(&request)?;
            let ctx = ReplyContext {
                replay_artifact,
                run_url,
            };
            let outcome = run::report(&file, &shards, &out, &ctx)?;
            let reply = out.join(run::REPLY_FILE);
            match std::fs::read_to_string(&reply) {
                Ok(text) => println!("{text}"),
                Err(source) => {
                    return Err(RunError::Read {
                        path: reply,
                        source,
                    })
                }
            }
            Ok(match outcome {
                Report::Passed => 0,
                Report::Diverged => 1,
                Report::Broken => 3,
            })
        }
        Command::Usage => {
            println!("{}", attn_ci::request::USAGE);
            Ok(0)
        }
    }
}
