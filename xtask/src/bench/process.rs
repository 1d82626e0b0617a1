//! Starting a waiting workload, attaching a tracer to it, letting it go, and stopping the tracer.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use anyhow::{Context as _, Result, bail};

/// How long a tracer may take to exit after SIGINT.
const STOP_TIMEOUT: Duration = Duration::from_secs(90);

/// A workload started with `--wait`: it printed its pid and waits for a line on stdin.
pub struct WaitingWorkload {
    child: Child,
    stdout: BufReader<ChildStdout>,
    pub pid: u32,
}

impl WaitingWorkload {
    pub fn start(binary: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(binary)
            .args(args)
            .arg("--wait")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().context("workload stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let pid = line.trim().parse().with_context(|| format!("workload printed {line:?} instead of its pid"))?;
        Ok(Self { child, stdout, pid })
    }

    /// Lets the workload run and returns the JSON line it prints when done.
    pub fn go(mut self) -> Result<serde_json::Value> {
        self.child.stdin.as_mut().context("workload stdin")?.write_all(b"go\n")?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("workload failed with {status}");
        }
        serde_json::from_str(line.trim()).with_context(|| format!("workload printed {line:?}"))
    }
}

/// How to know a tracer is attached: a line of its output (stdout or stderr) contains `marker`;
/// then wait `settle` (bpftrace prints `Attaching N probes...` before it attaches).
#[derive(Clone, Copy)]
pub struct Ready {
    marker: &'static str,
    settle: Duration,
}

impl Ready {
    /// Attached once a line contains `marker`.
    pub const fn on(marker: &'static str) -> Self {
        Self { marker, settle: Duration::ZERO }
    }

    /// ... and `settle` after that line.
    pub const fn then_wait(self, settle: Duration) -> Self {
        Self { settle, ..self }
    }
}

/// A running tracer (mm-probe or bpftrace) and everything it printed.
pub struct Tracer {
    child: Child,
    /// The program's name, for the errors (mm-probe or bpftrace).
    name: String,
    lines: mpsc::Receiver<String>,
    pub started: Instant,
    /// When it said it was attached (before any settle time), measured from `started`.
    pub ready_after: Duration,
}

impl Tracer {
    pub fn start(mut command: Command, ready: Ready, timeout: Duration) -> Result<Self> {
        let started = Instant::now();
        let name = Path::new(command.get_program()).file_name().unwrap_or_default().to_string_lossy().into_owned();
        // Run it as from a terminal: SIGINT at its default. (Shells start background jobs with
        // SIGINT ignored, and a tracer that has not installed its handler yet would ignore
        // the benchmark's Ctrl-C.)
        // SAFETY: signal() is async-signal-safe, as pre_exec requires.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("starting tracer")?;
        let (sender, lines) = mpsc::channel();
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut tracer = Self { child, name, lines, started, ready_after: Duration::ZERO };
        tracer.wait_ready(ready, timeout)?;
        Ok(tracer)
    }

    fn wait_ready(&mut self, ready: Ready, timeout: Duration) -> Result<()> {
        let Ready { marker, settle } = ready;
        loop {
            let late = || format!("{} did not attach in time", self.name);
            let left = timeout.checked_sub(self.started.elapsed()).with_context(late)?;
            let line = self.lines.recv_timeout(left).with_context(late)?;
            if line.contains(marker) {
                break;
            }
        }
        self.ready_after = self.started.elapsed();
        std::thread::sleep(settle);
        if let Some(status) = self.child.try_wait()? {
            let output: Vec<String> = self.lines.try_iter().collect();
            bail!("{} exited early with {status}: {}", self.name, output.join("\n"));
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes it (SIGSTOP), as a reader starved of CPU would be: the kernel side keeps running.
    pub fn freeze(&self) {
        // SAFETY: kill with a valid pid and signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
    }

    /// Lets a frozen tracer run again.
    pub fn thaw(&self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
    }

    /// Stops it as Ctrl-C would and returns everything it printed (bpftrace detaching kprobes on
    /// busy functions in an emulated guest took longer than 20 s).
    pub fn stop(mut self) -> Result<Vec<String>> {
        // SAFETY: kill with a valid pid and signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let output: Vec<String> = self.lines.try_iter().collect();
                bail!("{} ignored SIGINT for {STOP_TIMEOUT:?}; it printed:\n{}", self.name, output.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The reader threads end when the pipes close, which closes the channel.
        Ok(self.lines.iter().collect())
    }
}
