//! One running adapter process: started in its own process group with piped stdin, stdout
//! and stderr; a thread writes request frames, one reads reply frames, one keeps the tail of
//! stderr. Killing signals the whole group (an adapter started through a shell or one that
//! forks workers leaves nothing behind) and reaps the child, so no zombie remains.

use super::frame::{describe_head, read_frame, write_frame, FrameRead, MAX_FRAME_BYTES};
use super::spec::AdapterSpec;
use super::stderr_tail::StderrTail;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long a closing adapter gets to exit by itself before it is killed.
const EXIT_GRACE: Duration = Duration::from_millis(300);
/// How long to wait for the last of stderr after the process ended.
const STDERR_DRAIN: Duration = Duration::from_secs(1);

/// Why one request got no reply.
#[derive(Debug, Clone, PartialEq)]
pub enum ExchangeError {
    /// No reply within the limit.
    Timeout,
    /// The process closed stdout (ended, or is ending); says how.
    Ended(String),
    /// stdout carried something that is not a frame.
    Malformed(String),
}

enum Event {
    Frame(Vec<u8>),
    Ended(String),
    Malformed(String),
}

pub struct AdapterProcess {
    child: Child,
    to_stdin: Option<Sender<Vec<u8>>>,
    events: Receiver<Event>,
    stderr: Arc<Mutex<StderrTail>>,
    stderr_done: Receiver<()>,
    reaped: Option<ExitStatus>,
}

fn describe_status(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => s.to_string(),
    }
}

fn read_stdout(mut out: ChildStdout, events: Sender<Event>) {
    loop {
        let ev = match read_frame(&mut out) {
            FrameRead::Frame(f) => Event::Frame(f),
            FrameRead::Eof => Event::Ended("closed its stdout".into()),
            FrameRead::Truncated { expected, got } => Event::Ended(format!(
                "closed its stdout inside a frame ({got} of {expected} bytes)"
            )),
            FrameRead::TooLarge { len, head } => Event::Malformed(format!(
                "stdout carried {} where a frame length was expected (length {len} is over the \
                 {MAX_FRAME_BYTES}-byte limit); only framed messages may go to stdout, \
                 print diagnostics to stderr",
                describe_head(&head)
            )),
            FrameRead::Io(e) => Event::Ended(format!("stdout failed: {e}")),
        };
        let last = !matches!(ev, Event::Frame(_));
        if events.send(ev).is_err() || last {
            return;
        }
    }
}

fn read_stderr(mut err: ChildStderr, tail: Arc<Mutex<StderrTail>>, done: Sender<()>) {
    let mut buf = [0u8; 4096];
    loop {
        match err.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => tail
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(&buf[..n]),
        }
    }
    let _ = done.send(());
}

impl AdapterProcess {
    /// Start the adapter (no handshake yet).
    pub fn spawn(spec: &AdapterSpec) -> Result<AdapterProcess, String> {
        if super::live::ending() {
            return Err("the run was interrupted: no adapter starts any more".into());
        }
        let (program, args) = spec
            .command
            .split_first()
            .ok_or_else(|| "the command is empty".to_string())?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(&spec.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(dir) = &spec.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", spec.command.join(" ")))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let mut p = AdapterProcess::wrap(child);
            p.kill();
            return Err("the adapter's pipes were not set up".into());
        };
        let (to_stdin, requests) = channel::<Vec<u8>>();
        thread::spawn(move || {
            let mut stdin = stdin;
            for frame in requests {
                if write_frame(&mut stdin, &frame).is_err() {
                    // The adapter is gone; its stdout reader reports how.
                    return;
                }
            }
        });
        let (ev_tx, events) = channel();
        thread::spawn(move || read_stdout(stdout, ev_tx));
        let tail = Arc::new(Mutex::new(StderrTail::default()));
        let (done_tx, stderr_done) = channel();
        let t = Arc::clone(&tail);
        thread::spawn(move || read_stderr(stderr, t, done_tx));
        super::live::register(child.id() as i32);
        // Spawned while an interrupt was ending every adapter: end this one too.
        if super::live::ending() {
            super::live::kill_all();
        }
        Ok(AdapterProcess {
            child,
            to_stdin: Some(to_stdin),
            events,
            stderr: tail,
            stderr_done,
            reaped: None,
        })
    }

    /// A process whose pipes could not be taken: only good for killing.
    fn wrap(child: Child) -> AdapterProcess {
        let (_, events) = channel();
        let (_, stderr_done) = channel();
        AdapterProcess {
            child,
            to_stdin: None,
            events,
            stderr: Arc::new(Mutex::new(StderrTail::default())),
            stderr_done,
            reaped: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Send one request and wait for one reply frame.
    pub fn exchange(
        &mut self,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ExchangeError> {
        let sent = self
            .to_stdin
            .as_ref()
            .is_some_and(|tx| tx.send(request).is_ok());
        match self.events.recv_timeout(timeout) {
            Ok(Event::Frame(f)) => Ok(f),
            Ok(Event::Ended(how)) => Err(ExchangeError::Ended(how)),
            Ok(Event::Malformed(what)) => Err(ExchangeError::Malformed(what)),
            Err(RecvTimeoutError::Timeout) => Err(ExchangeError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Err(ExchangeError::Ended(if sent {
                "closed its stdout".into()
            } else {
                "closed its stdin".into()
            })),
        }
    }

    /// Whether the child has exited, without reaping it (its pid stays reserved, so
    /// signalling its group stays safe).
    fn has_exited(&self) -> bool {
        let pid = self.child.id() as libc::id_t;
        // SAFETY: waitid writes only into the zeroed siginfo_t we own; WNOWAIT leaves the
        // child waitable, WNOHANG returns at once.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            r == 0 && info.si_pid() != 0
        }
    }

    /// Close stdin, give the adapter [`EXIT_GRACE`] to exit, then kill its whole process
    /// group and reap it. Idempotent; describes how it ended.
    pub fn finish(&mut self, grace: Duration) -> String {
        if let Some(s) = self.reaped {
            return describe_status(s);
        }
        self.to_stdin = None;
        let until = Instant::now() + grace;
        while Instant::now() < until && !self.has_exited() {
            thread::sleep(Duration::from_millis(5));
        }
        let exited_by_itself = self.has_exited();
        // SAFETY: plain syscall; the child is not reaped yet, so its pid (= its process
        // group id) cannot have been reused.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        super::live::unregister(self.child.id() as i32);
        let reaped = self.child.wait();
        // Killed grandchildren (an adapter started through a shell) die on their own time,
        // which on a busy machine is later than their parent's reaping.
        wait_for_group_exit(self.child.id(), GROUP_EXIT_LIMIT);
        match reaped {
            Ok(s) => {
                self.reaped = Some(s);
                if exited_by_itself {
                    describe_status(s)
                } else {
                    format!("killed by attn-diff ({})", describe_status(s))
                }
            }
            Err(e) => format!("could not be reaped: {e}"),
        }
    }

    /// Kill at once (after a timeout or a protocol error).
    pub fn kill(&mut self) -> String {
        self.finish(Duration::ZERO)
    }

    /// The end of what the adapter wrote to stderr (waits briefly for the last of it once
    /// the process has ended).
    pub fn stderr_tail(&self) -> String {
        if self.reaped.is_some() {
            let _ = self.stderr_done.recv_timeout(STDERR_DRAIN);
        }
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).tail()
    }
}

impl Drop for AdapterProcess {
    fn drop(&mut self) {
        self.finish(EXIT_GRACE);
    }
}

/// How long [`AdapterProcess::finish`] waits for the killed group's last members to end.
const GROUP_EXIT_LIMIT: Duration = Duration::from_secs(2);

/// Wait until no process of group `pgid` is still running (zombies, which only their new
/// parent can reap, do not count), or `limit` passes. Linux reads `/proc`; elsewhere this
/// returns at once.
fn wait_for_group_exit(pgid: u32, limit: Duration) {
    let until = Instant::now() + limit;
    while group_has_live_members(pgid) && Instant::now() < until {
        thread::sleep(Duration::from_millis(5));
    }
}

fn group_has_live_members(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // "pid (comm) STATE PPID PGRP ...": the fields after the last ')'.
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, r)| r.split_whitespace().collect());
        rest.get(2) == Some(&pgid.to_string().as_str()) && rest.first() != Some(&"Z")
    })
}
