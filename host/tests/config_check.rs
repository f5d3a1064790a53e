//! Golden-file test of `sluice config check`: every `tests/config-check/cases/*.toml` is
//! checked by the `sluice` binary (offline: no database, broker or network) and its transcript
//! (exit code, stdout, stderr) must be byte for byte its `.out` file. `SLUICE_BLESS=1` writes
//! the `.out` files instead of comparing. See `tests/config-check/README.md`.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Set to `1` to (re)write the `.out` files from what the binary prints now.
const BLESS_ENV: &str = "SLUICE_BLESS";
/// A case that takes longer hangs (e.g. waits for the network), which no case may do.
const CASE_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of a case that give it an environment variable: `# env: NAME=VALUE`.
const ENV_LINE: &str = "# env: ";

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/config-check/cases")
}

/// The case's `# env: NAME=VALUE` lines (none when the file cannot be read: that is a case
/// too).
fn case_env(path: &Path) -> Vec<(String, String)> {
    let Ok(bytes) = fs::read(path) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| line.strip_prefix(ENV_LINE))
        .map(|assignment| match assignment.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => (assignment.to_owned(), String::new()),
        })
        .collect()
}

/// Runs `sluice config check --config NAME` in the cases directory with only PATH, the
/// disabled compile cache and the case's own variables in its environment.
fn run_case(dir: &Path, name: &str) -> Result<(ExitStatus, Vec<u8>, Vec<u8>), String> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["config", "check", "--config", name])
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SLUICE_PLUGIN_CACHE_DIR", "")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in case_env(&dir.join(name)) {
        command.env(OsString::from(key), OsString::from(value));
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", env!("CARGO_BIN_EXE_sluice")))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > CASE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {CASE_TIMEOUT:?}: killed"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = stdout.join().map_err(|_| "reading stdout failed")?;
    let stderr = stderr.join().map_err(|_| "reading stderr failed")?;
    Ok((status, stdout, stderr))
}

/// The exit code as a shell reports it (128 + the signal for a process killed by one).
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// One stream as the transcript holds it: the text with the cases directory replaced by
/// `<dir>`, and a marker line when it does not end with a line break.
fn section(bytes: &[u8], dirs: &[String]) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    for dir in dirs {
        text = text.replace(dir.as_str(), "<dir>");
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push_str("\n\\ no newline at end\n");
    }
    text
}

fn transcript(status: ExitStatus, stdout: &[u8], stderr: &[u8], dirs: &[String]) -> String {
    format!(
        "exit: {}\n--- stdout\n{}--- stderr\n{}",
        exit_code(status),
        section(stdout, dirs),
        section(stderr, dirs)
    )
}

/// A line diff of `expected` and `actual` (longest common subsequence): `-` expected only,
/// `+` actual only, ` ` both.
fn diff(expected: &str, actual: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!("   {}\n", a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!(" - {}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!(" + {}\n", b[j]));
            j += 1;
        }
    }
    if out.lines().all(|l| l.starts_with("   ")) {
        // Same lines: only a line break differs.
        out.push_str(" (the texts differ in line breaks or a trailing newline)\n");
    }
    out
}

#[test]
fn config_check_output_matches_the_golden_files() {
    let dir = cases_dir();
    let bless = std::env::var(BLESS_ENV).is_ok_and(|v| v == "1");
    // Both spellings of the directory, the longer first, so a path under it becomes `<dir>`.
    let mut dirs = vec![dir.to_string_lossy().into_owned()];
    if let Ok(canonical) = dir.canonicalize() {
        dirs.push(canonical.to_string_lossy().into_owned());
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    dirs.dedup();

    let mut cases = BTreeSet::new();
    let mut outs = BTreeSet::new();
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".toml") {
            cases.insert(stem.to_owned());
        } else if let Some(stem) = name.strip_suffix(".out") {
            outs.insert(stem.to_owned());
        }
    }
    assert!(
        cases.len() >= 40,
        "only {} cases in {}",
        cases.len(),
        dir.display()
    );

    let mut failures = Vec::new();
    for stale in outs.difference(&cases) {
        let out = dir.join(format!("{stale}.out"));
        if bless {
            fs::remove_file(&out).unwrap();
            eprintln!("removed {stale}.out (no {stale}.toml)");
        } else {
            failures.push(format!(
                "{stale}.out: no case {stale}.toml (remove it, or bless to remove it)"
            ));
        }
    }
    for case in &cases {
        let name = format!("{case}.toml");
        let out = dir.join(format!("{case}.out"));
        let actual = match run_case(&dir, &name) {
            Ok((status, stdout, stderr)) => transcript(status, &stdout, &stderr, &dirs),
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let expected = fs::read_to_string(&out).ok();
        if expected.as_deref() == Some(actual.as_str()) {
            continue;
        }
        if bless {
            fs::write(&out, &actual).unwrap();
            eprintln!("blessed {case}.out");
            continue;
        }
        failures.push(match expected {
            None => format!("{name}: no {case}.out; its output now:\n{actual}"),
            Some(expected) => format!(
                "{name}: `sluice config check` prints something else than {case}.out \
                 (- expected, + actual):\n{}",
                diff(&expected, &actual)
            ),
        });
    }
    assert!(
        failures.is_empty(),
        "{} of {} config-check cases failed (in {}; if the change is intended, rerun with \
         {BLESS_ENV}=1 and review the .out diff):\n\n{}",
        failures.len(),
        cases.len(),
        dir.display(),
        failures.join("\n")
    );
}
