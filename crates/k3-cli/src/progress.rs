//! Progress of long work on standard error, for a person at a terminal and for a log alike: a
//! bar where standard error is a terminal; elsewhere (nohup, a systemd unit, CI) a plain line
//! when the work starts, one every few seconds while it moves (done / total, rate, ETA; a
//! heartbeat while it waits on something slow), and one when it ends. Nothing under `--quiet`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{DecimalBytes, HumanDuration, ProgressBar, ProgressStyle};

/// A line at most this often while the work moves.
const EVERY: Duration = Duration::from_secs(5);
/// A line at least this often while it does not (a prefill chunk of a streaming model can take
/// minutes).
const HEARTBEAT: Duration = Duration::from_secs(30);

static QUIET: AtomicBool = AtomicBool::new(false);

/// No progress at all from here on (`--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A line for a person about long work, when there is no [`Progress`] to say it beside.
pub fn say(line: &str) {
    if !QUIET.load(Ordering::Relaxed) {
        eprintln!("{line}");
    }
}

/// What the work counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, said in decimal units (kB, MB, GB).
    Bytes,
    /// Things of this name (`tokens`, `windows`, `layers`).
    Items(&'static str),
}

/// One piece of long work's progress; [`finish`](Progress::finish) it (dropping it clears a bar
/// and says nothing more).
#[derive(Debug)]
pub struct Progress {
    shown: Shown,
}

#[derive(Debug)]
enum Shown {
    Bar(ProgressBar),
    Lines(Arc<Lines>, Option<JoinHandle<()>>),
    Off,
}

#[derive(Debug)]
struct Lines {
    label: String,
    unit: Unit,
    started: Instant,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    done: u64,
    total: u64,
    finished: bool,
}

impl Progress {
    /// Work of `total` units called `label`, shown as standard error allows.
    pub fn new(label: &str, total: u64, unit: Unit) -> Progress {
        let shown = if QUIET.load(Ordering::Relaxed) {
            Shown::Off
        } else if std::io::stderr().is_terminal() {
            Shown::Bar(bar(label, total, unit))
        } else {
            let lines = Arc::new(Lines {
                label: label.to_string(),
                unit,
                started: Instant::now(),
                state: Mutex::new(State { total, ..State::default() }),
                wake: Condvar::new(),
            });
            eprintln!("{}", lines.line(0, total));
            let ticker = Arc::clone(&lines);
            let handle = std::thread::Builder::new().name("progress".into()).spawn(move || ticker.tick()).ok();
            Shown::Lines(lines, handle)
        };
        Progress { shown }
    }

    /// `done` units of the total are done.
    pub fn set_position(&self, done: u64) {
        match &self.shown {
            Shown::Bar(pb) => pb.set_position(done),
            Shown::Lines(lines, _) => lines.state().done = done,
            Shown::Off => {}
        }
    }

    /// A line for a person beside the progress (above a bar).
    pub fn say(&self, line: &str) {
        match &self.shown {
            Shown::Bar(pb) => pb.suspend(|| eprintln!("{line}")),
            Shown::Lines(..) => eprintln!("{line}"),
            Shown::Off => {}
        }
    }

    /// The work ended: a bar is cleared; a log gets the line of how it went.
    pub fn finish(mut self) {
        self.stop(true);
    }

    fn stop(&mut self, say: bool) {
        match std::mem::replace(&mut self.shown, Shown::Off) {
            Shown::Bar(pb) => pb.finish_and_clear(),
            Shown::Lines(lines, handle) => {
                let done = {
                    let mut s = lines.state();
                    s.finished = true;
                    s.done
                };
                let end = lines.end_line(done);
                lines.wake.notify_all();
                if let Some(h) = handle {
                    let _ = h.join();
                }
                if say {
                    eprintln!("{end}");
                }
            }
            Shown::Off => {}
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop(false);
    }
}

fn bar(label: &str, total: u64, unit: Unit) -> ProgressBar {
    let counts = match unit {
        Unit::Bytes => "{decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}".to_string(),
        Unit::Items(name) => format!("{{pos}}/{{len}} {name}, {{elapsed}}"),
    };
    let style = ProgressStyle::with_template(&format!("{{msg:>9}} [{{bar:40}}] {counts} (ETA {{eta}})"))
        .expect("a template of constant parts parses")
        .progress_chars("=> ");
    let pb = ProgressBar::new(total).with_style(style).with_message(label.to_string());
    pb.enable_steady_tick(Duration::from_secs(1));
    pb
}

impl Lines {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Says a line every [`EVERY`] while the count moves, every [`HEARTBEAT`] while it does
    /// not, until the work is finished.
    fn tick(&self) {
        let (mut said_at, mut said_done) = (Instant::now(), 0);
        let mut s = self.state();
        // Finished may come before this thread first waits: it is looked at before every wait.
        while !s.finished {
            s = self.wake.wait_timeout(s, EVERY).map_or_else(|e| e.into_inner().0, |(g, _)| g);
            if s.finished {
                return;
            }
            let moved = s.done != said_done;
            if moved || said_at.elapsed() >= HEARTBEAT {
                eprintln!("{}", self.line(s.done, s.total));
                (said_at, said_done) = (Instant::now(), s.done);
            }
        }
    }

    fn amount(&self, n: u64) -> String {
        match self.unit {
            Unit::Bytes => DecimalBytes(n).to_string(),
            Unit::Items(_) => n.to_string(),
        }
    }

    fn rate(&self, done: u64, secs: f64) -> String {
        let per_s = done as f64 / secs.max(1e-9);
        match self.unit {
            Unit::Bytes => format!("{}/s", DecimalBytes(per_s as u64)),
            Unit::Items(name) => format!("{per_s:.1} {name}/s"),
        }
    }

    /// `experts: 12.30 GB/1.45 TB (0.8%), 1.20 GB/s, 2m 10s, ETA 20m`.
    fn line(&self, done: u64, total: u64) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        let name = match self.unit {
            Unit::Items(name) => format!(" {name}"),
            Unit::Bytes => String::new(),
        };
        let pct = if total > 0 { 100.0 * done as f64 / total as f64 } else { 0.0 };
        let mut line = format!("{}: {}/{}{name} ({pct:.1}%)", self.label, self.amount(done), self.amount(total));
        if done > 0 && secs > 0.0 {
            let eta = Duration::from_secs_f64(secs * total.saturating_sub(done) as f64 / done as f64);
            line += &format!(
                ", {}, {} elapsed, ETA {}",
                self.rate(done, secs),
                HumanDuration(self.started.elapsed()),
                HumanDuration(eta)
            );
        }
        line
    }

    /// `experts: done, 1.45 TB in 20m (1.20 GB/s)`.
    fn end_line(&self, done: u64) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        let took = HumanDuration(self.started.elapsed());
        format!("{}: done, {} in {took} ({})", self.label, self.amount(done), self.rate(done, secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(unit: Unit, secs: u64) -> Lines {
        Lines {
            label: "experts".into(),
            unit,
            started: Instant::now() - Duration::from_secs(secs),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        }
    }

    #[test]
    fn a_line_says_done_total_rate_and_eta() {
        let l = lines(Unit::Bytes, 10);
        let s = l.line(2_000_000_000, 8_000_000_000);
        assert!(
            s.starts_with("experts: 2.00 GB/8.00 GB (25.0%), 200.00 MB/s, 10 seconds elapsed, ETA 30 seconds"),
            "{s}"
        );
        let l = lines(Unit::Items("tokens"), 4);
        assert_eq!(l.line(0, 100), "experts: 0/100 tokens (0.0%)");
        let s = l.line(50, 100);
        assert!(
            s.starts_with("experts: 50/100 tokens (50.0%), 12.5 tokens/s, 4 seconds elapsed, ETA 4 seconds"),
            "{s}"
        );
        assert!(l.end_line(100).starts_with("experts: done, 100 in 4 seconds (25.0 tokens/s)"));
    }
}
